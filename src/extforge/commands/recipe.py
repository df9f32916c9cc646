"""`extforge recipe new NAME==VERSION`: a recipe folder for a torch extension's PyPI sdist."""

from __future__ import annotations

import argparse
import shlex
import tempfile
from pathlib import Path

from .. import channel_ref, safe_files
from ..errors import EXIT_FINDINGS, EXIT_OK, ExtforgeError
from ..fatbin import parse_arch_list, torch_arch_list
from ..options import option_type
from ..ui import console, emit_json

HELP = "write a recipe folder for a PyPI sdist (source, requirements, import tests) and say what it could not decide"


def cuda_archs(text: str) -> tuple[str, ...]:
    """'80,90', 'sm_80;9.0' -> ('8.0', '9.0'), as TORCH_CUDA_ARCH_LIST names them."""
    return torch_arch_list(parse_arch_list(text))


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("new",), help="new: write <dest>/<name>/recipe.yaml (and variants.yaml "
                        "with --archs)")
    parser.add_argument("requirement", metavar="NAME==VERSION", help="the PyPI release, e.g. causal-conv1d==1.7.0")
    parser.add_argument("--sdist", type=Path, help="the release's sdist on disk (offline): its sha256 is computed here")
    parser.add_argument("--url", help="with --sdist: the URL the recipe names after the source cache (default: "
                        "PyPI's /packages/source/ address derived from the file name)")
    parser.add_argument("--index", default=None,
                        help="the package index's JSON API root (default https://pypi.org/pypi; a PyPI proxy's own)")
    parser.add_argument("--dest", type=Path, default=Path("recipe"), help="folder of recipe folders (default: recipe)")
    parser.add_argument("--archs", type=option_type(cuda_archs), default=(),
                        help="GPU archs of the recipe's own variants.yaml, e.g. 8.0,9.0 or sm_80,sm_90 (default: no "
                        "variants.yaml, extforge-torch-build's gives 9.0)")
    parser.add_argument("-c", "--channel", action="append", default=[], metavar="CHANNEL",
                        help="the channel the recipe will build from (a folder, repeatable): the run requirements and "
                        "upstream's test requirements it lacks are named, with the `extforge mirror --extra` that adds them")
    parser.add_argument("--force", action="store_true", help="overwrite an existing recipe folder's two files")
    parser.epilog = ("exit codes: 0 written, every part decided; 1 written, with what it could not decide or a run "
                     "requirement the channel lacks listed (stderr, and `undecided`/`channel_lacks` in --json); "
                     "2 nothing written")


def run(args: argparse.Namespace) -> int:
    from packaging.utils import canonicalize_name

    from ..hashing import sha256_file
    from ..recipes import scaffold

    try:
        name, version = scaffold.parse_requirement(args.requirement)
    except ValueError as exc:
        raise ExtforgeError(f"cannot read '{args.requirement}'", str(exc), "extforge recipe new causal-conv1d==1.7.0") from exc
    folder = args.dest / canonicalize_name(name)
    if (folder / "recipe.yaml").exists() and not args.force:
        raise ExtforgeError(f"{folder / 'recipe.yaml'} exists", "recipe new never overwrites a recipe unasked",
                            "pass --force, or another --dest")
    derived: list[str] = []
    with tempfile.TemporaryDirectory(prefix="extforge-recipe-") as tmp:
        if args.sdist:
            if not args.sdist.is_file():
                raise ExtforgeError(f"no sdist at {args.sdist}", fix="pass the path of the release's .tar.gz")
            path = args.sdist
            sdist = scaffold.Sdist(path.name, args.url or scaffold.source_url(name, path.name), sha256_file(path))
            if (why := scaffold.sdist_problem(sdist)) is not None:
                raise ExtforgeError(f"cannot name {path} in a recipe", why,
                                    "give the file its sdist's own name (NAME-VERSION.tar.gz) and --url an http(s) URL to it")
            if not args.url:
                derived.append(f"source URL derived from the file name ({sdist.url}, a redirect some mirrors do not "
                               "serve): the index's files.pythonhosted.org URL is better (--url)")
        else:
            sdist = scaffold.pypi_sdist(name, version, args.index or scaffold.PYPI)
            path = scaffold.download(sdist, Path(tmp))
        facts = scaffold.read_sdist(path)
    if canonicalize_name(facts.name) != canonicalize_name(name) or facts.version != version:
        raise ExtforgeError(f"{path.name} is {facts.name} {facts.version}, not {name} {version}",
                            "its PKG-INFO names another release", "pass the sdist of the release asked for")
    made = scaffold.scaffold(facts, sdist, args.archs)
    undecided = [*derived, *made.undecided]
    remote = [c for c in args.channel if channel_ref.local_folder(c) is None]
    lacking = made.lacking(channel_ref.package_names([c for c in args.channel if c not in remote])) \
        if len(remote) < len(args.channel) else []
    if made.run and len(remote) == len(args.channel):
        undecided.append(f"runtime requirements mapped to conda by name ({', '.join(s.split()[0] for s in made.run)}): "
                         "check the channel names them alike (-c CHANNEL checks a channel folder)")
    # Nothing below --dest is followed: a link planted at <dest>/<name> is refused, not written through.
    safe_files.make_dirs(folder, beneath=args.dest)
    files = {folder / "recipe.yaml": made.recipe_yaml(), folder / "variants.yaml": made.variants_yaml()}
    for path, text in files.items():
        if text is not None:
            safe_files.write_atomic(path, text.encode(), beneath=args.dest)
        elif path.is_file():
            # A variants.yaml of an earlier `recipe new --archs` would keep its archs over the layer's.
            safe_files.remove(path, beneath=args.dest)
    written = [path for path, text in files.items() if text is not None]
    mirror = (f"extforge mirror --channel {shlex.quote(args.channel[0])} "
              + " ".join(f"--extra {shlex.quote(x.pypi)}" for x in lacking)) if lacking else None
    if args.json:
        emit_json({"recipe": str(folder), "files": [str(f) for f in written],
                   "sdist": {"filename": sdist.filename, "url": sdist.url, "sha256": sdist.sha256},
                   "imports": made.imports, "run": made.run, "translation_units": made.units,
                   "decided": [{"decides": d.decides, "set": dict(d.values), "reason": d.reason} for d in made.decisions],
                   "ops_test": made.ops.command() if made.ops else None,
                   "upstream_tests": {"in_sdist": list(made.tests.in_sdist), "folder": made.tests.folder,
                                      "url": made.tests.url, "requires": list(made.tests.requires),
                                      "imports": list(made.tests.imported)},
                   "channel_lacks": [{"name": x.conda, "pypi": x.pypi, "for": x.needed_by} for x in lacking],
                   "mirror_command": mirror, "undecided": undecided})
    console.print(f"wrote {' and '.join(str(f) for f in written)} ({facts.name} {facts.version}, imports: "
                  f"{', '.join(made.imports) or 'none'})", markup=False)
    for d in made.decisions:
        console.print(f"decided ({d.decides}): {', '.join(f'{k}={v}' for k, v in d.values.items())}: {d.reason}",
                      markup=False)
    if made.ops:
        console.print(f"tested through torch.ops.{made.ops.namespace}: {len(made.ops.ops)} ops registered", markup=False)
    console.print(made.tests.describe() + (f"; they import {', '.join(made.tests.imported)}" if made.tests.imported else ""),
                  markup=False)
    if remote:
        console.print(f"not checked against {', '.join(remote)}: recipe new reads channel folders only", markup=False)
    if lacking:
        console.print(f"{', '.join(args.channel)} lacks: "
                      + ", ".join(f"{x.conda} ({x.needed_by})" for x in lacking)
                      + f"; add them with the options the channel was made with: {mirror}", markup=False)
    if undecided:
        console.print("could not decide:\n" + "\n".join(f"  - {u}" for u in undecided), markup=False)
    console.print(f"next: extforge sources fetch {folder}; extforge build {folder} -c {shlex.quote(args.channel[0]) if args.channel else 'CHANNEL'}",
                  markup=False)
    # A run requirement the channel lacks fails the build's own tests; upstream's test requirements, only upstream's tests.
    return EXIT_FINDINGS if undecided or any(x.needed_by == "run" for x in lacking) else EXIT_OK

