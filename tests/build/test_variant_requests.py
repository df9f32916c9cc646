"""A variant a user asks for (--variant, -m, the recipe's files) is built exactly or refused before
anything compiles, with what the channel has and the command that adds the missing one; explain
knows those failures; the console output stays pasteable.

Each test starts from the user's command line (extforge's own `main`) and ends at the message.
The refusals need only the channel's variants.yaml (written here by the mirror's own writer) and
run in a second; the solve-failure test uses the real mirror channel's index.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from build_logs import build_log
from extforge.cli import main
from extforge.doctor.explain import explain_text
from extforge.mirror import rows

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "recipe" / "demo-ext"


def channel_of(folder: Path, builds: list[tuple[str, str, str, str]]) -> Path:
    """A mirror channel's variants.yaml for (python, pytorch, CUDA, ABI) rows, as `extforge mirror` writes it."""
    found: list[rows.Row] = []
    for py, torch, cuda, abi in builds:
        found = rows.merge(found, rows.Row({"python": py, "pytorch": torch, "cxx_abi": abi, "c_compiler": "gcc",
                                            "c_compiler_version": "12", "cxx_compiler": "gxx",
                                            "cxx_compiler_version": "12", "cuda_compiler": "cuda-nvcc",
                                            "cuda_compiler_version": cuda}))
    folder.mkdir(parents=True)
    (folder / "variants.yaml").write_text(rows.variants_yaml(found))
    return folder


@pytest.fixture
def one_python(tmp_path: Path) -> Path:
    """A channel holding one torch build: python 3.11, torch 2.14.1, CUDA 13.0 (the mirror's default)."""
    return channel_of(tmp_path / "mirror", [("3.11", "2.14.1", "13.0", "cxx11")])


def build(capsys: pytest.CaptureFixture[str], out: Path, *args: str) -> tuple[int, str]:
    """`extforge build recipe/demo-ext --output-dir OUT ARGS...`: exit code and stderr (stdout with --json)."""
    code = main(["build", str(DEMO), "--output-dir", str(out), *args])
    captured = capsys.readouterr()
    return code, captured.out if "--json" in args else captured.err


def nothing_built(out: Path) -> bool:
    """No package, and no work folder left behind."""
    return not list(out.glob("*/*.conda")) and not list(out.glob("bld/*"))


def test_a_variant_file_asking_for_a_python_the_channel_lacks_is_refused(tmp_path, one_python, capsys):
    """The issue's first case: -m with python 3.12 (cuda_archs given) used to build py311 with exit 0."""
    asked = tmp_path / "v.yaml"
    asked.write_text('python: ["3.12"]\ncuda_archs: ["9.0"]\n')
    code, err = build(capsys, tmp_path / "out", "-c", str(one_python), "-m", str(asked))
    assert code == 2 and nothing_built(tmp_path / "out")
    assert f"-m {asked} asks for python=3.12, which the channel cannot build: it has no python 3.12" in err
    assert "(python 3.11, pytorch 2.14.1, CUDA toolkit 13.0, C++ ABI cxx11, gcc 12, g++ 12)" in err
    assert (f"extforge mirror --channel {one_python} --from-pip --torch torch==2.14.1 --python /path/to/python3.12"
            in err)
    assert f'python: ["3.11"] in {asked}' in err


@pytest.mark.parametrize(
    ("variant", "lacks", "command"),
    [
        ("python=3.12", "it has no python 3.12", "--from-pip --torch torch==2.14.1 --python /path/to/python3.12"),
        ("pytorch=2.7.1", "it has no pytorch 2.7.1", "--from-pip --torch torch==2.7.1 --python /path/to/python3.11"),
        # The row's torch is a CUDA 13 build, which takes no 12.x toolkit: a torch built for it comes too.
        ("cuda_compiler_version=12.4", "it has no CUDA toolkit 12.4",
         "--from-wheels /path/to/wheels-with-a-torch-built-with-cuda-12.4-or-a-later-12.x --python /path/to/python3.11 "
         "--cuda-home /usr/local/cuda-12.4"),
        ("cxx_abi=cxx98", "it has no C++ ABI cxx98", "--from-wheels /path/to/wheels-with-a-cxx98-torch"),
    ],
)
def test_a_variant_override_the_channel_lacks_is_refused(tmp_path, one_python, capsys, variant, lacks, command):
    """The issue's third case: --variant python=3.12 reached the solver and its fix named --extra."""
    code, err = build(capsys, tmp_path / "out", "-c", str(one_python), "--variant", variant, "--json")
    assert code == 2 and nothing_built(tmp_path / "out")
    doc = json.loads(err)
    assert doc["error"] == f"--variant asks for {variant}, which the channel cannot build: {lacks}"
    assert command in doc["fix"] and "--extra" not in doc["fix"]
    key = variant.split("=")[0]
    assert f"--variant {key}=" in doc["fix"]


@pytest.mark.parametrize(("had", "asked", "same_torch"), [("12.4", "12.2", True), ("12.4", "12.4", True),
                                                         ("12.4", "12.8", False), ("12.4", "13.0", False),
                                                         ("13.0", "12.8", False), ("None", "13.0", False)])
def test_the_mirror_command_for_a_toolkit_is_one_the_toolkit_rule_accepts(had, asked, same_torch):
    """Suggesting --cuda-home 12.8 beside a CUDA 13 torch sent users to a mirror run that refuses it."""
    from extforge.cuda_rule import takes
    from extforge.recipes.variants import mirror_command

    row = {"python": "3.11", "pytorch": "2.14.1", "cuda_compiler_version": had, "cxx_abi": "cxx11"}
    words = shlex.split(mirror_command({"cuda_compiler_version": asked}, row, Path("/ch")))
    assert words[words.index("--cuda-home") + 1] == f"/usr/local/cuda-{asked}"
    assert ("--torch" in words and "torch==2.14.1" in words) is same_torch
    if same_torch:  # the row's torch took its toolkit, so its CUDA takes the one asked for
        assert takes(had, asked)
    else:
        assert words[words.index("--from-wheels") + 1].endswith(f"-cuda-{asked}-or-a-later-{asked.split('.')[0]}.x")


def test_one_missing_value_of_several_is_refused_not_dropped(tmp_path, one_python, capsys):
    code, err = build(capsys, tmp_path / "out", "-c", str(one_python), "--variant", "python=3.11,3.12")
    assert code == 2 and nothing_built(tmp_path / "out")
    assert "--variant asks for python=3.12, which the channel cannot build: it has no python 3.12" in err
    # A key the channel does not pin: a value the recipe's matrix lacks is refused the same way.
    from extforge.errors import ExtforgeError
    from extforge.recipes.variants import narrow
    with pytest.raises(ExtforgeError, match="--variant python=3.9 is not in the variant matrix"):
        narrow({"python": ["3.11", "3.12"], "pytorch": ["2.13", "2.14"]}, [["python", "pytorch"]],
               {"python": ["3.12", "3.9"]})


def test_a_combination_no_torch_build_has_is_refused(tmp_path, capsys):
    """Each value exists in some row, not together: python 3.10 is only with torch 2.9.1."""
    seed = channel_of(tmp_path / "seed", [("3.10", "2.9.1", "12.4", "cxx11"), ("3.12", "2.6.0", "12.4", "cxx98")])
    code, err = build(capsys, tmp_path / "out", "-c", str(seed), "--variant", "python=3.10", "--variant", "pytorch=2.6.0")
    assert code == 2 and nothing_built(tmp_path / "out")
    assert "asks for python=3.10, pytorch=2.6.0, which the channel cannot build" in err
    assert "holds 2 torch builds" in err and "python 3.12, pytorch 2.6.0" in err
    # What it may pick stays buildable: one row of the channel.
    from extforge.recipes.variants import resolve
    m = resolve(DEMO / "recipe.yaml", [str(seed)], [], {"python": ["3.12"], "pytorch": ["2.6.0"]})
    assert (m.values["cxx_abi"], m.values["cuda_compiler_version"]) == (["cxx98"], ["12.4"])


def test_rows_a_file_asks_for_that_the_channel_lacks_are_named(tmp_path, caplog):
    """A multi-row file (the offline matrix) is narrowed to the channel's rows, and says which it drops."""
    from extforge.recipes.variants import resolve

    channel = channel_of(tmp_path / "mirror", [("3.11", "2.14.1", "13.0", "cxx11")])
    offline = REPO / "recipe" / "flash-attn" / "variants-offline.yaml"
    m = resolve(REPO / "recipe" / "flash-attn" / "recipe.yaml", [str(channel)], [offline], {})
    assert m.values["python"] == ["3.11"] and m.values["pytorch"] == ["2.14.1"]
    (warning,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert "rows not built (the channel has no torch build for them)" in warning
    assert "python 3.12, pytorch 2.9.1" in warning


def test_an_undefined_variant_key_names_the_file_that_defines_it(tmp_path, one_python, capsys):
    """The issue's second case: -m without a key of the recipe's own variants.yaml (then demo-ext's
    cuda_archs, the build layer's now) gave a raw template error and a log of headers."""
    folder = tmp_path / "r"
    shutil.copytree(DEMO, folder)
    recipe = folder / "recipe.yaml"
    recipe.write_text(recipe.read_text().replace("TORCH_CUDA_ARCH_LIST: ${{ cuda_archs }}",
                                                 "TORCH_CUDA_ARCH_LIST: ${{ cuda_archs }}\n      DEMO_MODE: ${{ demo_mode }}"))
    (folder / "variants.yaml").write_text('demo_mode:\n  - "fast"\n')
    asked = tmp_path / "v.yaml"
    asked.write_text('python: ["3.11"]\n')
    out = tmp_path / "out"
    code = main(["build", str(folder), "--output-dir", str(out), "-c", str(one_python), "-m", str(asked)])
    err = capsys.readouterr().err
    assert code == 2 and nothing_built(out) and not (out / "logs").exists()
    assert f"the variant key `demo_mode` is undefined: {recipe} uses it in ${{{{ demo_mode }}}}" in err
    assert f"{folder / 'variants.yaml'} defines demo_mode, but -m FILE replaces the recipe's own variants.yaml" in err
    # The fix it names works: both files, the recipe's first.
    fix = err[err.index("(later files win): ") + len("(later files win): "):].split()
    from extforge.recipes.variants import render, resolve
    files = [Path(fix[i + 1]) for i, w in enumerate(fix) if w == "-m"]
    assert files == [folder / "variants.yaml", asked]
    (variant,) = render(recipe, resolve(recipe, [str(one_python)], files, {}))
    # The build string the recipe inherits from the build layer.
    assert variant.recipe.build.string.startswith("cuda130_torch214_py311_cxx11_h")


def test_a_key_no_file_defines_is_named_too(tmp_path, one_python):
    from extforge.errors import ExtforgeError
    from extforge.recipes.variants import render, resolve

    recipe = tmp_path / "r" / "recipe.yaml"
    recipe.parent.mkdir()
    recipe.write_text((DEMO / "recipe.yaml").read_text().replace("${{ cuda_archs }}", "${{ cuda_arch_list }}"))
    shutil.copytree(DEMO / "src", recipe.parent / "src")
    with pytest.raises(ExtforgeError, match="the variant key `cuda_arch_list` is undefined") as err:
        render(recipe, resolve(recipe, [str(one_python)], [], {}))
    assert "--variant cuda_arch_list=VALUE" in err.value.fix


def test_a_recipe_that_does_not_render_is_one_clear_error(tmp_path, one_python, capsys):
    recipe = tmp_path / "r" / "recipe.yaml"
    recipe.parent.mkdir()
    recipe.write_text((DEMO / "recipe.yaml").read_text().replace("${{ cuda_archs }}", "${{ cuda_archs | }}"))
    code = main(["build", str(recipe), "-c", str(one_python), "--output-dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and f"error: could not render {recipe}" in err and "Traceback" not in err


def test_build_help_says_m_replaces_the_recipe_variants(capsys):
    with pytest.raises(SystemExit):
        main(["build", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "REPLACES the recipe's own variants.yaml" in text and "-m RECIPE/variants.yaml -m FILE" in text


def test_a_solve_without_the_channel_variants_names_the_spec_and_the_fix(tmp_path, mirror_channel, capsys):
    """A channel without variants.yaml (not written by `extforge mirror`): the host solve fails
    before anything compiles; the message names the unmet spec, what the channel has and --python,
    and the log ends with it, so `extforge explain` recognises the log."""
    plain = tmp_path / "plain"
    plain.mkdir()
    for sub in ("linux-64", "noarch"):
        (plain / sub).symlink_to(mirror_channel / sub)
    pins = [f"{k}={v}" for k, v in (("python", "3.12"), ("pytorch", "2.14.1"), ("cuda_compiler_version", "13.0"),
                                    ("c_compiler", "gcc"), ("cxx_compiler", "gxx"), ("c_compiler_version", "12"),
                                    ("cxx_compiler_version", "12"), ("cuda_compiler", "cuda-nvcc"))]
    code, err = build(capsys, tmp_path / "out", "-c", str(plain), *[a for p in pins for a in ("--variant", p)])
    assert code == 2 and nothing_built(tmp_path / "out")
    assert "the channels have no package matching python 3.12.*" in err
    assert re.search(r"the channels have python 3\.11\.\d+; pytorch 2\.14\.1", err)
    assert f"extforge mirror --channel {plain}` (python: --python /path/to/pythonX.Y)" in err
    log = build_log(tmp_path / "out", "demo-ext")
    assert log.read_text().rstrip().endswith(err.rstrip().splitlines()[-1].strip())
    found = explain_text(log.read_text()).diagnoses
    assert found and found[0].id == "variant-not-in-channel" and "--python /path/to/pythonX.Y" in found[0].fix


@pytest.mark.parametrize(
    ("text", "sig", "in_fix"),
    [
        # What extforge build prints now, for the three paths of the issue.
        ("error: -m v.yaml asks for python=3.12, which the channel cannot build: it has no python 3.12\n"
         "  fix: add that build to the channel: extforge mirror --channel /ch --from-pip --torch torch==2.7.1 "
         "--python /path/to/python3.12; or ask for one the channel has (--variant python=3.13)",
         "variant-not-in-channel", "extforge mirror --channel /ch --from-pip --torch torch==2.7.1"),
        ("error: the variant key `cuda_archs` is undefined: recipe/demo-ext/recipe.yaml uses it in ${{ cuda_archs }}",
         "undefined-variant-variable", "-m RECIPE/variants.yaml -m FILE"),
        # What users paste from older versions and from rattler-build itself.
        ('Render error: Parse(JinjaError { message: "Template rendering failed: undefined value (in <string>:1) '
         '(template: ${{ cuda_archs }})", span: Span { start: None, end: None } })',
         "undefined-variant-variable", "--variant cuda_archs=VALUE"),
        ("error: no combination of packages in the channels satisfies: python 3.12.*, pip, setuptools, pytorch 2.7.1.*",
         "variant-not-in-channel", "--python /path/to/pythonX.Y"),
        ("Cannot solve the request because of: No candidates were found for python 3.12.*.",
         "variant-not-in-channel", "--torch torch==X.Y.Z"),
    ],
)
def test_explain_recognises_variant_failures(text, sig, in_fix):
    found = explain_text(text).diagnoses
    assert [d.id for d in found][:1] == [sig]
    assert in_fix in found[0].fix and "extforge doctor" not in found[0].fix


def test_piped_output_is_not_wrapped(tmp_path):
    """Through a pipe (tee, a CI log), a long path stays on one line, so it can be copied."""
    deep = channel_of(tmp_path / ("a-channel-folder-with-a-long-name-" * 3) / "mirror",
                      [("3.11", "2.14.1", "13.0", "cxx11")])
    env = dict(os.environ, COLUMNS="80")
    out = subprocess.run([sys.executable, "-m", "extforge", "build", str(DEMO), "-c", str(deep),
                          "--output-dir", str(tmp_path / "out"), "--variant", "python=3.12"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 2
    assert any(len(line) > 200 and f"--channel {deep} --from-pip" in line for line in out.stderr.splitlines())
    # A table (extforge status, verify --slurm) keeps its cells whole too.
    table = ("from rich.table import Table; from extforge.ui import console; t = Table(); t.add_column('log'); "
             f"t.add_row({str(deep)!r}); console.print(t)")
    out = subprocess.run([sys.executable, "-c", table], capture_output=True, text=True, env=env, timeout=60)
    assert str(deep) in out.stderr


def test_the_demo_echoes_commands_that_paste_back(tmp_path):
    """scripts/demo's step() prints each command; run through a shell, it gives back the same words."""
    demo = (REPO / "scripts" / "demo").read_text()
    step = demo[demo.index("step() {"):demo.index("\n}\n", demo.index("step() {")) + 3]
    words = ["/x/my env/bin/python", "-c", 'import torch; print("it\'s", torch.__file__)', "--map", "a=file:///b"]
    script = f"SUMMARY=()\n{step}\nstep title {' '.join(map(shlex.quote, words))} || true\n"
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)
    echoed = next(line[2:] for line in out.stderr.splitlines() if line.startswith("$ "))
    assert shlex.split(echoed) == words and "--map a=file:///b" in echoed


@pytest.mark.parametrize(
    ("verdict", "shown"),
    [("pass", "audit pass"), ("fail", "audit fail, kept aside (not in the output channel): run `extforge audit"), (None, "not audited (--no-audit)")],
)
def test_build_prints_the_audit_verdict(tmp_path, verdict, shown):
    from extforge.building.build import BuiltPackage
    from extforge.commands.build import built_line

    pkg = BuiltPackage(tmp_path / "demo-ext-0.1.0-x_0.conda", "demo-ext", "0.1.0", "x_0", "linux-64", verdict)
    assert built_line(pkg).startswith(f"built {pkg.path}; {shown}")


@pytest.mark.parametrize(("verdicts", "code"), [(["pass"], 0), ([None], 0), (["pass", "fail"], 1), (["fail"], 1)])
def test_build_exits_1_when_a_package_fails_its_audit(tmp_path, monkeypatch, capsys, verdicts, code):
    """A failed audit is a finding: CI that reads only the exit code must not go on to publish."""
    import extforge.building.build
    from extforge.building.build import BuiltPackage

    built = [BuiltPackage(tmp_path / f"demo-ext-0.1.0-x{i}_0.conda", "demo-ext", "0.1.0", f"x{i}_0", "linux-64", v)
             for i, v in enumerate(verdicts)]
    monkeypatch.setattr(extforge.building.build, "build_recipe", lambda options, on_step=None, notes=None, on_progress=None: built)
    assert main(["build", str(DEMO), "-c", str(tmp_path), "--output-dir", str(tmp_path / "out")]) == code
    assert capsys.readouterr().err.count("\nbuilt ") == len(verdicts)


def test_an_output_folder_whose_path_holds_a_space_is_refused_before_anything_is_built(tmp_path, one_python, capsys):
    out = tmp_path / "team builds" / "out"
    code, err = build(capsys, out, "-c", str(one_python))
    assert code == 2 and not out.exists()
    assert f"cannot build into {out}: its path holds a space" in err
    assert "pass an --output-dir whose path has no spaces" in err and "Traceback" not in err
