"""Compiles one CUDA unit as parallel parts (extforge-nvcc, for a unit the planner names in
EXTFORGE_SPLIT_UNITS). Usage: `split_unit.py PARTS NVCC ARGS...`, ARGS a compile of one .cu to
one object (`-c SRC -o OBJ`); `split_unit.py --count SRC_DIR` (the activation, before the
build) writes each .cu unit's explicit instantiations to EXTFORGE_SPLIT_LOG: the planner splits
only a unit a build has shown it can.

A unit whose time goes to many explicit template instantiations (causal-conv1d's backward unit:
18 instantiations, 355 of its build's 390 s on an H100 node) keeps one core busy while the rest
of the build waits for it. Each part is the same file with only its share of those
instantiation lines kept (the others become empty lines, so line numbers and __FILE__ stay
upstream's), compiled with the same flags beside the file, so its includes resolve as upstream's
do; the parts' objects are joined by `ld -r` into the object the build expects. A part that would
define a symbol another part defines too (a function that is not a template) makes the split
wrong: the unit is then compiled whole, and the build record says so.

Each part's seconds go to EXTFORGE_SPLIT_LOG (one JSON line per unit), which the planner learns
the unit's cost from: ninja's log holds only the longest part."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

# An explicit instantiation definition: `template void f<float>(Params &);` (not `template <...>`,
# not `extern template`), possibly over several lines, with no body.
INSTANTIATION = re.compile(r"^[ \t]*template[ \t]+(?!<)[^;{}]*;", re.M)
STRONG = frozenset("TDBRG")  # nm types of a global definition the linker would see twice


def instantiations(text: str) -> list[tuple[int, int]]:
    """Spans of the explicit instantiation definitions in `text`, in order."""
    return [m.span() for m in INSTANTIATION.finditer(text)]


def part_texts(text: str, spans: Sequence[tuple[int, int]], parts: int) -> list[str]:
    """`text` as at most `parts` files, its instantiations (`spans`) dealt in turn (neighbours are
    often the same kernel for another type: dealing spreads the heavy kinds); each file keeps the
    rest whole."""
    parts = min(parts, len(spans))
    out = []
    for k in range(parts):
        chunks, pos = [], 0
        for i, (start, end) in enumerate(spans):
            if i % parts != k:
                chunks += [text[pos:start], "\n" * text.count("\n", start, end)]
                pos = end
        out.append("".join(chunks) + text[pos:])
    return out


def compile_args(args: Sequence[str]) -> tuple[int, int, int | None]:
    """Indexes in `args` of the source, of the output after -o, and of the dependency file."""
    src = next((i for i, a in enumerate(args) if a.endswith(".cu") and Path(a).is_file()), None)
    out = next((i + 1 for i, a in enumerate(args[:-1]) if a in ("-o", "--output-file")), None)
    if src is None or out is None or not {"-c", "--compile"} & set(args):
        raise ValueError("not a compile of one .cu to one object")
    dep = next((i + 1 for i, a in enumerate(args[:-1]) if a in ("--dependency-output", "-MF")), None)
    return src, out, dep


def strong_symbols(nm: str, obj: Path) -> set[str]:
    listed = subprocess.run([nm, "--defined-only", "-g", str(obj)], capture_output=True, text=True, check=True).stdout
    return {f[2] for line in listed.splitlines() if len(f := line.split()) == 3 and f[1] in STRONG}


def run_parts(launcher: list[str], nvcc: str, args: list[str], texts: list[str]) -> tuple[list[Path], list[float], int]:
    """Compiles the parts at once, each `args` with a part for the source and an object of its
    own; returns their objects, seconds and the first failure's code."""
    src_i, out_i, dep_i = compile_args(args)
    src, out = Path(args[src_i]), Path(args[out_i])
    sources = [src.with_name(f"{src.stem}.extforge-part{k}of{len(texts)}{src.suffix}") for k in range(1, len(texts) + 1)]
    objects = [out.with_name(f"{out.name}.part{k}") for k in range(1, len(texts) + 1)]
    procs, started = [], []
    for text, part_src, obj in zip(texts, sources, objects, strict=True):
        # Upstream's file by its path from the build folder: __FILE__ names it, and the text is the same
        # in every build folder (the compile cache hits across builds).
        part_src.write_text(f'#line 1 "{os.path.relpath(args[src_i])}"\n{text}')
        part_args = list(args)
        part_args[src_i], part_args[out_i] = str(part_src), str(obj)
        if dep_i is not None:
            part_args[dep_i] = f"{obj}.d"
        started.append(time.monotonic())
        procs.append(subprocess.Popen([*launcher, nvcc, *part_args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    seconds, failed = [], 0
    for proc, t0 in zip(procs, started, strict=True):
        output, _ = proc.communicate()
        seconds.append(round(time.monotonic() - t0, 1))
        sys.stdout.buffer.write(output)
        failed = failed or proc.returncode
    if dep_i is not None and not failed:
        # ninja reads the dependencies of the unit it asked for, which name upstream's file.
        deps = Path(f"{objects[0]}.d").read_text()
        Path(args[dep_i]).write_text(deps.replace(str(sources[0]), args[src_i]))
    return objects, seconds, failed


def join(objects: Sequence[Path], out: Path) -> str | None:
    """The parts' objects joined into `out`; else why they cannot be (the unit is compiled whole)."""
    try:
        seen = Counter(sym for obj in objects for sym in strong_symbols(os.environ.get("NM") or "nm", obj))
        twice = sorted(s for s, n in seen.items() if n > 1)
        if twice:
            return f"{len(twice)} symbol(s) defined in more than one part, e.g. {twice[0]}"
        subprocess.run([os.environ.get("LD") or "ld", "-r", "-o", str(out), *map(str, objects)], check=True,
                       capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = exc.stderr.strip() if isinstance(exc, subprocess.CalledProcessError) and exc.stderr else str(exc)
        return f"the parts could not be joined: {detail}"
    return None


def log(record: dict[str, object]) -> None:
    with open(os.environ.get("EXTFORGE_SPLIT_LOG", os.devnull), "a") as fh:
        fh.write(json.dumps(record) + "\n")


def count(src_dir: Path) -> None:
    for path in sorted(src_dir.rglob("*.cu")):
        if ".extforge" not in path.parts and ".extforge-part" not in path.name:
            log({"unit": path.stem, "instantiations": len(instantiations(path.read_text(errors="replace")))})


def main(argv: Sequence[str]) -> int:
    if argv[0] == "--count":
        count(Path(argv[1]))
        return 0
    parts, nvcc, args = int(argv[0]), argv[1], list(argv[2:])
    launcher = shlex.split(os.environ.get("EXTFORGE_COMPILER_LAUNCHER", ""))
    src_i, out_i, _ = compile_args(args)
    src, out = Path(args[src_i]), Path(args[out_i])
    text = src.read_text()
    spans = instantiations(text)
    texts = part_texts(text, spans, parts)
    record = {"unit": src.stem, "parts": len(texts), "instantiations": len(spans)}
    whole = len(texts) < 2
    if not whole:
        objects, seconds, failed = run_parts(launcher, nvcc, args, texts)
        if failed:
            return failed
        reason = join(objects, out)
        if reason:
            record |= {"compiled_whole": reason}
            whole = True
        else:
            record["seconds"] = seconds
        for leftover in [*objects, *(Path(f"{obj}.d") for obj in objects)]:
            leftover.unlink(missing_ok=True)
    if whole:
        t0 = time.monotonic()
        rc = subprocess.run([*launcher, nvcc, *args]).returncode
        if rc:
            return rc
        record |= {"parts": 1, "seconds": [round(time.monotonic() - t0, 1)]}
    log(record)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
