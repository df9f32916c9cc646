"""Platform floor: the highest GLIBC_ / GLIBCXX_ / CXXABI_ versions a binary requires."""

from __future__ import annotations

from collections.abc import Iterable

from .policy import policy

FAMILIES = ("GLIBC", "GLIBCXX", "CXXABI")


def version_key(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def split_version(tag: str) -> tuple[str, str] | None:
    """'GLIBCXX_3.4.30' -> ('GLIBCXX', '3.4.30'); None for GLIBC_PRIVATE and the like."""
    family, _, number = tag.rpartition("_")
    if family not in FAMILIES or not number[:1].isdigit():
        return None
    return family, number


def floors(version_tags: Iterable[str]) -> dict[str, str]:
    """Highest required version per family, e.g. {"GLIBC": "2.34", "GLIBCXX": "3.4.30"}."""
    best: dict[str, str] = {}
    for tag in version_tags:
        split = split_version(tag)
        if split is None:
            continue
        family, number = split
        if family not in best or version_key(number) > version_key(best[family]):
            best[family] = number
    return best


def highest_tag(version_tags: Iterable[str], family: str) -> str | None:
    best = floors(version_tags).get(family)
    return f"{family}_{best}" if best else None


def baseline(glibc: str) -> dict[str, str]:
    """{"GLIBC": glibc, "GLIBCXX": ..., "CXXABI": ...} of the newest known distro baseline <= glibc."""
    table = policy()["glibc_baselines"]
    known = [g for g in table if version_key(g) <= version_key(glibc)]
    result = {"GLIBC": glibc}
    if known:
        result.update(table[max(known, key=version_key)])
    return result


def exceeds(required: str, available: str) -> bool:
    return version_key(required) > version_key(available)
