"""The audit policy data (data/audit-policy.yaml), loaded once, and the validation of the
values a user gives the audit (`--archs`, `--glibc`): every command that takes them calls these."""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from typing import Any

from ruamel.yaml import YAML

from ..fatbin import parse_arch_list


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


def arch_names(text: str) -> list[str]:
    """'sm_80, 90;9.0a' -> ['sm_80', 'sm_90', 'sm_90a'] (fatbin.parse_arch_list's spellings); ValueError with the reason."""
    return [a.name for a in parse_arch_list(text)]


def parse_glibc(text: str) -> str:
    """'2.28' -> '2.28'; ValueError unless it is a glibc version (2.N or 2.N.M)."""
    value = text.strip()
    if not re.fullmatch(r"2\.\d{1,3}(\.\d{1,3})?", value):
        raise ValueError(f"not a glibc version: {text!r} (write the oldest node's glibc, e.g. 2.28; "
                         "`ldd --version` prints it)")
    return value
