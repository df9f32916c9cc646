"""Python distributions (wheel files or dists installed in an environment) as conda packages."""

from __future__ import annotations

import configparser
import os
import zipfile
from pathlib import Path

from ..archive import member_refusal, unsafe_reason
from ._stage import wheel_member_target
from .deps import Dependency, conda_name, conda_version, python_abi_pin, python_pin
from .hashing import sha256_file, stat_identity
from .inputs import Artifact, Interpreter
from .licenses import installed_license, wheel_license
from .recipes import PackageJob, bytecode_spec

CONSOLE_SCRIPT = """#!@PREFIX@/{python}
import re
import sys
from {module} import {attr_head}
if __name__ == "__main__":
    sys.argv[0] = re.sub(r"(-script\\.pyw|\\.exe)?$", "", sys.argv[0])
    sys.exit({attr}())
"""


def console_script(name: str, value: str, python_rel: str) -> list[str]:
    """A [dst, content, mode] text entry for a `console_scripts` entry point, as pip writes it."""
    module, _, attr = value.partition(":")
    attr = attr.split("[", 1)[0].strip() or "main"
    text = CONSOLE_SCRIPT.format(python=python_rel, module=module.strip(), attr_head=attr.split(".")[0], attr=attr)
    return [f"bin/{name}", text, "755"]


def _wheel_entry_points(wheel: Path, data_dir_stem: str) -> list[tuple[str, str]]:
    with zipfile.ZipFile(wheel) as zf:
        try:
            text = zf.read(f"{data_dir_stem}.dist-info/entry_points.txt").decode()
        except KeyError:
            return []
    parser = configparser.ConfigParser(interpolation=None, delimiters=("=",))
    parser.optionxform = str  # type: ignore[assignment]
    parser.read_string(text)
    return list(parser.items("console_scripts")) if parser.has_section("console_scripts") else []


def check_wheel_targets(path: Path, wheel: dict, scripts: list[str]) -> None:
    """The package path rule for a wheel: every member, where _stage.py will write it, and
    every console script stays inside the prefix."""
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
    for name in names:
        target = wheel_member_target(name, wheel["data_dir"], wheel["site"], wheel["include"])
        reason = unsafe_reason(name) or (target is not None and unsafe_reason(target))
        if not reason:
            continue
        raise member_refusal(path.name, name, reason, "wheel")
    for script in scripts:
        reason = unsafe_reason(script) if script.count("/") == 1 else "a console script name holds a '/'"
        if reason:
            raise member_refusal(path.name, f"entry point {script}", reason, "wheel")


def _dist_info_stem(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA"))
    return meta.split(".dist-info/")[0]


def installed_files(art: Artifact, interp: Interpreter) -> list[list[str]]:
    """[src, dst, flags] for an installed dist: RECORD paths mapped from its env into the prefix.

    Files outside the environment (a RECORD may point anywhere) are left out; scripts get
    their shebang pointed at the package's python.
    """
    assert art.installed is not None
    site = Path(art.installed["site_dir"])
    env_prefix = Path(interp.prefix)
    out = []
    for rel in art.installed["files"]:
        src = Path(os.path.normpath(site / rel))
        if src.suffix == ".pyc" or not (src.is_file() or src.is_symlink()):
            continue
        if src.is_relative_to(site):
            dst = f"{interp.site_rel}/{src.relative_to(site).as_posix()}"
        elif src.is_relative_to(env_prefix):
            dst = src.relative_to(env_prefix).as_posix()
        else:
            continue
        out.append([str(src), dst, "s" if dst.startswith("bin/") else ""])
    return out


def dist_job(art: Artifact, deps: list[Dependency], interp: Interpreter) -> PackageJob:
    """The conda package of one distribution; it lives in lib/pythonX.Y, so it pins python's minor."""
    depends = [python_pin(interp.short), python_abi_pin(interp.short)] + [d.conda_spec for d in deps]
    manifest: dict = {"python": interp.python_rel, "bytecode": bytecode_spec(interp.executable, interp.version)}
    if art.wheel is not None:
        stem = _dist_info_stem(art.wheel)
        license, files = wheel_license(art.wheel, stem)
        wheel = {
            "path": str(art.wheel),
            "data_dir": f"{stem}.data",
            "site": interp.site_rel,
            "include": f"include/python{interp.short}/{art.display_name}",
            "licenses": files,
        }
        manifest["wheels"] = [wheel]
        manifest["texts"] = [
            console_script(n, v, interp.python_rel) for n, v in _wheel_entry_points(art.wheel, stem)
        ]
        check_wheel_targets(art.wheel, wheel, [t[0] for t in manifest["texts"]])
        identity = sha256_file(art.wheel)
        size = art.wheel.stat().st_size * 2
    else:
        files = installed_files(art, interp)
        assert art.installed is not None
        license, manifest["license_files"] = installed_license(Path(art.installed["dist_info"]))
        manifest["files"] = files
        identity = stat_identity(files)
        size = sum(os.lstat(f[0]).st_size for f in files)
    return PackageJob(
        name=conda_name(art.name),
        version=conda_version(art.version),
        build_string=f"py{interp.short.replace('.', '')}_h${{{{ hash }}}}_0",
        depends=depends,
        manifest=manifest,
        identity=identity,
        size_hint=size,
        summary=f"{art.display_name} {art.version} (Python distribution repackaged by extforge mirror)",
        license=license or "",
        relocate=False,
    )
