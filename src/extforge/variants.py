"""The variant matrix of a build: which files define it and how channels and flags narrow it.

Precedence follows rattler-build and conda-forge, plus one rule of ours:
- the recipe's own variants.yaml is read only when no variant file is given (rattler-build's
  rule), so `-m variants-offline.yaml` replaces the production matrix instead of adding to it;
- a channel written by `extforge mirror` carries variants.yaml with the values its packages
  satisfy: one zipped row per torch build it holds (python, pytorch, CUDA, C++ ABI, compilers).
  Those NARROW the matrix to the rows the channel can build, and fill keys the recipe leaves
  open; they never add rows the recipe file does not have (`fit_to_channel`);
- `--variant KEY=VALUE` narrows last.
`extforge build` and `extforge build --slurm` both go through `resolve()`, so a Slurm job
builds exactly the variant that was expanded for it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import engine
from .channel_ref import local_folder
from .errors import ExtforgeError

CHANNEL_VARIANTS = "variants.yaml"  # written by `extforge mirror` into its channel


@dataclass(frozen=True)
class Matrix:
    values: dict[str, list]
    zip_keys: list[list[str]]
    files: list[Path]  # the recipe-side files read, lowest precedence first

    def config(self) -> Any:
        """The matrix as a rattler_build.VariantConfig."""
        return engine.variant_config(self.values, self.zip_keys)


def channel_files(channels: Sequence[str]) -> list[Path]:
    folders = [local_folder(ch) for ch in channels]
    return [f / CHANNEL_VARIANTS for f in folders if f is not None and (f / CHANNEL_VARIANTS).is_file()]


def recipe_files(recipe: Path, given: Sequence[Path]) -> list[Path]:
    for f in given:
        if not Path(f).is_file():
            raise ExtforgeError(f"variant config {f} does not exist", "", "check the --variant-config path")
    if given:
        return [Path(f) for f in given]
    own = recipe.parent / "variants.yaml"
    return [own] if own.is_file() else []


def narrow(
    values: Mapping[str, list],
    zip_keys: list[list[str]],
    wanted: Mapping[str, list[str]],
    source: str = "--variant",
    strict: bool = False,
) -> dict[str, list]:
    """Restrict keys to the wanted values; a zipped key keeps its zip partners at the matching positions.

    A key outside every zip group, or (unless `strict`) a zipped key narrowed to its last row,
    is set to the wanted value.
    """
    out = {k: list(v) for k, v in values.items()}
    for key, want in wanted.items():
        group = next((g for g in zip_keys if key in g), None)
        if group is None or key not in out:
            out[key] = list(want)
            continue
        keep = [i for i, v in enumerate(out[key]) if str(v) in {str(w) for w in want}]
        if not keep and not strict and len(out[key]) == 1 and len(want) == 1:
            # One row left: a value it lacks overrides it (e.g. fewer archs for a quick build).
            out[key] = list(want)
            continue
        if not keep:
            raise ExtforgeError(
                f"{source} {key}={','.join(map(str, want))} is not in the variant matrix",
                f"{key} is zipped with {', '.join(k for k in group if k != key)} and takes only "
                f"{', '.join(map(str, out[key]))}",
                "pick one of those values, add a row with it (and its zip partners) to the variant file, "
                "or pass a variant file that has one (-m FILE)",
            )
        for k in group:
            if k in out:
                out[k] = [out[k][i] for i in keep]
    return out


def channel_rows(values: Mapping[str, Sequence], zip_keys: Sequence[Sequence[str]]) -> list[dict[str, str]]:
    """The rows of a mirror channel's variants.yaml: its one zip group, other keys single-valued."""
    zipped = next(iter(zip_keys), [])
    n = max((len(values[k]) for k in zipped if k in values), default=1)
    return [{k: str(v[i] if k in zipped and len(v) == n else v[0]) for k, v in values.items()} for i in range(n)]


def fit_to_channel(
    values: Mapping[str, list], zips: list[list[str]], channel_values: Mapping[str, list],
    channel_zips: Sequence[Sequence[str]],
) -> tuple[dict[str, list], list[list[str]]]:
    """The recipe's matrix cut down to the rows a mirror channel can build, filled with the
    channel's values for keys the recipe leaves open.

    A channel holds one or more torch builds (rows: python, pytorch, CUDA, ABI, compilers).
    A recipe row is kept once per channel row that agrees with it on every key both name;
    the result zips the recipe's zipped keys with the channel's, one entry per kept pair."""
    rows = channel_rows(channel_values, channel_zips)
    if not rows:
        return dict(values), zips
    source = f"the channel's {CHANNEL_VARIANTS}:"
    shared = [k for k in channel_values if k in values]
    # A value the matrix lacks entirely is named as such (add a row for it).
    values = narrow(values, zips, {k: sorted({r[k] for r in rows}) for k in shared}, source=source, strict=True)
    group = next((g for g in zips if any(k in g for k in shared)), [])
    n = len(values[group[0]]) if group else 1
    pairs = []
    for i in range(n):
        mine = {k: values[k][i] for k in group if k in values}
        for row in rows:
            if all(str(mine[k]) == row[k] if k in mine else row[k] in map(str, values[k]) for k in shared):
                pairs.append(mine | row)
    if not pairs:
        raise ExtforgeError(
            f"{source} no row of the channel is a row of the variant matrix",
            f"the channel holds {'; '.join(', '.join(f'{k}={r[k]}' for k in shared) for r in rows)}",
            "add a row for one of them (every list under zip_keys gets one value) to the variant file, "
            "or mirror a torch build the matrix has into the channel",
        )
    out = {k: list(v) for k, v in values.items() if k not in group}
    zipped = list(dict.fromkeys([*group, *channel_values]))
    out |= {k: [p[k] for p in pairs] for k in zipped}
    return out, [g for g in zips if g is not group] + ([zipped] if len(zipped) > 1 else [])


def resolve(
    recipe: Path, channels: Sequence[str], given: Sequence[Path], overrides: Mapping[str, list[str]]
) -> Matrix:
    files = recipe_files(recipe, given)
    values, zips = engine.read_variant_files(files)
    channel_values, channel_zips = engine.read_variant_files(channel_files(channels))
    values, zips = fit_to_channel(values, zips, channel_values, channel_zips)
    values = narrow(values, zips, overrides)
    return Matrix(values, zips, files)


def parse_variant_overrides(items: Sequence[str]) -> dict[str, list[str]]:
    """`--variant python=3.12 --variant cuda_archs=8.0,9.0` → {"python": ["3.12"], ...}."""
    out: dict[str, list[str]] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ExtforgeError(
                f"bad --variant '{item}'",
                "a variant override is KEY=VALUE (values of one key may be comma-separated)",
                "e.g. --variant python=3.12",
            )
        out[key.strip()] = [v.strip() for v in value.split(",")]
    return out


def head_dims(values: Mapping[str, object]) -> tuple[int, ...]:
    """Head dims a head-dim subset variant builds (flash_attn_head_dims="64;128"), () for every
    head dim. A matrix of several subsets is planned as their union; one "all" means all."""
    found: set[int] = set()
    for item in _items_of_keys(values, "head_dims"):
        if item.strip() in ("", "all"):
            return ()
        found.update(int(d) for d in re.findall(r"\d+", item))
    return tuple(sorted(found))


def archs(values: Mapping[str, object]) -> list[str]:
    """GPU archs named by a variant, from any key about archs (cuda_archs="8.0;9.0",
    flash_attn_cuda_archs="80;90"), as ["80", "90"]; values may be one value or a list."""
    found: list[str] = []
    for item in _items_of_keys(values, "arch"):
        for a in re.findall(r"\d+\.?\d*a?", item):
            if a.replace(".", "") not in found:
                found.append(a.replace(".", ""))
    return found


def _items_of_keys(values: Mapping[str, object], word: str) -> Iterator[str]:
    """Each value (one, or each of a list) of the keys whose name contains `word`."""
    for key, value in values.items():
        if word in key.lower():
            yield from (str(item) for item in (value if isinstance(value, list) else [value]))
