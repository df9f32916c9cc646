"""A local channel whose index claims another channel's sha256 for bytes of its own.

rattler extracts a `file://` package unhashed into the package cache entry named by its name,
version and build, recorded under the sha256 the index claims; every later environment asking for
that package and sha256 links from the entry, from whichever channel it solved. Channel A is the
user's own; channel B (a group's output folder, an internal channel others publish to) lists a
package of A's name, version and build, claiming A's sha256, md5 and size, but its archive holds
B's files. Both are real channels of real .conda packages, indexed by rattler.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from extforge.errors import ExtforgeError

from .crafted import craft_package, member

REPO = Path(__file__).resolve().parents[2]
OURS, THEIRS = b"A's library\n" * 64, b"B's library\n" * 64


def _channel(folder: Path, name: str, files: dict[str, bytes], version: str = "1.0", build: str = "0") -> Path:
    """`folder` as an indexed channel holding one linux-64 package of `files`."""
    from rattler.index import index_fs

    (folder / "noarch").mkdir(parents=True, exist_ok=True)
    craft_package(folder / "linux-64", name, [member(p, d) for p, d in files.items()], version=version, build=build,
                  subdir="linux-64")
    asyncio.run(index_fs(folder))
    return folder


def _forge(theirs: Path, ours: Path, file_name: str, claim: str = "ours") -> None:
    """`theirs`'s index claims `ours`'s sha256, md5 and size for its own archive named `file_name`
    (claim "ours"), or no digest at all (claim "none": rattler then records none, which any later
    sha256 takes)."""
    subdir = "linux-64"
    claimed = json.loads((ours / subdir / "repodata.json").read_text())["packages.conda"][file_name]
    index = theirs / subdir / "repodata.json"
    data = json.loads(index.read_text())
    record = data["packages.conda"][file_name]
    if claim == "ours":
        record |= {k: claimed[k] for k in ("sha256", "md5", "size")}
    else:
        del record["sha256"], record["md5"]
    index.write_text(json.dumps(data))


def _channels(root: Path, claim: str = "ours") -> tuple[Path, Path]:
    """(A, B): A holds pytorch 1.0 0 with OURS, B the same name, version and build with THEIRS,
    its index claiming A's archive (or no digest, see _forge)."""
    ours = _channel(root / "A", "pytorch", {"lib/libtarget.so": OURS})
    theirs = _channel(root / "B", "pytorch", {"lib/libtarget.so": THEIRS})
    _forge(theirs, ours, "pytorch-1.0-0.conda", claim)
    return ours, theirs


CLAIMS = pytest.mark.parametrize("claim", ["ours", "none"], ids=["claims-my-sha256", "claims-no-sha256"])


@pytest.fixture
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("EXTFORGE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("RATTLER_CACHE_DIR", raising=False)
    return tmp_path / "cache"


@CLAIMS
def test_an_audit_target_from_my_channel_never_holds_the_files_a_forged_channel_claimed_as_its_own(tmp_path, own_cache,
                                                                                                   claim):
    """The old code installed B's pinned torch as audit target without a word (rattler took B's
    archive as the sha256 its index claims) and so put B's files into the package cache entry of
    A's torch: the audit target then installed from A held B's library, and A's packages were
    judged against it. The same where B's index claims no sha256: rattler records none, and any
    later sha256 takes the entry. Now B's archive is hashed first (one without a sha256 is
    refused): exit 1 naming B and the package, nothing extracted; A's target holds A's library."""
    from extforge.audit.channel_target import pinned_torch_prefix

    ours, theirs = _channels(tmp_path, claim)
    with pytest.raises(ExtforgeError) as refused:
        pinned_torch_prefix(["pytorch ==1.0 0"], theirs.as_uri())
    assert refused.value.exit_code == 1
    assert "pytorch-1.0-0.conda" in refused.value.what and str(theirs) in refused.value.what
    assert not list(own_cache.glob("rattler*/pkgs/pytorch-1.0-0"))
    assert not list(own_cache.glob("audit-targets*/*/lib"))

    target = pinned_torch_prefix(["pytorch ==1.0 0"], ours.as_uri())
    assert (target / "lib" / "libtarget.so").read_bytes() == OURS


@CLAIMS
def test_a_cache_entry_a_forged_channel_filled_before_the_check_is_extracted_again(tmp_path, own_cache, claim):
    """What an earlier extforge (or any rattler install from B) left: the cache entry of A's torch,
    recorded under A's sha256 (or under none), holding B's files. The old code linked them into the
    audit target installed from A (rattler checks an entry only against its own paths.json). Now
    an entry not vouched for is compared once with A's checked archive and, differing (or recorded
    under no sha256), extracted again."""
    from rattler import Channel, RepoData, install

    from extforge.audit.channel_target import pinned_torch_prefix
    from extforge.paths import rattler_pkgs_dir

    ours, theirs = _channels(tmp_path, claim)
    records = RepoData.from_path(theirs / "linux-64" / "repodata.json").into_repo_data(Channel(theirs.as_uri()))
    asyncio.run(install(records, target_prefix=tmp_path / "their-env", cache_dir=rattler_pkgs_dir(), show_progress=False))
    assert (rattler_pkgs_dir() / "pytorch-1.0-0" / "lib" / "libtarget.so").read_bytes() == THEIRS

    target = pinned_torch_prefix(["pytorch ==1.0 0"], ours.as_uri())
    assert (target / "lib" / "libtarget.so").read_bytes() == OURS
    # Vouched for now: the next target links the entry as it is, comparing nothing.
    entry = rattler_pkgs_dir() / "pytorch-1.0-0"
    inode = entry.stat().st_ino
    shutil.rmtree(target)
    assert (pinned_torch_prefix(["pytorch ==1.0 0"], ours.as_uri()) / "lib" / "libtarget.so").read_bytes() == OURS
    assert entry.stat().st_ino == inode


def test_install_of_my_lock_links_my_files_after_a_forged_channel_filled_the_cache(sandbox):
    """`extforge install` takes nothing from the package cache on trust: it hashes the lock's
    archives and checks every linked file against the checked archive's own paths.json, extracting
    an entry that differs again. This passes on the old code too: it confirms that B's bytes,
    left in the cache entry of A's package under A's sha256, never reach an environment of A's lock."""
    from rattler import Channel, RepoData, install

    ours, theirs = _channels(sandbox.root)
    lock = sandbox.lock(ours, "pytorch")
    cache = sandbox.cache / "rattler" / "pkgs"
    records = RepoData.from_path(theirs / "linux-64" / "repodata.json").into_repo_data(Channel(theirs.as_uri()))
    asyncio.run(install(records, target_prefix=sandbox.root / "their-env", cache_dir=cache, show_progress=False))
    assert (cache / "pytorch-1.0-0" / "lib" / "libtarget.so").read_bytes() == THEIRS

    prefix = sandbox.root / "envs" / "mine"
    res = sandbox.run("install", "default", "--prefix", str(prefix), "--lock", str(lock), expect=0)
    assert "lib/libtarget.so" in res.output  # reported as repaired
    assert (prefix / "lib" / "libtarget.so").read_bytes() == OURS
    sandbox.run("verify", str(prefix), expect=0)


def test_a_build_never_takes_a_package_a_forged_channel_put_first(sandbox, mirror_channel):
    """demo-ext built with a forged channel first in -c: it lists the mirror's ninja (name,
    version, build, sha256, md5 and size) for an archive of its own, whose activation script
    writes a file. The old code built: rattler-build took B's ninja (the first channel that has
    it) and, with no ninja entry in the package cache yet, extracted B's archive under the
    mirror ninja's sha256, ran its activation script in the build and left the entry for every
    later build from the mirror (seen with a recipe needing ninja alone, against a cold cache;
    with a ninja entry there, it linked the mirror's files under B's record). Now the build is
    refused before rattler-build starts: exit 1 naming B and the package; nothing extracted,
    nothing run, nothing built."""
    (ninja,) = (mirror_channel / "linux-64").glob("ninja-*.conda")
    name, version, build = ninja.name.removesuffix(".conda").rsplit("-", 2)
    ran = sandbox.root / "forged-activation-ran"
    theirs = _channel(sandbox.root / "B", name, {"etc/conda/activate.d/ninja.sh": f"touch {ran}\n".encode()},
                      version=version, build=build)
    _forge(theirs, mirror_channel, ninja.name)
    out = sandbox.root / "out"

    res = sandbox.run("build", str(REPO / "recipe" / "demo-ext"), "-c", str(theirs), "-c", str(mirror_channel),
                      "--output-dir", str(out), expect=1)
    res.refused(ninja.name, str(theirs), "sha256", code=1)
    assert not ran.exists()
    assert not list(sandbox.cache.glob(f"rattler*/pkgs/{ninja.name.removesuffix('.conda')}"))
    assert not list(out.glob("*/*.conda"))


def test_checked_archives_are_not_read_again(tmp_path, own_cache, monkeypatch):
    """A warm check stats each archive and reads none: the digest is remembered per file
    (device, inode, size, mtime and, for a file others could write, ctime); one rewritten in place is
    hashed again."""
    from extforge import hashing
    from extforge.audit import local_archives

    ours = _channel(tmp_path / "A", "pytorch", {"lib/libtarget.so": OURS})
    claims = local_archives.channel_claims([str(ours)], ["linux-64", "noarch"])
    assert [c.file_name for c in claims] == ["pytorch-1.0-0.conda"]
    local_archives.check(claims)
    read: list[Path] = []

    def counting(paths, **kw):  # type: ignore[no-untyped-def]
        paths = list(paths)
        read.extend(paths)
        return hashing.hash_many(paths, **kw)

    monkeypatch.setattr(local_archives, "hash_many", counting)
    local_archives.check(claims)
    assert read == []
    archive = claims[0].path
    archive.write_bytes(archive.read_bytes())  # rewritten in place: the same bytes, another mtime
    local_archives.check(claims)
    assert read == [archive]


def test_the_cli_names_the_forged_package_in_one_line(tmp_path):
    """`extforge audit PKG --channel B`: exit 1, one line naming the package and the channel,
    no traceback (the old code exited 0 having installed B's torch as the target)."""
    ours, theirs = _channels(tmp_path)
    pkg = craft_package(tmp_path / "in", "greeter", [member("lib/libgreeter.so", b"\x7fELF")],
                        index={"depends": ["pytorch ==1.0 0"]}, subdir="linux-64")
    proc = subprocess.run([sys.executable, "-m", "extforge", "audit", str(pkg), "--channel", theirs.as_uri()],
                          capture_output=True, text=True, env={"PATH": str(Path(sys.executable).parent),
                                                               "EXTFORGE_CACHE": str(tmp_path / "cache"),
                                                               "HOME": str(tmp_path)})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "pytorch-1.0-0.conda" in proc.stderr + proc.stdout and "Traceback" not in proc.stderr
