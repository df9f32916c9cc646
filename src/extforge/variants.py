"""The variant matrix of a build: which files define it and how channels and flags narrow it.

Precedence follows rattler-build and conda-forge, plus one rule of ours:
- the recipe's own variants.yaml is read only when no variant file is given (rattler-build's
  rule), so `-m variants-offline.yaml` replaces the production matrix instead of adding to it;
- a channel written by `extforge mirror` carries variants.yaml with the values its packages
  satisfy (one python, one pytorch, the compilers it shims). Those NARROW the matrix to the rows
  the channel can build, and fill keys the recipe leaves open; they never add rows;
- `--variant KEY=VALUE` narrows last.
`extforge build` and `extforge build --slurm` both go through `resolve()`, so a Slurm job
builds exactly the variant that was expanded for it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
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


def resolve(
    recipe: Path, channels: Sequence[str], given: Sequence[Path], overrides: Mapping[str, list[str]]
) -> Matrix:
    files = recipe_files(recipe, given)
    values, zips = engine.read_variant_files(files)
    channel_values, _ = engine.read_variant_files(channel_files(channels))
    # A mirror channel holds one python and one pytorch: keep the recipe rows it can build.
    values = narrow(values, zips, {k: v for k, v in channel_values.items() if k in values},
                    source=f"the channel's {CHANNEL_VARIANTS}:", strict=True)
    for key, value in channel_values.items():
        values.setdefault(key, value)
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


def archs(values: Mapping[str, object]) -> list[str]:
    """GPU archs named by a variant, from any key about archs (cuda_archs="8.0;9.0",
    flash_attn_cuda_archs="80;90"), as ["80", "90"]; values may be one value or a list."""
    found: list[str] = []
    for key, value in values.items():
        if "arch" not in key.lower():
            continue
        for item in value if isinstance(value, list) else [value]:
            for a in re.findall(r"\d+\.?\d*a?", str(item)):
                if a.replace(".", "") not in found:
                    found.append(a.replace(".", ""))
    return found
