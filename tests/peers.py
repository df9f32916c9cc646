"""Real other users for the tests where permissions matter (a channel shared by a Unix group).

As root, `peer_site` creates the group `extforge-site` and two system users in it,
`extforge-peer` and `extforge-peer2`, and a folder under the temp dir that they can reach; the
last test session that uses them removes them when it ends (sessions running side by side share
them: each leaves a marker with its pid, and a session's end removes the users only when no other
live session's marker is left). `PeerSite.run(peer, ...)` runs the real `extforge` CLI as that user through
`setpriv` (real uid, gid and supplementary groups; no capabilities), with the umask given, so
the kernel's permission checks (fs.protected_hardlinks, group modes, setgid folders) apply as
they would to two admins of one site. Not root: the tests skip, saying why.
"""

from __future__ import annotations

import contextlib
import fcntl
import grp
import os
import pwd
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

GROUP = "extforge-site"
USERS = ("extforge-peer", "extforge-peer2")

# The venv's own interpreter may live where other users cannot enter (a pyenv under /root):
# the peers run the same Python version's system interpreter on the venv's site-packages.
_PEER_MAIN = (
    "import os, site, sys; os.umask(int(sys.argv[1], 8)); site.addsitedir(sys.argv[2]); "
    "from extforge.cli import main; sys.argv = ['extforge', *sys.argv[3:]]; sys.exit(main())"
)


@dataclass(frozen=True)
class Peer:
    name: str
    uid: int
    gid: int


@dataclass(frozen=True)
class PeerSite:
    root: Path  # a folder every peer can reach; the tests' channels and packages go here
    gid: int  # of GROUP
    peers: tuple[Peer, ...]
    python: str

    def run(self, peer: Peer, *args: str, umask: int = 0o022, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """`extforge ARGS` as `peer`; `env` adds to or replaces its environment (a shared EXTFORGE_CACHE)."""
        home = self.root / f"home-{peer.name}"
        if not home.exists():
            home.mkdir()
            os.chown(home, peer.uid, peer.gid)
        site_packages = sysconfig.get_paths()["purelib"]
        environ = {
            "PATH": "/usr/bin:/bin",
            "HOME": str(home),
            "USER": peer.name,
            "LOGNAME": peer.name,
            "EXTFORGE_CACHE": str(home / "cache"),
            # the indexer runs in a child interpreter: it must find rattler too
            "PYTHONPATH": site_packages,
            **(env or {}),
        }
        cmd = ["setpriv", f"--reuid={peer.uid}", f"--regid={peer.gid}", "--init-groups", "--inh-caps=-all", "--",
               self.python, "-c", _PEER_MAIN, f"{umask:o}", site_packages, *args]
        return subprocess.run(cmd, capture_output=True, text=True, env=environ, cwd=self.root, timeout=300)

    def shared_folder(self, name: str) -> Path:
        """A folder as docs/site-admin.md sets one up: group-owned, setgid, group-writable."""
        path = self.root / name
        path.mkdir()
        os.chown(path, 0, self.gid)
        os.chmod(path, 0o2775)
        return path

    def readable_copy(self, packages: list[Path], name: str = "pkgs") -> list[Path]:
        dest = self.root / name
        dest.mkdir(exist_ok=True)
        out = []
        for p in packages:
            out.append(Path(shutil.copyfile(p, dest / p.name)))
            os.chmod(out[-1], 0o644)
        return out


def _ensure_users(group: str, users: tuple[str, ...]) -> tuple[int, tuple[Peer, ...]]:
    subprocess.run(["groupadd", "-f", group], check=True, capture_output=True)
    for user in users:
        try:
            pwd.getpwnam(user)
        except KeyError:
            proc = subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                                   "--groups", group, user], capture_output=True, text=True)
            # exit 9: another test session created it a moment ago
            if proc.returncode not in (0, 9):
                raise RuntimeError(f"useradd {user}: {proc.stderr.strip()}") from None
        if group not in [g.gr_name for g in grp.getgrall() if user in g.gr_mem]:
            subprocess.run(["usermod", "--append", "--groups", group, user], check=True, capture_output=True)
    gid = grp.getgrnam(group).gr_gid
    return gid, tuple(Peer(u, pwd.getpwnam(u).pw_uid, pwd.getpwnam(u).pw_gid) for u in users)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


# Machine-wide like the users themselves, not under TMPDIR (a session may have its own); root's alone.
SESSIONS = Path("/run/extforge-site-sessions")


@contextlib.contextmanager
def site_users(group: str = GROUP, users: tuple[str, ...] = USERS,
               sessions: Path = SESSIONS) -> Iterator[tuple[int, tuple[Peer, ...]]]:
    """The group and its users for this session: created if missing, removed (users with their
    own groups, then the group) when the last live session that uses them ends. A marker left by a
    session that was killed names a dead pid and counts for nothing."""
    sessions.mkdir(mode=0o700, exist_ok=True)
    marker = sessions / f"{group}.{os.getpid()}"
    with open(sessions / f"{group}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = _ensure_users(group, users)
        marker.touch()
    try:
        yield found
    finally:
        with open(sessions / f"{group}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            marker.unlink(missing_ok=True)
            if not any(_pid_alive(int(m.suffix[1:])) for m in sessions.glob(f"{group}.*") if m.suffix[1:].isdigit()):
                for user in users:
                    subprocess.run(["userdel", user], capture_output=True)
                subprocess.run(["groupdel", group], capture_output=True)
                for m in sessions.glob(f"{group}.*[0-9]"):
                    m.unlink(missing_ok=True)


def _peer_python(peer: Peer) -> str | None:
    """An interpreter of this Python version that the peer can execute, and start again as
    sys.executable (extforge runs its indexer that way)."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    probe_code = "import subprocess, sys; subprocess.run([sys.executable, '-c', 'import sys; print(sys.version_info[:2])'], check=True)"
    for candidate in (f"/usr/bin/python{version}", shutil.which(f"python{version}") or "", sys.executable):
        if not candidate:
            continue
        probe = subprocess.run(["setpriv", f"--reuid={peer.uid}", f"--regid={peer.gid}", "--init-groups", "--inh-caps=-all",
                                "--", candidate, "-c", probe_code], capture_output=True, text=True, cwd="/")
        if probe.returncode == 0 and probe.stdout.strip() == str(sys.version_info[:2]):
            return candidate
    return None


@pytest.fixture(scope="session")
def peer_site() -> Iterator[PeerSite]:
    if os.geteuid() != 0:
        pytest.skip("the multi-user tests create real users (useradd) and switch to them (setpriv): run them as root, as CI does")
    if not shutil.which("setpriv") or not shutil.which("useradd"):
        pytest.skip("the multi-user tests need setpriv and useradd (util-linux, passwd)")
    with site_users() as (gid, peers):
        python = _peer_python(peers[0])
        if python is None:
            pytest.skip(f"no Python {sys.version_info.major}.{sys.version_info.minor} that {peers[0].name} may execute "
                        f"({sys.executable} lies in a folder only root can enter)")
        root = Path(tempfile.mkdtemp(prefix="extforge-site-"))
        os.chmod(root, 0o755)
        try:
            yield PeerSite(root, gid, peers, python)
        finally:
            # Before the users go: what they wrote here would be left to uids nobody has.
            shutil.rmtree(root, ignore_errors=True)
