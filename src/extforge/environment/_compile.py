"""Run by an environment's own Python at install (stdlib only): byte-compile the sources named on
stdin whose .pyc Python would not take as it is.

usage: python -I -S -B _compile.py STAGING PREFIX [checked-hash] < sources

A package may ship its byte code (conda-forge's carry timestamped .pyc, extforge mirror's
hash-checked ones); those that match their installed source stay. The rest are compiled on every
core: the stdlib's compileall takes a file list one file at a time (a torch env's 6,500 modules:
34 s on two cores, 14 s spread over both).

It reports on stdout, a line each as it goes (what a run cut short did is still said): `tag T`
(this Python's cache tag), `current SOURCE` for each source whose .pyc it takes as it is, then
`wrote PYC` for each .pyc it compiled and `invalid SOURCE` for each source this Python cannot
compile (test data of another Python version): Python cannot import it either.

Install compiles timestamped .pyc (Python checks them with one stat). The mirror compiles the
.pyc its packages ship with `checked-hash`: an installer may copy a file instead of linking it,
and a copy's mtime is not the one a timestamped .pyc names; a hash holds wherever the file lands.
PREFIX "" leaves code objects naming the path relative to STAGING (Python puts the real path
into them when it loads the .pyc).
"""

import functools
import importlib.util
import os
import py_compile
import sys

HEADER = 16  # magic, flags, then mtime + size or the source's hash
BATCH = 64  # files per task: one pickle round trip per batch, not per file


def is_current(source):
    """What Python checks at import: its magic, then the source's mtime and size, or its hash."""
    try:
        with open(importlib.util.cache_from_source(source), "rb") as fh:
            head = fh.read(HEADER)
        st = os.stat(source)
    except OSError:
        return False
    if len(head) < HEADER or head[:4] != importlib.util.MAGIC_NUMBER:
        return False
    flags = int.from_bytes(head[4:8], "little")
    if flags == 0:
        stamp = (int(st.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little") + (st.st_size & 0xFFFFFFFF).to_bytes(4, "little")
        return head[8:16] == stamp
    if flags in (1, 3):
        with open(source, "rb") as fh:
            return head[8:16] == importlib.util.source_hash(fh.read())
    return False


def main(staging, prefix, mode=None):
    print("tag", sys.implementation.cache_tag, flush=True)
    sources = []
    for source in sys.stdin.read().splitlines():
        if source and is_current(source):
            print("current", source)
        elif source:
            sources.append(source)
    sys.stdout.flush()
    invalidation = py_compile.PycInvalidationMode.CHECKED_HASH if mode == "checked-hash" else py_compile.PycInvalidationMode.TIMESTAMP
    # Code objects name the final path, not the staging folder the files sit in now.
    compile_one = functools.partial(compile_source, staging, prefix, invalidation)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if cores > 1 and len(sources) > BATCH:
        from concurrent.futures import ProcessPoolExecutor  # 20 ms of imports, for many modules only

        with ProcessPoolExecutor(min(cores, len(sources) // BATCH + 1)) as pool:
            report(sources, pool.map(compile_one, sources, chunksize=BATCH))
    else:
        report(sources, map(compile_one, sources))


def compile_source(staging, prefix, invalidation, source):
    """What compileall.compile_file(stripdir=staging, prependdir=prefix) does for one source,
    without compileall's imports (a third of this script's start): "wrote", "invalid" where
    the source's bytes do not compile, None where the .pyc could not be written."""
    try:
        py_compile.compile(source, dfile=os.path.join(prefix, os.path.relpath(source, staging)), doraise=True,
                           invalidation_mode=invalidation)
    except (py_compile.PyCompileError, SyntaxError, UnicodeError):
        return "invalid"
    except OSError:
        return None
    return "wrote"


def report(sources, results):
    for source, done in zip(sources, results):
        if done == "wrote":
            print("wrote", importlib.util.cache_from_source(source), flush=True)
        elif done:
            print(done, source, flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
