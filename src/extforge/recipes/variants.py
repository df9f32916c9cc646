"""The variant matrix of a build: which files define it and how channels and flags narrow it.

Precedence follows rattler-build and conda-forge, plus one rule of ours:
- the recipe's own variants.yaml is read only when no variant file is given (rattler-build's
  rule), so `-m variants-offline.yaml` replaces the production matrix instead of adding to it
  (a key only the recipe's own file defines is then undefined: `render` names that file);
- a channel written by `extforge mirror` carries variants.yaml with the values its packages
  satisfy: one zipped row per torch build it holds (python, pytorch, CUDA, C++ ABI, compilers).
  Those NARROW the matrix to the rows the channel can build, and fill keys the recipe leaves
  open; they never add rows the recipe file does not have (`fit_to_channel`), and never
  replace a value: a file that asks only for values the channel lacks is refused, naming what
  the channel has and the `extforge mirror` command that adds the missing one;
- `--variant KEY=VALUE` narrows last, and may not leave the channel's rows either.
Everything here runs before rattler-build solves or compiles anything.
`extforge build` and `extforge build --slurm` both go through `resolve()`, so a Slurm job
builds exactly the variant that was expanded for it.
"""

from __future__ import annotations

import itertools
import json
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import engine
from ..channel_ref import local_folder
from ..cuda_rule import fitting_toolkits, missing_toolkit, takes, version_key
from ..errors import ExtforgeError
from ..fatbin import Arch, parse_arch_list, torch_arch_list
from ..ui import log
from . import build_layer

CHANNEL_VARIANTS = "variants.yaml"  # written by `extforge mirror` into its channel


@dataclass(frozen=True)
class Matrix:
    values: dict[str, list]
    zip_keys: list[list[str]]
    files: list[Path]  # the recipe-side files read, lowest precedence first
    replaced: Path | None = None  # the recipe's own variants.yaml, when -m files replace it

    def config(self) -> Any:
        """The matrix as a rattler_build.VariantConfig."""
        return engine.variant_config(self.values, self.zip_keys)


def channel_files(channels: Sequence[str]) -> list[Path]:
    folders = [local_folder(ch) for ch in channels]
    return [f / CHANNEL_VARIANTS for f in folders if f is not None and (f / CHANNEL_VARIANTS).is_file()]


def inherited_files(recipe: Path) -> list[Path]:
    """The variant files a recipe reads before its own: the build layer's, for a recipe that lists it."""
    return [build_layer.variants_file()] if build_layer.uses_layer(recipe.read_text()) else []


def recipe_files(recipe: Path, given: Sequence[Path]) -> list[Path]:
    """The variant files of a build, lowest precedence first: those the recipe inherits, then
    the given ones, else the recipe's own variants.yaml."""
    for f in given:
        if not Path(f).is_file():
            raise ExtforgeError(f"variant config {f} does not exist", "", "check the --variant-config path")
    if given:
        return [*inherited_files(recipe), *map(Path, given)]
    own = recipe.parent / "variants.yaml"
    return [*inherited_files(recipe), *([own] if own.is_file() else [])]


def narrow(
    values: Mapping[str, list],
    zip_keys: list[list[str]],
    wanted: Mapping[str, list[str]],
    source: str = "--variant",
    strict: bool = False,
    some: bool = False,
) -> dict[str, list]:
    """Restrict keys to the wanted values; a zipped key keeps its zip partners at the matching positions.

    Unless `strict`, a key outside every zip group, or a zipped key narrowed to its last row, is
    set to the wanted value; `strict` only ever keeps values the matrix has. Every wanted value
    must be found, unless `some` (a channel offering more rows than the matrix names).
    """
    out = {k: list(v) for k, v in values.items()}
    for key, want in wanted.items():
        group = next((g for g in zip_keys if key in g), None)
        if key not in out or (group is None and not strict):
            out[key] = list(want)
            continue
        keep = [i for i, v in enumerate(out[key]) if str(v) in {str(w) for w in want}]
        if not keep and not strict and len(out[key]) == 1 and len(want) == 1:
            # One row left: a value it lacks overrides it (e.g. fewer archs for a quick build).
            out[key] = list(want)
            continue
        absent = [str(w) for w in want if str(w) not in {str(v) for v in out[key]}]
        if not keep or (absent and not some):
            raise ExtforgeError(
                f"{source} {key}={','.join(absent or map(str, want))} is not in the variant matrix",
                (f"{key} is zipped with {', '.join(k for k in group if k != key)} and " if group else f"{key} ")
                + f"takes only {', '.join(map(str, out[key]))}",
                "pick one of those values, add a row with it (and its zip partners) to the variant file, "
                "or pass a variant file that has one (-m FILE)",
            )
        for k in group or [key]:
            if k in out:
                out[k] = [out[k][i] for i in keep]
    return out


def channel_rows(values: Mapping[str, Sequence], zip_keys: Sequence[Sequence[str]]) -> list[dict[str, str]]:
    """The rows of a mirror channel's variants.yaml: its one zip group, other keys single-valued."""
    zipped = next(iter(zip_keys), [])
    n = max((len(values[k]) for k in zipped if k in values), default=1)
    return [{k: str(v[i] if k in zipped and len(v) == n else v[0]) for k, v in values.items()} for i in range(n)]


# The keys a mirror channel's rows pin, as people name them, in the order a torch build is described.
ROW_WORDS = {"python": "python", "pytorch": "pytorch", "cuda_compiler_version": "CUDA toolkit",
             "cxx_abi": "C++ ABI", "c_compiler_version": "gcc", "cxx_compiler_version": "g++"}


def describe_row(row: Mapping[str, str]) -> str:
    return ", ".join(f"{word} {row[k]}" for k, word in ROW_WORDS.items() if k in row) or "no pinned values"


def expand(values: Mapping[str, Sequence], zips: Sequence[Sequence[str]], keys: Sequence[str]) -> list[dict[str, str]]:
    """Every row of the matrix, each reduced to `keys` (zipped keys move together, others multiply)."""
    groups: list[list[dict[str, str]]] = []
    seen: set[str] = set()
    for g in zips:
        ks = [k for k in g if k in keys and k in values]
        seen |= set(g)
        if ks:
            groups.append([{k: str(values[k][i]) for k in ks} for i in range(min(len(values[k]) for k in ks))])
    groups += [[{k: str(v)} for v in values[k]] for k in keys if k in values and k not in seen]
    rows = [{k: v for part in combo for k, v in part.items()} for combo in itertools.product(*groups)]
    return list({tuple(r.items()): r for r in rows}.values())


def mirror_command(wanted: Mapping[str, str], like: Mapping[str, str], folder: Path | None) -> str:
    """The `extforge mirror` command that adds a torch build with the `wanted` values (the rest as
    in `like`, a row the channel has) to the channel folder."""
    row = {**like, **wanted}
    words = [f"CC=gcc-{row['c_compiler_version']}", f"CXX=g++-{row.get('cxx_compiler_version', row['c_compiler_version'])}"] \
        if {"c_compiler_version", "cxx_compiler_version"} & wanted.keys() and "c_compiler_version" in row else []
    words += ["extforge", "mirror", "--channel", shlex.quote(str(folder)) if folder else "CHANNEL_DIR"]
    toolkit = wanted.get("cuda_compiler_version")
    # The mirror packages a toolkit only for a torch that takes it (cuda_rule.takes). The row's
    # torch surely takes what it already took, or an older minor of that major; any other toolkit
    # comes with a torch built for it, and pip's index serves one CUDA build per torch release.
    had = like.get("cuda_compiler_version", "")  # "None" in a CPU row
    if "cxx_abi" in wanted:
        # pip's index serves one ABI per torch release; a wheel of the other comes from elsewhere.
        words += ["--from-wheels", f"/path/to/wheels-with-a-{row['cxx_abi']}-torch"]
    elif toolkit is not None and not (had[:1].isdigit() and takes(had, toolkit)):
        major = toolkit.split(".")[0]
        words += ["--from-wheels", f"/path/to/wheels-with-a-torch-built-with-cuda-{toolkit}-or-a-later-{major}.x"]
    else:
        words += ["--from-pip", "--torch", f"torch=={row.get('pytorch', 'VERSION')}"]
    if "python" in row:
        words += ["--python", f"/path/to/python{row['python']}"]
    if "cuda_compiler_version" in wanted:
        words += ["--cuda-home", f"/usr/local/cuda-{row['cuda_compiler_version']}"]
    return " ".join(words)


def channel_lacks(source: str, asked: Mapping[str, Sequence[str]], rows: Sequence[Mapping[str, str]],
                  folder: Path | None) -> ExtforgeError:
    """A request the channel's torch builds cannot meet: what it asked, what the channel has, and
    the `extforge mirror` command that adds the missing build."""
    asked = {k: list(dict.fromkeys(map(str, vs))) for k, vs in asked.items()}
    missing = [k for k, vs in asked.items() if not set(vs) & {r.get(k) for r in rows}]
    first = {k: vs[0] for k, vs in asked.items()}
    like = max(rows, key=lambda r: sum(r.get(k) == v for k, v in first.items()))
    lacks_each = [f"{ROW_WORDS.get(k, k)} {' or '.join(asked[k])}" for k in missing]
    lacks = (f"it has no {' and no '.join(lacks_each)}" if missing
             else f"none of its torch builds has {describe_row(first)} together")
    have = "; ".join(f"({describe_row(r)})" for r in rows)
    key = next(iter(missing or first))
    asked_text = ", ".join(f"{k}={','.join(vs)}" for k, vs in asked.items())
    pick = (f"--variant {key}={like.get(key, '...')}" if source == "--variant"
            else f"{key}: [\"{like.get(key, '...')}\"] in {source.replace('-m ', '')}")
    holds = (f"{folder or 'the channel'} holds {len(rows)} torch build{'s' if len(rows) != 1 else ''}: {have} "
             f"(its {CHANNEL_VARIANTS}, written by `extforge mirror`); a variant asked for is built exactly or not at all")
    if missing == ["cuda_compiler_version"]:
        # A toolkit of the same major and an older minor compiles for that torch: where the channel
        # has one, that is the answer, not a new mirror.
        have_toolkits = {r[key] for r in rows if key in r}
        fits = fitting_toolkits(*version_key(first[key]), have_toolkits)
        toolkit = missing_toolkit([f"cuda-nvcc_linux-64 {first[key]}.*"], have_toolkits) if fits else None
        if toolkit is not None:
            return ExtforgeError(f"{source} asks for {asked_text}: {toolkit.what}", f"{toolkit.why}; {holds}", toolkit.fix)
    return ExtforgeError(
        f"{source} asks for {asked_text}, which the channel cannot build: {lacks}",
        holds,
        f"add that build to the channel: {mirror_command(first, like, folder)}; or ask for one the channel has ({pick})",
    )


def fit_to_channel(
    values: Mapping[str, list], zips: list[list[str]], channel_values: Mapping[str, list],
    channel_zips: Sequence[Sequence[str]], source: str = "the variant file", folder: Path | None = None,
) -> tuple[dict[str, list], list[list[str]]]:
    """The recipe's matrix cut down to the rows a mirror channel can build, filled with the
    channel's values for keys the recipe leaves open.

    A channel holds one or more torch builds (rows: python, pytorch, CUDA, ABI, compilers).
    A recipe row is kept once per channel row that agrees with it on every key both name;
    the result zips the recipe's zipped keys with the channel's, one entry per kept pair.
    A matrix none of whose rows the channel has is refused (`channel_lacks`), never replaced."""
    rows = channel_rows(channel_values, channel_zips)
    shared = [k for k in channel_values if k in values]
    if not channel_values:
        return dict(values), zips
    for k in shared:
        if not {str(v) for v in values[k]} & {r[k] for r in rows}:
            raise channel_lacks(source, {k: values[k]}, rows, folder)
    values = narrow(values, zips, {k: sorted({r[k] for r in rows}) for k in shared}, source=source, strict=True,
                    some=True)
    group = next((g for g in zips if any(k in g for k in shared)), [])
    n = len(values[group[0]]) if group else 1
    pairs = []
    for i in range(n):
        mine = {k: values[k][i] for k in group if k in values}
        for row in rows:
            if all(str(mine[k]) == row[k] if k in mine else row[k] in map(str, values[k]) for k in shared):
                pairs.append(mine | row)
    if not pairs:
        first = expand(values, zips, shared)[0]
        raise channel_lacks(source, {k: [v] for k, v in first.items()}, rows, folder)
    out = {k: list(v) for k, v in values.items() if k not in group}
    zipped = list(dict.fromkeys([*group, *channel_values]))
    out |= {k: [p[k] for p in pairs] for k in zipped}
    return out, [g for g in zips if g is not group] + ([zipped] if len(zipped) > 1 else [])


def resolve(
    recipe: Path, channels: Sequence[str], given: Sequence[Path], overrides: Mapping[str, list[str]]
) -> Matrix:
    files = recipe_files(recipe, given)
    values, zips = engine.read_variant_files(files)
    source = " ".join(f"-m {f}" for f in given) if given else (str(files[-1]) if files else "the recipe")
    # Arch lists reach the build in the form its variant files write them, whatever a flag said.
    values = normal_archs(values, source)
    overrides = normal_archs(overrides, "--variant")
    found = channel_files(channels)
    channel_values, channel_zips = engine.read_variant_files(found)
    folder = found[0].parent if found else None
    fitted, fitted_zips = fit_to_channel(values, zips, channel_values, channel_zips, source, folder)
    keys = [k for k in channel_values if k in fitted]
    kept = [{k: r[k] for k in keys if k in values} for r in expand(fitted, fitted_zips, keys)]
    dropped = [r for r in expand(values, zips, keys) if r not in kept]
    if dropped:
        # Narrowing a matrix to the channel's rows is the offline file's purpose; still said, never silent.
        log.warning("%s: %d of its rows not built (the channel has no torch build for them): %s", source,
                    len(dropped), "; ".join(describe_row(r) for r in dropped))
    rows = channel_rows(channel_values, channel_zips) if channel_values else []
    for k, want in overrides.items():
        if rows and k in keys and not set(want) <= {r[k] for r in rows}:
            raise channel_lacks("--variant", {k: [w for w in want if w not in {r[k] for r in rows}]}, rows, folder)
    narrowed = narrow(fitted, fitted_zips, overrides)
    for row in expand(narrowed, fitted_zips, keys) if rows else []:
        if row not in [{k: r[k] for k in row} for r in rows]:
            asked = {k: [row[k]] for k in overrides if k in row} or {k: [v] for k, v in row.items()}
            raise channel_lacks("--variant", asked, rows, folder)
    own = recipe.parent / "variants.yaml"
    return Matrix(narrowed, fitted_zips, files, own if own.is_file() and own not in files else None)


# rattler-build's render error for a Jinja name no variant defines:
# `undefined value (in <string>:1) (template: ${{ cuda_archs }})`.
UNDEFINED = re.compile(r"undefined value \(in [^)]*\) \(template: (?P<template>.*?)\)(?: \}|\"|$)", re.S)
# Names rattler-build defines itself, and Jinja's words.
_NOT_VARIABLES = {"and", "or", "not", "in", "is", "if", "else", "true", "false", "none", "True", "False", "None",
                  "env", "hash", "build_number", "target_platform", "build_platform", "unix", "linux", "osx", "win",
                  "PYTHON", "PREFIX", "RECIPE_DIR", "SRC_DIR"}
# A name that is a variable: not an attribute (.get), filter (| f), call (f(...)), keyword argument
# (default=) or a name with a default (x | default(...)).
_VARIABLE = re.compile(r"(?<![\w.])(?<!\|)(?<!\|\s)([A-Za-z_]\w*)(?!\w)(?!\s*[(=])(?!\s*\|\s*default\b)")


def undefined_keys(template: str, defined: Mapping[str, object]) -> list[str]:
    """The variable names of a template (`${{ cuda_archs }}`, `${{ x | default("y") }}`) not in `defined`."""
    exprs = [re.sub(r"'[^']*'|\"[^\"]*\"", "''", e) for e in re.findall(r"\$\{\{(.*?)\}\}", template, re.S)]
    names = [n for e in exprs for n in _VARIABLE.findall(e)]
    return [n for n in dict.fromkeys(names) if n not in _NOT_VARIABLES and n not in defined]


def render(recipe_file: Path, matrix: Matrix) -> list[Any]:
    """rattler-build's rendered variants of the recipe over `matrix`; a Jinja name no variant file
    defines is named with the file that would define it (this runs before anything is solved)."""
    try:
        inherits = build_layer.uses_layer(recipe_file.read_text())
        return engine.render(recipe_file, matrix.config(), build_string=build_layer.BUILD_STRING if inherits else None)
    except BaseException as exc:  # rattler-build's own exception types for every parse step, or a panic
        if not engine.engine_failure(exc):
            raise
        if parse_error := recipe_yaml_error(exc, recipe_file):
            raise parse_error from exc
        found = UNDEFINED.search(str(exc))
        if found is None:
            raise ExtforgeError(f"could not render {recipe_file}", engine.engine_message(exc).splitlines()[0],
                                "fix the recipe or variant file") from exc
        raise undefined_variable(found.group("template"), recipe_file, matrix) from exc


# rattler-build's recipe parse errors: "Failed to parse YAML: 7:5: <what>" (line:column).
_YAML_ERROR = re.compile(r"Failed to parse YAML: (\d+):(\d+): (.+)", re.S)


def recipe_yaml_error(exc: BaseException, recipe_file: Path) -> ExtforgeError | None:
    """A recipe that is not YAML, said with its line (the build log holds nothing more)."""
    m = _YAML_ERROR.search(str(exc))
    if not m:
        return None
    line, column, detail = int(m.group(1)), int(m.group(2)), " ".join(m.group(3).split())
    try:
        text = recipe_file.read_text(errors="replace").splitlines()[line - 1].rstrip()
    except (OSError, IndexError):
        text = ""
    return ExtforgeError(
        f"{recipe_file} is not valid YAML: line {line}, column {column}: {detail}",
        f"line {line} reads: {text[:200]!r}" if text else "rattler-build could not parse the recipe",
        f"fix line {line} of {recipe_file.name} (a YAML linter such as `yamllint` shows the structure around it)",
    )


def undefined_variable(template: str, recipe_file: Path, matrix: Matrix) -> ExtforgeError:
    key = next(iter(undefined_keys(template, matrix.values)), template)
    own = engine.read_variant_files([matrix.replaced])[0] if matrix.replaced else {}
    # The build layer's file is read whatever is given: the fix names the files given alone.
    files = [f for f in matrix.files if f not in inherited_files(recipe_file)]
    given = ", ".join(map(str, files)) or "none"
    if key in own:
        why = (f"{matrix.replaced} defines {key}, but -m FILE replaces the recipe's own variants.yaml "
               f"(rattler-build's rule), and {given} does not define it")
        fix = (f"add `{key}: {json.dumps([str(v) for v in own[key]])}` to {given}, or pass the recipe's file first "
               f"so both are read (later files win): -m {matrix.replaced} " + " ".join(f"-m {f}" for f in files))
    else:
        why = f"no variant file read defines it (read: {given}; and the channel's {CHANNEL_VARIANTS})"
        fix = f"define it in a variant file (-m FILE) or on the command line: --variant {key}=VALUE"
    return ExtforgeError(
        f"the variant key `{key}` is undefined: {recipe_file} uses it in {template.strip()}", why, fix)


def parse_variant_overrides(items: Sequence[str]) -> dict[str, list[str]]:
    """`--variant python=3.12 --variant cuda_archs=8.0,9.0` → {"python": ["3.12"], ...}."""
    out: dict[str, list[str]] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ExtforgeError(
                f"bad --variant '{item}'",
                "a variant override is KEY=VALUE (values of one key may be comma-separated)",
                "e.g. --variant python=3.12",
            )
        out[key.strip()] = [v.strip() for v in value.split(",")]
    return out


ARCH_KEY = "cuda_archs"  # the variant key of a build's GPU archs (TORCH_CUDA_ARCH_LIST's spelling)


def archs(values: Mapping[str, object]) -> list[str]:
    """GPU archs a variant names (cuda_archs="8.0;9.0", one value or a list of them), as ["80", "90"]."""
    found: dict[str, None] = {}
    value = values.get(ARCH_KEY)
    for item in value if isinstance(value, list) else [] if value is None else [value]:
        found |= dict.fromkeys(a.code for a in _arch_list(str(item), "the variant"))
    return list(found)


def _arch_list(value: str, source: str) -> tuple[Arch, ...]:
    try:
        return parse_arch_list(value)
    except ValueError as exc:
        raise ExtforgeError(
            f"{source} {ARCH_KEY}={value!r} is not a list of GPU archs", str(exc),
            f"write {ARCH_KEY} like 9.0 or 8.0;9.0 (one variant's archs separated by ';'; a comma in --variant starts "
            "another variant)") from exc


def normal_archs(values: Mapping[str, list], source: str) -> dict[str, list]:
    """`values` with cuda_archs in TORCH_CUDA_ARCH_LIST's spelling ("8.0;9.0a"), which the build
    layer reads: whatever spelling a flag or a file used (sm_90, 90, 9.0), the build gets that
    form, and a value that names no arch is refused here, before anything is solved or compiled."""
    out = dict(values)
    if ARCH_KEY in values:
        out[ARCH_KEY] = [";".join(torch_arch_list(_arch_list(str(v), source))) for v in values[ARCH_KEY]]
    return out
