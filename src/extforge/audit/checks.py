"""The per-module checks: libraries, symbols, C++ ABI, GPU code, platform floor."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from ..fatbin import arch_coverage, arch_sets, gencode, parse_fatbin
from .abi import AbiEvidence, abi_evidence, uses_old_string
from .demangle import demangle_all
from .elf import ElfObject, Symbol
from .glibc import baseline, exceeds, floors
from .platforms import SUBDIRS, describe_elf, runs_on
from .policy import is_torch_library, owner_library, policy
from .report import Finding, ModuleFacts
from .resolve import Resolution, Resolver, TargetEnv
from .search_paths import Placement, search_path_findings

_RUNTIME_LIBS = ("libstdc++.so", "libgcc_s.so", "libc.so", "libm.so")
# Mangled names in the runtime's namespaces: std (St, and the abbreviations Sa Sb Ss Si So Sd)
# and __gnu_cxx.
# Names in namespace std (or __gnu_cxx), and their transactional-memory clones (_ZGTt).
STD_MANGLED = re.compile(r"_Z(?:GTt)?(?:NK?)?(?:S[tabsiod]|9__gnu_cxx)")


@dataclass
class Context:
    """What every module of one audit is checked against."""

    env: TargetEnv
    resolver: Resolver
    archs: list[str] | None  # promised GPU archs ("sm_90"); None: report only
    glibc: str | None  # the node's glibc floor; None: report only
    subdir: str | None = None  # the platform the modules must run on ("linux-64"); None: unknown
    # The archs are the build's exact code list (the build record of extforge's build layer):
    # code for any other arch is a finding too (upstream's own -gencode got through).
    exact_archs: bool = False
    wheel: bool = False  # the modules come from a wheel: its fixes are pip's, not a recipe's


@dataclass
class ModuleAudit:
    facts: ModuleFacts
    findings: list[Finding]
    target_cxx11_abi: bool | None  # of the C++ libraries this module links to in the target


def audit_module(ctx: Context, obj: ElfObject, rel: str, is_extension: bool, where: Placement) -> ModuleAudit:
    findings: list[Finding] = machine_findings(ctx, obj, rel)
    tags = [("RPATH", obj.rpath), ("RUNPATH", obj.runpath), ("NEEDED", [n for n in obj.needed if "/" in n])]
    findings += search_path_findings(rel, tags, where)
    resolution = ctx.resolver.resolve(obj)
    runtime = [n for n in policy()["cxx_runtime_markers"] if n in obj.exports]
    # A static libstdc++ brings both string ABIs' std:: instantiations of its own (the dual-ABI
    # locale shims): evidence of the runtime, not of how the module's code was compiled.
    exports = [n for n in obj.exports if not (runtime and STD_MANGLED.match(n))]
    evidence = abi_evidence([s.name for s in obj.undefined] + exports)
    target_abi, abi_source = target_cxx11_abi(ctx, resolution)
    facts = ModuleFacts(
        path=rel, is_extension=is_extension, needed=list(obj.needed), cxx11_abi=evidence.cxx11_abi,
        floors=floors(v for versions in obj.version_needs.values() for v in versions),
        undefined=len(obj.undefined), unresolved=len(resolution.unresolved),
    )
    findings += library_findings(rel, resolution)
    abi = abi_findings(rel, evidence, target_abi, abi_source, resolution.unresolved)
    # The ABI finding names the unresolved symbol that breaks loading: one defect, reported once.
    explained = {f.symbol for f in abi if f.severity == "error"}
    findings += [f for f in symbol_findings(ctx, rel, resolution, evidence.cxx11_abi, target_abi) if f.symbol not in explained]
    findings += runtime_findings(rel, runtime, len(obj.exports) - len(exports))
    findings += abi
    findings += init_findings(obj, rel, is_extension)
    findings += gpu_findings(ctx, obj, rel, facts)
    findings += platform_findings(ctx, obj, rel, facts, resolution)
    return ModuleAudit(facts, findings, target_abi)


def init_findings(obj: ElfObject, rel: str, is_extension: bool) -> list[Finding]:
    """Python imports `foo.cpython-311-x86_64-linux-gnu.so` by calling its PyInit_foo; a module
    that defines the init function of another name (built under one name, shipped under another)
    cannot be imported."""
    if not is_extension:
        return []
    name = rel.rsplit("/", 1)[-1].split(".", 1)[0]
    defined = sorted(n for n in obj.exports if n.startswith(("PyInit_", "PyInitU_")))
    if not defined or f"PyInit_{name}" in defined or any(n.startswith("PyInitU_") for n in defined):
        return []  # no init function at all is a library named like a module; PyInitU_ is a non-ASCII name
    return [Finding(
        "error", "symbols", f"{rel} defines {', '.join(defined[:3])}, not PyInit_{name}: `import {name}` fails",
        module=rel, symbol=f"PyInit_{name}",
        cause="the module was compiled under another name than its file's (PYBIND11_MODULE / TORCH_EXTENSION_NAME "
              "differ from the file name) or renamed after the build; Python says 'dynamic module does not define "
              "module export function'",
        fix=f"build it with the module name {name} (PYBIND11_MODULE({name}, m), TORCH_EXTENSION_NAME={name}), "
            "or name the file after the module it defines",
    )]


def machine_findings(ctx: Context, obj: ElfObject, rel: str) -> list[Finding]:
    if ctx.subdir not in SUBDIRS or runs_on(ctx.subdir, obj.machine, obj.elfclass, obj.little_endian):
        return []
    want = SUBDIRS[ctx.subdir]
    return [Finding(
        "error", "platform",
        f"{rel} is {describe_elf(obj.machine, obj.elfclass, obj.little_endian)} code; {ctx.subdir} runs "
        f"{want.describe()}",
        module=rel,
        cause="it was compiled for another CPU (a cross-compiler, or a file copied from another platform's build)",
        fix=f"build it on (or for) {ctx.subdir}, or publish it under the platform it was built for",
    )]


def library_findings(rel: str, resolution: Resolution) -> list[Finding]:
    return [
        Finding("error", "libraries",
                f"{rel}: {name} (needed by {by}) is not found in the target environment",
                module=rel, library=name,
                cause="the target lacks a library the module was linked against",
                fix="install the package that provides it into the target, or audit against the right prefix "
                    "(--against PREFIX)")
        for name, by in resolution.missing
    ]


def _expected_library(sym: Symbol, demangled: str) -> str | None:
    return sym.from_file or owner_library(demangled)


def classify(sym: Symbol, demangled: str, library: str | None, module_abi: bool | None,
             target_abi: bool | None, absent: set[str]) -> str:
    """'absent', 'versioned', 'abi', 'torch_skew' or 'missing': the likely reason a symbol is unresolved."""
    if library in absent:
        return "absent"
    if sym.version:
        return "versioned"
    strings = uses_old_string(demangled) or "__cxx11" in demangled
    if strings and module_abi is not None and target_abi is not None and module_abi != target_abi:
        return "abi"
    if library and is_torch_library(library):
        return "torch_skew"
    return "missing"


def symbol_findings(ctx: Context, rel: str, resolution: Resolution, module_abi: bool | None,
                    target_abi: bool | None) -> list[Finding]:
    names = demangle_all(s.name for s in resolution.unresolved)
    texts = policy()
    fixes = texts["fixes"] | (texts["wheel_fixes"] if ctx.wheel else {})
    absent = {name for name, _by in resolution.missing}
    findings = []
    for sym in resolution.unresolved:
        demangled = names[sym.name]
        library = _expected_library(sym, demangled)
        kind = classify(sym, demangled, library, module_abi, target_abi, absent)
        values = {"module_abi": _abi_int(module_abi), "target_abi": _abi_int(target_abi),
                  "target_abi_int": _abi_int(target_abi), "target_abi_bool": str(target_abi).upper(),
                  "library": library or "its library",
                  "torch": ctx.env.torch or "unknown", "version": sym.version or ""}
        shown = f"{demangled}@{sym.version}" if sym.version else demangled
        findings.append(Finding(
            "error", "symbols", f"{rel}: unresolved {shown}", module=rel, symbol=shown, library=library,
            cause=texts["causes"][kind].format(**values), fix=fixes[kind].format(**values),
        ))
    if resolution.assumed_interpreter:
        findings.append(Finding("info", "symbols",
                                f"{rel}: {len(resolution.assumed_interpreter)} Python C-API symbol(s) "
                                "left to the loading interpreter (the target has no bin/python)", module=rel))
    return findings


def target_cxx11_abi(ctx: Context, resolution: Resolution) -> tuple[bool | None, str | None]:
    """The string ABI of the C++ libraries the module links to: torch's libc10 when present."""
    libs = [o for o in resolution.closure[1:] if not ctx.env.is_system(o.path.resolve())
            and not o.path.name.startswith(_RUNTIME_LIBS)]
    c10 = [o for o in libs if o.path.name == "libc10.so"]
    for lib in c10 or libs:
        value = library_abi(lib.exports)
        if value is not None:
            return value, lib.path.name
    return None, None


def library_abi(exports: Iterable[str]) -> bool | None:
    """The string ABI of a library's own API. std:: names do not count: torch 2.6's old-ABI
    libc10.so exports libstdc++'s own instantiations of both ABIs (e.g. the __cxx11
    basic_string members), which made it look mixed and its ABI unknown."""
    return abi_evidence(n for n in exports if not STD_MANGLED.match(n)).cxx11_abi


def runtime_findings(rel: str, markers: list[str], std_exports: int) -> list[Finding]:
    if not markers:
        return []
    shown = demangle_all(markers[:1])[markers[0]]
    return [Finding(
        "error", "abi", f"{rel} carries its own C++ runtime (a static libstdc++) and exports it: "
                        f"{std_exports} C++ runtime symbols, e.g. {shown}",
        module=rel, symbol=shown, library="libstdc++.so.6",
        cause="it was linked with libstdc++.a (a g++ with no libstdc++.so beside it, or -static-libstdc++); "
              "in one process with torch's libstdc++.so.6 two C++ runtimes then share exceptions, locales and "
              "iostreams, and each library binds to whichever copy the loader finds first",
        fix="link the shared libstdc++: build with conda's gxx or the distribution's g++ (its "
            "`g++ -print-file-name=libstdc++.so` prints a path); `extforge mirror` picks such a g++",
    )]


def abi_findings(rel: str, evidence: AbiEvidence, target_abi: bool | None, source: str | None,
                 unresolved: list[Symbol]) -> list[Finding]:
    module_abi = evidence.cxx11_abi
    if evidence.mixed:
        offending = evidence.old[0]
        return [Finding(
            "warning", "abi", f"{rel} uses both C++ string ABIs", module=rel,
            symbol=demangle_all([offending])[offending],
            cause="objects compiled with different _GLIBCXX_USE_CXX11_ABI settings were linked together",
            fix="compile every object of the module with the target torch's _GLIBCXX_USE_CXX11_ABI",
        )]
    if module_abi is None or target_abi is None or module_abi == target_abi:
        return []
    wrong = evidence.old if target_abi else evidence.cxx11
    unresolved_names = {s.name for s in unresolved}
    # Name the symbol that actually breaks loading when there is one.
    offending = next((n for n in wrong if n in unresolved_names), wrong[0])
    demangled = demangle_all([offending])[offending]
    return [Finding(
        "error", "abi",
        f"{rel} was compiled with _GLIBCXX_USE_CXX11_ABI={_abi_int(module_abi)}, the target's {source} uses "
        f"{_abi_int(target_abi)}: {demangled}",
        module=rel, symbol=demangled, library=source,
        cause="the module and the target's C++ libraries disagree on std::string's layout and mangling",
        fix=f"rebuild with -D_GLIBCXX_USE_CXX11_ABI={_abi_int(target_abi)} "
            "(torch.compiled_with_cxx11_abi() in the target environment)",
    )]


def gpu_findings(ctx: Context, obj: ElfObject, rel: str, facts: ModuleFacts) -> list[Finding]:
    sec = obj.sections.get(".nv_fatbin")
    if sec is None or obj._map is None:
        return []
    entries = parse_fatbin(obj._map, sec.offset, sec.offset + sec.size)
    facts.sass_archs, facts.ptx_archs = arch_sets(entries)
    if not ctx.archs:
        return []
    has = ", ".join(facts.sass_archs + facts.ptx_archs) or "no GPU code"
    findings = []
    for arch in ctx.archs:
        coverage = arch_coverage(arch, facts.sass_archs, facts.ptx_archs)
        if coverage == "missing":
            findings.append(Finding(
                "error", "gpu", f"{rel}: promised {arch} but has no SASS or PTX for it (has {has})",
                module=rel, arch=arch, cause="the build's arch list (TORCH_CUDA_ARCH_LIST / -gencode) left it out",
                fix=f"add {gencode(arch)} to the build",
            ))
        elif coverage == "ptx":
            findings.append(Finding(
                "warning", "gpu", f"{rel}: {arch} is served only by PTX (has {has})", module=rel, arch=arch,
                cause="the driver JIT-compiles the PTX at first use: a slow first start, maybe slower kernels",
                fix=f"add SASS for it: {gencode(arch)}",
            ))
    if ctx.exact_archs:
        extra = [a for a in facts.sass_archs + facts.ptx_archs if a not in ctx.archs]
        if extra:
            findings.append(Finding(
                "error", "gpu", f"{rel}: has code for {', '.join(extra)}, which the build's arch list "
                                f"({', '.join(ctx.archs)}) does not name",
                module=rel, arch=extra[0],
                cause="a -gencode/-arch flag other than the variant's reached nvcc (upstream's build files, or a "
                      "compiler outside the build layer), so the package's build string and variant lie about its code",
                fix="build with the extforge-torch-build layer (it replaces upstream's arch flags), or add these archs "
                    "to the variant's cuda_archs",
            ))
    return findings


def platform_findings(ctx: Context, obj: ElfObject, rel: str, facts: ModuleFacts,
                      resolution: Resolution) -> list[Finding]:
    if ctx.glibc is None:
        return []
    limits = baseline(ctx.glibc)
    # libstdc++ shipped by the target environment (conda's libstdcxx) is not bounded by the
    # node's distro; whether it is new enough is the symbol check's business.
    own_cxx = any(o.path.name.startswith("libstdc++.so") and not ctx.env.is_system(o.path.resolve())
                  for o in resolution.closure[1:])
    findings = []
    for family, required in sorted(facts.floors.items()):
        limit = limits.get(family)
        if limit is None or (own_cxx and family != "GLIBC") or not exceeds(required, limit):
            continue
        tag = f"{family}_{required}"
        users = [s.name for s in obj.undefined if s.version == tag]
        shown = demangle_all(users[:1]).get(users[0], users[0]) if users else tag
        findings.append(Finding(
            "error", "platform",
            f"{rel} needs {tag} but a node with glibc {ctx.glibc} provides {family} {limit}: {shown}",
            module=rel, symbol=shown,
            cause="it was built on a newer distro or toolchain than the oldest node it must run on",
            fix="build in an older sysroot (conda's sysroot_linux-64 / manylinux image) or raise the glibc floor",
        ))
    return findings


def _abi_int(value: bool | None) -> str:
    return {True: "1", False: "0", None: "?"}[value]
