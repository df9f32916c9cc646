"""The mirror's tests: the multi-user fixture for the cases of a cache other users can write."""

from peers import peer_site  # noqa: F401  (shared with other areas)
