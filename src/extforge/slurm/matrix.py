"""A recipe's variant matrix, rendered by rattler-build: one entry per Slurm job."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import ExtforgeError

@dataclass(frozen=True)
class Variant:
    """One rendered variant: what a job builds and which package files prove it was published."""

    name: str
    version: str
    build_string: str
    subdir: str  # "noarch" or the target platform
    values: tuple[tuple[str, str], ...]  # the variant keys the recipe uses, sorted
    outputs: tuple[str, ...]  # "<subdir>/<name>-<version>-<build>" of every output

    @property
    def id(self) -> str:
        """Unique within a recipe and readable: names the job, its log and its state entry."""
        return f"{self.name}-{self.version}-{self.build_string}"

    @property
    def build_args(self) -> list[str]:
        """`--variant key=value` arguments that pin `extforge build` to exactly this variant."""
        return [a for k, v in self.values for a in ("--variant", f"{k}={v}")]

    def archs(self) -> list[str] | None:
        """CUDA archs from the variant (a key containing 'arch', e.g. cuda_archs="80;90")."""
        for key, value in self.values:
            if "arch" in key.lower():
                found = re.findall(r"\d+\.?\d*a?", value)
                return [a.replace(".", "") for a in found] or None
        return None


def narrow(
    values: dict[str, list], zip_keys: list[list[str]], overrides: dict[str, list[str]]
) -> tuple[dict[str, list], list[list[str]]]:
    """Restrict keys to the given values; a zipped key keeps its zip partners at the matching positions."""
    values = {k: list(v) for k, v in values.items()}
    for key, wanted in overrides.items():
        group = next((g for g in zip_keys if key in g), None)
        if group is None or key not in values:
            values[key] = list(wanted)
            continue
        keep = [i for i, v in enumerate(values[key]) if str(v) in wanted]
        if not keep:
            raise ExtforgeError(
                f"--variant {key}={','.join(wanted)} is not in the variant matrix",
                f"{key} is zipped with {', '.join(k for k in group if k != key)} and takes only {values[key]}",
                "pick one of those values, or add it (with its zip partners) to the variant file",
            )
        for k in group:
            if k in values:
                values[k] = [values[k][i] for i in keep]
    return values, zip_keys


def expand(recipe: Path, files: list[Path], overrides: dict[str, list[str]]) -> list[Variant]:
    """Render the recipe over its variant matrix; `overrides` narrow a key to one value.

    `files` must be what `extforge build` reads for the same recipe and channels
    (extforge.build.variant_files), so each job builds exactly the variant expanded here.
    """
    from rattler_build import Stage0Recipe, VariantConfig

    try:
        stage0 = Stage0Recipe.from_file(recipe)
        config = VariantConfig.from_files([str(f) for f in files]) if files else VariantConfig()
        matrix, zips = narrow(config.to_dict(), config.zip_keys or [], overrides)
        rendered = stage0.render(VariantConfig(matrix, zip_keys=zips or None))
    except Exception as exc:  # rattler-build raises its own exception types for every parse step
        raise ExtforgeError(f"could not render {recipe}", str(exc).strip().splitlines()[0], "fix the recipe or variant file") from exc

    grouped: dict[tuple[tuple[str, str], ...], list] = {}
    for r in rendered:
        # Only keys from the variant files: rattler-build adds its own (target_platform, __cuda).
        values = tuple(sorted((k, str(v)) for k, v in r.variant.items() if k in matrix))
        grouped.setdefault(values, []).append(r)
    variants = []
    for values, outs in grouped.items():
        first = outs[0].recipe
        subdir = lambda r: "noarch" if r.recipe.build.noarch else r.variant.get("target_platform", "linux-64")  # noqa: E731
        variants.append(
            Variant(
                name=first.package.name,
                version=str(first.package.version),
                build_string=first.build.string,
                subdir=subdir(outs[0]),
                values=values,
                outputs=tuple(
                    f"{subdir(o)}/{o.recipe.package.name}-{o.recipe.package.version}-{o.recipe.build.string}" for o in outs
                ),
            )
        )
    return variants
