"""GPU code inside a host binary: the `.nv_fatbin` section's fatbin containers.

Layout (little endian), as written by nvcc/fatbinary and read by the CUDA driver:
  container header, 16 bytes: u32 magic 0xBA55ED50, u16 version, u16 header size,
                              u64 size of the entries that follow
  entry header, `header size` bytes (64, longer for newer archs):
      u16 kind (1 = PTX, 2 = ELF/cubin), u16 -, u32 header size, u64 padded payload size,
      u32 payload size, u32 -, u16 minor, u16 major (code version), u32 sm arch (e.g. 90),
      u32 name offset, u32 name length, u64 flags, u64 -, u64 uncompressed size
The payload follows its entry header; only headers are read, never payloads, so a
200 MB section costs a few hundred small reads from the mapped file.
"""

from __future__ import annotations

import mmap
import re
import struct
from collections.abc import Iterable
from dataclasses import dataclass

FATBIN_MAGIC = 0xBA55ED50
_MAGIC_BYTES = struct.pack("<I", FATBIN_MAGIC)
KIND_PTX, KIND_ELF = 1, 2
# Compressed payloads: 0x2000 marks the LZ4-style compression of CUDA <= 12,
# 0x8000 the zstd compression introduced with CUDA 12.8/13.
FLAG_COMPRESSED = 0x2000 | 0x8000
_CONTAINER = struct.Struct("<IHHQ")
_ENTRY = struct.Struct("<HHIQIIHHIIIQQQ")


@dataclass(frozen=True)
class FatbinEntry:
    kind: str  # "sass" or "ptx"
    arch: int  # 90 for sm_90 / compute_90
    compressed: bool
    size: int

    @property
    def name(self) -> str:
        return f"{'sm' if self.kind == 'sass' else 'compute'}_{self.arch}"


def parse_fatbin(buf: bytes | mmap.mmap, start: int = 0, end: int | None = None) -> list[FatbinEntry]:
    """Every entry of every container in buf[start:end] (a `.nv_fatbin` section)."""
    end = len(buf) if end is None else end
    entries: list[FatbinEntry] = []
    pos = start
    while pos + _CONTAINER.size <= end:
        magic, _version, header_size, fat_size = _CONTAINER.unpack_from(buf, pos)
        if magic != FATBIN_MAGIC:
            # Containers are padded to an alignment: skip to the next magic.
            pos = buf.find(_MAGIC_BYTES, pos + 1, end)
            if pos < 0:
                break
            continue
        entry_pos = pos + header_size
        container_end = min(end, pos + header_size + fat_size)
        while entry_pos + _ENTRY.size <= container_end:
            kind, _u0, entry_header, padded, payload, _u1, _minor, _major, arch, _n0, _n1, flags, _z, _full = (
                _ENTRY.unpack_from(buf, entry_pos)
            )
            if entry_header == 0:
                break
            if kind in (KIND_PTX, KIND_ELF):
                entries.append(
                    FatbinEntry("ptx" if kind == KIND_PTX else "sass", arch, bool(flags & FLAG_COMPRESSED), payload)
                )
            entry_pos += entry_header + padded
        pos = max(container_end, pos + 1)
    return entries


def arch_runs_on(arch: str, cc: str, *, ptx: bool = False) -> bool:
    """Whether code for `arch` ("sm_80", "sm_90a", "compute_80") runs on a GPU of capability cc.

    SASS runs on the same major with an equal or higher minor; arch-specific SASS ("a") only
    on its exact capability; family SASS ("f") within its major. PTX JIT-compiles for any
    capability at or above its own.
    """
    m = re.fullmatch(r"(?:sm|compute)_(\d+?)(\d)([af]?)", arch)
    if not m:
        return False
    major, minor, suffix = int(m.group(1)), int(m.group(2)), m.group(3)
    gmaj, gmin = (int(x) for x in cc.split("."))
    if ptx:
        return (gmaj, gmin) >= (major, minor)
    if suffix == "a":
        return (gmaj, gmin) == (major, minor)
    return gmaj == major and gmin >= minor


def arch_sets(entries: Iterable[FatbinEntry]) -> tuple[list[str], list[str]]:
    """(SASS archs "sm_XX", PTX archs "compute_XX"), sorted by arch number."""
    sass = sorted({e.arch for e in entries if e.kind == "sass"})
    ptx = sorted({e.arch for e in entries if e.kind == "ptx"})
    return [f"sm_{a}" for a in sass], [f"compute_{a}" for a in ptx]


def arch_number(arch: str) -> int:
    """'sm_90', 'sm_90a', 'compute_90', '90', '9.0' -> 90."""
    text = arch.strip().lower()
    for prefix in ("sm_", "compute_"):
        text = text.removeprefix(prefix)
    text = text.rstrip("af").replace(".", "")
    if not text.isdigit():
        raise ValueError(f"not a CUDA arch: {arch!r}")
    return int(text)


def arch_coverage(promised: str, sass: Iterable[str], ptx: Iterable[str]) -> str:
    """'sass' if a cubin runs natively on the promised arch, 'ptx' if only JIT from PTX can
    serve it, else 'missing' (same rules as node admission: sm_80 code runs on sm_86)."""
    number = arch_number(promised)
    cc = f"{number // 10}.{number % 10}"
    if any(arch_runs_on(s, cc) for s in sass):
        return "sass"
    if any(arch_runs_on(p, cc, ptx=True) for p in ptx):
        return "ptx"
    return "missing"
