"""`extforge explain`: recognise known failure signatures in an error message or a build log.

The signatures are data (data/signatures.yaml): regexes, cause and fix templates. Code here
only matches them and runs the few analyzers that need more than a regex: demangling and
classifying an `undefined symbol`, translating a driver version, asking the build planner.
"""

from __future__ import annotations

import os
import re
import stat
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, BinaryIO

from .. import machine
from ..audit.abi import abi_evidence
from ..audit.demangle import demangle
from ..errors import ExtforgeError
from ..recipes.build_layer import switch_for
from .diagnosis import planner_values

UNKNOWN_ADVICE = (
    "unknown: no known failure signature matched. Run `extforge doctor` (add --python for the "
    "environment that failed) to check torch, nvcc, driver, compiler ABI and the installed CUDA extensions."
)


# The matcher sees the last TAIL_BYTES of a log: a failure's cause is printed just before the
# build stops, and a bounded input keeps a 1 GiB log (or a runaway one) to a fraction of a second.
TAIL_BYTES = 1024 * 1024
_CHUNK = 1024 * 1024


def read_tail(path: Path) -> str:
    """The last TAIL_BYTES of a log file (seeked to, not read through) or of a pipe (read to its
    end, keeping only the tail); a device such as /dev/zero is refused, it has no end."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise ExtforgeError(f"cannot read {path}", exc.strerror or str(exc), "pass an existing log file") from exc
    with os.fdopen(fd, "rb") as fh:
        mode = os.fstat(fd).st_mode
        if stat.S_ISREG(mode):
            fh.seek(max(0, os.fstat(fd).st_size - TAIL_BYTES))
            return fh.read(TAIL_BYTES).decode(errors="replace")
        if not stat.S_ISFIFO(mode) and not stat.S_ISSOCK(mode):
            raise ExtforgeError(f"{path} is not a log file", "it is a device or folder, which has no end to read the tail of",
                                "pass a log file, or pipe the failing command's output into `extforge explain`")
        os.set_blocking(fd, True)
        return stream_tail(fh)


def stream_tail(fh: BinaryIO) -> str:
    """The last TAIL_BYTES of a stream read to its end, in bounded memory."""
    kept: deque[bytes] = deque()
    size = 0
    while chunk := fh.read(_CHUNK):
        kept.append(chunk)
        size += len(chunk)
        while size - len(kept[0]) >= TAIL_BYTES:
            size -= len(kept.popleft())
    return b"".join(kept)[-TAIL_BYTES:].decode(errors="replace")


@dataclass(frozen=True)
class Signature:
    id: str
    title: str
    patterns: tuple[re.Pattern[str], ...]
    cause: str
    fix: str
    extract: tuple[re.Pattern[str], ...] = ()
    analyzer: str | None = None
    variants: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    suppressed_by: tuple[str, ...] = ()


@dataclass(frozen=True)
class Diagnosis:
    id: str
    title: str
    cause: str
    fix: str
    evidence: str  # the log line that matched
    values: dict[str, str]  # extracted groups and analyzer results
    variant: str | None = None


@dataclass(frozen=True)
class Explanation:
    diagnoses: list[Diagnosis]

    @property
    def recognised(self) -> bool:
        return bool(self.diagnoses)

    def to_json(self) -> dict[str, Any]:
        return {
            "recognised": self.recognised,
            "diagnoses": [asdict(d) for d in self.diagnoses],
            **({} if self.recognised else {"advice": UNKNOWN_ADVICE}),
        }

    def render(self) -> str:
        if not self.diagnoses:
            return UNKNOWN_ADVICE
        lines = []
        for i, d in enumerate(self.diagnoses):
            kind = f" [{d.variant}]" if d.variant else ""
            lines += [
                f"{'' if i == 0 else chr(10)}{d.id}{kind}: {d.title}",
                f"  seen:  {d.evidence.strip()}",
                f"  cause: {d.cause}",
                f"  fix:   {d.fix}",
            ]
        return "\n".join(lines)


def _compile(patterns: list[str]) -> tuple[re.Pattern[str], ...]:
    return tuple(re.compile(p, re.M) for p in patterns)


@cache
def load_signatures() -> tuple[Signature, ...]:
    from ruamel.yaml import YAML

    text = resources.files("extforge").joinpath("data/signatures.yaml").read_text()
    data = YAML(typ="safe").load(text)
    return tuple(
        Signature(
            id=s["id"],
            title=s["title"],
            patterns=_compile(s["patterns"]),
            cause=s.get("cause", ""),
            fix=s.get("fix", ""),
            extract=_compile(s.get("extract", [])),
            analyzer=s.get("analyzer"),
            variants=s.get("variants", {}),
            suppressed_by=tuple(s.get("suppressed_by", [])),
        )
        for s in data["signatures"]
    )


# --- analyzers: (values, context) -> more values; "variant" picks one of the signature's variants


@dataclass
class Context:
    torch_abi: bool | None = None  # the CXX11 ABI of the torch the failing module met, if known
    plan: Callable[[], tuple[dict[str, Any] | None, str | None]] | None = None


_TORCH_NS = re.compile(r"^(?:\w+ )?(c10|at|torch|caffe2)::")


def symbol_abi(mangled: str) -> bool | None:
    """The std::string ABI a symbol was mangled under: True (CXX11), False (old), None (no std strings)."""

    return abi_evidence([mangled]).cxx11_abi


def classify_undefined_symbol(mangled: str, demangled: str, torch_abi: bool | None) -> dict[str, str]:
    abi = symbol_abi(mangled)
    ns = _TORCH_NS.match(demangled)
    values = {"namespace": f"{ns.group(1)}::" if ns else "non-torch"}
    if abi is not None and (torch_abi is None or torch_abi != abi):
        marker = "std::__cxx11 / [abi:cxx11] in the name" if abi else "pre-C++11 std::string in the name"
        other = int(not abi)
        values |= {
            "variant": "abi-mismatch",
            "module_abi": str(int(abi)),
            "abi_evidence": marker,
            "torch_abi_word": "TRUE" if other else "FALSE",
            "torch_abi_text": f"this torch uses {other}"
            if torch_abi is not None
            else f"the torch it met probably uses {other} (not checked: pass --python; if it uses {int(abi)}, "
            "this is torch version skew instead)",
        }
        return values
    if ns:
        note = f"(the ABI flag matches: both {int(abi)})" if abi is not None else "(no std::string in the name, so not an ABI mismatch)"
        return values | {"variant": "version-skew", "abi_note": note}
    return values | {"variant": "library-skew"}


def _undefined_symbol(values: dict[str, str], ctx: Context) -> dict[str, str]:

    mangled = values["symbol"]
    demangled = demangle(mangled)
    return {"demangled": demangled, "module": values.get("module") or "<the extension .so>"} | classify_undefined_symbol(
        mangled, demangled, ctx.torch_abi
    )


def _driver_version(values: dict[str, str], ctx: Context) -> dict[str, str]:
    found = values.get("found")
    if not found:
        return {}
    # cudaDriverGetVersion encodes CUDA 12.2 as 12020.
    cuda = f"{int(found) // 1000}.{int(found) % 1000 // 10}"
    return {"driver_cuda": cuda, "driver_cuda_text": f" (the driver reports CUDA {cuda})"}


def _plan(values: dict[str, str], ctx: Context) -> dict[str, str]:
    if ctx.plan is None:

        plan, why = planner_values(machine.detect())
    else:
        plan, why = ctx.plan()
    if plan:
        env = " ".join(f"{k}={v}" for k, v in plan.items() if k.isupper())
        return {"plan_env": env, "plan_source": "the planner's values for this machine"}
    return {"plan_env": "MAX_JOBS=1 NVCC_THREADS=1", "plan_source": f"the safe minimum; {why}"}


def _compile_failure(values: dict[str, str], ctx: Context) -> dict[str, str]:
    """A failed compile job: a compiler error names its cause; without one, memory is the suspect."""
    if values.get("compiler_error"):
        return {"variant": "compiler-error"}
    return _plan(values, ctx)


def _download_switch(values: dict[str, str], ctx: Context) -> dict[str, str]:
    """The package whose prebuilt wheel the log names, and its switch (build_layer's data)."""
    switch = switch_for(" ".join(values.get(k, "") for k in ("url", "wheel", "path")))
    if switch is None:
        return {"package": "<package>", "switch": "<PACKAGE>_FORCE_BUILD", "assignment": "<PACKAGE>_FORCE_BUILD=TRUE"}
    return {"package": switch.package, "switch": next(iter(switch.values)),
            "assignment": switch.assignment(), "variant": "known-switch"}


ANALYZERS: dict[str, Callable[[dict[str, str], Context], dict[str, str]]] = {
    "undefined_symbol": _undefined_symbol,
    "driver_version": _driver_version,
    "plan": _plan,
    "compile_failure": _compile_failure,
    "download_switch": _download_switch,
}


class _Template(dict[str, str]):
    def __missing__(self, key: str) -> str:
        # Optional "<group>_text" snippets vanish when the group was not found.
        return "" if key.endswith("_text") else f"<{key}>"


def _line_at(text: str, pos: int) -> str:
    start = text.rfind("\n", 0, pos) + 1
    end = text.find("\n", pos)
    return text[start : end if end >= 0 else len(text)]


def _match(sig: Signature, text: str, ctx: Context) -> Diagnosis | None:
    m = next((m for p in sig.patterns if (m := p.search(text))), None)
    if m is None:
        return None
    values = {k: v for k, v in m.groupdict().items() if v}
    for p in sig.extract:
        if em := p.search(text):
            values |= {k: v for k, v in em.groupdict().items() if v and k not in values}
    for k, v in list(values.items()):
        values[f"{k}_text"] = f" ({k} {v})"
    if sig.analyzer:
        values |= ANALYZERS[sig.analyzer](values, ctx)
    # An analyzer serves several signatures: a variant this one does not have is no variant.
    variant = values.pop("variant", None)
    variant = variant if variant in sig.variants else None
    chosen = sig.variants.get(variant, {}) if variant else {}
    fill = _Template(values)
    return Diagnosis(
        id=sig.id,
        title=sig.title.format_map(fill),
        cause=" ".join(chosen.get("cause", sig.cause).format_map(fill).split()),
        fix=" ".join(chosen.get("fix", sig.fix).format_map(fill).split()),
        evidence=_line_at(text, m.start()),
        values={k: v for k, v in values.items() if not k.endswith("_text")},
        variant=variant,
    )


def explain_text(text: str, *, torch_abi: bool | None = None, context: Context | None = None) -> Explanation:
    """Every known failure signature in `text`, the primary one first.

    This is the library entry point: `explain_text(log_tail).render()` for people,
    `.to_json()` for machines, `.recognised` to branch on. Only the last TAIL_BYTES characters
    are matched; every signature matches in time linear in that.
    """
    ctx = context or Context(torch_abi=torch_abi)
    text = text[-TAIL_BYTES:]
    found = [d for sig in load_signatures() if (d := _match(sig, text, ctx))]
    ids = {d.id for d in found}
    sigs = {s.id: s for s in load_signatures()}
    return Explanation([d for d in found if not ids.intersection(sigs[d.id].suppressed_by)])
