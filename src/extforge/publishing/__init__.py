"""Serving a channel: publishing packages to it, re-indexing it, the names a package may have."""
