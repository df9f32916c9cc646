"""A Python distribution's licence as its metadata states it, and its licence files, for the
mirror's package of it (the `license` of info/index.json and about.json, and info/licenses/).

The distribution is someone else's data: the licence is taken only when it is one plain line,
and licence files only as plain relative names of a bounded size.
"""

from __future__ import annotations

import email.parser
import os
import re
import zipfile
from pathlib import Path

from ..archive import unsafe_reason

# Licence files a dist-info folder holds outside `licenses/` (setuptools before PEP 639 put them there).
_FILE_NAME = re.compile(r"(?i)^(licen[cs]e|copying|notice|authors)")
# What a licence may look like in a package's index: an SPDX expression, a name ("BSD",
# "NVIDIA Proprietary Software"); never several lines, markup or a template.
_PLAIN = re.compile(r"[\w .+\-()/,:;'&]{1,256}")
MAX_METADATA = 16 * 2**20
MAX_FILE = 16 * 2**20


def declared_license(metadata: str) -> str | None:
    """The licence a METADATA file declares: its License-Expression (PEP 639), else its License
    field, else its licence classifiers (their last part, several joined by OR); None where it
    declares none in a plain form."""
    fields = email.parser.Parser().parsestr(metadata, headersonly=True)
    classifiers = [last for c in fields.get_all("Classifier") or []
                   if c.startswith("License ::") and (last := c.split("::")[-1].strip()) != "OSI Approved"]
    candidates = [*(fields.get_all("License-Expression") or []), fields.get("License") or "", " OR ".join(classifiers)]
    return next((c.strip() for c in candidates if _PLAIN.fullmatch(c.strip()) and c.strip().upper() != "UNKNOWN"), None)


def _license_name(rel: str) -> str | None:
    """Where a file of the dist-info folder goes under info/licenses/ (None: not a licence file)."""
    if rel.startswith("licenses/"):
        name = rel.removeprefix("licenses/")
    elif "/" not in rel and _FILE_NAME.match(rel):
        name = rel
    else:
        return None
    return None if not name or name.endswith("/") or unsafe_reason(name) else name


def wheel_license(wheel: Path, stem: str) -> tuple[str | None, list[list[str]]]:
    """The licence `stem`.dist-info of the wheel declares and its licence files, as
    [member, name under info/licenses/]."""
    prefix = f"{stem}.dist-info/"
    with zipfile.ZipFile(wheel) as zf:
        meta = zf.getinfo(prefix + "METADATA")
        text = zf.open(meta).read(MAX_METADATA).decode("utf-8", "replace")
        files = {name: info.filename for info in zf.infolist()
                 if info.filename.startswith(prefix) and info.file_size <= MAX_FILE
                 and (name := _license_name(info.filename.removeprefix(prefix)))}
    return declared_license(text), [[member, name] for name, member in sorted(files.items())]


def installed_license(dist_info: Path) -> tuple[str | None, list[list[str]]]:
    """The same for an installed distribution's dist-info folder, as [file, name]; links are not followed."""
    try:
        with (dist_info / "METADATA").open("rb") as fh:
            text = fh.read(MAX_METADATA).decode("utf-8", "replace")
    except OSError:
        return None, []
    files = {}
    for dirpath, dirs, names in os.walk(dist_info):
        dirs.sort()
        for file in names:
            path = Path(dirpath, file)
            name = _license_name(path.relative_to(dist_info).as_posix())
            if name and not path.is_symlink() and path.is_file() and path.stat().st_size <= MAX_FILE:
                files[name] = str(path)
    return declared_license(text), [[src, name] for name, src in sorted(files.items())]
