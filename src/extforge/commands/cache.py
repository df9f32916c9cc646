"""`extforge cache`: what the cache root holds, per area; `--prune DAYS` removes what went unused."""

from __future__ import annotations

import argparse
import math
import shutil
import time
from dataclasses import asdict, dataclass

from ..errors import EXIT_OK, ExtforgeError
from ..options import option_type

HELP = "show what extforge's cache holds (per area) and remove entries unused for DAYS days (--prune)"


def days(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value >= 0):  # nan and inf too: no entry's age compares with them
        raise ExtforgeError(f"--prune {text} is not a number of days", "it counts the days an entry went unused",
                            "pass --prune 0 to remove every entry, or e.g. --prune 14")
    return value


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prune", type=option_type(days), metavar="DAYS",
                        help="remove the entries not used for DAYS days (0: every entry of the chosen areas)")
    parser.add_argument("--dry-run", action="store_true", help="with --prune: list what would go, remove nothing")
    parser.add_argument("--area", action="append", default=[], metavar="NAME",
                        help="only this area (repeatable; names as listed by `extforge cache`)")


@dataclass(frozen=True)
class AreaSummary:
    area: str
    path: str
    what: str
    entries: int
    bytes: int
    pruned: int
    pruned_bytes: int


def run(args: argparse.Namespace) -> int:
    from .. import cache
    from ..paths import cache_root
    from ..ui import console, emit_json, log

    root = cache_root()
    names = {a.name for a in cache.AREAS}
    unknown = sorted(set(args.area) - names)
    if unknown:
        raise ExtforgeError(f"unknown cache area(s): {', '.join(unknown)}", f"the areas are: {', '.join(sorted(names))}",
                            "pass --area with one of those names")
    if args.dry_run and args.prune is None:
        raise ExtforgeError("--dry-run needs --prune DAYS", "without --prune nothing would be removed anyway",
                            "add --prune DAYS")
    areas = [a for a in cache.AREAS if not args.area or a.name in args.area]
    listed_only = sorted(a.name for a in areas if not a.prunable and a.name in args.area)
    if args.prune is not None and listed_only:
        raise ExtforgeError(f"cache area(s) {', '.join(listed_only)} cannot be pruned by age",
                            "; ".join(f"{a.name}: {a.what}" for a in areas if a.name in listed_only),
                            "prune the other areas; remove such a folder by hand only when you mean to lose it")
    min_free = cache.min_free()
    entries = list(cache.scan(root, areas))
    prunable = {a.name for a in areas if a.prunable}
    unused = cache.unused([e for e in entries if e.area in prunable], time.time(), args.prune) if args.prune is not None else []
    doomed = [e for e in unused if e.mine]
    kept = [(e, "another user's: theirs to prune") for e in unused if not e.mine]
    # Counted before anything goes: what removal gives back, links from elsewhere excluded.
    frees = cache.freeable(doomed)
    summary = []
    for area in areas:
        mine = [e for e in entries if e.area == area.name]
        gone = [e for e in doomed if e.area == area.name]
        summary.append(AreaSummary(area.name, str(root / area.rel), area.what, len(mine), sum(e.bytes for e in mine),
                                   len(gone), frees.by_area.get(area.name, 0)))
    free_before = shutil.disk_usage(root).free if root.exists() else 0
    removed = []
    for entry in doomed:
        log.info("%s %s (%s)", "would remove" if args.dry_run else "removing", entry.path, cache.human_size(entry.bytes))
        if not args.dry_run:
            try:
                cache.remove(entry)
            except (OSError, ExtforgeError) as exc:
                kept.append((entry, exc.what if isinstance(exc, ExtforgeError) else exc.strerror or str(exc)))
                continue
        removed.append(entry)
    freed = (shutil.disk_usage(root).free - free_before) if removed and not args.dry_run else 0
    if args.json:
        emit_json({"root": str(root), "areas": [asdict(row) for row in summary], "dry_run": args.dry_run, "prune_days": args.prune,
                   "removed": [{"area": e.area, "path": str(e.path), "bytes": e.bytes} for e in removed],
                   "kept": [{"area": e.area, "path": str(e.path), "why": why} for e, why in kept],
                   "frees_bytes": frees.total, "freed_bytes": freed, "min_free_bytes": min_free})
        return EXIT_OK
    console.print(f"cache root: {root}")
    for row in summary:
        line = f"  {row.area:<16} {row.entries:>5} entries {cache.human_size(row.bytes):>10}"
        if args.prune is not None and row.area not in prunable:
            line += "   listed only, never pruned"
        elif args.prune is not None:
            verb = "would go" if args.dry_run else "removed"
            line += f"   {row.pruned} {verb} ({cache.human_size(row.pruned_bytes)})"
        console.print(line)
    console.print(f"  total {cache.human_size(sum(r.bytes for r in summary))} (files hard-linked from two areas count once)")
    console.print(f"keeps {cache.human_size(min_free)} free on its disk (${cache.MIN_FREE_ENV}): work that fills the cache first removes "
                  f"the least recently used entries unused for {cache.IN_USE_S // 60} minutes" if min_free else
                  f"keeps no free space on its disk (${cache.MIN_FREE_ENV}=0): nothing is removed unless pruned")
    if args.prune is not None:
        # pruned_bytes leaves out files still linked from elsewhere, so a prune never promises space it cannot give.
        if args.dry_run:
            console.print(f"would remove {len(removed)} entries unused for {args.prune:g} days, freeing {cache.human_size(frees.total)}")
        else:
            console.print(f"removed {len(removed)} entries unused for {args.prune:g} days: "
                          f"{cache.human_size(max(freed, 0))} freed on that disk")
        if kept:
            console.print(f"kept {len(kept)} entries you may not remove: "
                          + "; ".join(f"{e.path} ({why})" for e, why in kept), markup=False, soft_wrap=True)
    return EXIT_OK
