"""A build split into parts: N jobs (a Slurm array, or N machines) each compile a share of the
translation units into the shared compile cache, then one link job builds the package as
usual, every unit a cache hit. For a build no single allocation holds: the full
FlashAttention-3 compiles ~28 minutes on 64 cores.

Which part compiles a unit: the cost data's units are dealt longest first to the part with the
least work (balanced parts); a unit the data does not know goes by its name's hash. The parts
of one build must therefore run with the same cost data; if they do not, a unit compiled twice
or by no part costs time, never correctness: the link job compiles whatever the cache lacks.
The launcher (data/part-launcher.sh) applies this in front of every compiler call.

What the launcher reads (assignment.tsv) and notes (STATE) lies in the output folder, which
others may write: the assignment holds only unit names of shared_read.UNIT_NAME's characters and
part numbers, which the launcher checks again and never evaluates; the notes are read back only
from this user's private folder, as this user's files (shared_read).

Public API: Part, parse_part(text), parse_link_parts(text), assignment(costs, parts), owner(unit, parts),
launcher(split, cache, state_dir, assignment_file), state_dir(bld), Outcome, read_outcome(state_dir),
clear_notes(state_dir), part_reached_link(state_dir).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from .. import safe_files, shared_read
from ..errors import ExtforgeError

LINK = 0  # the part number of the link job
# A Slurm array's default MaxArraySize is 1001; more parts than units compile nothing.
MAX_PARTS = 10_000
ASSIGNMENT_FILE = "assignment.tsv"
# ccache's per-call counters (CCACHE_STATSLOG), beside the launcher's notes.
STATS_LOG = "ccache-stats.log"
NOTES = ("units", STATS_LOG)
NOTES_LIMIT = 64 * 2**20  # a line per compile
_COUNT = re.compile(r"[0-9]{1,9}")


@dataclass(frozen=True)
class Part:
    parts: int
    part: int  # 1..parts, or LINK

    @property
    def is_link(self) -> bool:
        return self.part == LINK

    def describe(self) -> str:
        return f"the link job of {self.parts} parts" if self.is_link else f"part {self.part} of {self.parts}"


def parse_part(text: str) -> Part:
    """`--part I/N` → Part(N, I)."""
    m = re.fullmatch(r"\s*([0-9]{1,6})\s*/\s*([0-9]{1,6})\s*", text)
    if not m or not 1 <= int(m[1]) <= int(m[2]) <= MAX_PARTS:
        raise ExtforgeError(f"--part {shared_read.shown(text)} is not I/N with 1 <= I <= N <= {MAX_PARTS}",
                            "a build in parts: a part names its number and the number of parts",
                            "e.g. --part 2/4 (Slurm: --part ${SLURM_ARRAY_TASK_ID}/4 in an array 1-4)")
    return Part(int(m[2]), int(m[1]))


def parse_link_parts(text: str) -> Part:
    """`--link-parts N` → Part(N, LINK)."""
    m = re.fullmatch(r"\s*([0-9]{1,6})\s*", text)
    if not m or not 1 <= int(m[1]) <= MAX_PARTS:
        raise ExtforgeError(f"--link-parts {shared_read.shown(text)}: a build in parts has 1 to {MAX_PARTS} parts", "",
                            "pass the N the parts were built with (--part I/N)")
    return Part(int(m[1]), LINK)


def owner(unit: str, parts: int) -> int:
    """The part of a unit the cost data does not know (part-launcher.sh computes the same)."""
    return int(hashlib.md5(unit.encode()).hexdigest()[:8], 16) % parts + 1


def assignment(costs: Mapping[str, float], parts: int) -> dict[str, int]:
    """Known units dealt longest first to the least loaded part (ties: the lower part)."""
    load = [0.0] * parts
    out: dict[str, int] = {}
    for unit, seconds in sorted(costs.items(), key=lambda kv: (-kv[1], kv[0])):
        i = min(range(parts), key=lambda p: (load[p], p))
        load[i] += seconds
        out[unit] = i + 1
    return out


def assignment_text(mapping: Mapping[str, int]) -> str:
    """The launcher's table; a name that could break its line (a tab, a newline) is a bug of the
    reader that let it through, and stops the build (ValueError)."""
    return "".join(f"{shared_read.unit_name(u)}\t{p}\n" for u, p in sorted(mapping.items()))


def launcher(part: Part, cache: str, state_dir: Path, assignment_file: Path) -> str:
    """EXTFORGE_COMPILER_LAUNCHER for one part or the link job (recipes split it on spaces)."""
    script = Path(str(resources.files("extforge").joinpath("data/part-launcher.sh")))
    words = [str(script), str(part.part), str(part.parts), str(assignment_file), str(state_dir), cache]
    spaced = [w for w in words if not w or re.search(r"\s", w)]
    if spaced:
        raise ExtforgeError(f"a build in parts cannot pass {spaced[0]!r} to its compile launcher",
                            "recipes split EXTFORGE_COMPILER_LAUNCHER on spaces",
                            "install extforge, the compile cache and the output folder under paths without spaces")
    return "bash " + " ".join(words)


def state_dir(bld: Path) -> Path:
    """Beside rattler-build's work folders: where a part or the link job notes each unit and
    reads its assignment; one for each user (a private folder: part_environment makes it)."""
    return bld / f"extforge-split-{os.geteuid()}"


@dataclass
class Outcome:
    """What the launcher noted in one build: units compiled (name → exit status), units left to
    other parts, links replaced by placeholders, and ccache's verdict per compile where known."""

    compiled: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)
    links: int = 0
    cache_hits: int = 0
    cache_misses: int = 0

    @property
    def failed(self) -> list[str]:
        return sorted(u for u, rc in self.compiled.items() if rc != 0)

    def summary(self, part: Part) -> str:
        done = len(self.compiled) - len(self.failed)
        longest = max(self.seconds.values(), default=0)
        if part.is_link:
            cached = f"{self.cache_hits} from the compile cache, {self.cache_misses} compiled here"
            return f"{part.describe()}: {done} units ({cached}; longest {longest} s)"
        return (f"{part.describe()}: {done} unit{'' if done == 1 else 's'} compiled into the compile cache ({self.cache_hits} were "
                f"there already; longest {longest} s), {len(self.skipped)} left to the other parts")


def _notes(path: Path) -> list[str]:
    try:
        return shared_read.read_text(path, limit=NOTES_LIMIT, own=True).splitlines()
    except FileNotFoundError:
        return []


def read_outcome(state_dir: Path) -> Outcome:
    """What the launcher noted: this user's own files or a refusal (shared_read); a line of
    other words or values is not counted."""
    out = Outcome()
    for words in map(str.split, _notes(state_dir / "units")):
        if words[:1] == ["link"]:
            out.links += 1
        elif len(words) >= 3 and shared_read.UNIT_NAME.fullmatch(words[1]) and all(map(_COUNT.fullmatch, words[2:])):
            if words[0] == "compiled" and len(words) == 4:
                out.compiled[words[1]] = int(words[2])
                out.seconds[words[1]] = int(words[3])
            elif words[0] == "skipped" and len(words) == 3:
                out.skipped[words[1]] = int(words[2])
    for _, verdict in read_verdicts(state_dir):
        out.cache_hits += verdict == "hit"
        out.cache_misses += verdict == "miss"
    return out


def read_verdicts(state_dir: Path) -> list[tuple[str, str]]:
    """ccache's verdict on each compile of the variant built, from its stats log in `state_dir`
    (this user's own file, as the launcher's notes)."""
    return compile_verdicts("\n".join(_notes(state_dir / STATS_LOG)))


def compile_verdicts(stats_log: str) -> list[tuple[str, str]]:
    """Each compiler call of ccache's stats log (`# SOURCE`, then one counter per line): its
    source and "hit", "miss" or "" (a call ccache did not cache: a link, an unsupported option)."""
    calls: list[tuple[str, str]] = []
    for line in stats_log.splitlines():
        if line.startswith("# "):
            calls.append((line[2:], ""))
        elif calls and line in ("direct_cache_hit", "preprocessed_cache_hit"):
            calls[-1] = (calls[-1][0], "hit")
        elif calls and line == "cache_miss" and not calls[-1][1]:
            calls[-1] = (calls[-1][0], "miss")
    return calls


def clear_notes(state_dir: Path) -> None:
    """Before each variant: the notes of the one before are not this one's. Each starts empty,
    0644 whatever the umask (the launcher and ccache append to it): read_outcome takes only a
    file nobody else may write."""
    for name in NOTES:
        safe_files.write_atomic(state_dir / name, b"", mode=0o644)


def part_reached_link(state_dir: Path) -> bool:
    """Whether a part compiled all its units (its build got to a link, no compile failed)."""
    outcome = read_outcome(state_dir)
    return outcome.links > 0 and not outcome.failed
