"""The staging script that runs inside rattler-build: wheel layout, shebangs, prefix rewriting."""

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from extforge.mirror import _stage
from extforge.mirror.python_pkg import needs_text_rewrite

SITE = "lib/python3.11/site-packages"


def test_wheel_members_land_where_pip_puts_them():
    target = lambda m: _stage.wheel_member_target(m, "foo-1.0.data", SITE, "include/python3.11/foo")  # noqa: E731
    assert target("foo/__init__.py") == f"{SITE}/foo/__init__.py"
    assert target("foo-1.0.dist-info/METADATA") == f"{SITE}/foo-1.0.dist-info/METADATA"
    assert target("foo-1.0.data/scripts/foo-cli") == "bin/foo-cli"
    assert target("foo-1.0.data/platlib/_foo.so") == f"{SITE}/_foo.so"
    assert target("foo-1.0.data/data/share/man/foo.1") == "share/man/foo.1"
    assert target("foo-1.0.data/headers/foo.h") == "include/python3.11/foo/foo.h"
    assert target("foo/__pycache__/x.cpython-311.pyc") is None


def test_shebangs_point_at_the_package_python():
    assert _stage.rewrite_shebang(b"#!python\nprint(1)\n", "/p/bin/python3.11") == b"#!/p/bin/python3.11\nprint(1)\n"
    venv = b"#!/home/u/venv/bin/python3\nimport x\n"
    assert _stage.rewrite_shebang(venv, "/p/bin/python3.11").startswith(b"#!/p/bin/python3.11\n")
    assert _stage.rewrite_shebang(b"#!/bin/sh\necho\n", "/p/bin/python3.11") == b"#!/bin/sh\necho\n"


def test_private_prefix_is_replaced_everywhere():
    text = "prefix = '/root/.pyenv/versions/3.11.7'\nLIBDIR='/root/.pyenv/versions/3.11.7/lib'\n"
    out = _stage.replace_prefix(text, "/root/.pyenv/versions/3.11.7", "/new", system=False)
    assert out == "prefix = '/new'\nLIBDIR='/new/lib'\n"


def test_system_prefix_is_replaced_only_as_a_path_head():
    text = "'prefix': '/usr',\n'INCLUDEPY': '/usr/include/python3.12',\n'SHELL': '/bin/sh /usr/bin/env',\n'X': '/opt/usrlocal/usr'"
    out = _stage.replace_prefix(text, "/usr", "/new", system=True)
    assert "'prefix': '/new'" in out
    assert "'/new/include/python3.12'" in out
    assert "/bin/sh /new/bin/env" in out  # a whole path head, so this one is rewritten too
    assert "/opt/usrlocal/usr" in out  # ...but never the middle of another path
    assert needs_text_rewrite("lib/python3.12/_sysconfigdata__linux_x86_64-linux-gnu.py", True)
    assert not needs_text_rewrite("lib/python3.12/os.py", True)
    assert needs_text_rewrite("lib/python3.11/os.py", False)


def test_stage_script_installs_a_wheel_and_files(tmp_path: Path):
    whl = tmp_path / "foo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as zf:
        zf.writestr("foo/__init__.py", "X = 1\n")
        info = zipfile.ZipInfo("foo-1.0.data/scripts/foo-cli")
        info.external_attr = 0o755 << 16
        zf.writestr(info, "#!python\nimport foo\n")
    cfg = tmp_path / "config.txt"
    cfg.write_text("root=/old/prefix/lib\n")
    prefix = tmp_path / "prefix"
    manifest = {
        "python": "bin/python3.11",
        "wheels": [{"path": str(whl), "data_dir": "foo-1.0.data", "site": SITE, "include": "include/foo"}],
        "files": [[str(cfg), "etc/config.txt", "t"]],
        "symlinks": [["bin/python", "python3.11"]],
        "texts": [["etc/where.txt", "@PREFIX@/bin\n", "644"]],
        "prefix_rewrite": {"old": "/old/prefix", "system": False},
    }
    (tmp_path / "m.json").write_text(json.dumps(manifest))
    subprocess.run([sys.executable, "-I", _stage.__file__, str(tmp_path / "m.json"), str(prefix)], check=True)
    assert (prefix / SITE / "foo/__init__.py").read_text() == "X = 1\n"
    script = prefix / "bin/foo-cli"
    assert script.read_text().startswith(f"#!{prefix}/bin/python3.11\n")
    assert os.access(script, os.X_OK)
    assert (prefix / "etc/config.txt").read_text() == f"root={prefix}/lib\n"
    assert os.readlink(prefix / "bin/python") == "python3.11"
    assert (prefix / "etc/where.txt").read_text() == f"{prefix}/bin\n"


def test_python_stdlib_links_out_of_the_tree_are_carried_or_dropped(tmp_path):
    """Debian's python links lib/python3.X/sitecustomize.py to /etc/python3.X/: the package must
    hold the file's content (an absolute link would be refused at install), and a dangling one
    is left out; links inside the stdlib stay links."""
    from extforge.mirror.python_pkg import _walk

    etc = tmp_path / "etc" / "sitecustomize.py"
    etc.parent.mkdir()
    etc.write_text("# hook\n")
    std = tmp_path / "lib" / "python3.12"
    std.mkdir(parents=True)
    (std / "os.py").write_text("")
    (std / "sitecustomize.py").symlink_to(etc)
    (std / "gone.py").symlink_to(tmp_path / "nowhere.py")
    (std / "alias.py").symlink_to("os.py")
    files = {rel: flags for _, rel, flags in _walk(std, "lib/python3.12", system_prefix=False)}
    assert "L" not in files["lib/python3.12/sitecustomize.py"]  # content, not a link
    assert files["lib/python3.12/alias.py"] == "L"
    assert "lib/python3.12/gone.py" not in files
