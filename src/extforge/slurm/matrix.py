"""A recipe's variant matrix, rendered by rattler-build: one entry per Slurm job."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..recipes.variants import Matrix, render
from ..recipes.variants import archs as variant_archs


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
        """CUDA archs from the variant (cuda_archs="8.0;9.0")."""
        return variant_archs(dict(self.values)) or None


def expand(recipe: Path, resolved: Matrix) -> list[Variant]:
    """Render the recipe over its variant matrix, resolved exactly as `extforge build` resolves it
    (extforge.recipes.variants.resolve), so each job builds the variant expanded here."""
    matrix = resolved.values
    rendered = render(recipe, resolved)

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
