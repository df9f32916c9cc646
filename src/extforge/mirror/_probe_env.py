"""Run by the target environment's python (stdlib only): describe the interpreter and its dists.

Executed as a script so extforge never imports that environment's packages (torch included).
Prints one JSON document on stdout.
"""

import json
import os
import site
import sys
import sysconfig
from importlib import metadata


def _interpreter():
    base = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    base_paths = sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_exec_prefix})
    site_py = os.path.join(base_paths["stdlib"], "site.py")
    try:
        with open(site_py, encoding="utf-8") as fh:
            debian_site = "dist-packages" in fh.read()
    except OSError:
        debian_site = False
    return {
        "version": "%d.%d.%d" % sys.version_info[:3],
        "executable": base,
        "base_prefix": sys.base_prefix,
        "stdlib": base_paths["stdlib"],
        "platstdlib": base_paths["platstdlib"],
        "include": base_paths["include"],
        "ldlibrary": sysconfig.get_config_var("LDLIBRARY") or "",
        "libdir": sysconfig.get_config_var("LIBDIR") or "",
        "multiarch": sysconfig.get_config_var("MULTIARCH") or "",
        "debian_site": debian_site,
        "in_venv": sys.prefix != sys.base_prefix,
        "prefix": sys.prefix,
        "site_packages": [p for p in site.getsitepackages() if os.path.isdir(p)],
    }


def _dists(site_dirs):
    out = {}
    for dist in metadata.distributions(path=site_dirs):
        name = dist.metadata["Name"]
        if not name or name.lower() in out:
            continue
        info_dir = str(getattr(dist, "_path", ""))
        files = []
        for f in dist.files or []:
            files.append(str(f))
        wheel_tags = []
        wheel_file = dist.read_text("WHEEL") or ""
        for line in wheel_file.splitlines():
            if line.startswith("Tag:"):
                wheel_tags.append(line.split(":", 1)[1].strip())
        out[name.lower()] = {
            "name": name,
            "version": dist.version,
            "requires_dist": list(dist.requires or []),
            "dist_info": info_dir,
            "site_dir": os.path.dirname(info_dir),
            "files": files,
            "record": dist.read_text("RECORD") or "",
            "tags": wheel_tags,
            "entry_points": [[ep.name, ep.value, ep.group] for ep in dist.entry_points],
        }
    return list(out.values())


def main():
    info = {"python": _interpreter()}
    if "--dists" in sys.argv:
        info["dists"] = _dists(info["python"]["site_packages"])
    json.dump(info, sys.stdout)


main()
