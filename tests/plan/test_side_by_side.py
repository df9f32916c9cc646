"""bench/build_side_by_side.py: phases from a build's output and its .ninja_log, the report, the
merge of two runs, and the per-unit costs it emits for the planner (synthetic logs, no GPU)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from extforge.planning import cost_store, unit_costs

BENCH = Path(__file__).resolve().parents[2] / "bench" / "build_side_by_side.py"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCH.parent))
    spec = importlib.util.spec_from_file_location("build_side_by_side", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


# ninja's clock starts at "Emitting ninja build file" (t = 40 s): edges 40.5 s .. 40 + 900 s.
NINJA_LOG = "# ninja log v5\n" + "".join(
    f"{start}\t{end}\t0\tbuild/temp.linux-x86_64-cpython-312/csrc/flash_attn/src/{name}.o\t{i:016x}\n"
    for i, (start, end, name) in enumerate([
        (500, 900000, "flash_bwd_hdim256_bf16_causal_sm80"),
        (510, 300000, "flash_fwd_hdim64_fp16_sm80"),
        (300100, 500000, "flash_fwd_split_hdim32_bf16_sm80"),
    ])
)
LINES = [
    (0.0, "running bdist_wheel"),
    (39.0, "torch.__version__  = 2.11.0"),
    (40.0, "building 'flash_attn_2_cuda' extension"),
    (41.0, "[1/3] /usr/local/cuda/bin/nvcc ..."),
    (941.0, "g++ -shared -Wl,-O1 build/temp.linux-x86_64-cpython-312/csrc/flash_attn/flash_api.o ... -o flash_attn_2_cuda.so"),
    (975.0, "copying build/lib.linux-x86_64-cpython-312/flash_attn_2_cuda.so -> build/bdist"),
    (990.0, "creating 'dist/flash_attn-2.8.3-cp312-cp312-linux_x86_64.whl'"),
]


def test_phases_of_a_plain_build(bench) -> None:
    edges = unit_costs.parse_ninja_log(NINJA_LOG)
    p = bench.phases(1000.0, LINES, edges)
    assert p == {"env set-up": 40.5, "compile": 899.5, "link": 35.0, "package": 25.0, "tests": 0.0, "audit": 0.0}
    assert sum(p.values()) == pytest.approx(1000.0)


def test_phases_of_a_recipe_build_with_tests_and_audit(bench) -> None:
    edges = unit_costs.parse_ninja_log(NINJA_LOG)
    lines = [(t + 100, line) for t, line in LINES]  # 100 s more of environment set-up
    p = bench.phases(1200.0, lines, edges, {"tests": 1110.0, "audit": 1160.0, "audit end": 1190.0})
    assert p["env set-up"] == 140.5 and p["compile"] == 899.5 and p["link"] == 35.0
    assert (p["package"], p["tests"], p["audit"]) == (35.0, 50.0, 30.0)


def test_a_log_without_ninja_is_refused(bench) -> None:
    with pytest.raises(ValueError, match="no ninja build"):
        bench.phases(10.0, [(0.0, "running build_ext")], unit_costs.parse_ninja_log(NINJA_LOG))


def _side(bench, side: str, wall: float, **units: float):
    return bench.Side(side, wall, {p: 1.0 for p in bench.PHASES}, units, "H100 node (16 cores, 125.9 GiB)", "2026-11-23",
                      {"MAX_JOBS": "16", "NVCC_THREADS": "1", "FLASH_ATTN_CUDA_ARCHS": "90"})


def test_two_runs_merge_into_one_report(bench, tmp_path: Path) -> None:
    (tmp_path / "plain.json").write_text(json.dumps([bench.asdict(_side(bench, "plain", 1004.0, a=300.0, b=200.0))]))
    (tmp_path / "recipe.json").write_text(json.dumps([bench.asdict(_side(bench, "recipe", 1034.1, a=310.0, b=190.0))]))
    sides = bench.load_sides([tmp_path / "recipe.json", tmp_path / "plain.json"])
    assert [s.side for s in sides] == ["plain", "recipe"]
    assert bench.ratio_line(sides) == ("full recipe/plain wall ratio: 1.03 (every head dim, H100 node (16 cores, "
                                       "125.9 GiB), 2026-11-23)")
    sides[1].settings["FLASH_ATTN_HEAD_DIMS"] = "128"
    assert bench.ratio_line(sides) == "recipe/plain wall ratio: 1.03 (head dims 128, H100 node (16 cores, 125.9 GiB), 2026-11-23)"
    rows = bench.table(sides)
    assert rows[0] == "| phase | plain s | recipe s |"
    assert "| summed per-unit compile s | 500 | 500 |" in rows
    assert bench.ratio_line(sides[:1]) is None


def test_emitted_costs_are_what_the_planner_reads(bench, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sdist = tmp_path / "unused.tar.gz"
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps([bench.asdict(_side(bench, "plain", 1004.0, flash_bwd_hdim128_fp16_sm80=250.0,
                                                    flash_fwd_hdim128_fp16_sm80=100.0))]))
    folder = tmp_path / "flash-attn"
    folder.mkdir()
    (folder / "recipe.yaml").write_text("context:\n  name: flash-attn\n  version: '2.8.3'\n")
    out = folder / cost_store.RECIPE_FILE
    monkeypatch.setattr(sys, "argv", [str(BENCH), str(sdist), "--merge", str(plain), "--emit-costs", str(out), "--no-record"])
    assert bench.main() == 0
    with cost_store.recipe_costs(folder):
        learned = cost_store.load("flash-attn", "2.8.3")
    assert learned is not None and learned.archs == ("90",) and learned.model is not None
    assert learned.host == "H100-node-(16-cores,-125.9-GiB)" and learned.model.measured.startswith("H100 node (16 cores")
    assert learned.costs().seconds() == {"flash_bwd_hdim128_fp16_sm80": 250.0, "flash_fwd_hdim128_fp16_sm80": 100.0}
    # What the recipe's data says of its units stays with them.
    assert learned.model.shards is not None


def test_the_timeline_keeps_every_line_and_mark_in_time_order(bench, tmp_path: Path) -> None:
    """Where the env set-up's seconds went is read from this file once the node is gone."""
    bench.write_timeline(tmp_path / "recipe-side.json", "recipe", [*LINES, (960.0, "== tests"), (2.5, "== solve")])
    text = (tmp_path / "recipe-side-recipe.timeline").read_text().splitlines()
    assert len(text) == len(LINES) + 2
    assert [float(line.split()[0]) for line in text] == sorted(float(line.split()[0]) for line in text)
    assert text[1] == "    2.50 == solve" and text[-3:] == ["  960.00 == tests", *(f"{t:8.2f} {line}" for t, line in LINES[-2:])]
    bench.write_timeline(None, "plain", LINES)  # no --json-out: nothing written, nothing fails
    assert sorted(p.name for p in tmp_path.iterdir()) == ["recipe-side-recipe.timeline"]
