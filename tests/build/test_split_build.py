"""A split build (`extforge build --part I/N`, then `--link-parts N`): real rattler-build builds
whose script compiles four C units with gcc through extforge's launcher and a real ccache, as
torch's ninja build does with nvcc; the parts share the compile cache, the link job makes the
package from it. And whole builds share it from any output folder."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from extforge import compile_cache
from extforge.building import parts
from extforge.building.build import build_recipe
from extforge.building.build_options import BuildOptions
from extforge.errors import ExtforgeError

UNITS = ("alpha", "beta", "gamma", "delta")
RECIPE = (Path(__file__).parents[1] / "data" / "split-demo" / "recipe.yaml").read_text()
BROKEN = "      # @BROKEN@"


@pytest.fixture()
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ccache: str) -> tuple[Path, Path]:
    """A recipe folder and an empty channel; the compile cache under an EXTFORGE_CACHE of the test's own."""
    if shutil.which("ninja") is None or shutil.which("gcc") is None:
        pytest.skip("ninja and gcc are needed")
    monkeypatch.setenv("PATH", f"{Path(ccache).parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("EXTFORGE_CACHE", str(tmp_path / "cache"))
    channel = tmp_path / "channel"
    (channel / "noarch").mkdir(parents=True)
    return _recipe(tmp_path, RECIPE), channel


def _recipe(tmp_path: Path, text: str) -> Path:
    recipe = tmp_path / "split-demo"
    recipe.mkdir(parents=True, exist_ok=True)
    (recipe / "recipe.yaml").write_text(text)
    return recipe


def _build(recipe: Path, channel: Path, out: Path, part: parts.Part | None) -> tuple[list, list[str]]:
    notes: list[str] = []
    built = build_recipe(BuildOptions.make(recipe, [str(channel)], out, test=False, audit=False, part=part), notes=notes)
    return built, notes


def _symbols(package: Path, tmp_path: Path) -> set[str]:
    from extforge.archive import package_tars

    so = tmp_path / "libsplit.so"
    for tar in package_tars(package, "pkg"):
        for member in tar:
            if member.name == "lib/libsplit.so":
                so.write_bytes(tar.extractfile(member).read())  # type: ignore[union-attr]
    nm = subprocess.run(["nm", "-D", "--defined-only", str(so)], capture_output=True, text=True, check=True)
    return {line.split()[-1] for line in nm.stdout.splitlines() if " T " in line}


def test_two_parts_then_the_link_job_make_the_package_from_the_cache(site: tuple[Path, Path], tmp_path: Path) -> None:
    recipe, channel = site
    owners = {u: parts.owner(u, 2) for u in UNITS}
    assert set(owners.values()) == {1, 2}, "the test needs units in both parts"
    # Output folders of different lengths: rattler-build pads each host prefix's name differently.
    for i in (1, 2):
        out = tmp_path / f"part{i * 'i'}"
        built, notes = _build(recipe, channel, out, parts.Part(2, i))
        # A part makes no package and leaves no work folder: its objects are in the cache only.
        assert built == [] and not list(out.rglob("*.conda")) and not list((out / "bld").glob("rattler-build_*"))
        # Its log, ninja's log and the unit notes stay: the units it compiled, with their seconds.
        (units,) = (out / "logs").glob("*.units")
        assert sorted(line.split()[1] for line in units.read_text().splitlines() if line.startswith("compiled")) == \
            sorted(u for u, p in owners.items() if p == i)
        assert len(list((out / "logs").glob("*.ninja_log"))) == 1
        mine = sum(1 for p in owners.values() if p == i)
        assert re.fullmatch(rf"part {i} of 2: {mine} units? compiled into the compile cache \(0 were there already; "
                            rf"longest \d+ s\), {4 - mine} left to the other parts", *notes)

    built, notes = _build(recipe, channel, tmp_path / "link", parts.Part(2, parts.LINK))
    assert [p.name for p in built] == ["split-demo"]
    assert re.fullmatch(r"the link job of 2 parts: 4 units \(4 from the compile cache, 0 compiled here; longest \d+ s\)", *notes)
    assert _symbols(built[0].path, tmp_path) == {f"f_{u}" for u in UNITS}


def _cache_hits() -> int:
    stats = subprocess.run(["ccache", "--print-stats"], capture_output=True, text=True, check=True,
                           env={**os.environ, "CCACHE_DIR": str(compile_cache.placement("ccache").path)}).stdout
    counters = dict(line.split("\t") for line in stats.splitlines() if "\t" in line)
    return int(counters.get("direct_cache_hit", 0)) + int(counters.get("preprocessed_cache_hit", 0))


def test_builds_in_output_folders_of_any_depth_and_length_share_the_compile_cache(site: tuple[Path, Path],
                                                                                 tmp_path: Path) -> None:
    """Another admin's output folder, or another job's: the host prefix's padded name and the
    system headers' path relative to the build (by the folder's depth) must not reach the key."""
    recipe, channel = site
    _build(recipe, channel, tmp_path / "out", None)
    hits = _cache_hits()
    (built,), _ = _build(recipe, channel, tmp_path / "a" / "deeper" / "and-a-longer-name" / "out", None)
    assert _cache_hits() - hits == len(UNITS)
    assert _symbols(built.path, tmp_path) == {f"f_{u}" for u in UNITS}


def test_a_link_job_without_its_parts_compiles_what_the_cache_lacks(site: tuple[Path, Path], tmp_path: Path) -> None:
    recipe, channel = site
    _build(recipe, channel, tmp_path / "part1", parts.Part(2, 1))
    built, notes = _build(recipe, channel, tmp_path / "link", parts.Part(2, parts.LINK))
    done_by_part1 = sum(1 for u in UNITS if parts.owner(u, 2) == 1)
    assert re.fullmatch(rf"the link job of 2 parts: 4 units \({done_by_part1} from the compile cache, "
                        rf"{4 - done_by_part1} compiled here; longest \d+ s\)", *notes)
    assert _symbols(built[0].path, tmp_path) == {f"f_{u}" for u in UNITS}


def test_a_part_whose_unit_does_not_compile_fails_with_the_compilers_error(site: tuple[Path, Path], tmp_path: Path) -> None:
    _, channel = site
    # Broken in every part: whichever part owns it must fail, and say the compiler's words.
    broken = _recipe(tmp_path / "b", re.sub(rf"^{BROKEN}.*$", '      echo "int f_beta(int x) { return x +; }" > beta.c', RECIPE, flags=re.M))
    failures = []
    for i in (1, 2):
        try:
            _build(broken, channel, tmp_path / f"part{i}", parts.Part(2, i))
        except ExtforgeError as exc:
            failures.append((i, exc))
    assert [i for i, _ in failures] == [parts.owner("beta", 2)]
    log = next((tmp_path / f"part{failures[0][0]}" / "logs").glob("*.log")).read_text()
    assert "expected expression" in log and "building split-demo failed" in failures[0][1].render()


def test_a_split_build_without_a_compile_cache_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    if shutil.which("ccache") or shutil.which("sccache"):
        monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    channel = tmp_path / "channel"
    (channel / "noarch").mkdir(parents=True)
    recipe = _recipe(tmp_path, RECIPE)
    with pytest.raises(ExtforgeError) as exc:
        _build(recipe, channel, tmp_path / "out", parts.Part(2, 1))
    assert "needs a compile cache" in exc.value.what and "apt-get install ccache" in exc.value.fix


def test_parts_are_balanced_by_the_cost_data_and_the_rest_by_name(tmp_path: Path) -> None:
    costs = {"a": 10.0, "b": 9.0, "c": 5.0, "d": 4.0, "e": 1.0}
    assert parts.assignment(costs, 2) == {"a": 1, "b": 2, "c": 2, "d": 1, "e": 1}
    assert parts.parse_part("2/4") == parts.Part(4, 2)
    for bad in ("0/4", "5/4", "2", "a/b"):
        with pytest.raises(ExtforgeError):
            parts.parse_part(bad)
    # The launcher (shell) and owner() (Python) put a unit the cost data does not know in one part.
    script = parts.launcher(parts.Part(3, 1), "ccache", Path("/s"), Path("/a")).split()[1]
    for unit in ("flash_fwd_hdim128_bf16_sm90", "x", "rmsnorm_kernel"):
        state = tmp_path / unit
        state.mkdir()
        subprocess.run(["bash", script, "1", "3", "/dev/null", str(state), "", "true", "-c", f"{unit}.cu", "-o",
                        str(state / f"{unit}.o")], check=True)
        words = (state / "units").read_text().split()
        assert (words[0], words[1]) == ("compiled" if parts.owner(unit, 3) == 1 else "skipped", unit)
        assert words[0] == "compiled" or int(words[2]) == parts.owner(unit, 3)
