"""Rewrites a 64-bit ELF library in place so that its `.dynamic` section (as section
headers describe it; the loader's PT_DYNAMIC is untouched, so the library still loads)
holds N `DT_NEEDED` entries that all name one string of LEN bytes, in a string table
appended to the file: a small file that names N x LEN bytes of strings.

usage: many_needed.py LIBRARY N LEN
"""
import struct
import sys

SHT_STRTAB, SHT_DYNAMIC, DT_NEEDED = 3, 6, 1


def pad(buf, align):
    while len(buf) % align:
        buf.append(0)


def main():
    path, n, length = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    data = bytearray(open(path, "rb").read())
    assert data[:4] == b"\x7fELF" and data[4] == 2, "a 64-bit ELF file"
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    assert shentsize == 64
    headers = [bytearray(data[shoff + i * 64 : shoff + (i + 1) * 64]) for i in range(shnum)]
    dynamic = next(h for h in headers if struct.unpack_from("<I", h, 4)[0] == SHT_DYNAMIC)

    pad(data, 8)
    strings = len(data)
    data += b"\0" + b"A" * length + b"\0"
    pad(data, 8)
    entries = len(data)
    data += struct.pack("<QQ", DT_NEEDED, 1) * n + struct.pack("<QQ", 0, 0)
    size = len(data) - entries

    table = bytearray(64)
    # name, type, flags, addr, offset, size, link, info, addralign, entsize
    struct.pack_into("<IIQQQQIIQQ", table, 0, 0, SHT_STRTAB, 0, 0, strings, length + 2, 0, 0, 1, 0)
    # .dynamic: offset, size, then link -> the new string table (the last header).
    struct.pack_into("<QQI", dynamic, 0x18, entries, size, shnum)

    pad(data, 8)
    struct.pack_into("<Q", data, 0x28, len(data))
    struct.pack_into("<H", data, 0x3C, shnum + 1)
    for h in headers:
        data += h
    data += table
    open(path, "wb").write(data)


if __name__ == "__main__":
    main()
