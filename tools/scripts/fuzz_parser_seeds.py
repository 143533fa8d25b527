#!/usr/bin/env python3
"""Writes the seed corpora of the parser fuzz targets (tests/fuzz/fuzz_parsers.c):
program cache entries (src/cache.c's format 2, keyed to FZ_CACHE_KEY) and
tuning files (src/tuning.h's format), valid ones and each kind of refusal.
The replay (test_fuzz_regressions --parsers) requires an input to be
accepted exactly when its name starts with "valid".

    tools/scripts/fuzz_parser_seeds.py [FUZZ_DIR]     default: tests/fuzz
"""
import os
import struct
import sys

KEY = b"clattn fuzz key."  # FZ_CACHE_KEY
FNV_BASIS, FNV_PRIME, MASK = 0xCBF29CE484222325, 0x100000001B3, (1 << 64) - 1


def fnv1a(data, h=FNV_BASIS):
    for b in data:
        h = ((h ^ b) * FNV_PRIME) & MASK
    return h


def entry(payload, key=KEY, fmt=2, length=None, checksum="format2", magic=b"CLATTNPB"):
    """An entry; length/checksum: None/"format2" = right for format 2."""
    head = magic + struct.pack("<II", fmt, 0) + key + struct.pack("<Q", len(payload) if length is None else length)
    if checksum == "format2":
        checksum = fnv1a(payload, fnv1a(head))
    elif checksum == "format1":
        checksum = fnv1a(payload)
    return head + struct.pack("<Q", checksum) + payload


PAYLOAD = b"POCL-like binary header\0" + bytes(range(40))
CACHE = {
    "valid": entry(PAYLOAD),
    "valid-one-byte": entry(b"\x01"),
    "other-key-valid": entry(PAYLOAD, key=b"another key 0123"),
    "header-only": entry(b""),
    "length-0x7fffffff-checksum-recomputed": entry(PAYLOAD, length=0x7FFFFFFF),
    "length-short": entry(PAYLOAD, length=len(PAYLOAD) - 1),
    "length-zero": entry(PAYLOAD, length=0),
    "format1-checksum": entry(PAYLOAD, checksum="format1"),
    "format1": entry(PAYLOAD, fmt=1, checksum="format1"),
    "bad-magic": entry(PAYLOAD, magic=b"CLATTNPX"),
    "bad-checksum": entry(PAYLOAD, checksum=0x0123456789ABCDEF),
    "truncated": entry(PAYLOAD)[:60],
    "short-header": entry(PAYLOAD)[:47],
    "empty": b"",
}

HEAD = b"format = 1\nplatform = P\ndevice = D\ndriver = 1\n"
TUNING = {
    "valid-all-keys": HEAD + b"".join(b"%s = %d\n" % (k, v) for k, v in [
        (b"score_tm", 8), (b"score_tn", 16), (b"score_tk", 32), (b"softmax_wg", 64), (b"mix_tm", 8),
        (b"mix_tv", 16), (b"mix_tj", 32), (b"flash_bm", 8), (b"flash_wg", 0), (b"scratch_bytes", 67108864),
        (b"block_rm", 2), (b"block_rn", 4), (b"flash_tile", 16)])
        + b"auto_prefill = fused\nauto_decode = gemm\nauto_weights = staged\n",
    "valid-comments-crlf": b"# written by hand\r\nformat = 1 # one\r\nplatform = Portable Computing Language\r\n"
        b"device = pthread-cpu\r\ndriver = 3.1+debian\r\n\r\n  flash_bm = 16  \r\n",
    "valid-no-final-newline": HEAD + b"flash_wg = 64",
    "valid-line-1023-bytes": HEAD + b"#" + b"x" * 1022 + b"\nflash_bm = 2\n",
    "line-1035-bytes-split-by-fgets": HEAD + b"#" + b"x" * 1022 + b"flash_bm = 2\n",
    "nul-byte": HEAD + b"flash_bm = 4\0flash_bm = 2\n",
    "nul-in-comment": HEAD + b"#\0\nflash_bm = 2\n",
    "bad-values": HEAD + b"flash_bm = 3\n",
    "negative-flash-wg": HEAD + b"flash_wg = -5\n",
    "negative-scratch": HEAD + b"scratch_bytes = -5\n",
    "integer-overflow": HEAD + b"score_tm = 99999999999999999999\n",
    "weights-fused": HEAD + b"auto_weights = fused\n",
    "block-pair-refused": HEAD + b"block_rm = 2\nblock_rn = 2\n",
    "block-rm-alone": HEAD + b"block_rm = 4\n",
    "flash-tile-past-64": HEAD + b"flash_tile = 128\n",
    "unknown-key": HEAD + b"tile = 4\n",
    "no-equals": HEAD + b"flash_bm 4\n",
    "no-format": b"platform = P\ndevice = D\ndriver = 1\n",
    "format-2": b"format = 2\nplatform = P\ndevice = D\ndriver = 1\n",
    "no-device": b"format = 1\nplatform = P\n",
    "valid-long-platform-truncated": b"format = 1\nplatform = " + b"p" * 600 + b"\ndevice = D\ndriver = 1\n",
    "empty": b"",
}


def main():
    base = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fuzz")
    for sub, seeds in (("corpus-cache-entry", CACHE), ("corpus-tuning-file", TUNING)):
        out = os.path.join(base, sub)
        os.makedirs(out, exist_ok=True)
        for name, data in seeds.items():
            with open(os.path.join(out, name), "wb") as f:
                f.write(data)
        print("%s: %d seeds" % (out, len(seeds)))


if __name__ == "__main__":
    main()
