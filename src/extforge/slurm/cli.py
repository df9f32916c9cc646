"""The Slurm options of `extforge build` and `extforge verify`, and what they run.

Each command adds them with one call (`add_build_options(parser)`) and hands over early
in run() (`if args.slurm: return submit_build(args)`), so the Slurm code stays here.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import EXIT_CANNOT_RUN, EXIT_FINDINGS, EXIT_OK, ExtforgeError
from .config import SlurmConfig, load


def _add_common(group: argparse._ArgumentGroup, what: str) -> None:
    group.add_argument("--slurm", action="store_true", help=what)
    group.add_argument("--partition", help="Slurm partition (default: slurm.toml, else the cluster's default)")
    group.add_argument("--account", help="Slurm account to charge")
    group.add_argument("--qos", help="Slurm QOS")
    group.add_argument("--sbatch-arg", dest="extra_args", action="append", default=[], metavar="OPTION",
                       help="extra sbatch/srun option, repeatable, e.g. --sbatch-arg=--constraint=h100")
    group.add_argument("--slurm-config", type=Path, metavar="FILE",
                       help="site settings (default: ~/.config/extforge/slurm.toml when present)")


def add_build_options(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("Slurm: one job per variant of the recipe's matrix")
    _add_common(g, "submit one Slurm job per variant instead of building here")
    g.add_argument("--publish-to", metavar="CHANNEL", help="channel folder each job publishes its audited package to")
    g.add_argument("--time", help="job time limit, overriding the planner's estimate (sbatch syntax)")
    g.add_argument("--node-cores", type=int, help="cores of a build node (default: the partition's smallest node)")
    g.add_argument("--node-memory", help="memory of a build node, e.g. 128G (default: from sinfo)")
    g.add_argument("--shared-cache", metavar="DIR", help="cache root on the shared filesystem for every job")
    g.add_argument("--dry-run", action="store_true", help="print the sbatch scripts instead of submitting them")
    g.add_argument("--wait", type=float, metavar="SECONDS", help="wait up to SECONDS for the jobs, then report")


def add_verify_options(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("Slurm: verify on every node of a partition")
    _add_common(g, "run the verification on every node of the partition (srun, one task per node)")
    g.add_argument("--nodelist", help="only these nodes (Slurm hostlist syntax)")


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


def submit_build(args: argparse.Namespace) -> int:
    from ..ui import console, emit_json
    from ..build import parse_variant_overrides
    from .report import print_rows, status_rows
    from .submit import BuildRequest, submit_matrix, wait_for

    if not args.publish_to:
        raise ExtforgeError(
            "--slurm needs --publish-to CHANNEL",
            "each job publishes the package it built to a channel every node can reach",
            "add --publish-to /shared/channels/internal (a folder on the shared filesystem)",
        )
    req = BuildRequest(
        recipe=Path(args.recipe),
        channels=tuple(args.channel or ()),
        publish_to=str(Path(args.publish_to).expanduser().resolve()) if "://" not in args.publish_to else args.publish_to,
        output_dir=Path(args.output_dir),
        variant_configs=tuple(args.variant_config),
        overrides=parse_variant_overrides(args.variant),
        config=slurm_config(args),
        no_test=args.no_test,
        no_audit=args.no_audit,
    )
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
    from ..ui import console, emit_json
    from .verify import print_node_rows, verify_on_nodes

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
