"""What a package identity and an environment name may be, checked before either becomes a
file name in a shared folder.

Package names, versions and build strings follow conda's rules (conda-build and conda's
MatchSpec refuse the rest): a name is lowercase letters, digits and `_.-` not starting with
`.` or `-`; a version has no `-` or spaces (an optional `N!` epoch, then alphanumeric
components joined by `.`, `_` or `+`); a build string is letters, digits and `_.+`. They
join into the file name `name-version-build.conda`, which the channel indexes by: a `/`,
`..` or `;` there became a path or a shell word later. Environment names follow pixi's rule
(lowercase letters, digits, `-`), so `envs/<name>.*` exports stay inside envs/.
"""

from __future__ import annotations

import re

from .index import PACKAGE_SUFFIXES

NAME = re.compile(r"[a-z0-9_][a-z0-9_.\-]*")
VERSION = re.compile(r"(\d+!)?[A-Za-z0-9_]+([._+][A-Za-z0-9_]+)*")
BUILD = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+]*")
ENV_NAME = re.compile(r"[a-z0-9\-]+")
# A platform subdir, as conda names them (linux-64, linux-aarch64, osx-arm64, noarch).
SUBDIR = re.compile(r"noarch|[a-z]+-[a-z0-9_]+")


def identity_problems(name: str, version: str, build: str) -> list[str]:
    """Why (name, version, build) is not a conda package identity; empty when it is one."""
    problems = []
    if not NAME.fullmatch(name):
        problems.append(f"name {name!r} is not lowercase letters, digits and _.- (not starting with . or -)")
    if not VERSION.fullmatch(version):
        problems.append(f"version {version!r} is not a conda version (alphanumeric parts joined by . _ +, no - or spaces)")
    if not BUILD.fullmatch(build):
        problems.append(f"build string {build!r} is not letters, digits and _.+")
    return problems


def file_stem(file_name: str) -> str | None:
    """name-version-build of a package file name; None for other files."""
    for suffix in PACKAGE_SUFFIXES:
        if file_name.endswith(suffix):
            return file_name[: -len(suffix)]
    return None


def env_name_problem(name: str) -> str | None:
    if ENV_NAME.fullmatch(name):
        return None
    return f"environment name {name!r} is not lowercase letters, digits and dashes (pixi's rule)"
