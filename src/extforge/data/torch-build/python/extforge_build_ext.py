"""extforge-torch-build: torch's BuildExtension compiles every extension of a setup.py in one
ninja run. Applied by sitecustomize when a build imports torch.utils.cpp_extension.

setuptools builds a setup.py's extensions one after another and torch runs one ninja per
extension: torch-cluster's nine extensions of 1-3 units each kept 3 of 16 cores busy. Here the
build runs in three passes over the same extensions: the first writes each extension's
build.ninja (nothing compiled, nothing linked), one ninja then compiles all their units at once
over MAX_JOBS slots, and the second pass links each extension from its objects (its compile
finds them built). setuptools' own parallel build_ext cannot do this: torch writes every
extension's build.ninja, .ninja_log and .ninja_deps into the one build_temp, so concurrent
extensions would overwrite each other's files.

Each extension's objects go below build_temp/<extension name>/: setup.py files such as
torch-cluster's (FORCE_CUDA=1) compile one source into two extensions with different macros,
which in one folder would be one object. ninja's log stays where readers look for it
(build_temp/.ninja_log), one run.

EXTFORGE_NINJA=on also turns ninja on where upstream turned it off (pyg's use_ninja=False);
EXTFORGE_NINJA=separate keeps upstream's one ninja per extension.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any


def _say(text: str) -> None:
    print(f"extforge-torch-build: {text}", file=sys.stderr, flush=True)


def patch(cpp_extension: Any) -> None:
    """Wrap BuildExtension of the module just imported; leaves a torch without the internals
    relied on (its module-level ninja runner) as it is, saying so."""
    mode = os.environ.get("EXTFORGE_NINJA", "")
    build_extension_cls = getattr(cpp_extension, "BuildExtension", None)
    if build_extension_cls is None or mode == "separate":
        return
    if mode == "on":
        original_init = build_extension_cls.__init__

        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            if kwargs.get("use_ninja") is False:
                _say("ninja turned on (EXTFORGE_NINJA=on; upstream passes use_ninja=False)")
            kwargs["use_ninja"] = True
            original_init(self, *args, **kwargs)

        build_extension_cls.__init__ = __init__
    if not callable(getattr(cpp_extension, "_run_ninja_build", None)):
        _say("this torch has no torch.utils.cpp_extension._run_ninja_build: one ninja run per extension, as upstream")
        return
    original_build_extensions = build_extension_cls.build_extensions
    original_build_extension = build_extension_cls.build_extension

    def build_extension(self: Any, ext: Any) -> Any:
        if not getattr(self, "_extforge_one_run", False):
            return original_build_extension(self, ext)
        inner = self.compiler.compile

        def compile_apart(sources: Any, output_dir: str | None = None, *args: Any, **kwargs: Any) -> Any:
            return inner(sources, os.path.join(output_dir or self.build_temp, *ext.name.split(".")), *args, **kwargs)

        self.compiler.compile = compile_apart
        try:
            return original_build_extension(self, ext)
        finally:
            self.compiler.compile = inner

    def build_extensions(self: Any) -> None:
        if not self.use_ninja or len(self.extensions) < 2:
            original_build_extensions(self)
            return
        run_ninja = cpp_extension._run_ninja_build
        written: list[str] = []
        self._extforge_one_run, self.parallel = True, None
        try:
            # Pass 1: each extension's build.ninja, below build_temp/<name>; no compile, no link.
            link = self.compiler.link
            cpp_extension._run_ninja_build = lambda build_directory, *_a, **_k: written.append(build_directory)
            self.compiler.link = _nothing
            try:
                original_build_extensions(self)
            finally:
                cpp_extension._run_ninja_build, self.compiler.link = run_ninja, link
            top = os.path.abspath(self.build_temp)
            os.makedirs(top, exist_ok=True)
            order = [u for u in os.environ.get("EXTFORGE_UNIT_ORDER", "").split(";") if u]
            write_top_ninja(top, [os.path.abspath(d) for d in dict.fromkeys(written)], order)
            _say(f"compiling {len(self.extensions)} extensions in one ninja run (MAX_JOBS={os.environ.get('MAX_JOBS', '-')})")
            run_ninja(top, True, "Error compiling objects for extension")
            # Pass 2: the objects are built; each extension links from them.
            cpp_extension._run_ninja_build = _nothing
            try:
                original_build_extensions(self)
            finally:
                cpp_extension._run_ninja_build = run_ninja
        finally:
            self._extforge_one_run = False

    build_extension_cls.build_extension = build_extension
    build_extension_cls.build_extensions = build_extensions


def write_top_ninja(top: str, folders: list[str], order: list[str]) -> None:
    """build_temp/build.ninja: every extension's build.ninja as a subninja; with the planner's
    order (EXTFORGE_UNIT_ORDER, longest first), one subninja per compile in that order instead.
    ninja starts the edges that are ready in the order it read them, and every compile is ready
    at once, so the order of the files is the order of the starts (torch-cluster on 16 cores:
    122 s of compile span in setup.py's order, 89.6 s predicted longest first). Each file repeats
    its extension's variables and rules: a subninja is a scope of its own."""
    lines = ["ninja_required_version = 1.3\n"]
    if not order:
        lines += [f"subninja {_escape(os.path.join(d, 'build.ninja'))}\n" for d in folders]
    else:
        rank = {unit: i for i, unit in enumerate(order)}
        edges: list[tuple[int, int, str, str]] = []
        for d in folders:
            with open(os.path.join(d, "build.ninja")) as fh:
                header, found = _edges(fh.read())
            edges += [(rank.get(_unit(output), len(rank)), len(edges), header, text) for output, text in found]
        folder = os.path.join(top, "extforge-order")
        os.makedirs(folder, exist_ok=True)
        for n, (_rank, _seen, header, text) in enumerate(sorted(edges)):
            path = os.path.join(folder, f"{n:05d}.ninja")
            with open(path, "w") as fh:
                fh.write(header + text)
            lines.append(f"subninja {_escape(path)}\n")
    with open(os.path.join(top, "build.ninja"), "w") as fh:
        fh.writelines(lines)


def _edges(text: str) -> tuple[str, list[tuple[str, str]]]:
    """(what comes before the first build statement: variables and rules, [(first output, the
    statement with its continuation and indented lines)]) of a build.ninja as torch writes it."""
    header: list[str] = []
    edges: list[tuple[str, list[str]]] = []
    continued = False
    for line in text.splitlines(keepends=True):
        if line.startswith("build ") and not continued:
            output = line[len("build "):].split(":", 1)[0].split(" ", 1)[0].replace("$ ", " ").replace("$$", "$")
            edges.append((output, [line]))
        elif edges and (continued or line.startswith((" ", "\t"))):
            edges[-1][1].append(line)
        elif edges and line.strip():
            edges.append(("", [line]))  # a default or pool statement after the edges: kept, last
        else:
            (edges[-1][1] if edges else header).append(line)
        continued = line.rstrip("\n").endswith("$") and not line.rstrip("\n").endswith("$$")
    return "".join(header), [(output, "".join(body)) for output, body in edges]


def _unit(output: str) -> str:
    """The planner's name of the unit an object compiles (extforge.planning.unit_costs.unit_name; a part
    of a unit compiled in parts starts where its unit does)."""
    name = os.path.basename(output)
    for suffix in (".o", ".obj", ".cu", ".cpp", ".cc", ".cxx"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return name.split("#part", 1)[0]


def _nothing(*_args: Any, **_kwargs: Any) -> None:
    return None


def _escape(path: str) -> str:
    """A path as a ninja file names it ($, space and colon escaped)."""
    return path.replace("$", "$$").replace(" ", "$ ").replace(":", "$:")


def after_import(loader: Any, then: Callable[[ModuleType], None]) -> None:
    """Run `then` on the module `loader` executes, once it has executed."""
    execute = loader.exec_module

    def exec_module(module: ModuleType) -> None:
        execute(module)
        then(module)

    loader.exec_module = exec_module
