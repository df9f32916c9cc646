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

Arch-specific code (`sm_90a`, `compute_100a`) and family-specific code (`sm_100f`) carry the
same arch number as the generic code; the entry's flags tell them apart (bits seen in nvcc
13.0's output for SASS and PTX alike).
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
FLAG_ARCH_SPECIFIC, FLAG_FAMILY = 0x100000, 0x200000
_CONTAINER = struct.Struct("<IHHQ")
_ENTRY = struct.Struct("<HHIQIIHHIIIQQQ")


@dataclass(frozen=True)
class FatbinEntry:
    kind: str  # "sass" or "ptx"
    arch: int  # 90 for sm_90 / compute_90
    compressed: bool
    size: int
    suffix: str = ""  # "a" arch-specific, "f" family-specific, "" generic

    @property
    def name(self) -> str:
        return f"{'sm' if self.kind == 'sass' else 'compute'}_{self.arch}{self.suffix}"


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
                suffix = "a" if flags & FLAG_ARCH_SPECIFIC else "f" if flags & FLAG_FAMILY else ""
                entries.append(FatbinEntry("ptx" if kind == KIND_PTX else "sass", arch,
                                           bool(flags & FLAG_COMPRESSED), payload, suffix))
            entry_pos += entry_header + padded
        pos = max(container_end, pos + 1)
    return entries


def arch_runs_on(arch: str, cc: str, *, ptx: bool = False) -> bool:
    """Whether code for `arch` ("sm_80", "sm_90a", "sm_100f", "compute_80") runs on a GPU of capability cc.

    NVIDIA's compatibility rules: generic SASS runs on the same major with an equal or higher
    minor; arch-specific code ("a", SASS or PTX) only on its exact capability; family-specific
    code ("f") on the members of its family at or above its own capability (sm_100f on 10.0 and
    10.3, sm_120f on 12.0 and 12.1; a family never spans majors). Generic PTX JIT-compiles for
    any capability at or above its own.
    """
    m = re.fullmatch(r"(?:sm|compute)_(\d+?)(\d)([af]?)", arch)
    if not m:
        return False
    major, minor, suffix = int(m.group(1)), int(m.group(2)), m.group(3)
    gmaj, gmin = (int(x) for x in cc.split("."))
    if suffix == "a":
        return (gmaj, gmin) == (major, minor)
    if ptx and not suffix:
        return (gmaj, gmin) >= (major, minor)
    return gmaj == major and gmin >= minor


def arch_sets(entries: Iterable[FatbinEntry]) -> tuple[list[str], list[str]]:
    """(SASS archs "sm_XX[a|f]", PTX archs "compute_XX[a|f]"), sorted by arch number."""
    entries = sorted(entries, key=lambda e: (e.arch, e.suffix))
    sass = dict.fromkeys(e.name for e in entries if e.kind == "sass")
    ptx = dict.fromkeys(e.name for e in entries if e.kind == "ptx")
    return list(sass), list(ptx)


# GPU archs extforge accepts (compute capability x 10). A value outside this list is a typo
# far more often than a GPU newer than this release of extforge; add new ones here.
KNOWN_ARCHS = (35, 37, 50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 88, 89, 90, 100, 101, 103, 110, 120, 121)
# The oldest arch with arch-specific ("a") and with family-specific ("f") code.
ARCH_SPECIFIC_SINCE, FAMILY_SPECIFIC_SINCE = 90, 100
ARCH_FORMS = ("8.0, 80, sm_80 or compute_80 (9.0a or sm_90a: arch-specific; 10.0f or sm_100f: family-specific; "
              "9.0+PTX: SASS and PTX), several separated by commas, semicolons or spaces")


@dataclass(frozen=True)
class Arch:
    """One GPU code target, whatever spelling named it: SASS (`sm_90`) or PTX (`compute_90`) for
    compute capability `number` / 10, generic or arch-specific ("a") or family-specific ("f")."""

    number: int  # 90 for 9.0
    suffix: str = ""  # "a", "f" or ""
    ptx: bool = False

    @property
    def name(self) -> str:
        """nvcc's and the audit's name: sm_90a, compute_90."""
        return f"{'compute' if self.ptx else 'sm'}_{self.code}"

    @property
    def code(self) -> str:
        """The number form (FLASH_ATTN_CUDA_ARCHS, CMake): 90a."""
        return f"{self.number}{self.suffix}"

    @property
    def capability(self) -> str:
        """The compute capability form (TORCH_CUDA_ARCH_LIST): 9.0a."""
        return f"{self.number // 10}.{self.number % 10}{self.suffix}"


_ARCH = re.compile(r"(sm_|compute_)?(?:(\d{1,2})\.(\d)|(\d{1,2})(\d))([af]?)")


def parse_arch(arch: str) -> Arch:
    """'sm_90' -> Arch(90), 'compute_100f' -> Arch(100, 'f', ptx=True), '9.0' -> Arch(90): the spelling
    alone (a list a user gives goes through parse_arch_list, which also knows which archs exist)."""
    m = _ARCH.fullmatch(arch.strip().lower())
    if not m:
        raise ValueError(f"not a CUDA arch: {arch!r}")
    major, minor = (m.group(2), m.group(3)) if m.group(2) else (m.group(4), m.group(5))
    return Arch(int(major) * 10 + int(minor), m.group(6), ptx=m.group(1) == "compute_")


def parse_arch_list(text: str) -> tuple[Arch, ...]:
    """Every spelling of a GPU arch list the commands and variant files use, as one typed list:
    '8.0;9.0' (TORCH_CUDA_ARCH_LIST), '80,90', 'sm_80 sm_90a', 'compute_90', '9.0+PTX' (SASS and
    PTX of 9.0). ValueError naming the entry and the forms accepted."""
    entries = [e for e in re.split(r"[,;\s]+", text.strip()) if e]
    if not entries:
        raise ValueError(f"no GPU arch given (write {ARCH_FORMS})")
    out: list[Arch] = []
    for entry in entries:
        # "+PTX" belongs to the compute capability form: "9.0+PTX", "90+PTX", never "sm_90+PTX".
        base, plus, rest = entry.lower().partition("+ptx")
        try:
            if rest or (plus and base.startswith(("sm_", "compute_"))):
                raise ValueError
            arch = parse_arch(base)
        except ValueError:
            raise ValueError(f"not a CUDA arch: {entry!r} (write {ARCH_FORMS})") from None
        if arch.number not in KNOWN_ARCHS:
            raise ValueError(f"not a known CUDA arch: {entry!r} (known: {', '.join(f'sm_{n}' for n in KNOWN_ARCHS)})")
        since = {"a": ARCH_SPECIFIC_SINCE, "f": FAMILY_SPECIFIC_SINCE}.get(arch.suffix)
        if since and arch.number < since:
            kind = "arch-specific" if arch.suffix == "a" else "family-specific"
            raise ValueError(f"not a CUDA arch: {entry!r} ({kind} '{arch.suffix}' code exists from sm_{since} on)")
        out += [arch, Arch(arch.number, arch.suffix, ptx=True)] if plus else [arch]
    return tuple(dict.fromkeys(out))


def torch_arch_list(archs: Iterable[Arch]) -> tuple[str, ...]:
    """The TORCH_CUDA_ARCH_LIST entries of `archs` (the build layer's form): 8.0, 9.0a, 9.0+PTX.
    PTX alone has no entry there: compute_90 asks for 9.0+PTX (its SASS comes with it)."""
    archs = list(archs)
    ptx = {(a.number, a.suffix) for a in archs if a.ptx}
    entries = (f"{a.capability}{'+PTX' if (a.number, a.suffix) in ptx else ''}" for a in archs)
    return tuple(dict.fromkeys(entries))


def gencode(arch: str) -> str:
    """The nvcc flag that produces SASS for `arch`: sm_90a -> -gencode arch=compute_90a,code=sm_90a."""
    code = parse_arch(arch).code
    return f"-gencode arch=compute_{code},code=sm_{code}"


def arch_coverage(promised: str, sass: Iterable[str], ptx: Iterable[str]) -> str:
    """'sass' if a cubin runs natively on the promised arch, 'ptx' if only JIT from PTX can
    serve it, else 'missing'.

    A plain promise ("sm_103") names the GPUs that must run the module: any code that runs on
    that capability serves it, by the rules of node admission (sm_80 runs on 8.6, sm_100f on
    10.3, sm_100a on 10.0 only). A suffixed promise ("sm_90a", "sm_100f") names the code the
    build promised to produce, with its arch-specific or family-specific instructions: only that
    exact SASS (or its PTX) serves it.
    """
    arch = parse_arch(promised)
    number, suffix = arch.number, arch.suffix
    sass, ptx = list(sass), list(ptx)
    if suffix:
        if f"sm_{number}{suffix}" in sass:
            return "sass"
        return "ptx" if f"compute_{number}{suffix}" in ptx else "missing"
    cc = f"{number // 10}.{number % 10}"
    if any(arch_runs_on(s, cc) for s in sass):
        return "sass"
    if any(arch_runs_on(p, cc, ptx=True) for p in ptx):
        return "ptx"
    return "missing"
