"""Which machine code each conda platform (subdir) runs: ELF machine, class and byte order.

A package says where it installs (`subdir` in info/index.json, a wheel's platform tag); its
ELF headers say where it runs. The audit holds the second to the first.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass


@dataclass(frozen=True)
class MachineCode:
    machine: str  # e_machine as pyelftools names it
    elfclass: int
    little_endian: bool
    name: str  # for people

    def describe(self) -> str:
        return f"{self.name} ({self.elfclass}-bit, {'little' if self.little_endian else 'big'}-endian)"


SUBDIRS = {
    "linux-64": MachineCode("EM_X86_64", 64, True, "x86-64"),
    "linux-aarch64": MachineCode("EM_AARCH64", 64, True, "aarch64"),
    "linux-ppc64le": MachineCode("EM_PPC64", 64, True, "ppc64le"),
    "linux-s390x": MachineCode("EM_S390", 64, False, "s390x"),
    "linux-32": MachineCode("EM_386", 32, True, "i386"),
    "linux-armv7l": MachineCode("EM_ARM", 32, True, "armv7l"),
}
# `uname -m` and wheel platform tags name CPUs this way.
_CPU_SUBDIRS = {
    "x86_64": "linux-64", "amd64": "linux-64", "aarch64": "linux-aarch64", "arm64": "linux-aarch64",
    "ppc64le": "linux-ppc64le", "s390x": "linux-s390x", "i686": "linux-32", "i386": "linux-32",
    "armv7l": "linux-armv7l",
}


def host_subdir() -> str | None:
    return _CPU_SUBDIRS.get(platform.machine().lower())


def wheel_subdir(tag: str) -> str | None:
    """'cp311-cp311-manylinux_2_28_x86_64' -> 'linux-64'; None for 'any' or a tag not for Linux."""
    plat = tag.rsplit("-", 1)[-1]
    if not plat.startswith(("linux_", "manylinux", "musllinux")):
        return None
    return next((subdir for cpu, subdir in _CPU_SUBDIRS.items() if plat.endswith("_" + cpu)), None)


def describe_elf(machine: str, elfclass: int, little_endian: bool) -> str:
    known = next((m for m in SUBDIRS.values() if m.machine == machine), None)
    name = known.name if known else str(machine).removeprefix("EM_").lower()
    return MachineCode(machine, elfclass, little_endian, name).describe()


def runs_on(subdir: str, machine: str, elfclass: int, little_endian: bool) -> bool:
    want = SUBDIRS[subdir]
    return (want.machine, want.elfclass, want.little_endian) == (machine, elfclass, little_endian)
