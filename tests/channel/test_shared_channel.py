"""A channel shared by a Unix group, published into by real other users (created with useradd,
switched to with setpriv): the kernel's own checks (fs.protected_hardlinks, group modes, setgid
folders) apply as they do to two admins of one site."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from extforge.channel.publish import LOG_NAME

from .conftest import build_package


def _indexed(channel: Path) -> set[str]:
    data = json.loads((channel / "noarch" / "repodata.json").read_text())
    return set(data.get("packages.conda", {})) | set(data.get("packages", {}))


def _listing(channel: Path) -> dict[str, bytes]:
    return {str(p.relative_to(channel)): p.read_bytes() for p in sorted(channel.rglob("*")) if p.is_file()}


def test_group_members_publish_into_one_channel(peer_site, tiny_packages):
    site = peer_site
    first, second = site.peers
    pkgs = site.readable_copy(tiny_packages.distinct[:3])
    channel = site.shared_folder("channel")

    # The first member's umask would make everything private; the second's is the usual one.
    proc = site.run(first, "publish", str(pkgs[0]), "--channel", str(channel), "--no-audit", umask=0o077)
    assert proc.returncode == 0, proc.stderr
    # The second re-indexes a channel holding the first one's files: a hard link to them is refused
    # by the kernel (protected_hardlinks), so they are copied into the shadow index.
    proc = site.run(second, "publish", str(pkgs[1]), "--channel", str(channel), "--no-audit")
    assert proc.returncode == 0, proc.stderr
    proc = site.run(first, "publish", str(pkgs[2]), "--channel", str(channel), "--no-audit", umask=0o077)
    assert proc.returncode == 0, proc.stderr

    assert _indexed(channel) == {p.name for p in pkgs}
    for sub in ("noarch", "linux-64"):
        st = (channel / sub).stat()
        assert st.st_gid == site.gid and stat.S_IMODE(st.st_mode) == 0o2775, sub
    owners = {}
    for f in (channel / "noarch").iterdir():
        st = f.stat()
        assert st.st_gid == site.gid, f.name
        assert st.st_mode & 0o044 == 0o044, f"{f.name} is not readable by the group and the cluster"
        owners[f.name] = st.st_uid
    assert owners[pkgs[0].name] == first.uid and owners[pkgs[1].name] == second.uid
    log = channel / LOG_NAME
    assert stat.S_IMODE(log.stat().st_mode) == 0o664 and log.stat().st_gid == site.gid
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(e["user"], e["status"]) for e in entries] == [(first.name, "published"), (second.name, "published"),
                                                           (first.name, "published")]
    assert not [p for p in channel.rglob(".extforge-*") if "publish.lock" not in p.name], "temporaries left behind"


def test_an_unreadable_package_is_named_and_nothing_changes(peer_site, tiny_packages):
    site = peer_site
    first, second = site.peers
    pkgs = site.readable_copy(tiny_packages.distinct[3:5])
    channel = site.shared_folder("channel-unreadable")
    assert site.run(first, "publish", str(pkgs[0]), "--channel", str(channel), "--no-audit").returncode == 0
    # A package the first member put there by hand from rattler-build's output (mode 0600).
    private = channel / "noarch" / pkgs[1].name
    private.write_bytes(pkgs[1].read_bytes())
    os.chown(private, first.uid, site.gid)
    os.chmod(private, 0o600)
    before = _listing(channel)

    new = site.readable_copy(tiny_packages.distinct[5:6], "pkgs-unreadable")
    proc = site.run(second, "publish", str(new[0]), "--channel", str(channel), "--no-audit")
    assert proc.returncode == 2, proc.stderr
    said = " ".join(proc.stderr.split())  # the console wraps long lines
    assert f"noarch/{pkgs[1].name}" in said and "chmod" in said and "unexpectedly" not in said
    assert _listing(channel) == before


def test_a_build_string_or_name_a_channel_cannot_serve_is_refused_before_copying(peer_site, tmp_path):
    site = peer_site
    pkg = build_package(tmp_path, "semi", build="h0;0")
    channel = site.shared_folder("channel-identity")
    (copy,) = site.readable_copy([pkg], "pkgs-identity")
    proc = site.run(site.peers[0], "publish", str(copy), "--channel", str(channel), "--no-audit")
    assert proc.returncode == 1, proc.stderr
    assert "build string 'h0;0'" in " ".join(proc.stderr.split())
    assert not (channel / "noarch").exists()


def test_a_lock_file_the_group_cannot_write_is_a_clear_error(peer_site, tiny_packages):
    site = peer_site
    first, second = site.peers
    pkgs = site.readable_copy(tiny_packages.distinct[6:8], "pkgs-lock")
    channel = site.shared_folder("channel-old-lock")
    assert site.run(first, "publish", str(pkgs[0]), "--channel", str(channel), "--no-audit").returncode == 0
    # As an extforge before the shared-channel work left it: 0644, owned by the first publisher.
    os.chmod(channel / ".extforge-publish.lock", 0o644)
    before = _listing(channel)
    proc = site.run(second, "publish", str(pkgs[1]), "--channel", str(channel), "--no-audit")
    said = " ".join(proc.stderr.split())
    assert proc.returncode == 2 and "chmod g+w" in said and ".extforge-publish.lock" in said, proc.stderr
    assert "unexpectedly" not in said
    assert _listing(channel) == before
