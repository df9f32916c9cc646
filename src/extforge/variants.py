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

from .errors import ExtforgeError

CHANNEL_VARIANTS = "variants.yaml"  # written by `extforge mirror` into its channel


@dataclass(frozen=True)
class Matrix:
    values: dict[str, list]
    zip_keys: list[list[str]]
    files: list[Path]  # the recipe-side files read, lowest precedence first

    def config(self):
        from rattler_build import VariantConfig

        return VariantConfig(self.values, zip_keys=self.zip_keys or None)


def channel_files(channels: Sequence[str]) -> list[Path]:
    files = []
    for ch in channels:
        if ch.startswith("file://"):
            candidate = Path(ch[len("file://") :]) / CHANNEL_VARIANTS
            if candidate.is_file():
                files.append(candidate)
    return files


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


def _read(files: Sequence[Path]) -> tuple[dict[str, list], list[list[str]]]:
    from rattler_build import VariantConfig

    if not files:
        return {}, []
    try:
        config = VariantConfig.from_files([str(f) for f in files])
    except Exception as exc:  # rattler-build's own error types for YAML and schema errors
        raise ExtforgeError(
            f"cannot read the variant config {', '.join(str(f) for f in files)}",
            str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__,
            "fix the YAML (a mapping of variant keys to lists of values, plus zip_keys)",
        ) from exc
    return config.to_dict(), [list(g) for g in (config.zip_keys or [])]


def resolve(
    recipe: Path, channels: Sequence[str], given: Sequence[Path], overrides: Mapping[str, list[str]]
) -> Matrix:
    files = recipe_files(recipe, given)
    values, zips = _read(files)
    channel_values, _ = _read(channel_files(channels))
    # A mirror channel holds one python and one pytorch: keep the recipe rows it can build.
    values = narrow(values, zips, {k: v for k, v in channel_values.items() if k in values},
                    source=f"the channel's {CHANNEL_VARIANTS}:", strict=True)
    for key, value in channel_values.items():
        values.setdefault(key, value)
    values = narrow(values, zips, overrides)
    return Matrix(values, zips, files)


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
