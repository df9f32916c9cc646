"""The installed extensions doctor looks for, as data (data/doctor-extensions.yaml): what each
is called by pip, conda and its compiled module, the oldest nvcc its build takes, and the command
that rebuilds it. Knowledge of one package lives there, not in code."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import resources
from typing import Any

from ruamel.yaml import YAML


@dataclass(frozen=True)
class ExtensionSpec:
    name: str  # conda package name
    distributions: tuple[str, ...]  # pip's names for it
    module: str  # the compiled extension module
    package: str  # the import name that loads the module
    reinstall: str  # rebuilds it from source; {version} is the installed one
    min_nvcc: tuple[int, int] | None = None
    min_nvcc_refusal: str = ""  # what its build says with an older nvcc

    def probe(self) -> dict[str, Any]:
        """What the probe inside the target python needs to find it."""
        return {"name": self.name, "distributions": list(self.distributions), "module": self.module}


def _spec(d: dict[str, Any]) -> ExtensionSpec:
    major, _, minor = str(d.get("min_nvcc") or "").partition(".")
    return ExtensionSpec(str(d["name"]), tuple(str(n) for n in d["distributions"]), str(d["module"]), str(d["package"]),
                         " ".join(str(d["reinstall"]).split()),
                         (int(major), int(minor or 0)) if major else None, str(d.get("min_nvcc_refusal") or ""))


@functools.cache
def known() -> tuple[ExtensionSpec, ...]:
    text = resources.files("extforge").joinpath("data/doctor-extensions.yaml").read_text()
    return tuple(_spec(d) for d in YAML(typ="safe").load(text)["extensions"])


def spec_for(name: str) -> ExtensionSpec | None:
    return next((s for s in known() if s.name == name), None)
