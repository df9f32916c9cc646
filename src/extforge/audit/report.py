"""Audit findings and the report that groups them."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..errors import ExtforgeError
from ..stamp import AuditStamp
from .glibc import version_key
from .resolve import TARGET_KINDS

Severity = Literal["error", "warning", "info"]
AGAINST_SOURCES = {
    "given": "the environment given",
    "prefix": "the prefix itself",
    "build": "the host environment of its build",
    "channel": "its pinned pytorch from the channel",
}
CHECKS = ("packaging", "libraries", "symbols", "abi", "gpu", "platform")
_ICON = {"error": "[red]✗[/red]", "warning": "[yellow]![/yellow]", "info": "[dim]·[/dim]"}


@dataclass(frozen=True)
class Finding:
    severity: Severity
    check: str  # one of CHECKS
    message: str
    module: str | None = None  # the ELF file it concerns, relative to the target
    symbol: str | None = None  # demangled
    arch: str | None = None
    library: str | None = None  # the library that should have provided the symbol
    cause: str | None = None
    fix: str | None = None


@dataclass
class ModuleFacts:
    """What one ELF file contains, independent of the target it is checked against."""

    path: str
    is_extension: bool
    needed: list[str]
    sass_archs: list[str] = field(default_factory=list)
    ptx_archs: list[str] = field(default_factory=list)
    cxx11_abi: bool | None = None
    floors: dict[str, str] = field(default_factory=dict)
    undefined: int = 0
    unresolved: int = 0


@dataclass
class AuditReport:
    target: str
    against: str | None = None
    against_source: str | None = None  # a key of AGAINST_SOURCES; None: the system libraries alone
    against_kind: str | None = None  # a key of resolve.TARGET_KINDS (venv, conda, ...)
    name: str | None = None
    version: str | None = None
    build: str | None = None
    torch: str | None = None  # the target's torch, "2.14.1+cu130" or "2.14.1 <build>"
    cuda_version: str | None = None
    platform: str | None = None  # the conda platform the modules must run on ("linux-64")
    target_cxx11_abi: bool | None = None
    modules: list[ModuleFacts] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    seconds: float = 0.0

    def add(self, finding: Finding) -> None:
        self.findings.append(finding)

    def extend(self, findings: Iterable[Finding]) -> None:
        self.findings.extend(findings)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "warning"]

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def verdict(self) -> str:
        return "pass" if self.ok else "fail"

    # Aggregates over all modules, as recorded in the package metadata.
    @property
    def sass_archs(self) -> list[str]:
        return _union(m.sass_archs for m in self.modules)

    @property
    def ptx_archs(self) -> list[str]:
        return _union(m.ptx_archs for m in self.modules)

    @property
    def cxx11_abi(self) -> bool | None:
        values = {m.cxx11_abi for m in self.modules if m.cxx11_abi is not None}
        return values.pop() if len(values) == 1 else None

    def to_stamp(self, path: Path) -> AuditStamp:
        """The record `stamp_package` writes into the package at `path`."""
        if not self.name:
            raise ExtforgeError(f"cannot stamp {path}", "the audit report has no package name (info/index.json)",
                                "stamp only .conda/.tar.bz2 packages built by rattler-build or conda-build")
        return AuditStamp(
            name=self.name,
            version=self.version,
            build=self.build,
            sass_archs=tuple(self.sass_archs),
            ptx_archs=tuple(self.ptx_archs),
            cxx11_abi=self.cxx11_abi,
            glibc_floor=self.floor("GLIBC"),
            glibcxx_floor=self.floor("GLIBCXX"),
            torch=self.torch,
            audited_against=self.against_source,
            cuda_version=self.cuda_version,
            verdict=self.verdict,
        )

    def floor(self, family: str) -> str | None:
        values = [m.floors[family] for m in self.modules if family in m.floors]
        return max(values, key=version_key) if values else None

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "against": self.against,
            "against_source": self.against_source,
            "against_kind": self.against_kind,
            "name": self.name,
            "version": self.version,
            "build": self.build,
            "torch": self.torch,
            "cuda_version": self.cuda_version,
            "platform": self.platform,
            "target_cxx11_abi": self.target_cxx11_abi,
            "verdict": self.verdict,
            "ok": self.ok,
            "sass_archs": self.sass_archs,
            "ptx_archs": self.ptx_archs,
            "cxx11_abi": self.cxx11_abi,
            "glibc_floor": self.floor("GLIBC"),
            "glibcxx_floor": self.floor("GLIBCXX"),
            "modules": [asdict(m) for m in self.modules],
            "findings": [asdict(f) for f in self.findings],
            "seconds": round(self.seconds, 3),
        }

    def render(self, verbose: bool = False) -> str:
        """Rich markup for people: a header, then the findings grouped by check."""
        lines = [f"[bold]audit of {self.target}[/bold]" + (f" against {self.against}" if self.against else "")]
        if self.against_source:
            kind = f" ({TARGET_KINDS[self.against_kind]})" if self.against_kind else ""
            lines.append(f"  target: {AGAINST_SOURCES[self.against_source]}{kind}")
        if self.platform:
            lines.append(f"  platform: {self.platform}")
        if self.torch:
            lines.append(f"  target torch {self.torch}, CXX11 ABI {_abi_text(self.target_cxx11_abi)}")
        for m in self.modules:
            gpu = ", ".join(m.sass_archs + m.ptx_archs) or "no GPU code"
            floor = " ".join(f"{k} {v}" for k, v in sorted(m.floors.items()))
            lines.append(f"  {m.path}: {gpu}; CXX11 ABI {_abi_text(m.cxx11_abi)}; needs {floor or 'nothing versioned'}")
        shown = [f for f in self.findings if verbose or f.severity != "info"]
        for check in CHECKS:
            group = [f for f in shown if f.check == check]
            if not group:
                continue
            lines.append(f"[bold]{check}[/bold]")
            lines.extend(_render_group(group))
        summary = f"{len(self.errors)} error(s), {len(self.warnings)} warning(s)"
        colour = "green" if self.ok else "red"
        lines.append(f"[{colour}]{self.verdict}[/{colour}]: {summary} ({self.seconds:.1f} s)")
        return "\n".join(lines)


def _render_group(group: list[Finding]) -> list[str]:
    lines: list[str] = []
    # Unresolved symbols are many: list them under the library that should have had them,
    # and state the cause and fix once per library.
    by_library: dict[tuple[str | None, str | None], list[Finding]] = {}
    for f in group:
        if f.symbol and f.check == "symbols":
            by_library.setdefault((f.module, f.library), []).append(f)
        else:
            lines.append(f"  {_ICON[f.severity]} {_esc(f.message)}")
            if f.cause:
                lines.append(f"      cause: {_esc(f.cause)}")
            if f.fix:
                lines.append(f"      fix: {_esc(f.fix)}")
    for (module, library), items in by_library.items():
        lines.append(f"  {_ICON[items[0].severity]} {module}: {len(items)} unresolved symbol(s) expected from "
                     f"{library or 'an unknown library'}")
        lines.extend(f"      {_esc(f.symbol or '')}" for f in items)
        if items[0].cause:
            lines.append(f"      cause: {_esc(items[0].cause)}")
        if items[0].fix:
            lines.append(f"      fix: {_esc(items[0].fix)}")
    return lines


def _esc(text: str) -> str:
    return text.replace("[", "\\[")


def _abi_text(value: bool | None) -> str:
    return {True: "1", False: "0", None: "unknown"}[value]


def _union(lists: Iterable[list[str]]) -> list[str]:
    seen: dict[str, None] = {}
    for items in lists:
        seen.update(dict.fromkeys(items))
    return sorted(seen, key=lambda a: (int("".join(c for c in a if c.isdigit()) or 0), a))
