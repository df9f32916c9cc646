"""meta.yaml rendered for one variant row the way conda-build renders it, without conda-build.

conda-build cannot be installed here (it needs conda), so this module follows its documented and
observable behaviour (conda-build 24-26, `conda_build/metadata.py`, `variants.py`,
`jinja_context.py`, `environ.py`), written from scratch:

- Jinja context: the variant's values, `environ`, `compiler()`, `stdlib()`, `pin_compatible()`
  and PKG_HASH, which is the placeholder "1234567" while the recipe is rendered.
- Build string: when the recipe writes `h{{ PKG_HASH }}`, every `h` + 7 hex digits in the rendered
  string is replaced by the dependency hash; otherwise the string stays as rendered (and keeps
  the placeholder).
- Dependency hash: "h" + the first 7 hex digits of the sha1 of the JSON (sorted keys) of the
  variant values the recipe uses (found by the same textual rules conda-build applies to the
  recipe and build.sh), without python/perl/lua/r_base, plus each virtual package of the run
  requirements (`{"__cuda": "__cuda >=13"}`).
"""

from __future__ import annotations

import hashlib
import io
import json
import re
from pathlib import Path

import jinja2
from ruamel.yaml import YAML

TARGET_PLATFORM = "linux-64"
RENDER_PKG_HASH = "1234567"
HASH_LENGTH = 7
NATIVE_COMPILERS = {"c": "gcc", "cxx": "gxx", "fortran": "gfortran"}
# Selector names true on linux-64 (the others are false).
SELECTORS = {"linux": True, "linux64": True, "unix": True, "x86_64": True, "x86": True,
             "win": False, "osx": False, "aarch64": False, "arm64": False, "ppc64le": False}
# Already in conda-build's default build strings, so left out of the hash.
IN_BUILD_STRING = ("python", "r_base", "perl", "lua")
IGNORE_BUILD_ONLY_DEPS = ("python", "numpy")


def conda_build_variant(row: dict[str, str]) -> dict[str, str]:
    """A variant row as conda-build holds it: every value a string, target_platform always set."""
    return {k: str(v) for k, v in row.items()} | {"target_platform": TARGET_PLATFORM}


def _star(spec: str) -> str:
    """conda-build's ensure_valid_spec: a bare version pin becomes a prefix match."""
    name, _, version = spec.partition(" ")
    if version and re.fullmatch(r"[0-9A-Za-z._]+", version):
        return f"{name} {version}.*"
    return spec


def jinja_context(variant: dict[str, str]) -> dict:
    def compiler(lang: str) -> str:
        name = variant.get(f"{lang}_compiler", NATIVE_COMPILERS.get(lang, lang))
        version = variant.get(f"{lang}_compiler_version")
        return _star(f"{name}_{TARGET_PLATFORM} {version}" if version else f"{name}_{TARGET_PLATFORM}")

    def stdlib(lang: str) -> str:
        # Without `<lang>_stdlib` in the variant conda-build asks for a package named after the language.
        name = variant.get(f"{lang}_stdlib", lang)
        version = variant.get(f"{lang}_stdlib_version")
        return _star(f"{name}_{TARGET_PLATFORM} {version}" if version else f"{name}_{TARGET_PLATFORM}")

    def pin_compatible(name: str, **kw) -> str:
        # Resolved against the host environment at build time; the twin compares the call itself.
        return "pin_compatible " + name + " " + " ".join(f"{k}={v}" for k, v in sorted(kw.items()))

    return {**variant, "environ": {}, "PKG_HASH": RENDER_PKG_HASH, "compiler": compiler, "stdlib": stdlib,
            "pin_compatible": pin_compatible}


def apply_selectors(text: str, variant: dict[str, str]) -> str:
    """Drop lines whose `# [expr]` selector is false on linux-64; keep the others without it."""
    namespace = SELECTORS | {k: v for k, v in variant.items() if k.isidentifier()}
    out = []
    for line in text.splitlines():
        m = re.match(r"^(.*?)\s*#\s*\[(.+)\]\s*$", line)
        if m is None:
            out.append(line)
        elif eval(m.group(2), {"__builtins__": {}}, namespace):
            out.append(m.group(1))
    return "\n".join(out) + "\n"


def render_text(recipe_dir: Path, variant: dict[str, str]) -> str:
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    return env.from_string((recipe_dir / "meta.yaml").read_text()).render(**jinja_context(variant))


def _uses(key: str, lines: list[str]) -> bool:
    """conda-build's textual test: is variant key `key` used by these recipe lines?"""
    compiler = re.match(r"(.*?)_compiler(_version)?$", key)
    patterns = []
    if compiler:
        patterns.append(r"\{\s*compiler\(['\"]%s['\"][^{]*?\}" % re.escape(compiler.group(1)))
        candidates = [line for line in lines if key in line or compiler.group(1) in line]
    else:
        candidates = [line for line in lines if key in line.replace("-", "_")]
    k = re.escape(key)
    patterns += [
        r"\{\s*(?:pin_[a-z]+\(\s*?['\"])?%s[^'\"]*?\}\}" % k,  # {{ key }} or {{ pin_x('key') }}
        r"^\s+-\s+%s\s*(?:\s[\[#]|$)" % "[-_]".join(map(re.escape, key.split("_"))),  # a bare requirement
        r"(?:^|[^{])\{%%\s*(?:el)?if\s*.*%s\s*(?:[^%%]*?)?%%\}" % k,  # {% if ... key ... %}
    ]
    pattern = re.compile("|".join(patterns))
    return any(pattern.search(line) for line in candidates)


def _selector_uses(key: str, lines: list[str]) -> bool:
    pattern = re.compile(r"^[^#\[]*?#?\s\[[^\]]*?(?<![_\w\d])%s[=\s<>!\]]" % re.escape(key))
    return any(pattern.search(line) for line in lines if key in line)


def _requirements_text(text: str) -> str:
    m = re.search(r"requirements:.+?(?=^\w|\Z)", text, flags=re.M | re.S)
    return m.group() if m else ""


def _names(specs: list[str]) -> set[str]:
    return {s.split()[0].replace("-", "_") for s in specs if s}


def _trim_build_only(used: set[str], requirements: dict) -> set[str]:
    """Keys that only a run requirement (or an ignored build-only one) uses do not shape the build."""
    run = requirements.get("run") or []
    build, host = _names(requirements.get("build") or []), _names(requirements.get("host") or [])
    drop = {k for k in used if (k in run and k not in build | host)
            or (k not in run and k in build and k not in host and k in IGNORE_BUILD_ONLY_DEPS)}
    return used - drop


def used_variables(recipe_dir: Path, variant: dict[str, str], meta: dict) -> set[str]:
    raw = (recipe_dir / "meta.yaml").read_text()
    selected = apply_selectors(raw, variant)
    keys = sorted(variant)
    everywhere = {k for k in keys if _uses(k, selected.splitlines()) or _selector_uses(k, raw.splitlines())}
    in_requirements = {k for k in keys if _uses(k, _requirements_text(selected).splitlines())}
    used = (everywhere - in_requirements) | _trim_build_only(in_requirements, meta.get("requirements") or {})
    build_sh = recipe_dir / "build.sh"
    if build_sh.is_file():
        script = build_sh.read_text()
        used |= {k for k in keys if re.search(r"(^[^$]*?\$\{?\s*%s\s*[\s|}])" % re.escape(k), script, flags=re.M | re.S)}
    return used | {"target_platform"}


def hash_inputs(recipe_dir: Path, variant: dict[str, str], meta: dict) -> dict[str, str]:
    used = used_variables(recipe_dir, variant, meta)
    excluded = re.compile("|".join(rf"{name}[\s$]?.*" for name in IN_BUILD_STRING))
    kept = {k for k in used if not excluded.match(k) or " " in variant[k]}
    inputs = {} if kept == {"target_platform"} else {k: variant[k] for k in kept}
    run = (meta.get("requirements") or {}).get("run") or []
    inputs |= {spec.split(" ")[0]: spec for spec in run if spec.startswith("__")}
    return inputs


def dependency_hash(inputs: dict[str, str]) -> str:
    if not inputs:
        return ""
    return ("h" + hashlib.sha1(json.dumps(inputs, sort_keys=True).encode()).hexdigest())[: HASH_LENGTH + 1]


def build_string(raw_meta: str, rendered: str, dep_hash: str) -> str:
    if not re.search(r"h\{\{\s*PKG_HASH\s*\}\}", raw_meta):
        return rendered  # a build string of the recipe's own: conda-build leaves it alone
    return re.sub(r"h[0-9a-f]{%d}" % HASH_LENGTH, dep_hash, rendered)


def render(recipe_dir: Path, row: dict[str, str]) -> dict:
    """The rendered recipe, its build string as the package will carry it."""
    variant = conda_build_variant(row)
    text = apply_selectors(render_text(recipe_dir, variant), variant)
    meta = YAML(typ="safe").load(io.StringIO(text))
    inputs = hash_inputs(recipe_dir, variant, meta)
    meta["build"]["string"] = build_string((recipe_dir / "meta.yaml").read_text(), str(meta["build"]["string"]),
                                           dependency_hash(inputs))
    meta["extra"] = (meta.get("extra") or {}) | {"hash_inputs": inputs}
    return meta


def v1_pin(dep: object) -> str:
    """A rattler-build requirement (a string, or a pin_compatible mapping) as conda-build writes it."""
    if isinstance(dep, dict):
        (kind, args), = dep.items()
        args = dict(args)
        name = args.pop("name")
        # rattler-build spells conda-build's min_pin/max_pin as lower_bound/upper_bound.
        renamed = {{"lower_bound": "min_pin", "upper_bound": "max_pin"}.get(k, k): v for k, v in args.items()}
        return f"{kind} {name} " + " ".join(f"{k}={v}" for k, v in sorted(renamed.items()))
    return str(dep)


def assert_same_tests(v1: dict, meta: dict) -> None:
    """meta.yaml's test section runs what the v1 recipe's tests run."""
    kinds = {next(iter(t)): t[next(iter(t))] for t in v1["tests"]}
    assert meta["test"].get("imports", []) == kinds.get("python", {}).get("imports", [])
    commands = "\n".join(meta["test"]["commands"])
    for pattern in kinds["package_contents"]["files"]:
        # rattler-build's `**/x` glob is a `find ${PREFIX} -path '*/x'` in conda-build's shell.
        as_find = f"find ${{PREFIX}} -path '*/{pattern.removeprefix('**/')}'"
        assert as_find in commands or "${PREFIX}/" + pattern in commands, pattern
    for site_package in kinds["package_contents"].get("site_packages", []):
        assert f"${{SP_DIR}}/{site_package}" in commands
    script_test = next(t for t in v1["tests"] if "script" in t)
    assert script_test["script"] in meta["test"]["commands"]
    assert meta["test"]["files"] == script_test["files"]["recipe"]
