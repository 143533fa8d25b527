#!/usr/bin/env python3
"""Per-kernel figures of an Intel GPU binary (ocloc's zebin: an ELF whose
.ze_info section is YAML), one line each:

    KERNEL SIMD GRF SCRATCH PRIVATE SLM

SIMD the width IGC compiled for, GRF the registers per hardware thread,
SCRATCH the bytes per thread of spills (and of private arrays IGC placed
there), PRIVATE the bytes of private memory per thread in global memory,
SLM the bytes of shared local memory per work-group (0 when absent).

    tools/scripts/zeinfo.py FILE.bin

Exit status 1 when FILE is not an ELF with a .ze_info section.
"""
import struct
import sys


def ze_info(data):
    if data[:4] != b"\x7fELF":
        return None
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    entsize, count, names = struct.unpack_from("<HHH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQ", data, shoff + i * entsize) for i in range(count)]
    strtab = sections[names][4]
    for name, _, _, _, offset, size in sections:
        end = data.index(b"\0", strtab + name)
        if data[strtab + name:end] == b".ze_info":
            return data[offset:offset + size].decode()
    return None


def kernels(text):
    """The kernels' entries of .ze_info's `kernels:` list, read line by line
    (the figures are `key: value` lines at known places; no YAML library)."""
    out, current, section, buffer_type = [], None, None, None
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        indent = len(line) - len(line.lstrip())
        if indent == 0:
            section = stripped.rstrip(":")
            current = None
            continue
        if section != "kernels":
            continue
        if indent == 2 and stripped.startswith("- name:"):
            current = {"name": stripped.split(":", 1)[1].strip(), "simd": "?", "grf": "?",
                       "scratch": 0, "private": 0, "slm": 0}
            out.append(current)
            continue
        if current is None:
            continue
        key, _, value = stripped.lstrip("- ").partition(":")
        value = value.strip()
        if key == "simd_size":
            current["simd"] = value
        elif key == "grf_count":
            current["grf"] = value
        elif key == "slm_size":
            current["slm"] = int(value)
        elif key == "type":
            buffer_type = value
        elif key == "size" and buffer_type in ("scratch", "private_space"):
            current["scratch" if buffer_type == "scratch" else "private"] += int(value)
            buffer_type = None
    return out


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: zeinfo.py FILE.bin")
    text = ze_info(open(sys.argv[1], "rb").read())
    if text is None:
        print("zeinfo: %s has no .ze_info section (not a zebin)" % sys.argv[1], file=sys.stderr)
        return 1
    for k in kernels(text):
        print(k["name"], k["simd"], k["grf"], k["scratch"], k["private"], k["slm"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
