"""A build split into parts: N jobs (a Slurm array, or N machines) each compile a share of the
translation units into the shared compile cache, then one link job builds the package as
usual, every unit a cache hit. For a build no single allocation holds: the full
FlashAttention-3 compiles ~28 minutes on 64 cores.

Which part compiles a unit: the cost data's units are dealt longest first to the part with the
least work (balanced parts); a unit the data does not know goes by its name's hash. The parts
of one build must therefore run with the same cost data; if they do not, a unit compiled twice
or by no part costs time, never correctness: the link job compiles whatever the cache lacks.
The launcher (data/part-launcher.sh) applies this in front of every compiler call.

Public API: Split, parse_part(text), assignment(costs, parts), owner(unit, parts),
launcher(split, cache, state_dir, assignment_file), Outcome, read_outcome(state_dir), clear_notes(state_dir),
part_reached_link(state_dir).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from . import safe_files
from .errors import ExtforgeError

LINK = 0  # the part number of the link job
# Beside rattler-build's work folders: where a part or the link job notes each unit (STATE)
# and reads its assignment.
STATE_DIR = "extforge-split"
ASSIGNMENT_FILE = "assignment.tsv"


@dataclass(frozen=True)
class Split:
    parts: int
    part: int  # 1..parts, or LINK

    @property
    def is_link(self) -> bool:
        return self.part == LINK

    def describe(self) -> str:
        return f"the link job of {self.parts} parts" if self.is_link else f"part {self.part} of {self.parts}"


def parse_part(text: str) -> Split:
    """`--part I/N` → Split(N, I)."""
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not m or not 1 <= int(m[1]) <= int(m[2]):
        raise ExtforgeError(f"--part {text!r} is not I/N with 1 <= I <= N",
                            "a split build's part names its number and the number of parts",
                            "e.g. --part 2/4 (Slurm: --part ${SLURM_ARRAY_TASK_ID}/4 in an array 1-4)")
    return Split(int(m[2]), int(m[1]))


def link_of(parts: int) -> Split:
    if parts < 1:
        raise ExtforgeError(f"--link-parts {parts}: a split build has at least one part", "",
                            "pass the N the parts were built with (--part I/N)")
    return Split(parts, LINK)


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
    return "".join(f"{u}\t{p}\n" for u, p in sorted(mapping.items()))


def launcher(split: Split, cache: str, state_dir: Path, assignment_file: Path) -> str:
    """EXTFORGE_COMPILER_LAUNCHER for one part or the link job (recipes split it on spaces)."""
    script = Path(str(resources.files("extforge").joinpath("data/part-launcher.sh")))
    words = [str(script), str(split.part), str(split.parts), str(assignment_file), str(state_dir), cache]
    spaced = [w for w in words if not w or re.search(r"\s", w)]
    if spaced:
        raise ExtforgeError(f"a split build cannot pass {spaced[0]!r} to its compile launcher",
                            "recipes split EXTFORGE_COMPILER_LAUNCHER on spaces",
                            "install extforge, the compile cache and the output folder under paths without spaces")
    return "bash " + " ".join(words)


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

    def summary(self, split: Split) -> str:
        done = len(self.compiled) - len(self.failed)
        longest = max(self.seconds.values(), default=0)
        if split.is_link:
            cached = f"{self.cache_hits} from the compile cache, {self.cache_misses} compiled here"
            return f"{split.describe()}: {done} units ({cached}; longest {longest} s)"
        return (f"{split.describe()}: {done} unit{'' if done == 1 else 's'} compiled into the compile cache ({self.cache_hits} were "
                f"there already; longest {longest} s), {len(self.skipped)} left to the other parts")


def read_outcome(state_dir: Path) -> Outcome:
    out = Outcome()
    units = state_dir / "units"
    for line in units.read_text(errors="replace").splitlines() if units.exists() else ():
        words = line.split()
        if words[:1] == ["compiled"] and len(words) == 4:
            out.compiled[words[1]] = int(words[2])
            out.seconds[words[1]] = int(words[3])
        elif words[:1] == ["skipped"] and len(words) == 3:
            out.skipped[words[1]] = int(words[2])
        elif words[:1] == ["link"]:
            out.links += 1
    stats = state_dir / "ccache-stats.log"
    # ccache's stats_log: "# SOURCE" and then one counter per line for each call.
    for line in stats.read_text(errors="replace").splitlines() if stats.exists() else ():
        if line in ("direct_cache_hit", "preprocessed_cache_hit"):
            out.cache_hits += 1
        elif line == "cache_miss":
            out.cache_misses += 1
    return out


def clear_notes(state_dir: Path) -> None:
    """Before each variant: the notes of the one before are not this one's."""
    for name in ("units", "ccache-stats.log"):
        safe_files.remove_quietly(state_dir / name)


def part_reached_link(state_dir: Path) -> bool:
    """Whether a part compiled all its units (its build got to a link, no compile failed)."""
    outcome = read_outcome(state_dir)
    return outcome.links > 0 and not outcome.failed
