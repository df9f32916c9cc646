"""Packages and wheels: extension modules found, pure-Python payloads refused, stamps written."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import os
import shutil
import tarfile
import tempfile
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest
import zstandard

from extforge.audit import audit_target
from extforge.cli import main
from extforge.errors import ExtforgeError
from extforge.stamp import AuditStamp, read_stamps, run_requirements, stamp_package


def _tar_zst(files: dict[str, bytes]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return zstandard.ZstdCompressor().compress(raw.getvalue())


def make_conda(dest: Path, name: str, payload: dict[str, bytes], depends: list[str], version: str = "1.0",
               build: str = "0") -> Path:
    """A .conda file laid out like rattler-build writes one (metadata, pkg and info members)."""
    stem = f"{name}-{version}-{build}"
    index = {"name": name, "version": version, "build": build, "build_number": 0, "depends": depends,
             "subdir": "linux-64"}
    paths = {"paths_version": 1, "paths": [{"_path": p, "path_type": "hardlink", "size_in_bytes": len(d)}
                                           for p, d in payload.items()]}
    info = {"info/index.json": json.dumps(index).encode(), "info/paths.json": json.dumps(paths).encode(),
            "info/files": "\n".join(payload).encode()}
    path = dest / f"{stem}.conda"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("metadata.json", json.dumps({"conda_pkg_format_version": 2}))
        zf.writestr(f"pkg-{stem}.tar.zst", _tar_zst(payload))
        zf.writestr(f"info-{stem}.tar.zst", _tar_zst(info))
    return path


def _ext_payload(elfs) -> dict[str, bytes]:
    return {
        "lib/python3.11/site-packages/greeter/__init__.py": b"from ._C import *\n",
        "lib/python3.11/site-packages/greeter/_C.cpython-311-x86_64-linux-gnu.so": elfs["good"].read_bytes(),
    }


def test_conda_package_is_audited_and_stamped(elfs, tmp_path):
    pkg = make_conda(tmp_path, "greeter", _ext_payload(elfs), ["python", "__glibc >=2.28,<3.0.a0"])
    report = audit_target(pkg, against=elfs["v1"])
    assert report.ok, report.render()
    assert report.name == "greeter" and report.version == "1.0"
    assert [m.path for m in report.modules] == ["lib/python3.11/site-packages/greeter/_C.cpython-311-x86_64-linux-gnu.so"]
    assert report.modules[0].is_extension

    record = stamp_package(pkg, report.to_stamp(pkg))
    assert record.verdict == "pass" and record.cxx11_abi is True and record.schema == 1
    # The stamp is in the payload and in info/paths.json with its sha256 and size.
    prefix = tmp_path / "prefix"
    with zipfile.ZipFile(pkg) as zf:
        names = zf.namelist()
        assert names[0] == "metadata.json"
        for member in names[1:]:
            with zf.open(member) as raw, tarfile.open(
                fileobj=zstandard.ZstdDecompressor().stream_reader(raw), mode="r|"
            ) as tar:
                tar.extractall(prefix, filter="data")
    stamp = prefix / "share/extforge/audit/greeter.json"
    entries = {p["_path"]: p for p in json.loads((prefix / "info/paths.json").read_text())["paths"]}
    import hashlib

    assert entries[str(stamp.relative_to(prefix))]["sha256"] == hashlib.sha256(stamp.read_bytes()).hexdigest()
    assert "share/extforge/audit/greeter.json" in (prefix / "info/files").read_text().splitlines()
    assert read_stamps(prefix) == [record]
    # Stamping again replaces the record rather than adding a second one.
    stamp_package(pkg, report.to_stamp(pkg))
    assert audit_target(pkg, against=elfs["v1"]).ok


def _members(pkg: Path) -> dict[str, bytes]:
    out = {}
    with zipfile.ZipFile(pkg) as zf:
        for member in zf.namelist()[1:]:
            with zf.open(member) as raw, tarfile.open(fileobj=zstandard.ZstdDecompressor().stream_reader(raw),
                                                      mode="r|") as tar:
                out |= {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}  # type: ignore[union-attr]
    return out


def test_a_stamped_package_names_no_folder_of_the_build_machine_in_about_json(elfs, tmp_path):
    """rattler-build lists the channels a build read in info/about.json, a local one as
    `file:///<the builder's folder>/`: every package extforge built told its users the build
    machine's folders, and the same build in another folder gave another package."""
    from channel.conftest import build_package
    from extforge import engine

    engine.prepare_environment()
    about = {}
    for where in ("one", "two"):
        pkg = build_package(tmp_path / where / "build", "tiny-about")
        assert str(tmp_path).encode() in _members(pkg)["info/about.json"]  # what rattler-build writes
        report = audit_target(pkg, against=elfs["v1"])
        stamp_package(pkg, report.to_stamp(pkg))
        about[where] = _members(pkg)["info/about.json"]
        assert str(tmp_path).encode() not in about[where] and json.loads(about[where])["channels"] == []
    assert about["one"] == about["two"]


def test_stamping_on_several_threads_writes_the_same_files(elfs, tmp_path):
    """The payload is recompressed on several threads (one thread took 42 s for the full
    flash-attn package): the files inside must not depend on how many."""
    payload = {**_ext_payload(elfs), "lib/big.bin": os.urandom(1 << 20) * 24}  # 24 MiB: several zstd jobs
    stamped = []
    for threads in (1, 4):
        (tmp_path / str(threads)).mkdir()
        pkg = make_conda(tmp_path / str(threads), "greeter", payload, ["python"])
        stamp_package(pkg, audit_target(pkg, against=elfs["v1"]).to_stamp(pkg), threads=threads)
        stamped.append(_members(pkg))
    one, four = stamped
    assert one == four and one["lib/big.bin"] == payload["lib/big.bin"]
    assert json.loads(one["share/extforge/audit/greeter.json"])["verdict"] == "pass"


def test_tar_bz2_package_is_stamped(elfs, tmp_path):
    pkg = tmp_path / "greeter-1.0-0.tar.bz2"
    index = {"name": "greeter", "version": "1.0", "build": "0", "depends": [], "subdir": "linux-64"}
    files = {**_ext_payload(elfs), "info/index.json": json.dumps(index).encode(),
             "info/paths.json": json.dumps({"paths_version": 1, "paths": []}).encode()}
    with tarfile.open(pkg, "w:bz2") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    report = audit_target(pkg, against=elfs["v1"])
    assert report.ok
    stamp_package(pkg, report.to_stamp(pkg))
    with tarfile.open(pkg) as tar:
        paths = json.load(tar.extractfile("info/paths.json"))["paths"]
        assert [p["_path"] for p in paths] == ["share/extforge/audit/greeter.json"]
        assert json.load(tar.extractfile("share/extforge/audit/greeter.json"))["name"] == "greeter"


def test_what_the_audit_proved_becomes_run_requirements() -> None:
    """conda-forge's forms: the sysroot's `__glibc` export, cuda-version's `__cuda` (the major: a
    12.0 driver runs 12.8's SASS; major.minor with PTX, which a driver JIT-compiles only from a PTX
    version it knows). Before, a package carried neither and a lock for older nodes succeeded."""
    gpu = AuditStamp("ext", sass_archs=("sm_90",), glibc_floor="2.32", cuda_version="13.0")
    assert run_requirements(gpu) == ["__glibc >=2.32,<3.0.a0", "__cuda >=13"]
    assert run_requirements(gpu, toolkit="12.8") == ["__glibc >=2.32,<3.0.a0", "__cuda >=12"]
    assert run_requirements(replace(gpu, ptx_archs=("compute_90",)), toolkit="12.8")[1] == "__cuda >=12.8"
    # No GPU code: no driver needed, whatever torch it was built against.
    assert run_requirements(replace(gpu, sass_archs=())) == ["__glibc >=2.32,<3.0.a0"]
    assert run_requirements(AuditStamp("pure")) == []


@pytest.mark.parametrize("kind", [".conda", ".tar.bz2"])
def test_stamping_writes_the_requirements_into_index_json(elfs, tmp_path, kind):
    """What `extforge build` stamps, the channel's repodata then lists (the indexer reads index.json);
    a requirement the recipe names itself (a sysroot's `__glibc` export) is kept, not doubled."""
    if kind == ".conda":
        pkg = make_conda(tmp_path, "greeter", _ext_payload(elfs), ["python", "__glibc >=2.28,<3.0.a0"])
    else:
        pkg = tmp_path / "greeter-1.0-0.tar.bz2"
        index = {"name": "greeter", "version": "1.0", "build": "0", "subdir": "linux-64",
                 "depends": ["python", "__glibc >=2.28,<3.0.a0"]}
        with tarfile.open(pkg, "w:bz2") as tar:
            for name, data in {**_ext_payload(elfs), "info/index.json": json.dumps(index).encode()}.items():
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    record = audit_target(pkg, against=elfs["v1"]).to_stamp(pkg)
    stamp_package(pkg, record, requires=["__glibc >=2.14,<3.0.a0", "__cuda >=13"])
    if kind == ".conda":
        index = json.loads(_members(pkg)["info/index.json"])
    else:
        with tarfile.open(pkg) as tar:
            index = json.load(tar.extractfile("info/index.json"))  # type: ignore[arg-type]
    assert index["depends"] == ["python", "__glibc >=2.28,<3.0.a0", "__cuda >=13"]
    assert index["name"] == "greeter" and audit_target(pkg, against=elfs["v1"]).ok


def test_python_without_extension_module_is_refused(tmp_path):
    pkg = make_conda(tmp_path, "greeter", {"lib/python3.11/site-packages/greeter/__init__.py": b""}, [])
    report = audit_target(pkg)
    (finding,) = report.errors
    assert finding.check == "packaging" and "no ELF" in finding.message
    assert "Python code but no extension module" in finding.cause


def test_a_torch_op_library_beside_the_python_code_is_the_compiled_part(elfs, tmp_path):
    # torch-scatter's shape: `_scatter_cuda.so` (no Python ABI tag; torch.ops.load_library loads
    # it) inside the package. The same library installed outside site-packages is still refused.
    good = elfs["good"].read_bytes()
    (tmp_path / "beside").mkdir()
    (tmp_path / "outside").mkdir()
    beside = make_conda(tmp_path / "beside", "greeter", {"lib/python3.11/site-packages/greeter/__init__.py": b"",
                                                        "lib/python3.11/site-packages/greeter/_ops_cuda.so": good}, [])
    assert not [f for f in audit_target(beside, against=elfs["v1"]).errors if f.check == "packaging"]
    outside = make_conda(tmp_path / "outside", "greeter", {"lib/python3.11/site-packages/greeter/__init__.py": b"",
                                                          "lib/libgreeter_ops.so": good}, [])
    (finding,) = [f for f in audit_target(outside, against=elfs["v1"]).errors if f.check == "packaging"]
    assert "no compiled module beside them" in finding.message and "torch.ops.load_library" in finding.fix


def test_pure_python_wheel_is_refused(tmp_path):
    wheel = tmp_path / "flash_attn-2.8.3-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("flash_attn/__init__.py", "")
        zf.writestr("flash_attn-2.8.3.dist-info/WHEEL", "Wheel-Version: 1.0\nTag: py3-none-any\n")
    report = audit_target(wheel)
    messages = [f.message for f in report.errors if f.check == "packaging"]
    assert any("py3-none-any" in m for m in messages)


def test_wheel_with_extension_passes(elfs, tmp_path):
    wheel = tmp_path / "greeter-1.0-cp311-cp311-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, data in _ext_payload(elfs).items():
            zf.writestr(name.removeprefix("lib/python3.11/site-packages/"), data)
        zf.writestr("greeter-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nTag: cp311-cp311-linux_x86_64\n")
    assert audit_target(wheel, against=elfs["v1"]).ok


def test_cli_exit_codes_and_json(elfs, tmp_path, capsys):
    assert main(["audit", str(elfs["good"]), "--against", str(elfs["v1"])]) == 0
    assert main(["audit", str(elfs["skew"]), "--against", str(elfs["v1"]), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"] == "fail"
    assert any(f["symbol"] == "greeter::added_in_v2(int)" for f in doc["findings"])
    assert main(["audit", str(tmp_path / "missing.so")]) == 2


def _torch_channel(elfs, tmp_path: Path, monkeypatch) -> Path:
    """An indexed channel whose stand-in "pytorch" 1.0 holds the library the extension links against."""
    monkeypatch.setenv("EXTFORGE_CACHE", str(tmp_path / "cache"))
    return _stand_in_torch_channel(tmp_path / "channel", elfs)


def test_pinned_torch_from_a_channel_is_the_default_target(elfs, tmp_path, monkeypatch):
    channel = _torch_channel(elfs, tmp_path, monkeypatch)
    pkg = make_conda(tmp_path, "greeter", _ext_payload(elfs), ["pytorch ==1.0 0"])
    report = audit_target(pkg, channel=channel.as_uri())
    assert report.ok, report.render()
    assert report.against and "audit-targets" in report.against
    assert (Path(report.against) / "lib" / "libtarget.so").is_file()


def _stand_in_torch_channel(folder: Path, elfs, lib: str = "v1", build: str = "0") -> Path:
    """`folder` as a channel whose "pytorch" 1.0 (build `build`) holds the `lib` build of libtarget."""
    from rattler.index import index_fs

    (folder / "linux-64").mkdir(parents=True)
    (folder / "noarch").mkdir()
    make_conda(folder / "linux-64", "pytorch", {"lib/libtarget.so": (elfs[lib] / "libtarget.so").read_bytes()}, [],
               build=build)
    asyncio.run(index_fs(folder))
    return folder


def test_channels_holding_the_same_torch_share_one_audit_target(elfs, tmp_path, monkeypatch):
    """Two channel folders (two checkouts' fixture channels, an output folder beside its mirror)
    holding the very same torch package: the second audit installs nothing, it judges against the
    first one's target. The old code keyed the target by the channel URLs and installed a second
    copy of the torch (~5 GB for a real one) for the second folder."""
    first = _torch_channel(elfs, tmp_path, monkeypatch)
    second = tmp_path / "second"
    (second / "linux-64").mkdir(parents=True)
    (second / "noarch").mkdir()
    (torch_file,) = (first / "linux-64").glob("pytorch-*.conda")
    shutil.copy2(torch_file, second / "linux-64")
    from rattler.index import index_fs

    asyncio.run(index_fs(second))
    pkg = make_conda(tmp_path, "greeter", _ext_payload(elfs), ["pytorch ==1.0 0"])

    report = audit_target(pkg, channel=first.as_uri())
    assert report.ok, report.render()
    record = Path(report.against or "") / "conda-meta" / "pytorch-1.0-0.json"
    installed = record.stat()
    again = audit_target(pkg, channel=str(second))
    assert again.ok, again.render()
    assert again.against == report.against
    assert (record.stat().st_ino, record.stat().st_mtime_ns) == (installed.st_ino, installed.st_mtime_ns)
    area = Path(report.against or "").parent
    assert [p.name for p in area.iterdir() if not p.name.endswith(".lock")] == [Path(report.against or "").name]


def test_what_a_killed_install_of_an_audit_target_left_goes_with_the_next_install(elfs, tmp_path, monkeypatch):
    """An audit killed while installing its target leaves `<key>.tmp<pid>` (a torch's ~5 GB of
    links), which `extforge cache --prune` passes by as a running install's. The old code removed
    only its own pid's folder, so the killed one's stayed for good; the next install of that
    target (under its lock, where no other runs) removes it."""
    channel = _torch_channel(elfs, tmp_path, monkeypatch)
    (torch,) = (channel / "linux-64").glob("pytorch-*.conda")
    key = hashlib.sha256(hashlib.sha256(torch.read_bytes()).hexdigest().encode()).hexdigest()[:16]
    left = tmp_path / "cache" / "audit-targets" / f"{key}.tmp4242"
    (left / "lib").mkdir(parents=True)
    (left / "lib" / "libtorch.so").write_bytes(b"half installed")
    report = audit_target(make_conda(tmp_path, "greeter", _ext_payload(elfs), ["pytorch ==1.0 0"]),
                          channel=channel.as_uri())
    assert report.ok, report.render()
    assert Path(report.against or "").name == key
    assert not left.exists()


def test_a_channel_whose_torch_was_rebuilt_gets_a_target_of_the_new_torch(elfs, tmp_path, monkeypatch):
    """The channel's torch was rebuilt (another build string, a library that gained a function)
    and my package, pinned `pytorch ==1.0`, calls that function. The old code keyed the target by
    the channel URL and the pin, both unchanged, and judged the package against the old torch's
    target: a missing symbol, exit 1 for a package that works with the torch users get. Now the
    new torch's packages name a target of their own, and the old one stays for the old torch."""
    monkeypatch.setenv("EXTFORGE_CACHE", str(tmp_path / "cache"))
    channel = _stand_in_torch_channel(tmp_path / "channel", elfs)
    plain = make_conda(tmp_path, "greeter", _ext_payload(elfs), ["pytorch ==1.0"])
    old = audit_target(plain, channel=channel.as_uri())
    assert old.ok, old.render()

    shutil.rmtree(channel)
    _stand_in_torch_channel(channel, elfs, lib="v2", build="1")
    (tmp_path / "skewed").mkdir()
    calls_v2 = make_conda(tmp_path / "skewed", "greeter", _ext_payload(elfs) | {
        "lib/python3.11/site-packages/greeter/_C.cpython-311-x86_64-linux-gnu.so": elfs["skew"].read_bytes()},
        ["pytorch ==1.0"])
    new = audit_target(calls_v2, channel=channel.as_uri())
    assert new.ok, new.render()
    assert new.against != old.against
    assert (Path(new.against or "") / "conda-meta" / "pytorch-1.0-1.json").is_file()
    assert (Path(old.against or "") / "conda-meta" / "pytorch-1.0-0.json").is_file()


def test_build_env_is_the_target_when_it_holds_the_pinned_torch(elfs, tmp_path, monkeypatch):
    """After a build the host env is audited against, unless the package pins another torch:
    then the pin itself is the error, and the channel's pinned torch is the target."""
    from extforge.audit.channel_target import pinned_torch_prefix

    channel = _torch_channel(elfs, tmp_path, monkeypatch)
    # A real installed prefix (conda-meta records and all), standing in for the build's host env.
    host = pinned_torch_prefix(["pytorch ==1.0 0"], channel.as_uri())

    pkg = make_conda(tmp_path, "greeter", _ext_payload(elfs), ["pytorch ==1.0 0"])
    report = audit_target(pkg, build_env=host, channel=channel.as_uri())
    assert report.ok, report.render()
    assert (report.against, report.against_source) == (str(host), "build")
    assert "host environment of its build" in report.render()

    (tmp_path / "skewed").mkdir()
    skewed = make_conda(tmp_path / "skewed", "greeter", _ext_payload(elfs), ["pytorch ==2.0 0"])
    report = audit_target(skewed, build_env=host)
    (pin,) = [f for f in report.errors if f.check == "packaging"]
    assert "pins `pytorch ==2.0 0`" in pin.message and "pytorch 1.0 0" in pin.message
    assert "pin_compatible('pytorch', exact=True)" in pin.fix
    assert report.against_source is None


@pytest.mark.parametrize("filters", ["data_filter", "no_filters"])
def test_member_escaping_the_extraction_folder_is_refused(filters, tmp_path, monkeypatch):
    """Both with tarfile's "data" filter and on Pythons without it (before 3.11.4)."""
    if filters == "no_filters":
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    pkg = make_conda(tmp_path, "evil", {"../../escaped.so": b"\x7fELF not really"}, [])
    with pytest.raises(ExtforgeError, match=r"member '../../escaped.so' is unsafe"):
        audit_target(pkg)
    assert not (tmp_path / "escaped.so").exists() and not (scratch / "escaped.so").exists()


def _torches_channel(elfs, tmp_path: Path, monkeypatch) -> Path:
    """Three stand-in torch builds: 2.9.1 for CUDA 12 with the v1 library, 2.11.0 and 2.14.1 for
    CUDA 13 with v2 (which adds a symbol)."""
    from rattler.index import index_fs

    monkeypatch.setenv("EXTFORGE_CACHE", str(tmp_path / "cache"))
    channel = tmp_path / "torches"
    (channel / "linux-64").mkdir(parents=True)
    (channel / "noarch").mkdir()
    for version, build, lib in (("2.9.1", "cuda128_0", "v1"), ("2.11.0", "cuda130_0", "v2"), ("2.14.1", "cuda130_0", "v2")):
        make_conda(channel / "linux-64", "pytorch", {"lib/libtarget.so": (elfs[lib] / "libtarget.so").read_bytes()}, [],
                   version=version, build=build)
    asyncio.run(index_fs(channel))
    return channel


def test_every_torch_admitted_must_pass(elfs, tmp_path, monkeypatch, capsys):
    """One build for many torches (a stable-ABI extension): the audit runs against each torch of the
    channel, and the run requirements must exclude every torch it fails against. The channel is
    `-c`, as build, recipe new and sources spell it (the old audit refused it: unrecognized arguments)."""
    channel = _torches_channel(elfs, tmp_path, monkeypatch)
    payload = {"lib/python3.11/site-packages/greeter/_C.cpython-311-x86_64-linux-gnu.so": elfs["skew"].read_bytes()}
    narrow = make_conda(tmp_path, "greeter", payload, ["pytorch >=2.9 cuda13*"])
    assert main(["audit", str(narrow), "--channel", channel.as_uri(), "--every-torch", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    by_torch = {t["torch"].split()[1]: t for t in doc["torches"]}
    assert doc["ok"] and set(by_torch) == {"2.9.1", "2.11.0", "2.14.1"}
    assert by_torch["2.11.0"]["admitted"] and by_torch["2.11.0"]["audit_ok"] and by_torch["2.14.1"]["audit_ok"]
    # 2.9.1 is excluded by the CUDA build pattern, and rightly: the module fails there.
    assert not by_torch["2.9.1"]["admitted"] and not by_torch["2.9.1"]["audit_ok"]

    (tmp_path / "wide").mkdir()
    wide = make_conda(tmp_path / "wide", "greeter", payload, ["pytorch >=2.9"])
    assert main(["audit", str(wide), "-c", channel.as_uri(), "--every-torch"]) == 1
    out = capsys.readouterr().err
    assert "ERR pytorch 2.9.1 cuda128_0: admitted; audit FAILS" in out and "added_in_v2" in out
    assert "narrow the package's run requirement on pytorch" in out


def test_every_torch_extracts_the_package_once(elfs, tmp_path, monkeypatch):
    """Each torch is its own target env; the package is unpacked once for all of them."""
    import extforge.audit
    from extforge.audit import audit_every_torch

    channel = _torches_channel(elfs, tmp_path, monkeypatch)
    payload = {"lib/python3.11/site-packages/greeter/_C.cpython-311-x86_64-linux-gnu.so": elfs["skew"].read_bytes()}
    pkg = make_conda(tmp_path, "greeter", payload, ["pytorch >=2.9 cuda13*"])
    opened = []
    real = extforge.audit.open_target
    monkeypatch.setattr(extforge.audit, "open_target", lambda path: opened.append(path) or real(path))
    verdicts = audit_every_torch(pkg, [channel.as_uri()])
    assert len(verdicts) == 3 and opened == [pkg]
    # Each verdict is audited against its own torch, not the first one's.
    assert len({v.report.against for v in verdicts}) == 3 and all(v.report.modules for v in verdicts)


def test_every_torch_needs_a_channel_and_a_package(elfs, tmp_path, capsys):
    assert main(["audit", str(elfs["good"]), "--every-torch"]) == 2
    assert "--every-torch needs --channel" in capsys.readouterr().err
