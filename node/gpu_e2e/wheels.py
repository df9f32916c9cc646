"""`wheels`, after `finish`: the packages `finish` published, as wheels for a pip user on the node.

`extforge publish --wheels` makes each wheel of the same .conda (no second compile) into a wheel
index in the work folder (OUT starts empty on every call), one row per torch; pip installs them
from it (`--index-url file://.../torch2.11.0-cu130/simple`) into a venv holding the node's own
pip torch, and everything `finish` ran with the installed prefix's python runs with that venv's:
tests/gpu (the transformers checks among them), upstream's FA3 sample, the attention benchmark,
whose ratios are set beside the prefix's. `extforge audit WHEEL --against VENV` judges each
wheel in that venv.

The venv is a copy of the node python's own venv, hard links where the work folder shares its
file system (pip replaces files, never writes into them), else a plain copy: pip's torch stays
in the site-packages the wheel installs into, as in a user's env, so the wheel's search paths
(`$ORIGIN/../torch/lib`, `$ORIGIN/../nvidia/cu13/lib`) are what finds torch's libraries. A
`--system-site-packages` venv made by a venv's python would see the base interpreter's
site-packages, not the venv's; a `.pth` pointing at them would leave those search paths
unexercised; pip into the node's venv itself would change the upstream a later `start` mirrors.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

from .builds import tool_env
from .node import json_out, mib
from .phases import Options, bench_json, bundle_results, clean_env, extforge, gpu_tests, promised_archs
from .state import Run, StepFailed

WHERE = "pip venv"
# Each installed project's compiled modules, loaded by their own search paths before torch is
# imported (the conda package's module would find no libc10.so in a venv), then imported beside it.
LOAD = """
import ctypes, importlib, importlib.machinery, importlib.metadata as md, sys
modules = []
for project in sys.argv[1:]:
    for f in md.files(project) or []:
        if f.name.endswith(".so"):
            ctypes.CDLL(str(f.locate()))
        if f.name.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)):
            modules.append((project, md.version(project), ".".join([*f.parent.parts, f.name.split(".")[0]])))
assert modules, "no compiled module installed"
import torch
for project, version, module in modules:
    importlib.import_module(module)
    print(project, version, module, "loads beside torch", torch.__version__)
"""


def client_env() -> dict[str, str]:
    """pip as a user runs it, none of this node's pip configuration taking part."""
    env = {k: v for k, v in clean_env().items() if not k.startswith(("PIP_", "UV_"))}
    return env | {"PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}


def venv_prefix(python: str) -> Path | None:
    """The venv `python` runs in (its sys.prefix), None where it runs in none."""
    probe = subprocess.run([python, "-c", "import sys; print(sys.prefix); print(sys.base_prefix)"],
                           capture_output=True, text=True)
    prefix, base = (probe.stdout.split("\n") + ["", ""])[:2]
    return Path(prefix) if probe.returncode == 0 and prefix != base else None


def copy_venv(run: Run, python: str) -> str:
    """The node python's venv copied into the work folder (why a copy: the module's docstring); its python."""
    source = venv_prefix(python)
    if source is None:
        run.record("venv of the node's pip torch", 0, False,
                   f"{python} runs in no venv: pass --python with the python of the venv holding the node's pip torch")
        raise StepFailed("venv of the node's pip torch")
    venv = run.work / "wheel-venv"
    src, dest = shlex.quote(str(source)), shlex.quote(str(venv))
    copied = run.step(f"venv of the node's pip torch (a copy of {source})",
                      f"rm -rf {dest} && {{ cp -al {src} {dest} && echo 'hard links'; }} 2>/dev/null || "
                      f"{{ rm -rf {dest} && cp -a {src} {dest} && echo 'a copy (another file system, or files not ours "
                      "to link)'; }")
    pyx = str(venv / "bin" / Path(python).name)
    torch = run.step("the venv's torch is its own", [pyx, "-c", "import sys, torch; assert torch.__file__.startswith(sys.prefix), "
                     "torch.__file__; print(torch.__version__, torch.__file__)"], env=client_env())
    run.fact("wheel venv", f"{venv}, {copied.stdout.strip()} of {source} ({torch.stdout.strip().splitlines()[-1]})")
    return pyx


def published_wheels(stdout: str, index: Path) -> list[Path]:
    """The wheel files `extforge publish --wheels --json` put into the index."""
    return [index / w["file"] for w in json_out(stdout)["wheels"]["wheels"]]


def project_of(wheel: Path) -> str:
    """The index folder a wheel is served from: its project (…/simple/flash-attn/flash_attn-….whl)."""
    return wheel.parent.name


def phase_wheels(run: Run, o: Options) -> None:
    work, py = run.work, o.python
    env = tool_env(work)
    packages = run.state.get("published", [])
    if not packages:
        run.record("packages published by finish", 0, False, "run `finish` first: the wheels are made of what it published")
        raise StepFailed("packages published by finish")
    index = work / "wheels"
    # This run's own index, made anew: a wheel remade by a mended extforge keeps its file name,
    # and an index refuses a name it holds with other bytes.
    shutil.rmtree(index, ignore_errors=True)
    # One package at a time: a wheel refused (its binary needs a newer libstdc++ than any
    # manylinux policy allows, say) is a finding of its own, and the others are still tested.
    wheels: list[Path] = []
    for package in packages:
        name = Path(package).name.rsplit("-", 2)[0]
        published = run.step(f"publish the {name} wheel (extforge publish --wheels)",
                             extforge(py, "publish", package, "--wheels", str(index), "--upstream", str(work / "mirror"),
                                      "--json"), env=env, log=f"wheels-publish-{name}.json", critical=False)
        if published.returncode == 0:
            wheels += published_wheels(published.stdout, index)
    if not wheels:
        raise StepFailed("publish the wheels")
    run.fact("wheels", "; ".join(f"{w.name} ({mib(w.stat().st_size)})" for w in wheels))
    rows = sorted({w.relative_to(index).parts[0] for w in wheels})
    if len(rows) != 1:
        run.record("one torch row", 0, False, f"the packages pin several torches ({', '.join(rows)}); one venv holds one")
        raise StepFailed("one torch row")
    pyx = copy_venv(run, py)
    projects = [project_of(w) for w in wheels]
    url = (index / rows[0] / "simple").as_uri()
    run.step(f"pip install {' '.join(projects)} --index-url {url}",
             [pyx, "-m", "pip", "install", "--no-cache-dir", "--index-url", url, *projects], env=client_env())
    run.step("pip check (the wheel venv)", [pyx, "-m", "pip", "check"], env=client_env(), critical=False)
    run.step("the wheels' modules load by their own search paths", [pyx, "-c", LOAD, *projects], env=client_env())
    venv = Path(pyx).parent.parent
    for wheel, project in zip(wheels, projects):
        run.step(f"audit the {project} wheel against the pip venv",
                 extforge(py, "audit", str(wheel), "--against", str(venv), *promised_archs(o, project), "--json"),
                 env=env, log=f"audit-wheel-{project}.json", critical=False)
    gpu_tests(run, o, env, pyx, WHERE)
    compare_benchmarks(run)
    bundle_results(run)


def bench_ratios(path: Path) -> dict[str, float]:
    """The attention benchmark's ratios to SDPA on its reference case (flash-attn forward; FA3
    forward and forward+backward where timed)."""
    if not path.exists():
        return {}
    verdict = json.loads(path.read_text()).get("verdict", {})
    ratios = {"flash-attn/SDPA fwd": verdict.get("ratio")}
    ratios |= {f"FA3/SDPA {mode.replace('_', '+')}": v.get("ratio") for mode, v in (verdict.get("fa3") or {}).items()}
    return {k: v for k, v in ratios.items() if isinstance(v, float)}


def compare_benchmarks(run: Run) -> None:
    """The wheel venv's benchmark ratios beside the prefix's, from the same node and run."""
    logs = run.work / "logs"
    conda, wheel = bench_ratios(logs / bench_json()), bench_ratios(logs / bench_json(WHERE))
    if wheel:
        run.fact("attention benchmark, conda prefix vs pip venv (wheels)", "; ".join(
            f"{k} {conda[k]:.3f} vs {v:.3f} ({v / conda[k] - 1:+.1%})" if k in conda else f"{k} {v:.3f} (the prefix: not timed)"
            for k, v in wheel.items()))
