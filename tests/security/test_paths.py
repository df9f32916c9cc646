"""Paths a package names (subdir, members, paths.json entries, link targets, entry points) never
lead a write outside the channel or the prefix. Each case crafts a package by hand, runs the
real command on it, and asserts the refusal names the member and nothing outside changed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from extforge.publishing.index import reindex

from .crafted import Member, craft_conda_outer, craft_package, device, hardlink, member, symlink

FORMATS = ["conda", "tar.bz2"]

# name -> (members, paths.json entries or None for the members' own, extra info files, what the refusal names)
INSTALL_CASES: dict[str, tuple[list[Member], list[dict] | None, dict[str, bytes], str]] = {
    "member-dotdot": ([member("../../escaped.txt")], None, {}, "../../escaped.txt"),
    "member-absolute": ([member("/ABS/escaped.txt")], None, {}, "/ABS/escaped.txt"),
    "pathsjson-dotdot": (
        [member("share/ok.txt")],
        [{"_path": "../../escaped.txt", "path_type": "hardlink", "sha256": "0" * 64, "size_in_bytes": 1}],
        {}, "../../escaped.txt",
    ),
    "symlink-out": ([symlink("lib/evil", "../../../outside")], None, {}, "lib/evil"),
    "symlink-absolute": ([symlink("lib/etc", "/ABS")], None, {}, "lib/etc"),
    # `lib/up -> ..` is the prefix itself (fine); `lib/up/../escaped.txt` normalises to
    # lib/escaped.txt as text, but the filesystem resolves lib/up first: the prefix's parent.
    "symlink-chain": ([symlink("lib/up", ".."), member("lib/up/../escaped.txt")], None, {}, "lib/up/../escaped.txt"),
    "write-through-symlink": ([symlink("lib/out", "../.."), member("lib/out/escaped.txt")], None, {}, "lib/out"),
    "hardlink-out": ([hardlink("bin/x", "../../outside")], None, {}, "bin/x"),
    "device": ([device("dev/null")], None, {}, "dev/null"),
    "fifo": ([device("run/pipe", "fifo")], None, {}, "run/pipe"),
    "entry-point": (
        [member("share/ok.txt")], None,
        {"info/link.json": json.dumps({"noarch": {"type": "python", "entry_points": ["../../../escaped = os:getcwd"]}}).encode()},
        "entry point name",
    ),
    "has-prefix": ([member("share/ok.txt")], None, {"info/has_prefix": b"/opt/placeholder text ../../escaped.txt\n"}, "../../escaped.txt"),
}


def _abs(sandbox, text: str) -> str:
    return text.replace("/ABS", str(sandbox.base / "abs-target"))


def _craft(sandbox, name: str, fmt: str, case: str) -> Path:
    members, paths, info_files, _ = INSTALL_CASES[case]
    members = [Member(_abs(sandbox, m.name), m.data, m.kind, _abs(sandbox, m.target), m.mode) for m in members]
    return craft_package(sandbox.path("in"), name, members, fmt=fmt, paths=paths, info_files=info_files)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("subdir", ["../../x", "/ABS", "linux-64/../../x", "linux-65"])
def test_publish_refuses_a_subdir_that_is_not_a_platform(sandbox, fmt, subdir):
    pkg = craft_package(sandbox.path("in"), "evil-subdir", subdir=_abs(sandbox, subdir), fmt=fmt)
    channel = sandbox.root / "ch"
    with sandbox.unchanged_outside(channel):
        res = sandbox.run("publish", str(pkg), "--channel", str(channel), "--no-audit")
    res.refused("is not a known platform name", pkg.name, code=1)
    assert not channel.exists(), "publish created the channel folder for a refused package"


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("case", sorted(INSTALL_CASES))
def test_publish_refuses_unsafe_paths(sandbox, fmt, case):
    pkg = _craft(sandbox, f"evil-{case}", fmt, case)
    channel = sandbox.root / "ch"
    for gate in (["--no-audit"], []):  # refused before the audit and by the audit itself
        with sandbox.unchanged_outside(channel):
            res = sandbox.run("publish", str(pkg), "--channel", str(channel), *gate)
        res.refused("unsafe", _abs(sandbox, INSTALL_CASES[case][3]), code=1)
        assert not channel.exists()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("case", sorted(INSTALL_CASES))
def test_audit_refuses_unsafe_paths(sandbox, fmt, case):
    pkg = _craft(sandbox, f"evil-{case}", fmt, case)
    with sandbox.unchanged_outside():
        res = sandbox.run("audit", str(pkg))
    res.refused("unsafe", _abs(sandbox, INSTALL_CASES[case][3]), code=1)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("case", sorted(INSTALL_CASES))
def test_install_refuses_unsafe_paths(sandbox, fmt, case):
    """The package reaches the channel behind publish's back (copied and indexed by hand)."""
    name = f"evil-{case}"
    channel = sandbox.path("ch")
    _craft(sandbox, name, fmt, case).rename(sandbox.path("ch", "noarch") / f"{name}-1.0-0.{fmt}")
    reindex(channel)
    lock = sandbox.lock(channel, name)
    prefix = sandbox.root / "envs" / "p"
    with sandbox.unchanged_outside(prefix):
        res = sandbox.run("install", "default", "--prefix", str(prefix), "--lock", str(lock))
    res.refused("unsafe", _abs(sandbox, INSTALL_CASES[case][3]), code=1)
    assert not prefix.exists()


def test_conda_outer_zip_member_is_refused(sandbox):
    pkg = craft_conda_outer(sandbox.path("in"), "evil-zip-1.0-0.conda",
                            {"metadata.json": b"{}", "../../escaped.tar.zst": b"x"})
    for args in (["publish", str(pkg), "--channel", str(sandbox.root / "ch"), "--no-audit"], ["audit", str(pkg)]):
        with sandbox.unchanged_outside(sandbox.root / "ch"):
            res = sandbox.run(*args)
        res.refused("unsafe", "../../escaped.tar.zst", code=1)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_safe_package_with_inside_links_is_published_and_installed(sandbox, fmt):
    """The rule refuses escapes, not links: relative links inside the prefix still install."""
    name = "fine-links"
    members = [member("lib/libx.so.1", b"\x7fELF not really"), symlink("lib/libx.so", "libx.so.1"),
               symlink("lib/up", ".."), member("share/fine/a.txt"), symlink("share/fine/b.txt", "../../share/fine/a.txt")]
    pkg = craft_package(sandbox.path("in"), name, members, fmt=fmt)
    channel = sandbox.root / "ch"
    with sandbox.unchanged_outside(channel):
        sandbox.run("publish", str(pkg), "--channel", str(channel), "--no-audit", expect=0)
    lock = sandbox.lock(channel, name)
    prefix = sandbox.path("envs") / "p"
    with sandbox.unchanged_outside(prefix):
        sandbox.run("install", "default", "--prefix", str(prefix), "--lock", str(lock), expect=0)
    assert (prefix / "share" / "fine" / "b.txt").read_bytes() == (prefix / "share" / "fine" / "a.txt").read_bytes()
