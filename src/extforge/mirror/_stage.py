"""Run inside a rattler-build build script (stdlib only): put a package's files into $PREFIX.

usage: python _stage.py MANIFEST.json PREFIX

Copying straight from the wheel or the installed environment into $PREFIX keeps a 4 GB torch
to a single copy. The manifest is written by extforge.mirror (see recipes.py for its fields).
"""

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import zipfile

SHEBANG_PYTHON = re.compile(rb"^#!.*python[0-9.]*\b")


def wheel_member_target(member, data_dir, site, include):
    """Where a wheel member goes, relative to the prefix (None: not installed)."""
    if member.endswith("/") or member.endswith(".pyc"):
        return None
    if member.startswith(data_dir + "/"):
        kind, _, rest = member[len(data_dir) + 1 :].partition("/")
        if not rest:
            return None
        return {
            "scripts": "bin/" + rest,
            "purelib": site + "/" + rest,
            "platlib": site + "/" + rest,
            "data": rest,
            "headers": include + "/" + rest,
        }.get(kind)
    return site + "/" + member


def rewrite_shebang(data, python):
    """`#!python` (wheel scripts) or `#!/old/env/bin/python3` → the package's own python."""
    first, nl, rest = data.partition(b"\n")
    if not SHEBANG_PYTHON.match(first):
        return data
    return b"#!" + python.encode() + nl + rest


def replace_prefix(text, old, new, system):
    """Point text at the new prefix. A system prefix (`/usr`) is only replaced as a whole path head."""
    if not system:
        return text.replace(old, new)
    pattern = re.escape(old) + r"(?=[/'\" :]|$)"
    return re.sub(r"(?<![\w/.-])" + pattern, new.replace("\\", "\\\\"), text, flags=re.M)


def compile_bytecode(spec, root, root_is_prefix=True):
    """Byte-compile the package's modules (every .py below ROOT/lib/python3.X) with the Python
    `spec` names (recipes.bytecode_spec says why); returns the .pyc files written, relative to
    ROOT. Modules that do not compile (test data in some packages) get none, as at install. Where
    ROOT is the build's $PREFIX (staging wrote it into files), so do modules naming it: the
    installer rewrites the prefix in them, and a .pyc would carry the old one, in binary, where a
    rewrite would break its marshalled strings. A private staging folder no file names is not
    searched for."""
    lib = os.path.join(root, "lib")
    sources = []
    for top in sorted(os.listdir(lib)) if os.path.isdir(lib) else []:
        if top.startswith("python3"):
            for dirpath, _dirs, files in os.walk(os.path.join(lib, top)):
                sources += [os.path.join(dirpath, f) for f in files if f.endswith(".py")]
    if root_is_prefix:
        sources = [s for s in sources if not _names(s, root.encode())]
    if not sources:
        return []
    proc = subprocess.run(
        [spec["python"], "-I", "-S", "-B", spec["script"], root, "", "checked-hash"],
        input="\n".join(sources), capture_output=True, text=True, check=False,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8"},
    )
    if proc.returncode != 0:
        raise RuntimeError(f"byte-compiling the package's modules with {spec['python']} failed "
                           f"(exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return sorted(
        os.path.relpath(os.path.join(dirpath, f), root)
        for dirpath, _dirs, files in os.walk(lib) if os.path.basename(dirpath) == "__pycache__"
        for f in files if f.endswith(".pyc")
    )


def _names(path, text):
    with open(path, "rb") as fh:
        return text in fh.read()


def _write(path, data, mode):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if os.path.lexists(path):
        os.unlink(path)
    with open(path, "wb") as fh:
        fh.write(data)
    os.chmod(path, mode)


def main(manifest_path, prefix):
    with open(manifest_path, encoding="utf-8") as fh:
        m = json.load(fh)
    python = os.path.join(prefix, m["python"]) if m.get("python") else None
    rewrite = m.get("prefix_rewrite")
    for w in m.get("wheels", []):
        with zipfile.ZipFile(w["path"]) as zf:
            for info in zf.infolist():
                rel = wheel_member_target(info.filename, w["data_dir"], w["site"], w["include"])
                if rel is None:
                    continue
                data = zf.read(info)
                mode = (info.external_attr >> 16) & 0o777 or 0o644
                if rel.startswith("bin/") and python:
                    data = rewrite_shebang(data, python)
                    mode |= 0o755
                _write(os.path.join(prefix, rel), data, mode)
    for src, dst, flags in m.get("files", []):
        out = os.path.join(prefix, dst)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        if os.path.islink(src) and "L" in flags:
            if os.path.lexists(out):
                os.unlink(out)
            os.symlink(os.readlink(src), out)
            continue
        if "s" in flags or "t" in flags:
            with open(src, "rb") as fh:
                data = fh.read()
            if "s" in flags and python:
                data = rewrite_shebang(data, python)
            if "t" in flags and rewrite and b"\0" not in data[:8192]:
                try:
                    text = data.decode("utf-8")
                except UnicodeDecodeError:
                    pass
                else:
                    data = replace_prefix(text, rewrite["old"], prefix, rewrite["system"]).encode()
            _write(out, data, stat.S_IMODE(os.stat(src).st_mode) | 0o644)
        else:
            shutil.copy2(src, out)
            os.chmod(out, stat.S_IMODE(os.stat(out).st_mode) | 0o644)
        if "r" in flags:
            # The interpreter's RUNPATH names the old prefix; rattler-build keeps $ORIGIN paths.
            subprocess.run([m["patchelf"], "--set-rpath", "$ORIGIN/../lib", out], check=True)
    for dst, target in m.get("symlinks", []):
        out = os.path.join(prefix, dst)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        if os.path.lexists(out):
            os.unlink(out)
        os.symlink(target, out)
    for dst, content, mode in m.get("texts", []):
        _write(os.path.join(prefix, dst), content.replace("@PREFIX@", prefix).encode(), int(mode, 8))
    if m.get("bytecode"):
        compile_bytecode(m["bytecode"], prefix)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
