"""The ELF layer: dynamic symbols with their versions, DT_NEEDED, RUNPATH/RPATH, sections.

Files are mapped, never read whole: a 222 MB extension module is mostly `.nv_fatbin`,
and libtorch_cpu.so exports ~100k dynamic symbols. pyelftools parses the headers, the
dynamic section and the (small) version sections; the symbol table itself is decoded
with `struct.iter_unpack`, which is two orders of magnitude faster than pyelftools'
per-symbol construct parsing on tables that large.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from elftools.elf.elffile import ELFFile

from ..errors import ExtforgeError

ELF_MAGIC = b"\x7fELF"
SHN_UNDEF = 0
STB_GLOBAL, STB_WEAK, STB_GNU_UNIQUE = 1, 2, 10
STV_HIDDEN, STV_INTERNAL = 2, 1
VERSYM_HIDDEN = 0x8000  # the symbol is `name@VER`, not the default `name@@VER`
# What decoding a crafted symbol or hash table raises (an index past the end, zero buckets).
_UNDECODABLE = (struct.error, IndexError, ValueError, ZeroDivisionError)


@dataclass(frozen=True)
class Symbol:
    name: str
    version: str | None = None  # "GLIBCXX_3.4.30"; None when unversioned
    weak: bool = False
    # For undefined symbols: the file the version requirement names (.gnu.version_r),
    # e.g. "libstdc++.so.6"; None when the reference is unversioned.
    from_file: str | None = None


@dataclass(frozen=True)
class Section:
    name: str
    offset: int
    size: int


@dataclass
class ElfObject:
    """One mapped ELF shared object or executable; symbol tables decode on first use."""

    path: Path
    machine: str  # e_machine as pyelftools names it: "EM_X86_64", "EM_AARCH64"
    elfclass: int  # 32 or 64
    little_endian: bool
    soname: str | None
    needed: list[str]
    rpath: list[str]  # entries as written, empty ones included: the loader reads "" as the cwd
    runpath: list[str]
    sections: dict[str, Section]
    version_needs: dict[str, list[str]]  # file -> versions required from it
    version_defs: list[str]
    _map: mmap.mmap | None = field(repr=False, default=None)
    _sym_layout: tuple | None = field(repr=False, default=None)

    def section_view(self, name: str) -> memoryview | None:
        sec = self.sections.get(name)
        if sec is None or self._map is None:
            return None
        return memoryview(self._map)[sec.offset : sec.offset + sec.size]

    @cached_property
    def _symbols(self) -> tuple[list[Symbol], dict[str, list[tuple[str | None, bool]]]]:
        try:
            return _decode_dynsym(self)
        except _UNDECODABLE as exc:
            raise unreadable(self.path, f"its dynamic symbol table cannot be decoded: {exc}") from exc

    @property
    def undefined(self) -> list[Symbol]:
        """Undefined dynamic symbols: what this object needs from others."""
        return self._symbols[0]

    @property
    def exports(self) -> dict[str, list[tuple[str | None, bool]]]:
        """Defined, visible dynamic symbols: name -> [(version, hidden-version?)]."""
        return self._symbols[1]

    def lookup(self, name: str) -> list[tuple[str | None, bool]]:
        """The visible definitions of `name` here: [(version, hidden-version?)].

        Uses the GNU hash table when there is one, so asking libtorch_cpu.so for a few
        hundred names does not decode its ~75k exports.
        """
        table, mm, layout = self._gnu_hash, self._map, self._sym_layout
        if table is None or mm is None or layout is None:
            return self.exports.get(name, [])
        try:
            return _gnu_lookup(mm, layout, table, name)
        except _UNDECODABLE as exc:
            raise unreadable(self.path, f"its GNU hash table cannot be followed: {exc}") from exc

    @cached_property
    def _gnu_hash(self) -> tuple[int, int, int, int] | None:
        sec = self.sections.get(".gnu.hash")
        if sec is None or self._map is None or self._sym_layout is None:
            return None
        endian = self._sym_layout[1]
        nbuckets, symoffset, bloom_size, _shift = struct.unpack_from(endian + "4I", self._map, sec.offset)
        word = 8 if self._sym_layout[0] == 64 else 4
        buckets = sec.offset + 16 + bloom_size * word
        return nbuckets, symoffset, buckets, buckets + 4 * nbuckets

    def close(self) -> None:
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # a memoryview is still alive; the GC closes it later
                pass
            self._map = None


def unreadable(path: Path, why: str) -> ExtforgeError:
    """A module the audit cannot read is never passed: the audit stops, exit 2."""
    return ExtforgeError(f"could not audit {path}", why,
                         "rebuild it, or re-extract it if it was truncated on the way; an audit vouches only "
                         "for what it has read")


def is_elf(path: Path) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(4) == ELF_MAGIC
    except OSError:
        return False


def open_elf(path: Path) -> ElfObject:
    """Map `path` and read its headers, dynamic section and version sections."""
    try:
        fh = open(path, "rb")
    except OSError as exc:
        raise ExtforgeError(f"cannot open {path}", str(exc), "check the path and its permissions") from exc
    with fh:
        try:
            mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError as exc:  # empty file
            raise ExtforgeError(f"{path} is empty", str(exc), "rebuild or re-extract it") from exc
    if mm[:4] != ELF_MAGIC:
        mm.close()
        raise ExtforgeError(f"{path} is not an ELF file", "its first bytes are not \\x7fELF",
                            "pass a shared library (.so), a package, a wheel or a prefix")
    try:
        return _read_headers(path, mm)
    except ExtforgeError:
        mm.close()
        raise
    # pyelftools meets hostile or truncated headers with whatever its parsing hits first
    # (ELFError, construct's errors, struct.error, IndexError, ...): all mean the same here.
    except Exception as exc:
        mm.close()
        raise unreadable(path, f"its headers cannot be parsed ({type(exc).__name__}: {exc})") from exc


_SHDR = {32: "10I", 64: "IIQQQQIIQQ"}  # sh_name, sh_type, ..., sh_offset [4], sh_size [5], ...
SHT_NOBITS = 8


def _section_table(path: Path, elf: ELFFile, mm: mmap.mmap) -> tuple[dict[str, Section], dict[str, int]]:
    """Sections by name, and their indexes, read straight from the section header table:
    pyelftools would build an object per section (and parse each hash table) just to name them.

    Everything the audit reads goes through these headers, which the loader never uses: a file
    without them, or with sections past its end, would otherwise look like one with no
    dependencies and no symbols, and pass."""
    count, shoff, entsize = elf.num_sections(), elf["e_shoff"], elf["e_shentsize"]
    if count == 0:
        raise unreadable(path, "it has no section headers (stripped with sstrip, or crafted)")
    fmt = struct.Struct(("<" if elf.little_endian else ">") + _SHDR[elf.elfclass])
    if entsize < fmt.size or shoff + count * entsize > len(mm):
        raise unreadable(path, f"its section header table ends past the end of the {len(mm)}-byte file (truncated)")
    headers = [fmt.unpack_from(mm, shoff + i * entsize) for i in range(count)]
    _n, _t, _f, _a, names_at, names_size, *_ = headers[elf.get_shstrndx()]
    sections: dict[str, Section] = {}
    index: dict[str, int] = {}
    for i, (sh_name, sh_type, _f, _a, offset, size, *_rest) in enumerate(headers):
        end = mm.find(b"\0", names_at + sh_name, names_at + names_size)
        name = mm[names_at + sh_name : end].decode("utf-8", "replace") if end >= 0 else ""
        if sh_type != SHT_NOBITS:
            if offset + size > len(mm):
                raise unreadable(path, f"section {name or f'#{i}'} ends at byte {offset + size} "
                                       f"of a {len(mm)}-byte file (truncated)")
            sections[name] = Section(name, offset, size)
        index.setdefault(name, i)
    return sections, index


def _read_headers(path: Path, mm: mmap.mmap) -> ElfObject:
    elf = ELFFile(mm)
    sections, index = _section_table(path, elf, mm)

    def section(name: str) -> Any:
        return elf.get_section(index[name]) if name in index else None

    needed: list[str] = []
    rpath: list[str] = []
    runpath: list[str] = []
    soname = None
    dynamic = section(".dynamic")
    # The loader reads the PT_DYNAMIC segment; the section must be that very table.
    segment = next((seg for seg in elf.iter_segments() if seg["p_type"] == "PT_DYNAMIC"), None)
    if segment is not None and (dynamic is None or dynamic["sh_offset"] != segment["p_offset"]):
        where = f"at byte {dynamic['sh_offset']}" if dynamic is not None else "nowhere"
        raise unreadable(path, f"the loader reads its dynamic table at byte {segment['p_offset']}, "
                               f"its section headers put it {where}")
    if dynamic is not None:
        for tag in dynamic.iter_tags():
            kind = tag.entry.d_tag
            if kind == "DT_NEEDED":
                needed.append(tag.needed)
            elif kind == "DT_RPATH":
                rpath.extend(tag.rpath.split(":"))
            elif kind == "DT_RUNPATH":
                runpath.extend(tag.runpath.split(":"))
            elif kind == "DT_SONAME":
                soname = tag.soname

    version_needs: dict[str, list[str]] = {}
    verneed = section(".gnu.version_r")
    # Version index -> (name, file); index 0/1 are "local"/"global" (unversioned).
    index_names: dict[int, tuple[str, str | None]] = {}
    if verneed is not None:
        for need, auxes in verneed.iter_versions():
            for aux in auxes:
                version_needs.setdefault(need.name, []).append(aux.name)
                index_names[aux["vna_other"]] = (aux.name, need.name)
    version_defs: list[str] = []
    verdef = section(".gnu.version_d")
    if verdef is not None:
        for vd, auxes in verdef.iter_versions():
            names = [a.name for a in auxes]
            if vd["vd_flags"] & 0x1:  # VER_FLG_BASE: the soname itself, not a version
                continue
            if names:
                version_defs.append(names[0])
                index_names[vd["vd_ndx"]] = (names[0], None)

    dynsym = section(".dynsym")
    layout = None
    if dynsym is not None:
        strtab = elf.get_section(dynsym["sh_link"])
        layout = (
            elf.elfclass,
            "<" if elf.little_endian else ">",
            dynsym["sh_offset"], dynsym["sh_size"],
            strtab["sh_offset"], strtab["sh_size"],
            sections.get(".gnu.version"),
            index_names,
        )
    return ElfObject(
        path=path,
        machine=elf["e_machine"],
        elfclass=elf.elfclass,
        little_endian=elf.little_endian,
        soname=soname,
        needed=needed,
        rpath=rpath,
        runpath=runpath,
        sections=sections,
        version_needs=version_needs,
        version_defs=version_defs,
        _map=mm,
        _sym_layout=layout,
    )


def _decode_dynsym(obj: ElfObject) -> tuple[list[Symbol], dict[str, list[tuple[str | None, bool]]]]:
    if obj._sym_layout is None or obj._map is None:
        return [], {}
    elfclass, endian, sym_off, sym_size, str_off, str_size, versym_sec, index_names = obj._sym_layout
    mm = obj._map
    strtab = mm[str_off : str_off + str_size]
    if elfclass == 64:
        fmt, entsize = endian + "IBBHQQ", 24
    else:
        fmt, entsize = endian + "IIIBBH", 16
    raw = mm[sym_off : sym_off + sym_size - sym_size % entsize]
    versyms: tuple[int, ...] | None = None
    if versym_sec is not None:
        count = versym_sec.size // 2
        versyms = struct.unpack_from(f"{endian}{count}H", mm, versym_sec.offset)

    undefined: list[Symbol] = []
    exports: dict[str, list[tuple[str | None, bool]]] = {}
    for i, entry in enumerate(struct.iter_unpack(fmt, raw)):
        if i == 0:
            continue
        if elfclass == 64:
            st_name, st_info, st_other, st_shndx = entry[0], entry[1], entry[2], entry[3]
        else:
            st_name, st_info, st_other, st_shndx = entry[0], entry[3], entry[4], entry[5]
        bind = st_info >> 4
        if bind not in (STB_GLOBAL, STB_WEAK, STB_GNU_UNIQUE) or not st_name:
            continue
        end = strtab.find(b"\0", st_name)
        name = strtab[st_name:end].decode("utf-8", "replace")
        version = from_file = None
        hidden = False
        if versyms is not None and i < len(versyms):
            vs = versyms[i]
            hidden = bool(vs & VERSYM_HIDDEN)
            named = index_names.get(vs & 0x7FFF)
            if named is not None:
                version, from_file = named
        if st_shndx == SHN_UNDEF:
            undefined.append(Symbol(name, version, bind == STB_WEAK, from_file))
        elif (st_other & 0x3) not in (STV_HIDDEN, STV_INTERNAL):
            exports.setdefault(name, []).append((version, hidden))
    return undefined, exports


def gnu_hash(name: bytes) -> int:
    h = 5381
    for byte in name:
        h = (h * 33 + byte) & 0xFFFFFFFF
    return h


def _gnu_lookup(mm: mmap.mmap, layout: tuple, table: tuple[int, int, int, int], name: str) -> list[tuple[str | None, bool]]:
    nbuckets, symoffset, buckets, chains = table
    elfclass, endian, sym_off, _sym_size, str_off, _str_size, versym_sec, index_names = layout
    key = name.encode()
    h = gnu_hash(key)
    (index,) = struct.unpack_from(endian + "I", mm, buckets + 4 * (h % nbuckets))
    found: list[tuple[str | None, bool]] = []
    if index < symoffset:
        return found
    entsize = 24 if elfclass == 64 else 16
    fmt = endian + ("IBBH" if elfclass == 64 else "I8xBBH")
    while True:
        (chain,) = struct.unpack_from(endian + "I", mm, chains + 4 * (index - symoffset))
        if (chain | 1) == (h | 1):
            st_name, st_info, st_other, st_shndx = struct.unpack_from(fmt, mm, sym_off + index * entsize)
            start = str_off + st_name
            if (
                mm[start : start + len(key)] == key
                and mm[start + len(key)] == 0
                and st_shndx != SHN_UNDEF
                and (st_other & 0x3) not in (STV_HIDDEN, STV_INTERNAL)
                and (st_info >> 4) in (STB_GLOBAL, STB_WEAK, STB_GNU_UNIQUE)
            ):
                version, hidden = None, False
                if versym_sec is not None:
                    (vs,) = struct.unpack_from(endian + "H", mm, versym_sec.offset + 2 * index)
                    hidden = bool(vs & VERSYM_HIDDEN)
                    named = index_names.get(vs & 0x7FFF)
                    version = named[0] if named else None
                found.append((version, hidden))
        if chain & 1:
            return found
        index += 1
