"""Several torch builds in one mirror channel: one row per python x torch x CUDA x C++ ABI.

A mirror run adds its row to the channel, or replaces it: the packages and variant values of
the other rows stay. The channel's rows file records each row's variant values and package
files; variants.yaml is written from every row, zipped, so that a recipe builds exactly the
rows the channel holds (pure logic here, the I/O in build_mirror).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..channel_ref import SUBDIRS
from ..errors import ExtforgeError
from ..shared_read import Refused, read_json, shown

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


# A row's files as the mirror writes them: a subdir of the channel, then a package's file name.
_FILE = re.compile(rf"(?:{'|'.join(map(re.escape, SUBDIRS))})/[A-Za-z0-9_][A-Za-z0-9_.+!-]{{0,250}}\.conda")
_VALUE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.*+!=<>, -]{0,199}")
ROWS_LIMIT = 4 << 20


def _rows(data: object) -> list[Row]:
    """The rows of a rows file, typed: variant names and values of a version's characters, files
    `<subdir>/<name>.conda` (the mirror removes a re-mirrored row's old files: a name reaching out
    of the channel would have it delete there)."""
    if not isinstance(data, dict) or not isinstance(data.get("rows", []), list):
        raise ValueError("not a rows file ({\"rows\": [...]})")
    out = []
    for r in data.get("rows", []):
        if not isinstance(r, dict) or not isinstance(r.get("variants"), dict) or not isinstance(r.get("files"), list):
            raise ValueError(f"a row is not {{\"variants\": {{...}}, \"files\": [...]}}: {shown(r)}")
        variants = {k: v for k, v in r["variants"].items() if isinstance(k, str) and isinstance(v, str)
                    and _VALUE.fullmatch(k) and _VALUE.fullmatch(v)}
        if len(variants) != len(r["variants"]):
            raise ValueError(f"a row's variants are not names and versions: {shown(r['variants'])}")
        bad = [f for f in r["files"] if not isinstance(f, str) or not _FILE.fullmatch(f)]
        if bad:
            raise ValueError(f"a row names {shown(bad[0])}, not a package file <subdir>/<name>.conda of the channel")
        out.append(Row(variants, list(r["files"])))
    return out


def load_rows(channel: Path) -> list[Row]:
    """The rows the channel's rows file records (none where there is no file). A file extforge
    did not write that way is refused, never half-read: the rows left out would lose their
    packages and their place in variants.yaml."""
    try:
        return read_json(channel / ROWS_FILE, _rows, limit=ROWS_LIMIT, beneath=channel)
    except FileNotFoundError:
        return []
    except Refused as exc:
        raise ExtforgeError(f"cannot add a row to the mirror channel {channel}", exc.what,
                            f"restore {channel / ROWS_FILE} as `extforge mirror` wrote it, or remove it and mirror every "
                            "row of the channel again (its packages stay until then)") from None


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

