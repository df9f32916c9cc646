"""A lock names the manifest's channels and installs at another site through another mirror;
pixi.toml in both platform forms; the exports conda users read (environment.yml, conda-lock.yml)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from cli_run import EXTFORGE
from extforge.environment.lock import lock, stale_reasons
from extforge.environment.manifest import parse_manifest, read_manifest
from extforge.environment.mirrors import Mirrors, parse_channel_map, pixi_config_paths, read_pixi_mirrors, site_mirrors
from extforge.errors import ExtforgeError
from extforge.publishing.publish import publish

INTERNAL = "https://conda.internal.example/extforge"
MANIFEST = f"""\
[workspace]
name = "site"
channels = ["{INTERNAL}"]
platforms = [{{ platform = "linux-64", cuda = "13.0", glibc = "2.28" }}]

[feature.app.dependencies]
tiny-app = "*"

[environments]
app = ["app"]
"""


def _run(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*EXTFORGE, *args], capture_output=True, text=True, **kw)


def test_lock_made_through_one_mirror_installs_through_another(tiny_packages, http_root, tmp_path, isolated_cache,
                                                               monkeypatch):
    root, url = http_root
    publish(tiny_packages.distinct[:2] + [tiny_packages.app], root / "extforge", audit=False)
    # Site A serves the channel over HTTP and says so in pixi's own config file.
    ws = tmp_path / "ws"
    (ws / ".pixi").mkdir(parents=True)
    (ws / "pixi.toml").write_text(MANIFEST)
    (ws / ".pixi" / "config.toml").write_text(f'[mirrors]\n"{INTERNAL}" = ["{url}/extforge"]\n')
    proc = _run("lock", "--manifest", str(ws / "pixi.toml"), "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["mirrors"][INTERNAL] == [f"{url}/extforge"] and str(ws / ".pixi" / "config.toml") in report["mirror_sources"]

    lock_path = ws / "pixi.lock"
    doc = YAML(typ="safe").load(lock_path.read_text())
    manifest_channels = [c + "/" for c in read_manifest(ws / "pixi.toml").channels]
    assert [c["url"] for c in doc["environments"]["app"]["channels"]] == manifest_channels
    urls = [p["conda"] for p in doc["packages"]]
    assert len(urls) == 3 and all(u.startswith(f"{INTERNAL}/noarch/") for u in urls)
    assert url not in lock_path.read_text() + (ws / "envs" / "app.explicit.txt").read_text()
    env_yml = (ws / "envs" / "app.environment.yml").read_text()
    assert YAML(typ="safe").load(env_yml)["channels"] == [INTERNAL] and "nodefaults" not in env_yml
    locked_bytes = lock_path.read_bytes()

    # Site B: the lock travels alone; the channel is a folder there, named on the command line.
    site_b = tmp_path / "site-b"
    node = tmp_path / "node"
    node.mkdir()
    shutil.copytree(root / "extforge", site_b / "extforge")
    shutil.copy(lock_path, node / "pixi.lock")
    shutil.rmtree(root / "extforge")  # site A's mirror is gone
    prefix = tmp_path / "envs" / "app"
    proc = _run("install", "app", "--prefix", str(prefix), "--lock", str(node / "pixi.lock"))
    assert proc.returncode == 2 and "cannot fetch" in proc.stderr and not prefix.exists()
    mapping = f"--channel-map={INTERNAL}={(site_b / 'extforge').as_uri()}"
    proc = _run("install", "app", "--prefix", str(prefix), "--lock", str(node / "pixi.lock"), mapping)
    assert proc.returncode == 0, proc.stderr
    assert (node / "pixi.lock").read_bytes() == locked_bytes
    meta = [json.loads(p.read_text()) for p in (prefix / "conda-meta").glob("*.json")]
    assert sorted(m["url"] for m in meta) == sorted(urls)  # conda-meta names the channel, too

    proc = _run("verify", str(prefix), "--env", "app", "--lock", str(node / "pixi.lock"), "--json")
    assert proc.returncode == 0, proc.stderr
    # A package conda fetched from site B's folder: the same channel only through the mirror.
    record = next(p for p in (prefix / "conda-meta").glob("tiny-app-*.json"))
    data = json.loads(record.read_text())
    data["url"] = (site_b / "extforge" / "noarch" / data["fn"]).as_uri()
    record.write_text(json.dumps(data))
    checks = lambda p: {c["name"]: c for c in json.loads(p.stdout)["checks"]}  # noqa: E731
    proc = _run("verify", str(prefix), "--env", "app", "--lock", str(node / "pixi.lock"), "--json")
    packages = checks(proc)["packages"]
    assert proc.returncode == 1 and any(f.startswith("origin: tiny-app") for f in packages["findings"])
    proc = _run("verify", str(prefix), "--env", "app", "--lock", str(node / "pixi.lock"), "--json", mapping)
    assert proc.returncode == 0 and checks(proc)["packages"]["verdict"] == "pass"


def test_pixi_config_files_in_pixis_order(tmp_path, monkeypatch):
    home, xdg, pixi_home, ws = (tmp_path / n for n in ("home", "xdg", "pixi-home", "ws"))
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(xdg))
    monkeypatch.setenv("PIXI_HOME", str(pixi_home))
    monkeypatch.delenv("EXTFORGE_CHANNEL_MAP", raising=False)
    key = "https://conda.anaconda.org/conda-forge"
    for folder, mirror in ((home / ".config" / "pixi", "https://user"), (xdg / "pixi", "https://xdg"),
                           (pixi_home, "https://pixi-home"), (ws / ".pixi", "https://workspace")):
        folder.mkdir(parents=True)
        (folder / "config.toml").write_text(f'[mirrors]\n"{key}" = ["{mirror}"]\n"https://conda.anaconda.org" = ["{mirror}/all"]\n')
    paths = pixi_config_paths(ws)
    assert paths[-1] == ws / ".pixi" / "config.toml" and paths.index(xdg / "pixi" / "config.toml") < paths.index(pixi_home / "config.toml")
    mirrors = site_mirrors(ws)
    # The longest key wins; a host-wide key covers the other channels of that host.
    assert mirrors.redirect(f"{key}/linux-64/x.conda") == "https://workspace/linux-64/x.conda"
    assert mirrors.redirect("https://conda.anaconda.org/bioconda/noarch/y.conda") == "https://workspace/all/bioconda/noarch/y.conda"
    assert mirrors.redirect("https://conda.anaconda.org/conda-forgeX/z") == "https://workspace/all/conda-forgeX/z"
    assert mirrors.redirect("https://elsewhere.example/c/noarch/z") == "https://elsewhere.example/c/noarch/z"
    # --channel-map is one more mirror in the same table, and wins over every file.
    mirrors = site_mirrors(ws, {"conda-forge": "https://manifest"}, ["conda-forge=/nfs/mirror"])
    assert mirrors.redirect(f"{key}/noarch/a.conda") == "file:///nfs/mirror/noarch/a.conda"
    monkeypatch.setenv("EXTFORGE_CHANNEL_MAP", "conda-forge=https://env")
    assert site_mirrors(ws, {"conda-forge": "https://manifest"}).redirect(key) == "https://env"
    (ws / ".pixi" / "config.toml").write_text('[mirrors]\n"https://x" = "https://not-a-list"\n')
    with pytest.raises(ExtforgeError, match="not in pixi's form"):
        read_pixi_mirrors(ws / ".pixi" / "config.toml")
    with pytest.raises(ExtforgeError, match="bad channel mapping"):
        parse_channel_map(["conda-forge"], ws, "--channel-map")


PLATFORMS_FORM = """\
[workspace]
name = "p"
channels = ["conda-forge"]
platforms = ["linux-64", { name = "gpu", platform = "linux-64", cuda = { driver = "13.0", arch = "9.0" }, glibc = "2.34", __custom = "1" }]

[feature.gpu]
platforms = ["gpu"]

[feature.gpu.dependencies]
pytorch = "==2.14.1"

[environments]
gpu = ["gpu"]
cpu = []
"""

DEPRECATED_FORM = """\
[workspace]
name = "p"
channels = ["conda-forge"]
platforms = ["linux-64"]

[system-requirements]
cuda = "13.0"
libc = { family = "glibc", version = "2.34" }

[feature.gpu.dependencies]
pytorch = "==2.14.1"

[environments]
gpu = ["gpu"]
"""


def test_both_platform_forms_give_the_same_solve_inputs(tmp_path):
    from extforge.environment.lock import virtual_packages

    new = parse_manifest(PLATFORMS_FORM, tmp_path / "pixi.toml")
    old = parse_manifest(DEPRECATED_FORM, tmp_path / "pixi.toml")
    assert new.deprecations == [] and len(old.deprecations) == 1 and "[system-requirements] is deprecated" in old.deprecations[0]
    (gpu,) = new.env("gpu").platforms
    assert (gpu.name, gpu.subdir, gpu.cuda, gpu.glibc) == ("gpu", "linux-64", "13.0", "2.34")
    assert gpu.virtual["__cuda_arch"] == "9.0" and gpu.virtual["__custom"] == "1"
    assert new.env("cpu").platforms[0].cuda is None
    (migrated,) = old.env("gpu").platforms
    assert (migrated.subdir, migrated.cuda, migrated.glibc) == ("linux-64", "13.0", "2.34")
    names = lambda p: {(str(v.name.normalized), str(v.version)) for v in virtual_packages(p)}  # noqa: E731
    assert {("__cuda", "13.0"), ("__glibc", "2.34"), ("__linux", "4.18"), ("__unix", "0")} <= names(migrated)
    assert names(migrated) <= names(gpu)
    with pytest.raises(ExtforgeError, match="does not define"):
        parse_manifest(PLATFORMS_FORM.replace('platforms = ["gpu"]', 'platforms = ["tpu"]'), tmp_path / "pixi.toml").env("gpu")


def test_lock_warns_about_the_deprecated_form(tiny_packages, tmp_path, isolated_cache):
    channel = tmp_path / "ch"
    publish(tiny_packages.distinct[:2] + [tiny_packages.app], channel, audit=False)
    manifest = tmp_path / "pixi.toml"
    manifest.write_text(MANIFEST.replace('platforms = [{ platform = "linux-64", cuda = "13.0", glibc = "2.28" }]',
                                         'platforms = ["linux-64"]\n\n[system-requirements]\ncuda = "13.0"'))
    proc = _run("lock", "--manifest", str(manifest), f"--channel-map={INTERNAL}={channel.as_uri()}")
    assert proc.returncode == 0, proc.stderr
    assert "warning:" in proc.stderr and "[system-requirements] is deprecated" in proc.stderr
    assert stale_reasons(read_manifest(manifest), tmp_path / "pixi.lock") == []


def test_repository_manifests_are_in_the_platforms_form():
    repo = Path(__file__).resolve().parents[2]
    for path in [repo / "pixi.toml", *sorted((repo / "envs").glob("*/pixi.toml"))]:
        manifest = read_manifest(path)
        assert manifest.deprecations == [], path
        for name in manifest.env_names():
            assert all(p.cuda for p in manifest.env(name).platforms), (path, name)


def test_mirrors_leave_unknown_urls_alone():
    assert Mirrors().redirect("file:///x/noarch/a.conda") == "file:///x/noarch/a.conda"
    assert Mirrors({"https://a/b/": ["https://m/"]}).redirect("https://a/b/noarch/x") == "https://m/noarch/x"


CONDA_LOCK = "conda-lock==4.0.3"


@pytest.fixture(scope="session")
def conda_lock_bin() -> Path:
    """conda-lock from PyPI in a throwaway venv, cached per version (it is never imported here)."""
    import os
    import sys
    import urllib.request

    from extforge import paths
    from extforge.locking import exclusive

    venv = paths.cache_root() / "tools" / CONDA_LOCK.replace("==", "-")
    with exclusive(venv.with_name(venv.name + ".lock")):
        if not (venv / ".complete").exists():
            shutil.rmtree(venv, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            proc = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                                   CONDA_LOCK], capture_output=True, text=True)
            if proc.returncode != 0:
                index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple/")
                try:
                    urllib.request.urlopen(index, timeout=15).close()
                except OSError as exc:
                    pytest.skip(f"PyPI ({index}) is unreachable, so {CONDA_LOCK} cannot be installed: {exc}")
                pytest.fail(f"pip could not install {CONDA_LOCK}:\n{proc.stderr[-3000:]}")
            (venv / ".complete").touch()
    return venv / "bin" / "conda-lock"


def test_conda_lock_renders_our_explicit_list(tiny_packages, conda_lock_bin, tmp_path, monkeypatch):
    from .conftest import build_package

    monkeypatch.setenv("RATTLER_CACHE_DIR", str(tmp_path / "rattler-cache"))
    # "aa-top" sorts first by name but needs tiny-app: the order is topological, not by name.
    top = build_package(tmp_path / "build", "aa-top", run="tiny-app")
    channel = tmp_path / "ch"
    publish(tiny_packages.distinct[:2] + [tiny_packages.app, top], channel, audit=False)
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "pixi.toml").write_text(MANIFEST.replace('tiny-app = "*"', 'aa-top = "*"'))
    lock(read_manifest(ws / "pixi.toml"), ws / "pixi.lock", parse_channel_map([f"{INTERNAL}={channel.as_uri()}"], ws, "test"))
    ours = [line for line in (ws / "envs" / "app.explicit.txt").read_text().splitlines() if not line.startswith("#")]
    assert ours[0] == "@EXPLICIT" and [line.rsplit("/", 1)[1].split("-1.0")[0] for line in ours[1:]] == [
        "tiny-00", "tiny-01", "tiny-app", "aa-top"]
    document = YAML(typ="safe").load((ws / "envs" / "app.conda-lock.yml").read_text())
    assert document["version"] == 1 and [c["url"] for c in document["metadata"]["channels"]] == [INTERNAL]
    lock_doc = YAML(typ="safe").load((ws / "pixi.lock").read_text())
    hashes = {p["conda"]: (p["md5"], p["sha256"]) for p in lock_doc["packages"]}
    assert {p["url"]: (p["hash"]["md5"], p["hash"]["sha256"]) for p in document["package"]} == hashes

    out = tmp_path / "render"
    out.mkdir()
    proc = subprocess.run([str(conda_lock_bin), "render", "--kind", "explicit", "--platform", "linux-64",
                           str(ws / "envs" / "app.conda-lock.yml")], cwd=out, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    (rendered,) = out.glob("*.lock")
    theirs = [line for line in rendered.read_text().splitlines() if line.strip() and not line.startswith("#")]
    assert theirs == ours
