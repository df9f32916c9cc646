# Runs inside the TARGET python (`python -c <this source>`), never imported by extforge:
# extforge must not import torch, and the target may be another Python version (>= 3.8),
# so this file keeps to the standard library and to syntax old interpreters accept.
# It prints one line: SENTINEL + JSON. Its argument (JSON) names the extensions to look for.
import glob
import json
import os
import sys
import sysconfig

SENTINEL = "EXTFORGE-PROBE "


def python_facts():
    tag = "cp%d%d" % sys.version_info[:2]
    if sysconfig.get_config_var("Py_GIL_DISABLED"):
        tag += "t"
    return {
        "executable": sys.executable,
        "version": "%d.%d.%d" % sys.version_info[:3],
        "tag": tag,
        "soabi": sysconfig.get_config_var("SOABI"),
        "prefix": sys.prefix,
    }


def conda_record(name):
    for path in glob.glob(os.path.join(sys.prefix, "conda-meta", name + "-*.json")):
        try:
            with open(path) as f:
                rec = json.load(f)
        except (OSError, ValueError):
            continue
        if rec.get("name") == name:
            return rec
    return None


def extension_facts(want):
    import importlib.util
    from importlib import metadata

    dist = None
    for name in want["distributions"]:
        try:
            dist = metadata.distribution(name)
            break
        except metadata.PackageNotFoundError:
            pass
    rec = conda_record(want["name"])
    if dist is None and rec is None:
        return None
    wheel = (dist.read_text("WHEEL") or "") if dist else ""
    # find_spec locates the extension module without loading it (loading would pull in libtorch).
    spec = importlib.util.find_spec(want["module"])
    return {
        "name": want["name"],
        "module": want["module"],
        "version": dist.version if dist else rec["version"],
        "location": str(dist.locate_file("")) if dist else sys.prefix,
        "installer": "conda" if rec or dist is None else ((dist.read_text("INSTALLER") or "").strip() or "unknown"),
        "conda_build": rec.get("build") if rec else None,
        "conda_channel": rec.get("channel") if rec else None,
        "wheel_tags": [t.split(":", 1)[1].strip() for t in wheel.splitlines() if t.startswith("Tag:")],
        "extension": spec.origin if spec and spec.origin else None,
    }


def torch_facts():
    import torch

    archs: list[str] = []
    try:
        # Unlike torch.cuda.get_arch_list(), this answers on a machine without a GPU.
        archs = (torch._C._cuda_getArchFlags() or "").split()
    except Exception:
        pass
    return {
        "version": torch.__version__,
        "cuda": torch.version.cuda,
        "cxx11_abi": bool(torch._C._GLIBCXX_USE_CXX11_ABI),
        "lib_dir": os.path.join(os.path.dirname(torch.__file__), "lib"),
        "arch_list": archs,
    }


def main():
    out = {"python": python_facts(), "errors": {}, "extensions": []}
    probes = [(w["name"], lambda w=w: extension_facts(w)) for w in json.loads(sys.argv[1])]
    for key, fn in probes + [("torch", torch_facts)]:
        try:
            found = fn()
        except BaseException as exc:  # a broken install is a fact to report
            found = None
            out["errors"][key] = "%s: %s" % (type(exc).__name__, exc)
        if key == "torch":
            out["torch"] = found
        elif found:
            out["extensions"].append(found)
    sys.stdout.write("\n" + SENTINEL + json.dumps(out) + "\n")


main()
