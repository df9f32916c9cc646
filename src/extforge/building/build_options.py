"""What one `extforge build` builds and how: made once from the command line, then read by the
local build (`build.build_recipe`) and by the Slurm path (`slurm.submit`, which turns it back
into each job's `extforge build` flags), so both paths cannot drift apart."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .parts import Part


@dataclass(frozen=True)
class BuildOptions:
    recipe: Path  # recipe folder or its recipe.yaml
    channels: tuple[str, ...]  # folders or URLs, in priority order; never an implicit conda-forge
    output_dir: Path  # the channel folder the packages land in
    variant_configs: tuple[Path, ...] = ()
    overrides: tuple[tuple[str, tuple[str, ...]], ...] = ()  # --variant KEY=VALUE[,VALUE]
    profile: str | None = None  # planner profile named on the command line
    test: bool = True
    audit: bool = True  # audit and stamp what was built (and, on Slurm, gate the publish)
    part: Part | None = None  # one part of a build in parts, or its link job (parts.py)
    wheel: bool = False  # also write each audited package's wheel (extforge.wheel) into <output>/wheels
    manylinux: tuple[int, int] | None = None  # the site's target policy a wheel may not exceed (2, 28)

    @classmethod
    def make(
        cls,
        recipe: Path,
        channels: Sequence[str | Path],
        output_dir: Path,
        *,
        variant_configs: Sequence[Path] = (),
        variants: Mapping[str, Sequence[str]] | None = None,
        profile: str | None = None,
        test: bool = True,
        audit: bool = True,
        part: Part | None = None,
        wheel: bool = False,
        manylinux: tuple[int, int] | None = None,
    ) -> BuildOptions:
        return cls(
            # Absolute now: the working directory may be replaced while a long build runs.
            recipe=Path(recipe).absolute(),
            channels=tuple(str(c) for c in channels),
            output_dir=Path(output_dir).absolute(),
            variant_configs=tuple(Path(p).absolute() for p in variant_configs),
            overrides=tuple((k, tuple(v)) for k, v in (variants or {}).items()),
            profile=profile,
            test=test,
            audit=audit,
            part=part,
            wheel=wheel,
            manylinux=manylinux,
        )

    @property
    def variants(self) -> dict[str, list[str]]:
        """The --variant overrides as variants.resolve takes them."""
        return {k: list(v) for k, v in self.overrides}
