import sys

from .cli import main

# Guarded: the mirror's packaging workers are spawned processes, which import the parent's
# main module (this one under `python -m extforge`) without running it.
if __name__ == "__main__":
    sys.exit(main())
