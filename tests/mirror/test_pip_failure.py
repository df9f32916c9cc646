"""A mirror whose `pip download` fails says what pip said: its ERROR: lines, the versions the index
has among them. Before, it showed the last line containing "rror" ("No matching distribution
found for torch==2.9.1+cu129"), without the versions pip listed or where a +cuXYZ torch is served.
"""

from __future__ import annotations

import os
import sys
import zipfile
from pathlib import Path

import pytest

from extforge.errors import ExtforgeError
from extforge.mirror.inputs import from_pip


def test_a_torch_the_index_lacks_is_named_with_pips_own_explanation(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    links = tmp_path / "links"
    links.mkdir()
    for version in ("2.9.0", "2.9.1"):
        with zipfile.ZipFile(links / f"torch-{version}-py3-none-any.whl", "w") as zf:
            zf.writestr(f"torch-{version}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n")
    monkeypatch.setenv("EXTFORGE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # this machine's pip settings (other indexes) stay out
    for name in [n for n in os.environ if n.startswith("PIP_") and n != "PIP_CONFIG_FILE"]:
        monkeypatch.delenv(name)
    with pytest.raises(ExtforgeError) as err:
        from_pip(["torch==2.9.1+cu129", "--no-index", "--find-links", str(links)], sys.executable)
    assert err.value.what == "pip could not download the wheels to mirror"
    assert "Could not find a version that satisfies the requirement torch==2.9.1+cu129 (from versions: 2.9.0, 2.9.1)" \
        in err.value.why
    assert "No matching distribution found for torch==2.9.1+cu129" in err.value.why
    assert "ERROR:" not in err.value.why and "[notice]" not in err.value.why
    assert err.value.fix.startswith("torch==2.9.1+cu129 is on PyTorch's own index: "
                                    "PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cu129 extforge mirror ...")
