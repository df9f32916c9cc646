"""Several torch builds in one mirror channel: one row per python x torch x CUDA x C++ ABI.

A mirror run adds its row to the channel, or replaces it: the packages and variant values of
the other rows stay. The channel's rows file records each row's variant values and package
files; variants.yaml is written from every row, zipped, so that a recipe builds exactly the
rows the channel holds (pure logic here, the I/O in build_mirror).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROWS_FILE = "mirror-rows.json"
# Values shared by every row (the compiler package names); the rest are zipped per row.
SHARED_KEYS = ("c_compiler", "cxx_compiler", "cuda_compiler")
# What a CPU row has for a key only CUDA rows set (conda-forge's spelling).
NO_VALUE = "None"


@dataclass
class Row:
    variants: dict[str, str]
    files: list[str] = field(default_factory=list)  # "<subdir>/<file name>"

    @property
    def key(self) -> str:
        v = self.variants
        cuda = v.get("cuda_compiler_version")
        cuda_tag = f"cuda{cuda}" if cuda and cuda != NO_VALUE else "cpu"
        return f"python{v.get('python')}-pytorch{v.get('pytorch')}-{cuda_tag}-{v.get('cxx_abi', 'cxx11')}"


def load_rows(channel: Path) -> list[Row]:
    try:
        data = json.loads((channel / ROWS_FILE).read_text())
    except (OSError, ValueError):
        return []
    return [Row(dict(r["variants"]), list(r["files"])) for r in data.get("rows", [])]


def rows_json(rows: Sequence[Row]) -> str:
    return json.dumps({"schema": 1, "rows": [asdict(r) | {"key": r.key} for r in rows]}, indent=1) + "\n"


def merge(rows: Sequence[Row], new: Row) -> list[Row]:
    """`rows` with `new` in place of the row of the same key, or appended."""
    out = [r for r in rows if r.key != new.key]
    at = next((i for i, r in enumerate(rows) if r.key == new.key), len(out))
    return out[:at] + [new] + out[at:]


def stale_files(before: Sequence[Row], after: Sequence[Row]) -> set[str]:
    """Files no row of the channel needs any more (a re-mirrored row's old packages)."""
    keep = {f for r in after for f in r.files}
    return {f for r in before for f in r.files} - keep


def matrix(rows: Sequence[Row]) -> tuple[dict[str, list[str]], list[str]]:
    """Variant values of all rows (per-row keys as equal-length lists) and the zipped keys."""
    shared: dict[str, str] = {}
    for r in rows:
        for k in SHARED_KEYS:
            if k in r.variants:
                shared[k] = r.variants[k]
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r.variants if k not in SHARED_KEYS and k not in keys]
    values: dict[str, list[str]] = {k: [v] for k, v in shared.items()}
    values |= {k: [r.variants.get(k, NO_VALUE) for r in rows] for k in keys}
    return values, keys


def variants_yaml(rows: Sequence[Row]) -> str:
    values, zipped = matrix(rows)
    lines = [
        "# Written by `extforge mirror`: the variant values this channel's packages satisfy,",
        f"# one zipped row per torch build it holds ({', '.join(r.key for r in rows)}).",
    ]
    if len(zipped) > 1:
        lines.append(f"zip_keys:\n  - [{', '.join(zipped)}]")
    for key, vals in values.items():
        lines.append(f"{key}: [{', '.join(json.dumps(v) for v in vals)}]")
    return "\n".join(lines) + "\n"

