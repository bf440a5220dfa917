"""Writes a hostile `.debug_line` section to OUT: small on disk, and each of its two line
programs would make a reader that keeps what it parses allocate some ninety bytes per byte
(gimli keeps each file entry as a structure of that size):

- a DWARF 5 program whose header lists N files, each one byte (an empty inline string);
- a DWARF 4 program that defines N files as it runs (`DW_LNE_define_file`, seven bytes
  each), then ends its only sequence.

A test puts it in a program with `objcopy --remove-section=.debug_line
--add-section=.debug_line=OUT` and runs that program as nobody beside a daemon that names
call sites from line tables.

usage: hostile_dwarf.py OUT N
"""
import struct
import sys

DW_LNCT_PATH, DW_FORM_STRING = 1, 0x08
DW_LNE_END_SEQUENCE, DW_LNE_SET_ADDRESS, DW_LNE_DEFINE_FILE = 1, 2, 3
STANDARD_OPCODE_LENGTHS = bytes([0, 1, 1, 1, 1, 0, 0, 0, 1, 0, 0, 1])


def uleb(v):
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def common(opcode_base=13):
    # Minimum instruction length, maximum operations, default is_stmt, line base, range,
    # opcode base, the standard opcodes' lengths.
    return bytes([1, 1, 1, 0xFB, 14, opcode_base]) + STANDARD_OPCODE_LENGTHS


def unit(version_and_sizes, header, program):
    header_length = struct.pack("<I", len(header))
    body = version_and_sizes + header_length + header + program
    return struct.pack("<I", len(body)) + body


def dwarf5_many_files(n):
    header = common()
    header += bytes([1]) + uleb(DW_LNCT_PATH) + uleb(DW_FORM_STRING)  # directory format
    header += uleb(1) + b"/\0"  # one directory
    header += bytes([1]) + uleb(DW_LNCT_PATH) + uleb(DW_FORM_STRING)  # file format
    header += uleb(n) + b"\0" * n  # n files, each an empty name
    return unit(struct.pack("<HBB", 5, 8, 0), header, b"")


def dwarf4_defining_files(n):
    header = common() + b"\0" + b"a.c\0" + uleb(0) + uleb(0) + uleb(0) + b"\0"
    define = bytes([0]) + uleb(5) + bytes([DW_LNE_DEFINE_FILE]) + b"\0" + uleb(0) * 3
    set_address = bytes([0]) + uleb(9) + bytes([DW_LNE_SET_ADDRESS]) + struct.pack("<Q", 0x1000)
    end = bytes([0]) + uleb(1) + bytes([DW_LNE_END_SEQUENCE])
    return unit(struct.pack("<H", 4), header, set_address + define * n + end)


def main():
    out, n = sys.argv[1], int(sys.argv[2])
    with open(out, "wb") as f:
        f.write(dwarf5_many_files(n) + dwarf4_defining_files(n))


main()
