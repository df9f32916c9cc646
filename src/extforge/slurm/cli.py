"""What the Slurm options of `extforge build` and `extforge verify` run (the options
themselves: slurm.options).

Each command hands over early in run() (`if args.slurm: return submit_build(opts, args)`),
so the Slurm code stays here.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..building.build_options import BuildOptions
from ..errors import EXIT_CANNOT_RUN, EXIT_FINDINGS, EXIT_OK, ExtforgeError
from ..ui import console, emit_json
from .config import SlurmConfig, load
from .report import print_rows, status_rows
from .submit import BuildRequest, submit_matrix, wait_for
from .verify import print_node_rows, verify_on_nodes


def slurm_config(args: argparse.Namespace) -> SlurmConfig:
    flags = {
        "partition": args.partition,
        "account": args.account,
        "qos": args.qos,
        "extra_args": args.extra_args,
        "time": getattr(args, "time", None),
        "node_cores": getattr(args, "node_cores", None),
        "node_memory": getattr(args, "node_memory", None),
        "profile": getattr(args, "profile", None),
        "shared_cache": getattr(args, "shared_cache", None),
    }
    return load(args.slurm_config, flags)


def build_request(opts: BuildOptions, args: argparse.Namespace) -> BuildRequest:
    """What the jobs build and where they publish, the paths absolute (a job starts elsewhere)."""
    return BuildRequest(
        options=opts,
        publish_to=str(Path(args.publish_to).expanduser().resolve()) if "://" not in args.publish_to else args.publish_to,
        config=slurm_config(args),
        parts=args.parts,
        wheels=args.wheels.expanduser().resolve() if args.wheels else None,
    )


def submit_build(opts: BuildOptions, args: argparse.Namespace) -> int:
    """One Slurm job per variant of `opts`; `args` holds the Slurm flags this module added."""

    if not args.publish_to:
        raise ExtforgeError(
            "--slurm needs --publish-to CHANNEL",
            "each job publishes the package it built to a channel every node can reach",
            "add --publish-to /shared/channels/internal (a folder on the shared filesystem)",
        )
    if opts.part:
        raise ExtforgeError(
            "--part and --link-parts are what the jobs of a build in parts run, not options of --slurm",
            "with --slurm, extforge submits the parts and the link job itself",
            "pass --parts N instead (and --shared-cache DIR, on storage every build node sees)",
        )
    req = build_request(opts, args)
    result = submit_matrix(req, dry_run=args.dry_run)
    if args.dry_run:
        if args.json:
            emit_json({"scripts": result.scripts, "skipped": [s.__dict__ for s in result.skipped]})
        else:
            for vid, text in result.scripts.items():
                print(f"# ===== {vid} =====\n{text}")
        return EXIT_OK
    for s in result.skipped:
        console.print(f"  {s.variant_id}: {s.state} ({s.detail}), not resubmitted")
    for r in result.submitted:
        console.print(f"  {r.variant_id}: submitted as job {r.job_id}")
    doc: dict = {"submitted": [r.__dict__ for r in result.submitted], "skipped": [s.__dict__ for s in result.skipped]}
    code = EXIT_OK
    if args.wait:
        ids = [r.variant_id for r in result.submitted] + [s.variant_id for s in result.skipped]
        rows = status_rows(wait_for(req.root, ids, args.wait))
        doc["variants"] = rows
        if not args.json:
            print_rows(rows)
        if any(r["state"] in {"failed", "lost"} for r in rows):
            code = EXIT_FINDINGS
        elif any(r["state"] in {"pending", "running"} for r in rows):
            console.print(f"still running after {args.wait:.0f} s: follow with `extforge status {req.output_dir}`")
            code = EXIT_CANNOT_RUN
    else:
        console.print(f"follow with: extforge status {req.output_dir}")
    if args.json:
        emit_json(doc)
    return code


def verify_slurm(args: argparse.Namespace) -> int:
    """Run `extforge verify PREFIX --json` on every node; one verdict row per node."""

    # Absolute paths: the tasks start in the same directory only where it is shared.
    verify_argv = [str(Path(args.prefix).resolve())]
    if getattr(args, "env", None):
        verify_argv += ["--env", args.env]
    if getattr(args, "lock", None):
        verify_argv += ["--lock", str(Path(args.lock).resolve())]
    if getattr(args, "threads", None):
        verify_argv += ["--threads", str(args.threads)]
    if getattr(args, "rehash", False):
        verify_argv.append("--rehash")
    verify_argv += [f"--channel-map={m}" for m in getattr(args, "channel_map", [])]

    rows = verify_on_nodes(slurm_config(args), verify_argv, nodelist=args.nodelist)
    if args.json:
        emit_json({"nodes": [r.to_json() for r in rows]})
    else:
        print_node_rows(rows)
        console.print(f"{sum(r.verdict == 'pass' for r in rows)}/{len(rows)} nodes can run this environment")
    return EXIT_OK if all(r.verdict == "pass" for r in rows) else EXIT_FINDINGS
