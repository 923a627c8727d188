"""Engines' own checkpoint files for tests: GROMACS .cpt and LAMMPS restart files, each
a real header and headers made as the engine writes them."""

from __future__ import annotations

import struct

#: The first 160 bytes of a .cpt GROMACS 2022.5 (Debian) wrote at step 10000 of the
#: example (`gmx dump -cp` of the file: "checkpoint file version = 22 ... step = 10000").
GMX_2022_HEAD = bytes.fromhex(
    "00029f2900000016323032322e352d44656269616e5f323032322e355f32000000000000000000000000"
    "00000000000c2f7573722f62696e2f676d7800000019546875204465632020332031353a33323a353020"
    "323032360a000000000000160000000000000002766d0000000005fa0000000100000000000000000000"
    "00000000000000000001000000000000271040340000000000000000000100000001"
)


def xdr_string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack(">i", len(raw)) + raw + bytes(-len(raw) % 4)


def cpt_header(version: int, step: int) -> bytes:
    """A header as GROMACS's do_cpt_header writes file version `version` (fields it
    gained later left out), then the time."""
    out = struct.pack(">i", 171817)
    out += b"".join(xdr_string(s) for s in ("4.5.7", "", "me", "host", "mdrun", "today!"))
    out += struct.pack(">i", version)
    if version >= 13:
        out += struct.pack(">i", 1)  # double precision
    if version >= 12:
        out += xdr_string("node7")
    out += struct.pack(">2i", 99_999, 3)  # atoms, T-coupling groups
    out += struct.pack(">i", 10) if version >= 10 else b""
    out += struct.pack(">i", 10) if version >= 11 else b""
    out += struct.pack(">i", 7) if version >= 14 else b""
    out += struct.pack(">i", 2)  # integrator
    out += struct.pack(">i", 4) if version >= 3 else b""  # simulation part
    out += struct.pack(">q", step) if version >= 5 else struct.pack(">i", step)
    return out + struct.pack(">d", 1.5)


def cpt_file(step: int, fill: bytes = b"x", size: int = 4096) -> bytes:
    """A complete .cpt as far as m27 reads one: a version-22 header at MD step `step`, a
    body depending on `fill`, and GROMACS's footer magic."""
    return cpt_header(22, step) + fill * size + struct.pack(">i", 171819)


#: The first 104 bytes of a restart file LAMMPS 29 Sep 2021 (Debian) wrote at step 20000
#: of the example's melt (`write_restart`; little-endian, format revision 2).
LAMMPS_2021_HEAD = bytes.fromhex(
    "4c616d6d7053205265737461727454000100000002000000000000000c00000032392053657020323032"
    "310001000000040000003000000004000000020000000400000003000000080000000400000003000000"
    "6c6a0005000000204e0000000000000600000003"
)

LAMMPS_MAGIC = b"LammpS RestartT\0"


def lammps_restart(step: int, order: str = "<", revision: int = 2, body: int = 2000) -> bytes:
    """A complete restart file as LAMMPS's write_restart lays it out: the magic string,
    endian int and format revision, the header entries (flag, value) up to the step, a
    body, and (since revision 1) the magic string again."""

    def entry(flag: int, value: int, fmt: str = "i") -> bytes:
        return struct.pack(f"{order}i{fmt}", flag, value)

    def text(flag: int, value: str) -> bytes:
        raw = value.encode() + b"\0"
        return struct.pack(f"{order}2i", flag, len(raw)) + raw

    out = LAMMPS_MAGIC + struct.pack(f"{order}2i", 1, revision)
    out += text(0, "29 Sep 2021") + entry(1, 4) + entry(48, 4) + entry(2, 4) + entry(3, 8)
    out += text(4, "lj") + entry(5, step, "q") + bytes(body)
    return out + (LAMMPS_MAGIC if revision >= 1 else b"")
