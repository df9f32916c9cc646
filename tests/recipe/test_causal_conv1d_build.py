"""causal-conv1d 1.7.0 from its PyPI sdist, built for sm_90 against the mirror's torch 2.14.1 as
any site builds it: recipe/causal-conv1d is `extforge recipe new`'s recipe, the layer does the
rest. Upstream's setup.py compiles for 9 archs and downloads a prebuilt wheel unless told not
to; its backward unit is most of the build. The GPU side (upstream's tests against the installed
package) runs on a node: node/extensions.sh."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from extforge.planning import cost_store
from package_files import package_member


@pytest.mark.slow
def test_causal_conv1d_builds_for_the_variants_arch_with_its_long_unit_in_parallel_parts(
        causal_conv1d_build: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The build's cost store started empty (causal_conv1d_build): the recipe's build-costs.json planned it.
    (pkg,) = sorted((causal_conv1d_build / "channel" / "linux-64").glob("causal-conv1d-*.conda"))
    stamp = json.loads(package_member(pkg, "share/extforge/audit/causal-conv1d.json"))
    assert stamp["verdict"] == "pass" and pkg.name.startswith("causal-conv1d-1.7.0-cuda130_torch214_py311_cxx11_")
    record = json.loads(package_member(pkg, "share/extforge/build/causal-conv1d.json"))
    # Upstream's 9 archs became the variant's one: the audit passed a package of sm_90 code only.
    assert record["cuda_archs"] == ["sm_90"] and "arch: -gencode arch=compute_75,code=sm_75" in record["upstream_flags_replaced"]
    assert stamp["sass_archs"] == ["sm_90"] and not stamp.get("ptx_archs")
    # No download: the build ran without network, upstream's switch set from data.
    assert record["network"] in ("namespace", "proxy")
    # The backward unit compiled as parts, joined into the one object the extension links.
    (split,) = record["split_units"]
    assert split["unit"] == "causal_conv1d_bwd" and split["parts"] >= 2 and split["instantiations"] == 18
    assert "compiled_whole" not in split and len(split["seconds"]) == split["parts"]
    # What the build taught the site's store: the unit whole, and which units could be split.
    monkeypatch.setenv(cost_store.STORE_ENV, str(causal_conv1d_build / "cost-store"))
    learned = cost_store.load("causal-conv1d", "1.7.0")
    assert learned is not None and learned.part_limits == {"causal_conv1d_bwd": 18, "causal_conv1d_fwd": 18,
                                                           "causal_conv1d_update": 9}
    split_log = next((causal_conv1d_build / "channel" / "logs").glob("causal-conv1d-*.split.log")).read_text()
    assert '"parts": ' in split_log
