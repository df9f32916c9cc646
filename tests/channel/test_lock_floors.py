"""What a package's audit proved about the nodes it needs reaches the lock: demo-ext carries its
glibc floor and CUDA driver as `__glibc`/`__cuda` run requirements, and `extforge lock` for a
platform below them fails at lock time, naming the package and its floor. Before, the package
carried neither: a lock for glibc 2.28 nodes succeeded with demo-ext (which needs 2.32 where it
was built here), and only `extforge verify` on a node noticed; a lock that could not solve, and
one that found no torch, said only "check that the channels are reachable".
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_run import run_extforge
from extforge.machine import detect
from package_files import package_member

MACHINE_GLIBC = str(detect().glibc)


def _requirements(conda: Path) -> dict[str, str]:
    """{"__glibc": "__glibc >=2.32,<3.0.a0", ...} of a package's depends."""
    depends = json.loads(package_member(conda, "info/index.json"))["depends"]
    return {d.split()[0]: d for d in depends if d.startswith("__")}


def _lock(tmp_path: Path, channels: list[Path], platform: str, dependencies: str) -> tuple[int, str, Path]:
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    names = ", ".join(f'"{c.resolve().as_uri()}"' for c in channels)
    (ws / "pixi.toml").write_text(f'[workspace]\nname = "floors"\nchannels = [{names}]\nplatforms = [{platform}]\n\n'
                                  f"[dependencies]\n{dependencies}\n")
    proc = run_extforge("lock", "--manifest", str(ws / "pixi.toml"))
    return proc.returncode, proc.stderr, ws / "pixi.lock"


@pytest.mark.slow
def test_demo_ext_carries_its_glibc_floor_and_driver_in_its_index_and_the_channels(demo_package: Path,
                                                                                   demo_channel: Path) -> None:
    stamp = json.loads(package_member(demo_package, "share/extforge/audit/demo-ext.json"))
    # sm_90 SASS only, compiled by CUDA 13.0: a 13.x driver of any minor runs it.
    assert _requirements(demo_package) == {"__glibc": f"__glibc >={stamp['glibc_floor']},<3.0.a0",
                                           "__cuda": "__cuda >=13"}
    repodata = json.loads((demo_channel / "linux-64" / "repodata.json").read_text())
    (record,) = repodata["packages.conda"].values()
    assert {f"__glibc >={stamp['glibc_floor']},<3.0.a0", "__cuda >=13"} <= set(record["depends"])


@pytest.mark.slow
def test_a_lock_for_nodes_below_a_packages_glibc_floor_is_refused_naming_it(demo_package: Path, demo_channel: Path,
                                                                           mirror_channel: Path, tmp_path: Path) -> None:
    floor = _requirements(demo_package)["__glibc"].split(">=")[1].split(",")[0]  # 2.32 where built on Debian 12
    below = "2.28" if tuple(map(int, floor.split("."))) > (2, 28) else f"2.{int(floor.split('.')[1]) - 1}"
    code, err, lock = _lock(tmp_path, [demo_channel, mirror_channel],
                            f'{{ platform = "linux-64", cuda = "13.0", glibc = "{below}" }}', 'demo-ext = "*"')
    assert code == 2, err
    assert (f"cannot lock environment 'default' for linux-64: demo-ext 0.1.0 needs glibc >= {floor} "
            f"(__glibc >={floor},<3.0.a0; the platform's nodes have {below})") in err
    assert f'lock for nodes with glibc {floor} or newer (glibc = "{floor}" on the platform line' in err
    assert f"or rebuild demo-ext on an older sysroot (a build machine or container with glibc {below})" in err
    assert "channels are reachable" not in err and not lock.exists()
    # Nodes with this machine's glibc, where demo-ext was built, run it.
    code, err, lock = _lock(tmp_path, [demo_channel, mirror_channel],
                            f'{{ platform = "linux-64", cuda = "13.0", glibc = "{MACHINE_GLIBC}" }}', 'demo-ext = "*"')
    assert code == 0, err
    assert lock.is_file()


@pytest.mark.slow
def test_a_lock_for_an_older_or_no_cuda_driver_is_refused_naming_the_packages(demo_channel: Path, mirror_channel: Path,
                                                                             tmp_path: Path) -> None:
    code, err, _ = _lock(tmp_path, [demo_channel, mirror_channel],
                         f'{{ platform = "linux-64", cuda = "12.8", glibc = "{MACHINE_GLIBC}" }}', 'demo-ext = "*"')
    assert code == 2, err
    assert "demo-ext 0.1.0 needs a driver for CUDA >= 13 (__cuda >=13; the platform's nodes have 12.8)" in err
    assert "pytorch 2.14.1 needs a driver for CUDA >= 13" in err
    assert ('lock for nodes whose driver runs CUDA 13 (cuda = "13" on the platform line of the manifest), or build '
            "for CUDA 12: a torch built for it in the mirror channel (`extforge mirror`) and demo-ext rebuilt") in err
    code, err, _ = _lock(tmp_path, [demo_channel, mirror_channel], f'{{ platform = "linux-64", glibc = "{MACHINE_GLIBC}" }}',
                         'demo-ext = "*"')
    assert code == 2, err
    assert "(__cuda >=13; the platform declares none)" in err
    assert "declare the nodes' CUDA driver (cuda = \"13\" on the platform line of the manifest; `nvidia-smi`" in err


@pytest.mark.slow
def test_a_lock_whose_torch_no_channel_holds_names_the_mirror_command(mirror_channel: Path, tmp_path: Path) -> None:
    code, err, _ = _lock(tmp_path, [mirror_channel], f'{{ platform = "linux-64", cuda = "13.0", glibc = "{MACHINE_GLIBC}" }}',
                         'python = "3.11.*"\npytorch = "==2.9.1"')
    assert code == 2, err
    assert "cannot lock environment 'default' for linux-64: no channel holds pytorch ==2.9.1" in err
    assert f"the mirror channel {mirror_channel.resolve()} holds (python 3.11, pytorch 2.14.1, CUDA toolkit 13.0" in err
    assert (f"add that torch build to the mirror channel: extforge mirror --channel {mirror_channel.resolve()} "
            "--from-pip --torch torch==2.9.1 --python /path/to/python3.11") in err
    assert "channels are reachable" not in err
