"""docs/site-admin.md's `.condarc` for a site mirror, run as written with a real conda 26.7.1:
`conda env create -f` of the environment.yml `extforge lock` wrote (which names the internal
channel by its full URL and conda-forge by name), and `conda install -c extforge`. The site's
mirror host is replaced by a local folder; nothing else of the recipe changes.

conda comes from ../shared/tools/conda-from-source (about 45 s, once per checkout); without
../shared the test skips and says so."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from extforge.environment.lock import lock
from extforge.environment.manifest import read_manifest
from extforge.environment.mirrors import site_mirrors
from extforge.locking import exclusive
from extforge.publishing.publish import publish

REPO = Path(__file__).resolve().parents[2]
CONDA_FROM_SOURCE = REPO.parent / "shared" / "tools" / "conda-from-source"
SITE_MIRROR = "https://conda-mirror.site.example"
INTERNAL = "https://conda.internal.example/extforge"
CONDA_FORGE = "https://conda.anaconda.org/conda-forge"

MANIFEST = f"""\
[workspace]
name = "site"
channels = ["{INTERNAL}", "conda-forge"]
platforms = ["linux-64"]

[feature.app.dependencies]
tiny-app = "*"

[environments]
app = ["app"]
"""


def site_condarc(doc: Path = REPO / "docs" / "site-admin.md") -> str:
    """The `.condarc` block of the site admin guide, as written."""
    (block,) = re.findall(r"```yaml\n(# site-condarc.*?)```", doc.read_text(), re.S)
    return block


@pytest.fixture(scope="session")
def real_conda(fixtures_dir: Path) -> Path:
    if not CONDA_FROM_SOURCE.is_file():
        pytest.skip(f"no ../shared/tools/conda-from-source beside this checkout ({CONDA_FROM_SOURCE}): "
                    "the real-conda tests need it to set up conda 26.7.1")
    root = fixtures_dir / "conda-26.7.1"
    with exclusive(fixtures_dir / "conda-26.7.1.lock"):
        if not (root / "bin" / "conda").is_file():
            proc = subprocess.run([str(CONDA_FROM_SOURCE), str(root)], capture_output=True, text=True)
            assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return root


def _conda(root: Path, condarc: Path, tmp: Path, *args: str) -> subprocess.CompletedProcess:
    # A package cache of its own: the tiny packages are rebuilt every session under the same names.
    env = {**os.environ, "CONDARC": str(condarc), "CONDA_PKGS_DIRS": str(tmp / "pkgs")}
    return subprocess.run([str(root / "bin" / "conda"), *args], capture_output=True, text=True, env=env, timeout=600)


def _done(proc: subprocess.CompletedProcess) -> bool:
    """Whether conda finished its command. On a loaded machine conda's interpreter sometimes
    aborts after the command, while it shuts down ("Python runtime state: finalizing": a
    solver thread taking the GIL at exit); the exit status is then lost, so the caller
    checks the command's effect on the prefix instead of trusting or failing on it."""
    return proc.returncode == 0 or (proc.returncode < 0 and "Python runtime state: finalizing" in proc.stderr)


def test_the_site_condarc_redirects_both_channels(real_conda, tiny_packages, tmp_path):
    mirror = tmp_path / "mirror"
    publish(tiny_packages.distinct[:2], mirror / "conda-forge", audit=False)
    publish([tiny_packages.app], mirror / "extforge", audit=False)
    ws = tmp_path / "ws"
    (ws / ".pixi").mkdir(parents=True)
    (ws / "pixi.toml").write_text(MANIFEST)
    (ws / ".pixi" / "config.toml").write_text(
        f'[mirrors]\n"{CONDA_FORGE}" = ["{(mirror / "conda-forge").as_uri()}"]\n"{INTERNAL}" = ["{(mirror / "extforge").as_uri()}"]\n'
    )
    lock(read_manifest(ws / "pixi.toml"), ws / "pixi.lock", site_mirrors(ws))
    env_yml = ws / "envs" / "app.environment.yml"
    assert INTERNAL in env_yml.read_text()

    base = (real_conda / "condarc").read_text()
    recipe = site_condarc().replace(SITE_MIRROR, mirror.as_uri())
    condarc = tmp_path / "condarc"
    condarc.write_text(base + recipe)
    proc = _conda(real_conda, condarc, tmp_path, "env", "create", "-f", str(env_yml), "-p", str(tmp_path / "e1"))
    assert _done(proc), proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (tmp_path / "e1" / "share" / "tiny-app" / "data.txt").is_file()

    proc = _conda(real_conda, condarc, tmp_path, "create", "-p", str(tmp_path / "e2"))
    assert _done(proc) and (tmp_path / "e2" / "conda-meta").is_dir(), proc.stderr[-3000:]
    proc = _conda(real_conda, condarc, tmp_path, "install", "-p", str(tmp_path / "e2"), "-c", "extforge", "-c", "conda-forge", "tiny-app")
    assert _done(proc), proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (tmp_path / "e2" / "share" / "tiny-01" / "data.txt").is_file()

    # Without migrated_custom_channels (the guide's earlier recipe) the internal URL is fetched as is.
    condarc.write_text(base + re.sub(r"migrated_custom_channels:\n(  .*\n)+", "", recipe))
    proc = _conda(real_conda, condarc, tmp_path, "env", "create", "-f", str(env_yml), "-p", str(tmp_path / "e3"))
    assert proc.returncode != 0 and "conda.internal.example" in proc.stdout + proc.stderr
