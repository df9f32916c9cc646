"""Real pip and uv runs in the tests: the environment they get."""

from __future__ import annotations

import os


def clean_client_env(**extra: str) -> dict[str, str]:
    """The environment for a real pip or uv run: no configuration of this machine's (its pip.conf's
    extra indexes and find-links, PIP_*/UV_* variables) takes part; nothing reaches the network."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    return {**env, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "UV_NO_CONFIG": "1",
            "UV_OFFLINE": "1", **extra}
