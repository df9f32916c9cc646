"""The multi-user tests leave no users or groups behind (tests/peers.py), with sessions side by side."""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import subprocess
import sys

import pytest

from peers import site_users


def _exists(group: str, users: tuple[str, ...]) -> list[bool]:
    found = []
    for lookup, name in [(grp.getgrnam, group), *((pwd.getpwnam, u) for u in users)]:
        try:
            lookup(name)
            found.append(True)
        except KeyError:
            found.append(False)
    return found


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("useradd"), reason="creates real users: root with useradd")
def test_the_last_session_removes_the_users_and_the_group(tmp_path):
    # Names of this test alone: the real site's users may serve another session right now.
    group, users = f"efx-{os.getpid()}", (f"efx-{os.getpid()}-a", f"efx-{os.getpid()}-b")
    sessions = tmp_path / "sessions"
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with site_users(group, users, sessions) as (gid, peers):
            assert _exists(group, users) == [True, True, True] and gid == grp.getgrnam(group).gr_gid
            assert [p.name for p in peers] == list(users)
            assert set(users) <= set(grp.getgrgid(gid).gr_mem)
            (sessions / f"{group}.{other.pid}").touch()  # another live session uses them too
            (sessions / f"{group}.999999999").touch()  # a killed session's marker
        assert _exists(group, users) == [True, True, True]
        other.kill()
        other.wait()
        with site_users(group, users, sessions):
            pass
        assert _exists(group, users) == [False, False, False]
        assert sorted(p.name for p in sessions.iterdir()) == [f"{group}.lock"]
    finally:
        other.kill()
        for user in users:
            subprocess.run(["userdel", user], capture_output=True)
        subprocess.run(["groupdel", group], capture_output=True)
