"""A channel shared by a Unix group, published into by real other users (created with useradd,
switched to with setpriv): the kernel's own checks (fs.protected_hardlinks, group modes, setgid
folders) apply as they do to two admins of one site."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from extforge.publishing.publish import LOG_NAME

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


def _publish(site, peer, pkg: Path, channel: Path) -> dict:
    proc = site.run(peer, "publish", str(pkg), "--channel", str(channel), "--no-audit", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


def _as(peer, *cmd: str) -> None:
    import subprocess

    subprocess.run(["setpriv", f"--reuid={peer.uid}", f"--regid={peer.gid}", "--init-groups", "--inh-caps=-all", "--", *cmd],
                   check=True, capture_output=True, text=True, cwd="/")


def test_a_member_swapping_or_deleting_another_members_package_is_noticed(peer_site, tiny_packages):
    # The group folder lets any member rename over or remove another member's file.
    site = peer_site
    first, second = site.peers
    pkgs = site.readable_copy([*tiny_packages.distinct[6:9]], "pkgs-behind")
    (clash,) = site.readable_copy([tiny_packages.clash], "pkgs-behind-clash")
    channel = site.shared_folder("channel-behind")
    _publish(site, first, site.readable_copy([tiny_packages.distinct[0]], "pkgs-behind-0")[0], channel)
    _publish(site, first, pkgs[0], channel)
    victim = channel / "noarch" / tiny_packages.distinct[0].name
    # Other bytes under the same name (mtime set back as well), and a published package removed.
    _as(second, "sh", "-c", f"cp {clash} {channel}/noarch/.x && touch -r {victim} {channel}/noarch/.x && "
                            f"mv -f {channel}/noarch/.x {victim} && rm -f {channel}/noarch/{pkgs[0].name}")
    result = _publish(site, first, pkgs[1], channel)
    changed = result["changed_behind"]
    assert len(changed) == 2, changed
    assert changed[0].startswith(f"swapped: noarch/{victim.name}: its bytes (sha256 "), changed
    assert "replaced behind the channel's back; not served" in changed[0]
    assert changed[1].startswith(f"deleted: noarch/{pkgs[0].name} (published by {first.name} at "), changed
    assert _indexed(channel) == {pkgs[1].name}  # neither the swapped bytes nor the deleted file are served
    assert [i.split(":")[0] for i in result["ignored"]] == [f"noarch/{victim.name}"]
    # The human output says so too; the deletion was reported once, the swap is until it is undone.
    proc = site.run(second, "publish", str(pkgs[2]), "--channel", str(channel), "--no-audit")
    said = " ".join(proc.stderr.split()) + " ".join(proc.stdout.split())
    assert proc.returncode == 0 and f"changed behind the publish log: swapped: noarch/{victim.name}" in said, said
    assert "deleted:" not in said, said
    _as(first, "sh", "-c", f"cp {site.root / 'pkgs-behind-0' / victim.name} {channel}/noarch/.y && mv -f {channel}/noarch/.y {victim}")
    result = _publish(site, first, pkgs[1], channel)
    assert result["changed_behind"] == [] and result["ignored"] == []
    assert _indexed(channel) == {victim.name, pkgs[1].name, pkgs[2].name}


def test_links_fifos_and_devices_in_a_subdir_are_never_served_or_opened(peer_site, tiny_packages):
    site = peer_site
    first, second = site.peers
    pkgs = site.readable_copy(tiny_packages.distinct[9:11], "pkgs-special")
    channel = site.shared_folder("channel-special")
    _publish(site, first, pkgs[0], channel)
    # The first member's private package, and a second member's plants under package names.
    home = site.root / "home-private"
    home.mkdir()
    private = home / "secret-1.0-h0_0.conda"
    private.write_bytes(tiny_packages.distinct[11].read_bytes())
    os.chown(home, first.uid, first.gid)
    os.chown(private, first.uid, first.gid)
    private.chmod(0o644)
    noarch = channel / "noarch"
    _as(second, "sh", "-c", f"ln -s {private} {noarch}/secret-1.0-h0_0.conda && ln -s /dev/zero {noarch}/zero-1.0-h0_0.conda"
                            f" && mkfifo {noarch}/fifo-1.0-h0_0.conda && ln -s {private} {channel}/linux-64/s-1.0-h0_0.conda")
    result = _publish(site, first, pkgs[1], channel)  # returns: nothing was opened (site.run times out at 300 s)
    assert _indexed(channel) == {pkgs[0].name, pkgs[1].name}
    assert sorted(result["ignored"]) == sorted(f"{sd}/{n}: it is a symbolic link or not a regular file" for sd, n in [
        ("linux-64", "s-1.0-h0_0.conda"), ("noarch", "fifo-1.0-h0_0.conda"), ("noarch", "secret-1.0-h0_0.conda"),
        ("noarch", "zero-1.0-h0_0.conda")])
    assert result["log_repaired"] == []  # never logged as published either


def test_publish_makes_a_missing_channel_folder_every_member_can_publish_into(peer_site, tiny_packages):
    """`publish --channel DIR` with DIR missing made it under the publisher's umask (drwxr-sr-x in
    the site's setgid folder), saying nothing: the next member of the group could not publish
    ("cannot write …/.extforge-publish.lock"). It is made as the channel rules make a subdir,
    with the group bits of the site folder above it, and the publish says so."""
    site = peer_site
    first, second = site.peers
    pkgs = site.readable_copy(tiny_packages.distinct[3:5], "pkgs-created")
    channel = site.shared_folder("site-channels") / "team" / "main"
    proc = site.run(first, "publish", str(pkgs[0]), "--channel", str(channel), "--no-audit", umask=0o077)
    assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE(channel.stat().st_mode) == stat.S_IMODE(channel.parent.stat().st_mode) == 0o2775
    assert f"created the channel folder {channel} (drwxrwsr-x): it did not exist" in " ".join(proc.stderr.split())
    proc = site.run(second, "publish", str(pkgs[1]), "--channel", str(channel), "--no-audit")
    assert proc.returncode == 0 and "created the channel folder" not in proc.stderr, proc.stderr
    assert _indexed(channel) == {p.name for p in pkgs}
