"""The audit policy data (data/audit-policy.yaml), loaded once."""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

from ruamel.yaml import YAML


@cache
def policy() -> dict[str, Any]:
    text = resources.files("extforge").joinpath("data/audit-policy.yaml").read_text()
    return YAML(typ="safe").load(text)


def owner_library(demangled: str) -> str | None:
    """The library that should define an unversioned symbol, from its namespace."""
    for rule in policy()["symbol_owners"]:
        if demangled.startswith(rule["prefix"]):
            return rule["library"]
    return None


def is_torch_library(name: str) -> bool:
    return name.split(".so")[0] + ".so" in policy()["torch_libraries"]


def is_interpreter_symbol(name: str) -> bool:
    return name.startswith(tuple(policy()["interpreter_prefixes"]))
