"""demo-ext and its torch (a real ~5 GB environment), locked on a channel inside a sandbox and
installed by `extforge install` once per session (the `installed_demo` fixture), then lent out:
its prefix to the tests that plant edits in it, its extracted package cache to the ones that
tamper with the cache. One install is 50-100 s on 2 cores, most of it byte-compiling torch;
the four installs these tests made were the same one.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from extforge import paths
from extforge.environment.receipt import receipt_path
from extforge.machine import detect
from extforge.publishing.index import dated_after_its_packages, reindex

from .conftest import Sandbox


def _linked_copy(channels: list[Path], dest: Path) -> Path:
    """One channel holding hard links to the packages of several (indexed), its repodata their
    entries merged, dated after the links: the re-index carries them (the files are the ones
    indexed) instead of reading a torch env's 3 GB of archives again (~30 s on 2 cores)."""
    for sub in ("noarch", "linux-64"):
        (dest / sub).mkdir(parents=True, exist_ok=True)
        merged: dict = {"info": {"subdir": sub}, "packages": {}, "packages.conda": {}}
        for channel in channels:
            for f in (channel / sub).glob("*"):
                if f.name.endswith((".conda", ".tar.bz2")):
                    os.link(f, dest / sub / f.name)
            indexed = json.loads((channel / sub / "repodata.json").read_text())
            for key in ("packages", "packages.conda"):
                merged[key] |= indexed.get(key, {})
        (dest / sub / "repodata.json").write_text(json.dumps(merged))
        dated_after_its_packages(dest, sub)
    reindex(dest)
    return dest


def _lend_trust(source: Path, sandbox: Sandbox, shas: list[str]) -> None:
    """The sandbox's private trust folder as the same user's earlier installs from the cache
    `source` left it: their key and its signed records of these packages (manifests, archive
    checks), so the sandbox's install does not decompress a torch env's archives again (~20 s on
    2 cores). What `source` lacks, the sandbox's install makes; a sandbox with a key keeps it."""
    src, dst = source / f"trust-{os.getuid()}", sandbox.cache / f"trust-{os.getuid()}"
    if not (src / "secret").is_file() or (dst / "secret").exists():
        return
    for folder in (dst, dst / "manifests", dst / "checked"):
        folder.mkdir(mode=0o700, exist_ok=True)
    shutil.copy2(src / "secret", dst / "secret")
    for record in (src / area / f"{sha}.json" for area in ("manifests", "checked") for sha in shas):
        if record.is_file():
            shutil.copy2(record, dst / record.parent.name / record.name)


def _prefill_caches(sandbox: Sandbox, channel: Path, extracted: Path, trusted: Path) -> None:
    """The sandbox's package store, and its extracted cache as hard links to the entries found
    in `extracted` (a 5 GB environment would otherwise be copied and extracted again), and the
    trust records of the cache `trusted`. Edits replace files, never write into a linked one, and
    rattler's own lock files are copied."""
    repodata = json.loads((channel / "linux-64" / "repodata.json").read_text())
    _lend_trust(trusted, sandbox, [record["sha256"] for record in repodata["packages.conda"].values()])
    for fn, record in repodata["packages.conda"].items():
        stored = sandbox.cache / "pkgs" / record["sha256"] / fn
        stored.parent.mkdir(parents=True, exist_ok=True)
        os.link(channel / "linux-64" / fn, stored)
        entry = extracted / fn.removesuffix(".conda")
        if entry.is_dir() and Path(f"{entry}.lock").is_file():
            shutil.copytree(entry, sandbox.cache / "rattler" / "pkgs" / entry.name, copy_function=os.link)
            shutil.copy(f"{entry}.lock", sandbox.cache / "rattler" / "pkgs")


def lock_demo_ext(sandbox: Sandbox, demo_channel: Path, mirror_channel: Path) -> Path:
    """pixi.lock of demo-ext and its torch on a channel in the sandbox (sandbox/ch), the sandbox's
    caches prefilled from the user's own."""
    # Hard links: the shared fixture channels may be rebuilt by another session meanwhile.
    channel = _linked_copy([demo_channel, mirror_channel], sandbox.path("ch"))
    manifest = sandbox.manifest("demo-ext")
    # pytorch needs __cuda; demo-ext the glibc its audit found on this machine, where it was built.
    manifest.write_text(manifest.read_text() + f'\n[system-requirements]\ncuda = "13.0"\nlibc = "{detect().glibc}"\n')
    sandbox.run("lock", "--manifest", str(manifest), "--channel-map", f"internal={channel.as_uri()}", expect=0)
    _prefill_caches(sandbox, channel, paths.rattler_pkgs_dir(), paths.cache_root())
    return manifest.with_name("pixi.lock")


def clone_tree(src: Path, dst: Path) -> None:
    """dst as a copy of src (symbolic links and modes kept) that an edit of one leaves the other
    without: the files src shares with the package cache (more than one link; whoever edits an
    installed env replaces those, as editing one in place would change the cache) are linked
    again, the ones only src holds (records, byte code, prefix-patched files) are copied."""

    def copy(s: str, d: str) -> None:
        if os.stat(s).st_nlink > 1:
            os.link(s, d)
        else:
            shutil.copy2(s, d)

    shutil.copytree(src, dst, symlinks=True, copy_function=copy)


@dataclass
class InstalledDemo:
    """The installed env, its lock and sandbox (whose cache holds the key its install record is
    signed with, so verify runs in it), and the copy of the prefix it is restored from."""

    sandbox: Sandbox
    lock: Path
    prefix: Path
    pristine: Path  # the prefix and its install record as install left them
    _lent: bool = field(default=False)

    @classmethod
    def install(cls, sandbox: Sandbox, demo_channel: Path, mirror_channel: Path, pristine: Path) -> InstalledDemo:
        lock = lock_demo_ext(sandbox, demo_channel, mirror_channel)
        prefix = sandbox.root / "envs" / "demo"
        sandbox.run("install", "default", "--prefix", str(prefix), "--lock", str(lock), expect=0)
        clone_tree(prefix, pristine / prefix.name)
        shutil.copy2(receipt_path(prefix), receipt_path(pristine / prefix.name))
        return cls(sandbox, lock, prefix, pristine)

    def lend_caches(self, other: Sandbox) -> Path:
        """The env's pixi.lock, `other`'s package store, extracted cache and trust records prefilled
        from this install's sandbox (demo-ext's extracted entry among them, as install made it)."""
        _prefill_caches(other, self.sandbox.root / "ch", self.sandbox.cache / "rattler" / "pkgs", self.sandbox.cache)
        return self.lock

    def borrow(self) -> tuple[Path, Path]:
        """(pixi.lock, prefix), the prefix and its install record as install left them (restored
        at the same path: install wrote the prefix's path into its files)."""
        if self._lent:
            shutil.rmtree(self.prefix)
            clone_tree(self.pristine / self.prefix.name, self.prefix)
            shutil.copy2(receipt_path(self.pristine / self.prefix.name), receipt_path(self.prefix))
        self._lent = True
        return self.lock, self.prefix
