"""A distribution's package written straight into a .conda holds what rattler-build would have
packaged from the same job, installs with rattler, and its record is the file's own."""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import io
import json
import platform
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import zstandard

from extforge.archive import check_package
from extforge.mirror.builder import _build_with_rattler, build_jobs, place
from extforge.mirror.recipes import PackageJob, bytecode_spec, exact_self_pin
from extforge.mirror.wheels import console_script

# The package's python is the one running the tests: it compiles the .pyc the package ships.
SHORT = f"{sys.version_info.major}.{sys.version_info.minor}"
SITE = f"lib/python{SHORT}/site-packages"
PYC = f"{SITE}/demo_pkg/__pycache__/__init__.{sys.implementation.cache_tag}.pyc"


def _wheel(tmp_path: Path) -> Path:
    whl = tmp_path / "demo_pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("demo_pkg/__init__.py", "X = 1\n")
        zf.writestr(f"demo_pkg/__pycache__/__init__.{sys.implementation.cache_tag}.pyc", b"stale")  # never packaged
        zf.writestr("demo_pkg/py2_data.py", "print 'test data'\n")  # does not compile: no .pyc
        zf.writestr("demo_pkg/blob.bin", bytes(range(256)) * 4096)  # 1 MiB: streamed in chunks
        tool = zipfile.ZipInfo("demo_pkg-1.0.data/scripts/demo-tool")
        tool.external_attr = 0o755 << 16
        zf.writestr(tool, "#!python\nimport demo_pkg\n")
        zf.writestr("demo_pkg-1.0.data/scripts/plain.sh", "#!/bin/sh\necho hi\n")
        zf.writestr("demo_pkg-1.0.data/headers/demo.h", "int demo;\n")
        zf.writestr("demo_pkg-1.0.dist-info/METADATA", "Name: demo-pkg\nVersion: 1.0\n")
        zf.writestr("demo_pkg-1.0.dist-info/entry_points.txt", "[console_scripts]\ndemo = demo_pkg:main\n")
    return whl


def _job(tmp_path: Path, installed: Path) -> PackageJob:
    wheel = {"path": str(_wheel(tmp_path)), "data_dir": "demo_pkg-1.0.data", "site": SITE,
             "include": f"include/python{SHORT}/demo-pkg"}
    return PackageJob(
        name="demo-pkg", version="1.0", build_string="py_h${{ hash }}_0", identity="demo-pkg-test",
        constrains=["other-pkg >=2"], run_exports=["demo-pkg >=1.0", exact_self_pin("demo-pkg")],
        manifest={"python": f"bin/python{SHORT}", "wheels": [wheel],
                  "texts": [console_script("demo", "demo_pkg:main", f"bin/python{SHORT}")],
                  "files": [[str(installed), "share/demo/config.py", "s"]],
                  "bytecode": bytecode_spec(sys.executable, platform.python_version())},
        relocate=False,
    )


def _read_conda(path: Path) -> tuple[dict[str, tuple[int, bytes]], dict[str, bytes]]:
    """(pkg members: path -> (mode, content), info members: name -> content)."""
    out: list[dict] = []
    with zipfile.ZipFile(path) as zf:
        assert zf.namelist()[0] == "metadata.json"
        assert json.loads(zf.read("metadata.json")) == {"conda_pkg_format_version": 2}
        for prefix in ("pkg-", "info-"):
            (name,) = [n for n in zf.namelist() if n.startswith(prefix)]
            data = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(zf.read(name))).read()
            with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                out.append({m.name: (m.mode, tar.extractfile(m).read()) for m in tar if m.isfile()})  # type: ignore[union-attr]
    return out[0], {k: v for k, (_, v) in out[1].items()}


def _normalized(files: dict[str, tuple[int, bytes]], paths: list[dict]) -> dict[str, tuple[int, bytes]]:
    placeholders = {p["_path"]: p["prefix_placeholder"].encode() for p in paths if "prefix_placeholder" in p}
    return {k: (mode, data.replace(placeholders.get(k, b"\0never"), b"@PREFIX@")) for k, (mode, data) in files.items()}


def test_written_like_rattler_build_would_package_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("EXTFORGE_CACHE", str(tmp_path / "cache"))
    installed = tmp_path / "old-env-config.py"
    installed.write_text("#!/old/env/bin/python3\nprint('config')\n")
    installed.chmod(0o700)
    job = _job(tmp_path, installed)
    assert job.written_directly
    (direct,) = build_jobs([job], None, None, workers=1)
    ours, our_info = _read_conda(direct.path)
    work = tmp_path / "rb"
    work.mkdir()
    theirs_path, their_record = _build_with_rattler(job, work, None, 1)
    theirs, their_info = _read_conda(theirs_path)

    our_paths = json.loads(our_info["info/paths.json"])["paths"]
    their_paths = json.loads(their_info["info/paths.json"])["paths"]
    assert _normalized(ours, our_paths) == _normalized(theirs, their_paths)
    assert [p["_path"] for p in our_paths] == sorted(theirs)
    for mine, other in zip(our_paths, sorted(their_paths, key=lambda p: p["_path"]), strict=True):
        assert mine.keys() == other.keys() and mine.get("file_mode") == other.get("file_mode"), mine["_path"]
        assert mine["sha256"] == hashlib.sha256(ours[mine["_path"]][1]).hexdigest()
        assert mine["size_in_bytes"] == len(ours[mine["_path"]][1])
    # The files that name the prefix are the scripts the mirror writes, nothing else.
    assert sorted(p["_path"] for p in our_paths if "prefix_placeholder" in p) == [
        "bin/demo", "bin/demo-tool", "share/demo/config.py"]
    # The wheel's own .pyc is never packaged; the package's python compiled one, checked by the
    # source's hash (the file may be copied, not linked, at install), naming no build folder.
    pyc = ours[PYC][1]
    assert pyc != b"stale" and pyc[:4] == importlib.util.MAGIC_NUMBER
    assert int.from_bytes(pyc[4:8], "little") == 3 and pyc[8:16] == importlib.util.source_hash(b"X = 1\n")
    assert str(tmp_path).encode() not in pyc and f"{SITE}/demo_pkg/__init__.py".encode() in pyc
    assert sorted(p for p in ours if p.endswith(".pyc")) == [PYC]

    our_index = json.loads(our_info["info/index.json"])
    their_index = json.loads(their_info["info/index.json"])
    assert {k: v for k, v in our_index.items() if k not in ("build", "timestamp")} == \
        {k: v for k, v in their_index.items() if k not in ("build", "timestamp")}
    # An exact self-pin (the mirror's pytorch exports one) names each package's own build.
    assert json.loads(our_info["info/run_exports.json"]) == {"weak": ["demo-pkg >=1.0", f"demo-pkg ==1.0 {our_index['build']}"]}
    assert json.loads(their_info["info/run_exports.json"]) == {"weak": ["demo-pkg >=1.0",
                                                                        f"demo-pkg ==1.0 {their_index['build']}"]}
    assert json.loads(our_info["info/about.json"])["summary"] == json.loads(their_info["info/about.json"])["summary"]
    # The cache entry's record is the whole file's, as the channel index would compute it.
    record = json.loads((direct.path.parent / "package.json").read_text())["record"]
    blob = direct.path.read_bytes()
    assert (record["sha256"], record["md5"], record["size"]) == (
        hashlib.sha256(blob).hexdigest(), hashlib.md5(blob).hexdigest(), len(blob))
    assert record.keys() == their_record.keys()


def test_a_written_package_installs_with_rattler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import rattler

    monkeypatch.setenv("EXTFORGE_CACHE", str(tmp_path / "cache"))
    installed = tmp_path / "config.py"
    installed.write_text("print('config')\n")
    built = build_jobs([_job(tmp_path, installed)], None, None, workers=1)
    channel = tmp_path / "channel"
    place(built, channel)
    records = asyncio.run(rattler.solve([channel.as_uri()], ["demo-pkg"], platforms=["linux-64", "noarch"],
                                        virtual_packages=[]))
    prefix = tmp_path / "env"
    asyncio.run(rattler.install(records, target_prefix=prefix, cache_dir=tmp_path / "pkgs", show_progress=False))
    assert (prefix / "bin" / "demo-tool").read_text().startswith(f"#!{prefix}/bin/python{SHORT}\n")
    assert (prefix / "bin" / "demo").read_text().startswith(f"#!{prefix}/bin/python{SHORT}\n")
    assert (prefix / "bin" / "demo-tool").stat().st_mode & 0o111
    assert (prefix / SITE / "demo_pkg" / "blob.bin").read_bytes() == bytes(range(256)) * 4096
    assert (prefix / f"include/python{SHORT}/demo-pkg/demo.h").is_file()
    # Python takes the shipped .pyc as it is: an import where it may write rewrites nothing.
    site = prefix / SITE
    before = [(p, p.stat().st_ino, p.stat().st_mtime_ns) for p in sorted(site.rglob("*"))]
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}
    subprocess.run([sys.executable, "-c", "import demo_pkg; assert demo_pkg.X == 1"], env=env, check=True)
    assert [(p, p.stat().st_ino, p.stat().st_mtime_ns) for p in sorted(site.rglob("*"))] == before
    assert (prefix / PYC).is_file()


def test_a_vanished_wheel_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from extforge.errors import ExtforgeError

    monkeypatch.setenv("EXTFORGE_CACHE", str(tmp_path / "cache"))
    installed = tmp_path / "config.py"
    installed.write_text("print('config')\n")
    job = _job(tmp_path, installed)
    Path(job.manifest["wheels"][0]["path"]).unlink()
    with pytest.raises(ExtforgeError) as err:
        build_jobs([job], None, None, workers=1)
    assert "could not package demo-pkg 1.0" in str(err.value) and "mirror again" in (err.value.fix or "")


def test_a_python_that_cannot_compile_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from extforge.errors import ExtforgeError

    monkeypatch.setenv("EXTFORGE_CACHE", str(tmp_path / "cache"))
    installed = tmp_path / "config.py"
    installed.write_text("print('config')\n")
    job = _job(tmp_path, installed)
    job.manifest["bytecode"] = bytecode_spec(str(tmp_path / "gone" / "python3"), platform.python_version())
    with pytest.raises(ExtforgeError) as err:
        build_jobs([job], None, None, workers=1)
    assert "could not package demo-pkg 1.0" in str(err.value) and "byte code could not be compiled" in err.value.why
    assert str(tmp_path / "gone" / "python3") in (err.value.fix or "")
    assert not list((tmp_path / "cache").rglob("*.conda"))  # nothing half-made kept


def _licensed_wheel(tmp_path: Path, metadata: str, files: dict[str, str]) -> Path:
    whl = tmp_path / "lic_pkg-2.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("lic_pkg/__init__.py", "X = 2\n")
        zf.writestr("lic_pkg-2.0.dist-info/METADATA", "Metadata-Version: 2.4\nName: lic-pkg\nVersion: 2.0\n" + metadata
                    + "\nA long description that is no licence.\n")
        for name, text in files.items():
            zf.writestr(f"lic_pkg-2.0.dist-info/{name}", text)
    return whl


def _dist_package(tmp_path: Path, wheel: Path) -> tuple[dict, dict[str, bytes], Path]:
    from extforge.mirror.inputs import Artifact, Interpreter
    from extforge.mirror.wheels import dist_job

    interp = Interpreter(platform.python_version(), sys.executable, sys.base_prefix, "", "", "", "", "", False)
    job = dist_job(Artifact("lic-pkg", "lic-pkg", "2.0", [], ["py3-none-any"], wheel=wheel), [], interp)
    (built,) = build_jobs([job], None, None, workers=1)
    _, info = _read_conda(built.path)
    return json.loads(info["info/index.json"]), info, built.path


def test_a_distributions_licence_and_licence_files_come_from_its_metadata(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Every package the mirror made of a wheel said `license: LicenseRef-upstream` and carried
    no licence file, though the wheels declare their licence (License-Expression, License or
    classifiers) and ship its text (PEP 639's dist-info/licenses/, or LICENSE in dist-info)."""
    monkeypatch.setenv("EXTFORGE_CACHE", str(tmp_path / "cache"))
    wheel = _licensed_wheel(tmp_path, "License-Expression: Apache-2.0 OR BSD-2-Clause\nLicense-File: LICENSE\n"
                            "Classifier: License :: OSI Approved :: MIT License\n",
                            {"licenses/LICENSE": "apache or bsd", "licenses/third_party/zlib/LICENSE": "zlib",
                             "COPYING": "old style", "RECORD": "", "licenses/../../escape": "never"})
    index, info, package = _dist_package(tmp_path, wheel)
    assert index["license"] == json.loads(info["info/about.json"])["license"] == "Apache-2.0 OR BSD-2-Clause"
    assert {k: v for k, v in info.items() if k.startswith("info/licenses/")} == {
        "info/licenses/LICENSE": b"apache or bsd", "info/licenses/third_party/zlib/LICENSE": b"zlib",
        "info/licenses/COPYING": b"old style"}
    check_package(package)  # the package path rule publish and install apply
    # Older metadata: the License field, else the licence classifiers; markup or several lines are no licence.
    for metadata, want in (("License: BSD\nClassifier: License :: OSI Approved :: BSD License\n", "BSD"),
                           ("License: line one\n  line two\nClassifier: License :: OSI Approved :: BSD License\n"
                            "Classifier: License :: Other/Proprietary License\n", "BSD License OR Other/Proprietary License"),
                           ("License: ${{ evil }}\n", "LicenseRef-upstream")):
        (tmp_path / "lic_pkg-2.0-py3-none-any.whl").unlink()
        index, _, _ = _dist_package(tmp_path, _licensed_wheel(tmp_path, metadata, {}))
        assert index["license"] == want, metadata


def test_an_installed_distributions_licence_files_are_found_without_following_links(tmp_path: Path):
    from extforge.mirror.licenses import installed_license

    dist_info = tmp_path / "site" / "lic_pkg-2.0.dist-info"
    (dist_info / "licenses" / "sub").mkdir(parents=True)
    (dist_info / "METADATA").write_text("Name: lic-pkg\nLicense-Expression: MIT\n\nbody\n")
    (dist_info / "licenses" / "LICENSE").write_text("mit")
    (dist_info / "licenses" / "sub" / "NOTICE").write_text("notice")
    (dist_info / "LICENSE.txt").write_text("old style")
    (dist_info / "licenses" / "passwd").symlink_to("/etc/passwd")
    (dist_info / "RECORD").write_text("")
    assert installed_license(dist_info) == ("MIT", [[str(dist_info / "licenses" / "LICENSE"), "LICENSE"],
                                                    [str(dist_info / "LICENSE.txt"), "LICENSE.txt"],
                                                    [str(dist_info / "licenses" / "sub" / "NOTICE"), "sub/NOTICE"]])
