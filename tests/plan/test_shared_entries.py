"""The cost data the planner learns from lies where other users write (the store, a build's work
folder): what it takes from there is typed and bounded, and a unit name that could mean something
to a shell never gets into the store or into a script's input. The planted-file cases, run as a
second user, are tests/security/test_shared_state.py."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from tests.plan.test_cost_store import ninja_log

from extforge.building import parts
from extforge.planning import cost_store


def test_the_split_log_takes_only_records_of_valid_values() -> None:
    """The old code took NaN seconds and any unit name, and crashed (RecursionError) on a deep line."""
    good = {"unit": "causal_conv1d_bwd", "parts": 2, "instantiations": 18, "seconds": [300.0, 340.0]}
    lines = [json.dumps(good), json.dumps({"unit": "fwd", "instantiations": 6}),
             json.dumps({"unit": "a$(id)", "instantiations": 4}),
             json.dumps({"unit": "nan_unit", "parts": 2, "instantiations": 4, "seconds": [float("nan"), 1.0]}),
             json.dumps({"unit": "many", "parts": 10**9, "instantiations": 4, "seconds": [1.0]}),
             json.dumps({"unit": "negative", "instantiations": -3}), json.dumps(["unit", "x"]),
             '{"unit": "deep", "instantiations": 4, "x": ' + "[" * 5000 + "]" * 5000 + "}", '{"unit": "torn", "inst']
    split = cost_store.read_split_log("\n".join(lines) + "\n")
    assert split.parts == {"causal_conv1d_bwd": 2} and list(split.seconds) == ["causal_conv1d_bwd"]
    assert split.limits == {"causal_conv1d_bwd": 18, "fwd": 6}


def test_a_unit_name_no_script_may_see_is_never_stored(tmp_path: Path, own_cost_store: Path,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    """A source file named like `a[$(id)].cu` (a planted ninja log, or upstream's own): the old
    code stored the name, and the next split build wrote it into the launcher's table."""
    log = tmp_path / ".ninja_log"
    log.write_text(ninja_log({"good": 10.0, "a[$(id)]": 5.0}, 2))
    with caplog.at_level(logging.WARNING, logger="extforge"):
        assert cost_store.learn_from_build("causal-conv1d", "1.7.0", log, ("90",), {"NVCC_THREADS": "1"}) is None
    assert "build costs of causal-conv1d 1.7.0 not stored: unit 'a[$(id)]' is not a unit name" in caplog.text
    assert not own_cost_store.exists()
    with pytest.raises(ValueError, match="is not a unit name"):
        parts.assignment_text({"good": 1, "x\ta[$(id)]": 2})
    assert parts.assignment_text({"good": 1, "seg@2": 2}) == "good\t1\nseg@2\t2\n"


def test_an_entry_out_of_its_bounds_is_ignored_with_one_warning(own_cost_store: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    """Read again by plan, a build's parts and its progress report, a bad entry is named once."""
    entry = json.loads((Path(__file__).resolve().parents[2] / "recipe" / "causal-conv1d" / cost_store.RECIPE_FILE).read_text())
    folder = own_cost_store / "causal-conv1d"
    folder.mkdir(parents=True)
    (folder / "1.7.0.json").write_text(json.dumps(entry | {"nvcc_threads": 10**6}))
    with caplog.at_level(logging.WARNING, logger="extforge"):
        for _ in range(3):
            assert cost_store.load("causal-conv1d", "1.7.0") is None
    assert caplog.text.count("ignoring the build-cost entry") == 1
    assert "nvcc_threads is 1000000, not a whole number from 1 to 1024" in caplog.text
    (folder / "1.7.0.json").write_text(json.dumps(entry))
    assert cost_store.load("causal-conv1d", "1.7.0") is not None
