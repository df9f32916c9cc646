"""The Slurm options of `extforge build` and `extforge verify`.

Each command adds them with one call (`add_build_options(parser)`); this module imports
nothing else, so building the CLI's parser stays fast.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..options import add_wheel_index, option_type, positive_int


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
    add_wheel_index(g, "each job also publishes its package's wheel (first: a wheel refused leaves the variant failed)")
    g.add_argument("--time", help="job time limit, overriding the planner's estimate (sbatch syntax)")
    g.add_argument("--node-cores", type=option_type(positive_int), help="cores of a build node (default: the partition's smallest node)")
    g.add_argument("--node-memory", help="memory of a build node, e.g. 128G (default: from sinfo)")
    g.add_argument("--shared-cache", metavar="DIR", help="cache root on the shared filesystem for every job")
    g.add_argument("--parts", type=option_type(positive_int), default=1, metavar="N",
                   help="split each variant's build: a job array of N parts compiles into the compile cache under "
                        "--shared-cache, then a link job builds and publishes the package (for a build longer than "
                        "one job may run)")
    g.add_argument("--dry-run", action="store_true", help="print the sbatch scripts instead of submitting them")
    g.add_argument("--wait", type=float, metavar="SECONDS", help="wait up to SECONDS for the jobs, then report")


def add_verify_options(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("Slurm: verify on every node of a partition")
    _add_common(g, "run the verification on every node of the partition (srun, one task per node)")
    g.add_argument("--nodelist", help="only these nodes (Slurm hostlist syntax)")
