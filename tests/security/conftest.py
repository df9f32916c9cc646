"""The adversarial suite's harness: run the real `extforge` on crafted input inside a sandbox
and prove nothing outside the allowed folders changed.

    def test_x(sandbox):
        pkg = craft_package(sandbox.path("in"), "evil", [member("../../x")])
        with sandbox.unchanged_outside(sandbox.root / "ch"):
            res = sandbox.run("publish", str(pkg), "--channel", str(sandbox.root / "ch"), expect=1)
        res.refused("../../x")

sandbox.lock(channel, "pkg") locks a one-package workspace for install/verify cases.
Every sandbox.run fails the test on a Python traceback or a Rust panic in the output, on a
process killed by a signal, and on anything the command left in its TMPDIR.
"""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from .demo_env import InstalledDemo

# A workspace of one environment ("default") on one channel ("internal"), for lock/install cases.
MANIFEST = """\
[workspace]
name = "sec"
channels = ["internal"]
platforms = ["linux-64"]

[dependencies]
{package} = "*"
"""

# Output that means the command crashed instead of refusing.
CRASH_MARKERS = ("Traceback (most recent call last)", "panicked at", "RUST_BACKTRACE", "Segmentation fault", "core dumped")


@dataclass(frozen=True)
class Result:
    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def refused(self, *needles: str, code: int | Collection[int] = (1, 2)) -> Result:
        """Assert the command refused (exit 1 or 2 unless code says) and its output names each needle."""
        codes = {code} if isinstance(code, int) else set(code)
        assert self.returncode in codes, f"extforge {' '.join(self.args)}: exit {self.returncode}, wanted {codes}\n{self.output}"
        for needle in needles:
            assert needle in self.output, f"{needle!r} not in the output of extforge {' '.join(self.args)}:\n{self.output}"
        return self


Listing = dict[str, tuple]


def listing(root: Path, skip: Collection[Path] = ()) -> Listing:
    """Every entry under root (root itself included): kind, mode, link target or content hash.
    Directory mtimes are left out: they change whenever an allowed child changes."""
    out: Listing = {}
    skipped = {p.resolve() for p in skip}
    stack = [root]
    while stack:
        p = stack.pop()
        if p.resolve() in skipped and p != root:
            continue
        try:
            st = p.lstat()
        except FileNotFoundError:
            continue
        rel = str(p.relative_to(root))
        if stat.S_ISLNK(st.st_mode):
            out[rel] = ("link", os.readlink(p))
        elif stat.S_ISDIR(st.st_mode):
            out[rel] = ("dir", stat.S_IMODE(st.st_mode))
            try:
                stack.extend(p.iterdir())
            except PermissionError:
                out[rel] = ("dir-unreadable", stat.S_IMODE(st.st_mode))
        elif stat.S_ISREG(st.st_mode):
            try:
                digest = hashlib.sha256(p.read_bytes()).hexdigest()
            except PermissionError:
                digest = f"unreadable {st.st_size} {st.st_mtime_ns}"
            out[rel] = ("file", stat.S_IMODE(st.st_mode), digest)
        else:
            out[rel] = ("special", st.st_mode, st.st_rdev)
    return out


def changes(before: Listing, after: Listing) -> list[str]:
    diff = [f"+ {k}" for k in after.keys() - before.keys()] + [f"- {k}" for k in before.keys() - after.keys()]
    diff += [f"~ {k}" for k in before.keys() & after.keys() if before[k] != after[k]]
    return sorted(diff)


class Sandbox:
    """A folder tree for one case, and extforge run inside it with its own cache and TMPDIR.

    root:  where the case puts its inputs, channels and prefixes (and what is watched);
    cache: EXTFORGE_CACHE and RATTLER_CACHE_DIR (extforge may write there: not watched);
    tmp:   TMPDIR for every run; it must be empty again when a run ends.
    """

    def __init__(self, base: Path) -> None:
        self.base = base
        self.root = base / "world"
        self.cache = base / "cache"
        self.tmp = base / "tmp"
        for d in (self.root, self.cache, self.tmp):
            d.mkdir(parents=True, exist_ok=True)
        self.env = {
            **os.environ,
            "EXTFORGE_CACHE": str(self.cache),
            "RATTLER_CACHE_DIR": str(self.cache / "rattler"),
            "TMPDIR": str(self.tmp),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            "NO_COLOR": "1",
            "COLUMNS": "200",
        }

    def path(self, *parts: str) -> Path:
        """A folder under root (created)."""
        p = self.root.joinpath(*parts)
        p.mkdir(parents=True, exist_ok=True)
        return p

    def run(
        self,
        *args: str,
        expect: int | Collection[int] | None = None,
        input: str | None = None,
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
        timeout: float = 600,
        tmp_must_be_empty: bool = True,
    ) -> Result:
        """Run `extforge ARGS` as a subprocess; fail on a crash whatever the exit code."""
        proc = subprocess.run(
            [sys.executable, "-m", "extforge", *args],
            cwd=cwd or self.root, env={**self.env, **(env or {})}, input=input if input is not None else "",
            capture_output=True, text=True, timeout=timeout,
        )
        res = Result(tuple(args), proc.returncode, proc.stdout, proc.stderr)
        assert_no_crash(res)
        if tmp_must_be_empty:
            left = sorted(p.name for p in self.tmp.iterdir())
            assert not left, f"extforge {' '.join(args)} left {left} in its TMPDIR"
        if expect is not None:
            codes = {expect} if isinstance(expect, int) else set(expect)
            assert res.returncode in codes, f"extforge {' '.join(args)}: exit {res.returncode}, wanted {codes}\n{res.output}"
        return res

    def manifest(self, package: str) -> Path:
        """ws/pixi.toml whose default environment asks for `package` from the channel "internal"."""
        path = self.path("ws") / "pixi.toml"
        path.write_text(MANIFEST.format(package=package))
        return path

    def lock(self, channel: Path, package: str) -> Path:
        """`extforge lock` of manifest(package) against the channel folder; the pixi.lock path."""
        manifest = self.manifest(package)
        # The site's mirror as pixi keeps it (the workspace's .pixi/config.toml): the lock names
        # the manifest's channel, and lock, install and verify all fetch from the folder.
        config = manifest.parent / ".pixi" / "config.toml"
        config.parent.mkdir(exist_ok=True)
        config.write_text(f'[mirrors]\n"https://conda.anaconda.org/internal" = ["{channel.as_uri()}"]\n')
        self.run("lock", "--manifest", str(manifest), expect=0)
        return manifest.with_name("pixi.lock")

    def listing(self, *allowed: Path) -> Listing:
        from extforge.environment.receipt import receipt_path

        # An allowed prefix comes with its install record beside it.
        return listing(self.base, skip=[self.cache, self.tmp, *allowed, *(receipt_path(a) for a in allowed)])

    @contextmanager
    def unchanged_outside(self, *allowed: Path) -> Iterator[None]:
        """Assert that nothing under the sandbox changed except under `allowed` (and the cache).

        The allowed folders themselves may appear or vanish; their contents are not compared."""
        before = self.listing(*allowed)
        yield
        after = self.listing(*allowed)
        diff = changes(before, after)
        assert not diff, "written outside the allowed folders:\n" + "\n".join(diff)


def assert_no_crash(res: Result) -> None:
    assert res.returncode >= 0, f"extforge {' '.join(res.args)} killed by signal {-res.returncode}\n{res.output}"
    for marker in CRASH_MARKERS:
        assert marker not in res.output, f"extforge {' '.join(res.args)} crashed ({marker!r}):\n{res.output}"


@pytest.fixture
def sandbox(tmp_path: Path) -> Sandbox:
    return Sandbox(tmp_path)


@pytest.fixture(scope="session")
def installed_demo(demo_channel: Path, mirror_channel: Path, tmp_path_factory: pytest.TempPathFactory) -> InstalledDemo:
    """demo-ext and its torch installed once per session in a sandbox of its own, lent to the
    tests (demo_env.py)."""
    from .demo_env import InstalledDemo

    return InstalledDemo.install(Sandbox(tmp_path_factory.mktemp("demo-sandbox")), demo_channel, mirror_channel,
                                 tmp_path_factory.mktemp("demo-pristine"))


@pytest.fixture
def pyish_env(sandbox: Sandbox) -> tuple[Path, Path]:
    """(pixi.lock, prefix) of the pyish environment (pyish.py), installed by `extforge install`."""
    from .pyish import pyish_package

    channel = sandbox.path("ch")
    pyish_package(channel)
    lock = sandbox.lock(channel, "pyish")
    prefix = sandbox.root / "envs" / "p"
    sandbox.run("install", "default", "--prefix", str(prefix), "--lock", str(lock), expect=0)
    return lock, prefix


from peers import peer_site  # noqa: E402, F401  (the multi-user fixture, shared with other areas)


@pytest.fixture(scope="session")
def mirror_python() -> Path:
    """The mirror's `python` package alone (the interpreter running the tests, relocated as
    `extforge mirror` packages it): the smallest lock with a real python, without torch."""
    from extforge.mirror.builder import build_job
    from extforge.mirror.inputs import Interpreter, probe
    from extforge.mirror.python_pkg import python_job

    return build_job(python_job(Interpreter.from_json(probe(sys.executable, dists=False)["python"]))).path
