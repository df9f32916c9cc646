"""From facts to findings: pure logic, so each rule is tested with facts written by hand."""

from __future__ import annotations

import os
from collections.abc import Sequence

from .extensions import ExtensionSpec, known, spec_for
from .model import ExtensionFacts, Facts, Finding, Nvcc


def major_minor(version: str | None) -> tuple[int, int] | None:
    if not version:
        return None
    parts = version.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    except ValueError:
        return None


def build_nvcc(facts: Facts) -> Nvcc | None:
    """The nvcc a torch extension build runs: $CUDA_HOME/bin/nvcc as torch resolves CUDA_HOME."""
    want = facts.cuda_home.nvcc if facts.cuda_home else None
    if not want:
        return None
    real = os.path.realpath(want)
    return next((n for n in facts.nvccs if n.path == want or (n.real_path or n.path) == real), None)


def best_nvcc(facts: Facts) -> Nvcc | None:
    """The toolkit a build should use: torch's CUDA major.minor, else its major, else the newest."""
    usable = [n for n in facts.nvccs if n.toolkit_root and major_minor(n.version)]
    if not usable:
        return None
    want = major_minor(facts.torch.cuda) if facts.torch else None

    def rank(n: Nvcc) -> tuple[int, tuple[int, int]]:
        mm = major_minor(n.version) or (0, 0)
        return (2 if mm == want else 1 if want and mm[0] == want[0] else 0, mm)

    return max(usable, key=rank)


def use_toolkit(n: Nvcc) -> str:
    return f"export CUDA_HOME={n.toolkit_root} PATH={n.toolkit_root}/bin:$PATH"


def diagnose(facts: Facts, extensions: Sequence[ExtensionSpec] | None = None) -> list[Finding]:
    """`extensions`: the packages whose builds and installs are judged (default: the data's)."""
    specs = known() if extensions is None else tuple(extensions)
    findings: list[Finding] = []
    for rule in (_torch, _driver, _compiler, _compile_cache):
        findings.extend(rule(facts))
    findings += _nvcc(facts, specs)
    for ext in facts.extensions:
        findings += _extension(ext, next((s for s in specs if s.name == ext.name), None) or spec_for(ext.name))
    order = {"error": 0, "warning": 1, "info": 2}
    return sorted(findings, key=lambda f: order[f.severity])


def _compile_cache(facts: Facts) -> list[Finding]:
    cc = facts.compile_cache
    if cc is None or cc.use != "refused":
        return []
    return [Finding("warning", f"builds compile without the compile cache: {cc.why}",
                    "a compile cache folder someone else made or can reach could hand their objects to your builds; "
                    "a build in parts refuses to run without the cache", cc.fix)]


def _torch(facts: Facts) -> list[Finding]:
    t = facts.torch
    if t is None or t.cuda:
        return []
    return [
        Finding(
            "warning",
            f"torch {t.version} is a CPU build",
            "torch.version.cuda is None: CUDA extensions cannot be built or run against it.",
            "install a CUDA build of torch, e.g. pip install torch --index-url https://download.pytorch.org/whl/cu130",
        )
    ]


def _install_toolkit(cuda: str | None) -> str:
    version = f" {cuda}" if cuda else ""
    return (
        f"install the CUDA toolkit{version} (e.g. conda install -c nvidia cuda-nvcc{'=' + cuda if cuda else ''}) "
        "and run: export CUDA_HOME=<its root> PATH=<its root>/bin:$PATH"
    )


def _nvcc(facts: Facts, specs: Sequence[ExtensionSpec]) -> list[Finding]:
    tc = facts.torch.cuda if facts.torch else None
    torch_cuda = major_minor(tc)
    home = facts.cuda_home
    if home is None:  # not probed
        return []
    used = build_nvcc(facts)
    best = best_nvcc(facts)
    out: list[Finding] = []
    if used is None or used.version is None:
        if torch_cuda is None and not facts.nvccs:
            return []
        where = home.nvcc or "no CUDA_HOME"
        why = f"torch resolves CUDA_HOME to {home.path} ({home.reason})" if home.path else home.reason
        out.append(
            Finding(
                "error" if torch_cuda else "warning",
                "no working nvcc for extension builds",
                f"{why}, but {where} does not run. Builds of CUDA extensions fail before compiling.",
                use_toolkit(best) if best else _install_toolkit(tc),
            )
        )
        return out
    mm = major_minor(used.version)
    assert mm is not None
    if best is not None and major_minor(best.version) != mm:
        fix = use_toolkit(best)
    elif torch_cuda and torch_cuda != mm:
        fix = _install_toolkit(tc)
    else:
        fix = use_toolkit(best) if best else _install_toolkit(tc)
    via = f"CUDA_HOME={home.path} ({home.reason})"
    # The extension whose build refuses the most toolkits speaks for them all.
    strictest = max((s for s in specs if s.min_nvcc and mm < s.min_nvcc), key=lambda s: s.min_nvcc or (0, 0), default=None)
    if strictest and strictest.min_nvcc:
        out.append(
            Finding(
                "error",
                f"the nvcc builds use is CUDA {used.version}, older than {'.'.join(map(str, strictest.min_nvcc))}",
                f"{used.path} is the build's nvcc ({via}); {strictest.name}'s setup.py stops with "
                f"\"{strictest.min_nvcc_refusal}\".",
                fix,
            )
        )
    elif torch_cuda and mm[0] != torch_cuda[0]:
        out.append(
            Finding(
                "error",
                f"nvcc {used.version} does not match torch's CUDA {tc}",
                f"{used.path} is the build's nvcc ({via}); torch.utils.cpp_extension refuses a different "
                "CUDA major version (\"The detected CUDA version ... mismatches the version that was used "
                "to compile PyTorch\").",
                fix,
            )
        )
    elif torch_cuda and mm != torch_cuda:
        out.append(
            Finding(
                "warning",
                f"nvcc {used.version} differs from torch's CUDA {tc} in the minor version",
                f"{used.path} is the build's nvcc ({via}); torch only warns, and kernels built with it usually "
                "load, but the exact toolkit avoids surprises.",
                fix,
            )
        )
    if home.path and not home.has_headers:
        out.append(
            Finding(
                "warning",
                f"CUDA_HOME resolves to {home.path}, which has no include/cuda_runtime.h",
                f"torch derives CUDA_HOME from {home.reason} and compiles with -I{home.path}/include and "
                f"links with -L{home.path}/lib(64); host code that includes CUDA headers or links cudart fails.",
                fix,
            )
        )
    first_on_path = next((n for n in facts.nvccs if any(v.startswith("PATH[") for v in n.found_via)), None)
    if first_on_path and first_on_path.version and first_on_path.version != used.version:
        out.append(
            Finding(
                "warning",
                f"the nvcc on PATH ({first_on_path.version}) is not the one builds use ({used.version})",
                f"`nvcc` runs {first_on_path.path}, while torch builds run {used.path}; CMake projects and "
                "manual checks (nvcc -V) see the other toolkit.",
                fix,
            )
        )
    return out


def _driver(facts: Facts) -> list[Finding]:
    d, t = facts.driver, facts.torch
    if d is None:
        return []
    if d.driver_version is None:
        return [
            Finding(
                "info",
                "no NVIDIA driver on this machine",
                f"{d.source}. Building needs no GPU; running CUDA kernels does.",
                "run GPU checks on a GPU node: srun --gres=gpu:1 extforge doctor",
            )
        ]
    out: list[Finding] = []
    need, have = major_minor(t.cuda if t else None), major_minor(d.max_cuda)
    if need and have and need > have:
        same_major = need[0] == have[0]
        out.append(
            Finding(
                "warning" if same_major else "error",
                f"driver {d.driver_version} supports CUDA up to {d.max_cuda}; torch needs {t.cuda if t else ''}",
                "CUDA minor version compatibility lets most kernels run, but PTX JIT and new APIs fail."
                if same_major
                else "the CUDA runtime refuses to start: \"CUDA driver version is insufficient for CUDA runtime version\".",
                f"update the NVIDIA driver to one supporting CUDA {t.cuda if t else ''}, or install a torch built for CUDA <= {d.max_cuda}",
            )
        )
    if t and t.arch_list:
        for gpu in d.gpus:
            if gpu.sm not in t.arch_list:
                out.append(
                    Finding(
                        "error",
                        f"torch {t.version} has no kernels for {gpu.name} ({gpu.sm})",
                        f"torch was built for {' '.join(t.arch_list)}; CUDA calls fail with "
                        "\"no kernel image is available for execution on the device\".",
                        f"install a torch build that lists {gpu.sm} in torch.cuda.get_arch_list()",
                    )
                )
    return out


def _compiler(facts: Facts) -> list[Finding]:
    c, t = facts.compiler, facts.torch
    if c is None:
        return []
    if c.path is None:
        return [
            Finding(
                "error" if t and t.cuda else "warning",
                f"no C++ compiler: {c.command} is not on PATH",
                "torch.utils.cpp_extension compiles host code with $CXX (default c++).",
                "install g++ (apt install g++, or conda install gxx) or set CXX",
            )
        ]
    out: list[Finding] = []
    if c.shared_libstdcxx is None:
        out.append(Finding(
            "warning",
            f"{c.command} links libstdc++ statically: it finds no libstdc++.so",
            f"`{c.path} -print-file-name=libstdc++.so` names no file, so every extension built with it "
            "(pip install flash-attn, torch.utils.cpp_extension) embeds and exports its own C++ runtime "
            "beside the libstdc++.so.6 torch loads; `extforge audit` refuses such a module.",
            "export CXX=/usr/bin/g++ CC=/usr/bin/gcc (or any g++ whose -print-file-name=libstdc++.so prints a path)",
        ))
    if t and c.default_cxx11_abi is not None and c.default_cxx11_abi != t.cxx11_abi:
        flag = int(t.cxx11_abi)
        return out + [
            Finding(
                "warning",
                f"{c.command} defaults to _GLIBCXX_USE_CXX11_ABI={int(c.default_cxx11_abi)}, torch uses {flag}",
                "torch.utils.cpp_extension passes torch's flag, so extensions built through it match; "
                "C++ built any other way (CMake, a static library linked in) gets the compiler's default and "
                "fails at import with an `undefined symbol` naming std::string.",
                f'export CXXFLAGS="-D_GLIBCXX_USE_CXX11_ABI={flag} $CXXFLAGS"',
            )
        ]
    return out


def _extension(ext: ExtensionFacts, spec: ExtensionSpec | None) -> list[Finding]:
    reinstall = spec.reinstall.format(version=ext.version) if spec else ""
    package = spec.package if spec else ext.name
    generic = any(tag.endswith("-none-any") for tag in ext.wheel_tags)
    if ext.extension is None:
        how = f"a generic wheel ({', '.join(ext.wheel_tags)})" if generic else f"installed by {ext.installer}"
        return [
            Finding(
                "error",
                f"{ext.name} {ext.version} has no {ext.module} extension",
                f"the package is {how} and ships Python code only, or its build failed or was skipped; "
                f"`import {package}` raises \"No module named '{ext.module}'\".",
                reinstall,
            )
        ]
    if ext.audit_verdict and ext.audit_verdict != "pass":
        return [
            Finding(
                "error",
                f"{ext.name} {ext.version} fails the audit against the installed torch ({ext.audit_verdict})",
                "; ".join(ext.audit_problems) or "see: extforge audit " + ext.extension,
                reinstall,
            )
        ]
    return []
