"""Install takes nothing from the package cache on trust: an extracted package whose files (and
its own info/paths.json) were changed is re-extracted from the archive the lock vouches for."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from extforge.environment.install import CLOBBERS
from extforge.publishing.index import reindex

from .demo_env import InstalledDemo
from .pyish import MODULE, SITE, forge_record, pyish_package

INJECTED = b"open(__file__ + '.ran', 'w').write('injected')\n"


def tamper_cache_entry(entry: Path, replace: dict[str, bytes]) -> None:
    """Replace (or add) files of an extracted package and make its info/paths.json agree; every
    file written is a new inode (the entry may be linked from another cache)."""
    paths_json = entry / "info" / "paths.json"
    data = json.loads(paths_json.read_text())
    paths_json.unlink()  # written anew below: the entry's files may be hard links into another cache
    entries = {e["_path"]: e for e in data["paths"]}
    for rel, content in replace.items():
        path = entry / rel
        path.unlink(missing_ok=True)  # a new inode: installed prefixes may hard-link the old one
        path.write_bytes(content)
        e = entries.setdefault(rel, {"_path": rel, "path_type": "hardlink"})
        e.update(sha256=hashlib.sha256(content).hexdigest(), size_in_bytes=len(content))
        e.pop("prefix_placeholder", None)
    data["paths"] = list(entries.values())
    paths_json.write_text(json.dumps(data))


def test_tampered_extracted_cache_is_repaired_not_installed(sandbox):
    channel = sandbox.path("ch")
    pyish_package(channel)
    lock = sandbox.lock(channel, "pyish")
    first = sandbox.root / "envs" / "first"
    sandbox.run("install", "default", "--prefix", str(first), "--lock", str(lock), expect=0)
    entry = sandbox.cache / "rattler" / "pkgs" / "pyish-1.0-0"
    tamper_cache_entry(entry, {MODULE: INJECTED, f"{SITE}/zz-evil.pth": b"import os\n"})

    prefix = sandbox.root / "envs" / "second"
    with sandbox.unchanged_outside(prefix):
        res = sandbox.run("install", "default", "--prefix", str(prefix), "--lock", str(lock), expect=0)
    assert f"repaired {MODULE}" in res.output and f"repaired {SITE}/zz-evil.pth" in res.output, res.output
    assert (prefix / MODULE).read_bytes() == b"VALUE = 1\n"
    assert not (prefix / SITE / "zz-evil.pth").exists()
    assert (entry / MODULE).read_bytes() == b"VALUE = 1\n"  # the cache entry was extracted again
    sandbox.run("verify", str(prefix), "--env", "default", "--lock", str(lock), "--rehash", expect=0)


def test_package_store_copy_that_differs_is_fetched_again(sandbox):
    channel = sandbox.path("ch")
    pkg = pyish_package(channel)
    lock = sandbox.lock(channel, "pyish")
    sandbox.run("install", "default", "--prefix", str(sandbox.root / "envs" / "first"), "--lock", str(lock), expect=0)
    (stored,) = (sandbox.cache / "pkgs").glob(f"*/{pkg.name}")
    # The store holds a hard link to the channel's file (same filesystem): no second copy.
    assert stored.stat().st_ino == pkg.stat().st_ino
    stored.unlink()  # replaced, not written into: a write into the link would change the channel's file too
    stored.write_bytes(b"not the package")

    prefix = sandbox.root / "envs" / "second"
    with sandbox.unchanged_outside(prefix):
        res = sandbox.run("install", "default", "--prefix", str(prefix), "--lock", str(lock), expect=0)
    assert f"repaired {stored} (sha256" in res.output, res.output
    assert stored.read_bytes() == pkg.read_bytes() and (prefix / MODULE).read_bytes() == b"VALUE = 1\n"


def test_a_second_install_asks_python_only_about_modules_it_has_not_found_current(sandbox, mirror_python):
    """The old install sent every module of the environment to the interpreter at every install,
    which read each shipped .pyc and, for a hash-checked one, its whole source (a torch env's
    6,500 modules: 0.2-0.4 s). What it found current is remembered by the source's and the .pyc's
    sha256 and the source's mtime and size: a source whose mtime changed is asked about again."""
    channel = sandbox.path("ch")
    (channel / "linux-64").mkdir(exist_ok=True)
    shutil.copy(mirror_python, channel / "linux-64")
    reindex(channel)
    lock = sandbox.lock(channel, "python")

    def install(name: str) -> tuple[int, dict]:
        prefix = sandbox.root / "envs" / name
        res = sandbox.run("install", "default", "--prefix", str(prefix), "--lock", str(lock), "--json", expect=0)
        record = json.loads((prefix.parent / f".{name}.extforge-install.json").read_text())
        return json.loads(res.stdout)["modules_checked"], record["written"]

    first, written = install("first")
    assert first > 100  # every module of the standard library
    second, again = install("second")
    # Only modules without a shipped .pyc that would do (the build configuration, rewritten for
    # each prefix) are asked about again; they are compiled as before.
    assert 0 < second < first // 10 and again.keys() == written.keys(), (first, second)
    (entry,) = (p for p in (sandbox.cache / "rattler" / "pkgs").glob("python-*") if p.is_dir())
    os.utime(entry / f"lib/python{sys.version_info.major}.{sys.version_info.minor}/os.py", (1, 1))
    third, _ = install("third")
    assert third == second + 1
    assert install("fourth")[0] == second


def test_a_module_python_cannot_compile_is_asked_about_once(sandbox, mirror_python):
    """A source the interpreter cannot compile (torch ships test data in Python 3.12's syntax)
    gets no .pyc, so the old install sent it again at every install: with the configuration
    modules, it kept a Python process running for nothing. Its key is remembered as the current
    .pyc's are: asked about again only once its bytes, mtime or size change."""
    from .crafted import craft_package, member

    bad = f"lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages/py2_data.py"
    channel = sandbox.path("ch")
    (channel / "linux-64").mkdir(exist_ok=True)
    shutil.copy(mirror_python, channel / "linux-64")
    craft_package(channel / "noarch", "oldsyntax", [member(bad, b"print 'py2 test data'\n")], index={"depends": ["python"]})
    reindex(channel)
    lock = sandbox.lock(channel, "oldsyntax")

    def install(name: str) -> int:
        prefix = sandbox.root / "envs" / name
        res = sandbox.run("install", "default", "--prefix", str(prefix), "--lock", str(lock), "--json", expect=0)
        assert not (prefix / Path(bad).parent / "__pycache__").exists()
        return json.loads(res.stdout)["modules_checked"]

    install("first")
    second = install("second")
    os.utime(sandbox.cache / "rattler" / "pkgs" / "oldsyntax-1.0-0" / bad, (1, 1))
    assert install("third") == second + 1
    assert install("fourth") == second


@pytest.mark.slow
def test_demo_ext_from_a_tampered_cache_is_repaired_and_edited_records_are_caught(sandbox, installed_demo: InstalledDemo):
    # The caches an install of this lock filled (the session's, linked in): demo-ext's extracted entry is there.
    lock = installed_demo.lend_caches(sandbox)
    init = "lib/python3.11/site-packages/demo_ext/__init__.py"
    (entry,) = (sandbox.cache / "rattler" / "pkgs").glob("demo-ext-*_0")
    tamper_cache_entry(entry, {init: INJECTED})

    prefix = sandbox.path("envs") / "second"
    with sandbox.unchanged_outside(prefix):
        res = sandbox.run("install", "default", "--prefix", str(prefix), "--lock", str(lock), expect=0)
    assert f"repaired {init}" in res.output, res.output
    imported = subprocess.run([str(prefix / "bin" / "python"), "-c", "import demo_ext; print(demo_ext.__file__)"],
                              capture_output=True, text=True)
    assert imported.returncode == 0, imported.stderr
    assert not list((prefix / "lib").rglob("*.ran")), "the injected code ran"

    # The same edit made in the installed prefix, its conda-meta record rewritten to match.
    forge_record(prefix, "demo-ext", init, INJECTED)
    with sandbox.unchanged_outside():
        res = sandbox.run("verify", str(prefix), "--env", "default", "--lock", str(lock), "--rehash", expect=1)
    assert f"modified: {init} (demo-ext)" in res.output, res.output


def test_packages_sharing_a_path_install_and_the_set_aside_copy_is_checked(sandbox):
    """Every nvidia-*-cu12 wheel ships its own nvidia/__init__.py; rattler keeps one in place and
    sets the others aside under __clobbers__/<package>/. Those copies belong to their package
    (torch 2.6/2.9 envs installed only once this was understood) and are hashed like the rest;
    the one in place may be any of them, bytes and all."""
    from .crafted import craft_package, member

    channel = sandbox.path("ch")
    shared = f"{SITE}/nsshared/__init__.py"
    # As torch's: several independent packages ship the path, one of them depends on another,
    # and rattler's choice of the copy it keeps in place is not the last of them by name. Their
    # copies differ, as namespace packages' __init__.py of different projects may.
    owners = {"ns-a": [], "ns-b": [], "ns-c": ["ns-a"], "ns-d": []}
    for name, depends in owners.items():
        craft_package(channel / "noarch", name,
                      [member(shared, f"# {name}\n".encode()), member(f"{SITE}/nsshared/{name}.py", b"X = 1\n")],
                      index={"depends": depends})
    craft_package(channel / "noarch", "ns-app", [member(f"{SITE}/nsapp.py", b"")],
                  index={"depends": ["ns-d", "ns-c", "ns-b"]})
    reindex(channel)
    lock = sandbox.lock(channel, "ns-app")
    prefix = sandbox.root / "envs" / "ns"
    sandbox.run("install", "default", "--prefix", str(prefix), "--lock", str(lock), expect=0)
    aside = {a.relative_to(prefix / CLOBBERS).parts[0]: a.read_bytes() for a in (prefix / CLOBBERS).glob(f"*/{shared}")}
    (kept,) = set(owners) - set(aside)
    assert aside == {name: f"# {name}\n".encode() for name in owners if name != kept}
    assert (prefix / shared).read_bytes() == f"# {kept}\n".encode()
    # The copy in place is a hard link of its package's cache copy, whichever package rattler kept.
    assert (prefix / shared).stat().st_nlink == 2
    sandbox.run("verify", str(prefix), "--env", "default", "--lock", str(lock), "--rehash", expect=0)
    # And an install over it finds it complete (it runs the same checks).
    sandbox.run("install", "default", "--prefix", str(prefix), "--lock", str(lock), expect=0)


def test_a_tampered_set_aside_copy_is_repaired_from_its_package(sandbox):
    """The copy rattler sets aside under __clobbers__/ comes from the extracted cache like any
    other file: a tampered cache entry behind it is dropped and extracted again."""
    from .crafted import craft_package, member

    channel = sandbox.path("ch")
    shared = f"{SITE}/nsshared/__init__.py"
    for name, extra in (("ns-a", {}), ("ns-b", {"depends": ["ns-a"]})):
        craft_package(channel / "noarch", name, [member(shared, b""), member(f"{SITE}/nsshared/{name[-1]}.py", b"X = 1\n")],
                      index=extra)
    reindex(channel)
    lock = sandbox.lock(channel, "ns-b")
    first = sandbox.root / "envs" / "first"
    sandbox.run("install", "default", "--prefix", str(first), "--lock", str(lock), expect=0)
    (first_aside,) = (first / CLOBBERS).glob(f"*/{shared}")
    set_aside = first_aside.relative_to(first / CLOBBERS).parts[0]  # the package whose copy rattler set aside
    tamper_cache_entry(sandbox.cache / "rattler" / "pkgs" / f"{set_aside}-1.0-0", {shared: INJECTED})

    prefix = sandbox.root / "envs" / "second"
    res = sandbox.run("install", "default", "--prefix", str(prefix), "--lock", str(lock), expect=0)
    assert f"repaired {CLOBBERS}/{set_aside}/{shared}" in res.output, res.output
    (aside,) = (prefix / CLOBBERS).glob(f"*/{shared}")
    assert aside.read_bytes() == b"" and (prefix / shared).read_bytes() == b""


def _install_json(sandbox, lock: Path, name: str, *extra: str) -> dict:
    res = sandbox.run("install", "default", "--prefix", str(sandbox.root / "envs" / name), "--lock", str(lock), "--json",
                      *extra, expect=0)
    return json.loads(res.stdout)


@pytest.mark.parametrize("tamper", ["content", "mode", "link"])
def test_a_cache_file_changed_between_two_installs_is_noticed_and_extracted_again(sandbox, tamper):
    """A warm install hashes only the files it did not link from cache files an install verified
    before (pyish's two placeholder files, rewritten for each prefix). A cache file written in
    place (same inode, same size), made writable by others, or swapped for a link to a copy of
    itself is not one of those any more: it is hashed or refused, its cache entry extracted
    again, and the install after that is warm again. The old code hashed every file at every
    install (a torch env: 25,000 files, 10-20 s) and reported no `files_hashed`."""
    channel = sandbox.path("ch")
    pyish_package(channel)
    lock = sandbox.lock(channel, "pyish")
    assert _install_json(sandbox, lock, "first")["files_hashed"] == 4
    assert _install_json(sandbox, lock, "second")["files_hashed"] == 2
    cached = sandbox.cache / "rattler" / "pkgs" / "pyish-1.0-0" / MODULE
    if tamper == "content":
        with open(cached, "r+b") as fh:  # the same inode, hard-linked into both prefixes
            fh.write(b"VALUE = 2\n")
    elif tamper == "mode":
        cached.chmod(0o666)
    else:
        copy = sandbox.cache / "elsewhere.py"
        copy.write_bytes(cached.read_bytes())
        cached.unlink()
        cached.symlink_to(copy)

    third = _install_json(sandbox, lock, "third")
    assert [m.split(" ")[0] for m in third["cache_mismatches"]] == [MODULE], third
    installed = sandbox.root / "envs" / "third" / MODULE
    assert not installed.is_symlink() and installed.read_bytes() == b"VALUE = 1\n"
    assert installed.stat().st_mode & 0o777 == 0o644
    assert not cached.is_symlink() and cached.read_bytes() == b"VALUE = 1\n"  # extracted again
    sandbox.run("verify", str(sandbox.root / "envs" / "third"), "--env", "default", "--lock", str(lock), "--rehash", expect=0)
    fourth = _install_json(sandbox, lock, "fourth")
    assert fourth["files_hashed"] == 2 and fourth["cache_mismatches"] == [], fourth
    assert _install_json(sandbox, lock, "fifth", "--rehash")["files_hashed"] == 4


def test_a_cache_entry_another_user_put_in_my_package_cache_is_never_linked(peer_site):
    """root's package cache, which root lets its team's group write (2775): a member swapped an
    extracted package there for a copy of their own, the package's bytes and modes. The old code
    hard-linked their files into root's prefix (the hashes and modes were right, and the kernel
    lets root link anyone's file), so that member could change root's environment after install.
    Now a staged file that is not the installing user's is a mismatch: the entry is extracted
    again, root's, and each file said in one line."""
    from .conftest import Sandbox
    from .test_install_own_state import _as

    sandbox = Sandbox(peer_site.root / "planted-entry")  # where the other user can reach the cache
    channel = sandbox.path("ch")
    pyish_package(channel)
    lock = sandbox.lock(channel, "pyish")
    _install_json(sandbox, lock, "first")
    pkgs = sandbox.cache / "rattler" / "pkgs"
    os.chown(pkgs, 0, peer_site.gid)
    pkgs.chmod(0o2775)
    entry = pkgs / "pyish-1.0-0"
    other = peer_site.peers[1]
    theirs = pkgs / "theirs"
    shutil.copytree(entry, theirs, symlinks=True)
    for path in (theirs, *theirs.rglob("*")):
        os.lchown(path, other.uid, other.gid)
    _as(other, "sh", "-c", f"mv {entry} {pkgs}/was && mv {theirs} {entry}")
    assert (entry / MODULE).stat().st_uid == other.uid

    second = _install_json(sandbox, lock, "second")
    assert MODULE in [m.split(" ")[0] for m in second["cache_mismatches"]], second
    assert {p.lstat().st_uid for p in (sandbox.root / "envs" / "second").rglob("*")} == {0}
    assert (entry / MODULE).stat().st_uid == 0  # extracted again, root's


def test_the_stores_archives_are_read_again_only_when_their_stat_changed(sandbox, monkeypatch):
    """The old code hashed every archive of the package store at every install (a torch env's
    ~3 GB: 10 s of a warm install's 16-30 s), and followed a link swapped in for one (to a copy
    anyone could change before rattler read it). The digests an install took are recorded,
    signed, with the archive's stat; an archive written in place (same inode) is read again,
    found to differ from the lock and fetched again; a link is fetched over."""
    from extforge.environment import packages
    from extforge.environment.install import install_env
    from extforge.environment.mirrors import site_mirrors

    channel = sandbox.path("ch")
    pkg = pyish_package(channel)
    lock = sandbox.lock(channel, "pyish")
    sandbox.run("install", "default", "--prefix", str(sandbox.root / "envs" / "first"), "--lock", str(lock), expect=0)
    monkeypatch.setenv("EXTFORGE_CACHE", str(sandbox.cache))
    monkeypatch.setenv("RATTLER_CACHE_DIR", str(sandbox.cache / "rattler"))
    read: list[Path] = []
    digests_file = packages.digests_file
    monkeypatch.setattr(packages, "digests_file", lambda path, *a, **kw: read.append(Path(path)) or digests_file(path, *a, **kw))
    mirrors = site_mirrors(lock.parent)
    install_env(lock, "default", sandbox.root / "envs" / "second", mirrors=mirrors)
    assert read == []
    (stored,) = (sandbox.cache / "pkgs").glob(f"*/{pkg.name}")
    stored.unlink()  # its own inode (it was a link to the channel's file), then written in place
    stored.write_bytes(pkg.read_bytes())
    with open(stored, "r+b") as fh:
        fh.seek(-1, os.SEEK_END)
        fh.write(b"\0" if pkg.read_bytes()[-1:] != b"\0" else b"\1")
    third = install_env(lock, "default", sandbox.root / "envs" / "third", mirrors=mirrors)
    assert read == [stored], read
    (repaired,) = third.cache_mismatches
    assert repaired.startswith(f"{stored} (sha256 ") and repaired.endswith("fetched again)")
    assert stored.read_bytes() == pkg.read_bytes()
    copy = sandbox.cache / "elsewhere.conda"
    copy.write_bytes(pkg.read_bytes())
    stored.unlink()
    stored.symlink_to(copy)
    fourth = install_env(lock, "default", sandbox.root / "envs" / "fourth", mirrors=mirrors)
    assert fourth.cache_mismatches == [f"{stored} (a symbolic link, fetched again)"]
    assert not stored.is_symlink() and stored.read_bytes() == pkg.read_bytes()


def test_a_new_prefix_reads_the_manifest_once_and_leaves_it_as_it_is(tmp_path, monkeypatch):
    """The placeholder files' hashes in a prefix were added to the package's manifest, which grew
    by every prefix ever installed (torch's: 2.7 MB of JSON after 100), and for each new prefix
    the old install read it three times (to find the prefix missing, again in ensure_manifest,
    then as the manifest to complete) and wrote it whole. Now it is read once and left as it
    is; the new prefix's hashes are a record of their own, found by the next install there."""
    from extforge.environment import trust

    monkeypatch.setenv("EXTFORGE_CACHE", str(tmp_path / "cache"))
    pkg = pyish_package(tmp_path / "ch")
    sha = hashlib.sha256(pkg.read_bytes()).hexdigest()
    ref = trust.PackageRef("pyish", pkg.name, pkg.as_uri(), sha, pkg.stat().st_size)
    reads: list[Path] = []
    read_signed = trust.read_signed
    monkeypatch.setattr(trust, "read_signed", lambda path: reads.append(path) or read_signed(path))
    first, second = tmp_path / "first", tmp_path / "second"
    trust.manifests_for([ref], first, {pkg.name: pkg})
    stored = trust.manifest_path(sha).read_bytes()
    reads.clear()
    manifests, _ = trust.manifests_for([ref], second, {pkg.name: pkg})
    assert reads.count(trust.manifest_path(sha)) == 1
    assert trust.manifest_path(sha).read_bytes() == stored
    hashes = manifests["pyish"]["in_prefix"][str(second)]
    assert hashes and hashes != manifests["pyish"]["in_prefix"][str(first)]
    again, _ = trust.manifests_for([ref], second, {})  # no archive at hand: the record serves
    assert again["pyish"]["in_prefix"][str(second)] == hashes
