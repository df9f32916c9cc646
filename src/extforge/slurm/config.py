"""Site settings for Slurm: partition, account and extra sbatch options.

They come from a TOML file (`--slurm-config`, else `$XDG_CONFIG_HOME/extforge/slurm.toml`)
and command-line flags, flags winning; a cluster team writes the file once per site.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ..errors import ExtforgeError


@dataclass(frozen=True)
class SlurmConfig:
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    # Overrides the planner's wall-time estimate (sbatch --time syntax, e.g. "4:00:00").
    time: str | None = None
    # Anything else the site needs, one sbatch option per item, e.g. "--constraint=h100".
    extra_args: tuple[str, ...] = ()
    # The build node type; when unset, the smallest node of the partition as sinfo reports it.
    node_cores: int | None = None
    node_memory: str | None = None
    profile: str | None = None
    # Shared-filesystem cache root (source cache, compile cache) for every job; default: ours.
    shared_cache: str | None = None
    # Shell lines run at the start of every job, e.g. "module load cuda/13.0".
    setup: tuple[str, ...] = ()
    # How a node runs extforge; default: the interpreter running this command (a shared venv).
    extforge: str | None = None
    verify_mem: str = "1G"
    sources: dict[str, str] = field(default_factory=dict, compare=False)


_KEYS = {f.name for f in fields(SlurmConfig)} - {"sources"}
_TUPLES = {"extra_args", "setup"}


def default_config_path() -> Path:
    xdg = os.environ.get("XDG_CONFIG_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".config"
    return base / "extforge" / "slurm.toml"


def parse_config(text: str, origin: str) -> dict[str, Any]:
    """slurm.toml text → its settings; unknown keys are errors so typos do not pass silently."""
    try:
        data = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError) as exc:  # tomllib recurses into nested arrays
        raise ExtforgeError(f"{origin} is not valid TOML", str(exc), "fix the line named above") from None
    # A [slurm] table is accepted too, so the settings can live in a larger file.
    if isinstance(data.get("slurm"), dict):
        data = data["slurm"]
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise ExtforgeError(
            f"{origin} has unknown settings: {', '.join(unknown)}",
            f"known settings are {', '.join(sorted(_KEYS))}",
            "rename or remove them",
        )
    for key in _TUPLES & set(data):
        value = data[key]
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ExtforgeError(f"{origin}: {key} must be a list of strings", f"got {value!r}", f'write {key} = ["..."]')
        data[key] = tuple(value)
    return data


def merge(file_settings: dict[str, Any], flags: dict[str, Any], origin: str | None) -> SlurmConfig:
    """File settings overlaid with the flags that were given (None means not given)."""
    values: dict[str, Any] = dict(file_settings)
    sources = {k: origin or "file" for k in file_settings}
    for key, value in flags.items():
        if value is None or value == () or value == []:
            continue
        values[key] = tuple(value) if key in _TUPLES else value
        sources[key] = "flag"
    return SlurmConfig(**values, sources=sources)


def load(path: Path | None, flags: dict[str, Any]) -> SlurmConfig:
    """Read the config file (an explicit path must exist; the default one may not) and apply flags."""
    explicit = path is not None
    path = path or default_config_path()
    if not path.is_file():
        if explicit:
            raise ExtforgeError(
                f"Slurm config file {path} does not exist",
                "--slurm-config names a file that is not there",
                "create it (e.g. partition = \"gpu\" and account = \"myproj\") or drop --slurm-config",
            )
        return merge({}, flags, None)
    return merge(parse_config(path.read_text(), str(path)), flags, str(path))
