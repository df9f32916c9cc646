"""`extforge lock` on a manifest whose environment has [pypi-dependencies]: a PEP 751
pylock.toml that the real pip and uv install as it is, with every wheel's sha256 required."""

from __future__ import annotations

import hashlib
import json
import platform
import subprocess
import tomllib

from channel.pip_envs import EXT_VERSION, PipSite
from cli_run import run_extforge

SHORT = ".".join(platform.python_version().split(".")[:2])


def _lock(site: PipSite, *args: str):
    res = run_extforge("lock", "--manifest", str(site.manifest), *args)
    assert res.returncode == 0, res.stderr
    return res


def test_lock_writes_a_pylock_that_pip_and_uv_install_with_hashes(pip_site: PipSite, tmp_path):
    """The old code refused the manifest ("extforge locks conda packages only"); now the PyPI part
    is locked into pylock.node.toml: the extension wheel from the index and its PyPI dependency,
    each with URL, size and sha256, for this Python on linux-64 only; pip (`-r`) and uv (`pip
    install -r`, `pip sync`) install it into fresh venvs, where the compiled module runs."""
    res = _lock(pip_site, "--json")
    assert json.loads(res.stdout)["pypi"] == {"node": 2}
    lock = tomllib.loads(pip_site.pylock.read_text())
    assert lock["lock-version"] == "1.0" and lock["created-by"] == "extforge"
    assert lock["requires-python"] == f"=={SHORT}.*"
    assert lock["environments"] == [f"sys_platform == 'linux' and platform_machine == 'x86_64' and "
                                    f"implementation_name == 'cpython' and python_version == '{SHORT}'"]
    by_name = {p["name"]: p for p in lock["packages"]}
    assert sorted(by_name) == ["pip-ext", "pip-pure"]
    assert by_name["pip-ext"]["version"] == EXT_VERSION
    for package in lock["packages"]:
        (wheel,) = package["wheels"]
        built = next(w for w in pip_site.wheels if w.name == wheel["name"])
        assert wheel["hashes"] == {"sha256": hashlib.sha256(built.read_bytes()).hexdigest()}
        assert wheel["size"] == built.stat().st_size
        assert wheel["url"].startswith(pip_site.index.removesuffix("simple")), wheel["url"]

    check = "import pip_ext, pip_pure; assert pip_ext.greet('node') == 'hello node' and pip_pure.VALUE == 42"
    by_pip = pip_site.venv(tmp_path / "by-pip")
    res = pip_site.pip_install(by_pip, "-r", str(pip_site.pylock))
    assert res.returncode == 0, res.stderr
    by_uv = pip_site.venv(tmp_path / "by-uv")
    res = pip_site.uv_pip("install", by_uv, "--require-hashes", "-r", str(pip_site.pylock))
    assert res.returncode == 0, res.stderr
    by_sync = pip_site.venv(tmp_path / "by-uv-sync")
    res = pip_site.uv_pip("sync", by_sync, "--require-hashes", str(pip_site.pylock))
    assert res.returncode == 0, res.stderr
    for venv in (by_pip, by_uv, by_sync):
        run = subprocess.run([str(venv / "bin" / "python"), "-c", check], capture_output=True, text=True)
        assert run.returncode == 0, (venv, run.stderr)

    res = run_extforge("lock", "--manifest", str(pip_site.manifest), "--check")
    assert res.returncode == 0, res.stdout + res.stderr


def test_the_torch_row_is_locked_from_the_mirrors_wheels(pip_site: PipSite, tmp_path):
    """pip's torch 2.14.1+cu130 wheels, which the mirror fixture downloads (a folder of find-links
    beside the wheel index): torch, its nvidia-* wheels and its PyPI dependencies are locked, each
    the very file with its sha256, for this Python's manylinux_2_28 platform."""
    from extforge import mirror

    wheels = mirror.from_pip(mirror.pip_requirements("torch==2.14.1", [])).artifacts["torch"].wheel.parent
    ws = tmp_path / "ws"
    ws.mkdir()
    text = pip_site.manifest.read_text().replace('pip-ext = "==1.0+cpu"', 'pip-ext = "==1.0+cpu"\ntorch = "==2.14.1"')
    (ws / "pixi.toml").write_text(text.replace("[environments]", f'find-links = [{{ path = "{wheels}" }}]\n\n[environments]'))
    res = run_extforge("lock", "--manifest", str(ws / "pixi.toml"), "--json")
    assert res.returncode == 0, res.stderr
    lock = tomllib.loads((ws / "pylock.node.toml").read_text())
    by_name = {p["name"]: p for p in lock["packages"]}
    assert by_name["torch"]["version"] == "2.14.1"
    (torch,) = by_name["torch"]["wheels"]
    local = wheels / torch["name"]
    assert torch["url"] == local.as_uri() and torch["size"] == local.stat().st_size
    assert torch["hashes"]["sha256"] == hashlib.sha256(local.read_bytes()).hexdigest()
    assert {"nvidia-cuda-runtime", "nvidia-cublas", "sympy", "pip-ext", "pip-pure"} <= set(by_name)


def test_install_of_the_conda_part_names_the_pylock(pip_site: PipSite, tmp_path):
    """pixi.lock holds the environment's conda packages only: install says where the PyPI part is
    (the old code refused to lock such a manifest at all)."""
    _lock(pip_site)
    prefix = tmp_path / "env"
    res = run_extforge("install", "node", "--prefix", str(prefix), "--lock", str(pip_site.workspace / "pixi.lock"))
    assert res.returncode == 0, res.stderr
    assert f"its PyPI packages: {prefix}/bin/python -m pip install -r {pip_site.pylock}" in res.stderr
