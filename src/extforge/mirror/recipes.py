"""A mirrored package as data (PackageJob) and its rendering into a rattler-build v1 recipe."""

from __future__ import annotations

import hashlib
import json
import shlex
import sys
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from string import Template
from typing import Any

from .. import __version__
from ..environment.receipt import COMPILE_SCRIPT


def template_text() -> str:
    return resources.files("extforge").joinpath("data/mirror/recipe.yaml").read_text(encoding="utf-8")


def exact_self_pin(name: str) -> str:
    """A run export that pins whatever builds against the package to exactly its own build
    (version and build string), as rattler-build's pin_subpackage writes it."""
    return f"${{{{ pin_subpackage('{name}', exact=True) }}}}"


STAGE_SCRIPT = Path(__file__).with_name("_stage.py")
# What writes a distribution's package without rattler-build (its behaviour is in the key too).
CONDA_WRITER = Path(__file__).with_name("conda_writer.py")


def code_generation() -> str:
    """Hash of the mirror's own code that package cache keys include: a record of cached packages
    made under another generation (a test's warm record, say) names packages no run will use again."""
    h = hashlib.sha256(__version__.encode() + b"\0" + template_text().encode())
    for script in (STAGE_SCRIPT, CONDA_WRITER, COMPILE_SCRIPT):
        h.update(b"\0" + script.read_bytes())
    return h.hexdigest()


def bytecode_spec(python: str, version: str) -> dict[str, str]:
    """The manifest's `bytecode`: the packages of a Python ship their modules' .pyc, compiled by
    that Python (its minor fixes the .pyc's magic), as conda-forge's do. Without them an env
    that pixi or conda installs has none (both compile only noarch packages): Python compiles
    torch's ~3,500 modules again at every start where it cannot write the env (a team's env on
    NFS), and writes them where it can, files `extforge verify` reports as not from any package."""
    return {"python": python, "version": version, "script": str(COMPILE_SCRIPT)}


@dataclass
class PackageJob:
    """One conda package of the mirror channel: metadata plus what goes into $PREFIX.

    `manifest` is the _stage.py manifest: `wheels` (installed like pip does), `files`
    ([src, dst, flags]: s = rewrite a python shebang, t = rewrite the old prefix in text,
    r = set RUNPATH to $ORIGIN/../lib, L = keep a symlink), `symlinks`, `texts` (generated
    files; @PREFIX@ is replaced), `prefix_rewrite` and `bytecode` (bytecode_spec); and for
    conda_writer, which alone writes a distribution's package, its licence files for
    info/licenses/: a wheel's `licenses` ([member, name]) or `license_files` ([src, name]).
    `identity` is what the inputs' content hashes to (artifact sha256s, file stats).
    """

    name: str
    version: str
    build_string: str  # may use ${{ hash }}
    depends: list[str] = field(default_factory=list)
    constrains: list[str] = field(default_factory=list)
    run_exports: list[str] = field(default_factory=list)
    strong_run_exports: list[str] = field(default_factory=list)
    manifest: dict[str, Any] = field(default_factory=dict)
    identity: str = ""
    size_hint: int = 0  # bytes to stage: the biggest packages are built first
    summary: str = ""
    license: str = ""
    build_number: int = 0
    relocate: bool = True  # let rattler-build rewrite RUNPATHs (not for wheels: installed as pip would)

    @property
    def about_summary(self) -> str:
        return self.summary or f"{self.name} {self.version}, repackaged by extforge mirror"

    @property
    def about_license(self) -> str:
        return self.license or "LicenseRef-upstream"

    @property
    def package_format(self) -> str:
        # A mirror channel is read from local disk, rarely shipped: zstd level 1 instead of
        # rattler-build's 15 (level 3 took 217 s instead of 597 s for torch + nvidia, +5% size;
        # level 1 adds ~2% more, docs/benchmarks-history.md "Mirror phases of one row").
        return "conda:1"

    @property
    def zstd_level(self) -> int:
        return int(self.package_format.partition(":")[2])

    @property
    def written_directly(self) -> bool:
        """A distribution's package, which conda_writer writes without rattler-build: nothing
        relinked, no symlinks, no text rewritten but python shebangs."""
        return (
            not self.relocate
            and not self.manifest.get("symlinks")
            and not self.manifest.get("prefix_rewrite")
            and all(flags in ("", "s") for _, _, flags in self.manifest.get("files", []))
        )

    def cache_key(self) -> str:
        """Hash of everything the package is made of; equal keys give interchangeable packages."""
        payload = {
            "extforge": __version__,
            "template": hashlib.sha256(template_text().encode()).hexdigest(),
            "stage": hashlib.sha256(STAGE_SCRIPT.read_bytes()).hexdigest(),
            "name": self.name,
            "version": self.version,
            "build_string": self.build_string,
            "build_number": self.build_number,
            "depends": self.depends,
            "constrains": self.constrains,
            "run_exports": self.run_exports,
            "strong_run_exports": self.strong_run_exports,
            "identity": self.identity,
            "texts": self.manifest.get("texts", []),
            "symlinks": self.manifest.get("symlinks", []),
            "format": self.package_format,
            "relocate": self.relocate,
            # The licence goes into the direct writer's packages alone (a distribution's metadata).
            "writer": [hashlib.sha256(CONDA_WRITER.read_bytes()).hexdigest(), self.about_license,
                       [w.get("licenses", []) for w in self.manifest.get("wheels", [])], self.manifest.get("license_files", [])]
            if self.written_directly else "rattler-build",
        }
        if bytecode := self.manifest.get("bytecode"):
            # Packages without Python modules keep their keys (and their cached builds).
            payload["bytecode"] = [bytecode["version"], hashlib.sha256(Path(bytecode["script"]).read_bytes()).hexdigest()]
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:32]


def render_recipe(job: PackageJob, manifest_path: Path, python: str = sys.executable) -> str:
    """The recipe text for `job`; the build script stages files with `python _stage.py`."""
    stage = f"{shlex.quote(python)} -I {shlex.quote(str(STAGE_SCRIPT))} {shlex.quote(str(manifest_path))} \"$PREFIX\""
    values = {
        "name": job.name,
        "version": job.version,
        "build_number": job.build_number,
        "build_string": job.build_string,
        "stage_command": stage,
        "depends": job.depends,
        "constrains": job.constrains,
        "run_exports": job.run_exports,
        "strong_run_exports": job.strong_run_exports,
        "summary": job.about_summary,
        "license": job.about_license,
        "binary_relocation": job.relocate,
    }
    return Template(template_text()).substitute({k: json.dumps(v) for k, v in values.items()})
