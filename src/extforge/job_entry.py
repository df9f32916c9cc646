"""How Slurm jobs run extforge (`python -m extforge.job_entry`): like `python -m extforge`,
but ending without interpreter finalization.

py-rattler 0.28 leaves native threads behind after `rattler.index.index_fs` (used by build
and publish); about every other process then dies at exit with SIGSEGV or SIGABRT
("PyGILState_Release: thread state ... must be current", runtime finalizing) after all
its work is done. In a job that turns a built, published package into a failed variant.
"""

from __future__ import annotations

import os
import sys

from .cli import main as cli_main


def main() -> None:
    code = cli_main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
