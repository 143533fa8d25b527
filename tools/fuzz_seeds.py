#!/usr/bin/env python3
"""Writes the fuzz harness's seed corpus (tests/fuzz/corpus): small inputs in
the format tests/fuzz/fuzz_case.c documents, one per feature, so the fuzzer
starts from calls that reach every path and every check.

    tools/fuzz_seeds.py [OUT_DIR]       default: tests/fuzz/corpus
"""
import os
import sys

DIMS = [1, 3, 4, 16, 17, 32]
VIEWS = ["q", "k", "v", "out", "mask", "bias", "lse", "weights", "entropy", "max_weight", "argmax"]
FLAG1 = {"done": 1, "kv_lens": 2, "mask": 4, "bias": 8, "lse": 16, "weights": 32, "entropy": 64,
         "max_weight": 128}
FLAG2 = {"argmax": 1, "kv_lens_short": 2, "null_ctx": 4, "null_params": 8}
SCALE = {"default": 0, 1.0: 1, 0.5: 2, 0.0: 4, "inf": 10, "-0": 12}
WINDOW = {-1: 0, 0: 1, 1: 2, 2: 3, 3: 4, 4: 5, 7: 6, 16: 7, -2: 0xF0, "INT_MIN": 0xF1, "INT_MAX": 0xF2}
HOSTILE = {0: 0xF0, -1: 0xF1, "INT_MAX": 0xF2, "INT_MIN": 0xF3, 65536: 0xF5}


def dim(value, kind):
    if value in HOSTILE:
        return HOSTILE[value]
    if kind == "batch":
        return value - 1
    if kind == "q_heads":
        return value - 1
    if kind == "kv_heads":
        return value - 1
    if kind == "q_len":
        return value - 1
    if kind == "kv_len":
        return value - 1
    return DIMS.index(value)


def case(B=1, Hq=1, Hkv=1, M=8, N=8, dk=4, dv=4, dtype=0, scale="default", causal=0, wl=-1, wr=-1,
         empty=0, algo=0, flags=(), views=None, data=b""):
    """views: {name: (mode, offset, size, param)}; absent = dense, exact."""
    f1 = sum(FLAG1[f] for f in flags if f in FLAG1)
    f2 = sum(FLAG2[f] for f in flags if f in FLAG2)
    head = [dim(B, "batch"), dim(Hq, "q_heads"), dim(Hkv, "kv_heads"), dim(M, "q_len"), dim(N, "kv_len"),
            dim(dk, "dk"), dim(dv, "dv"), dtype, SCALE[scale], causal, WINDOW[wl], WINDOW[wr], empty, algo,
            f1, f2]
    views = views or {}
    for name in VIEWS:
        head += list(views.get(name, (0, 0, 0, 0)))
    assert len(head) == 60
    return bytes(head) + data


SEEDS = {
    "basic_fused": case(),
    "staged_weights_lse": case(M=5, N=11, algo=1, flags=("weights", "lse")),
    "gemm_gqa_causal": case(B=2, Hq=4, Hkv=2, M=6, N=9, dk=16, dv=4, algo=3, causal=1, flags=("lse",)),
    "fused_diag_window": case(M=12, N=20, dk=16, dv=16, wl=3, wr=1, algo=2,
                              flags=("entropy", "max_weight", "argmax", "done")),
    "mask_bias_bcast": case(Hq=2, M=7, N=13, flags=("mask", "bias"),
                            views={"mask": (3, 0, 0, 0b0011), "bias": (3, 2, 0, 0b0101)}),
    "kv_lens_padding": case(B=3, M=4, N=17, dk=16, dv=16, flags=("kv_lens", "lse"),
                            data=bytes([0, 4, 5])),  # kv_lens N, 0, -1
    "empty_error": case(M=4, N=4, empty=1, flags=("mask",), data=bytes([0] * 64)),
    "bshd_gaps_offsets": case(B=2, Hq=2, Hkv=1, M=5, N=6, views={
        "q": (1, 3, 2, 0), "k": (2, 1, 0, 2), "v": (4, 2, 0, 0), "out": (2, 4, 6, 1)}),
    "nan_inf_data": case(M=3, N=5, flags=("lse", "entropy"),
                         data=bytes([0xFD, 3, 0xFE, 1, 0xFF, 2] * 20)),
    "too_small_by_one": case(views={"k": (0, 0, 1, 0)}),
    "output_broadcast": case(M=4, views={"out": (3, 0, 0, 0b0100)}),
    "hostile_strides": case(views={"v": (7, 0, 1, 0b10101010)}),
    "hostile_offset": case(views={"q": (0, 0xF0, 0, 0)}),
    "bad_dims": case(Hq=3, Hkv=2),
    "negative_dim_intmax": case(B=-1, M="INT_MAX", dk=0),
    "bad_enums": case(dtype=0xF0, algo=0xF9, empty=0xFA, scale="inf", wl=-2,
                      flags=("null_ctx", "null_params")),
    "fused_weights_unsupported": case(algo=2, flags=("weights",)),
    "null_out": case(views={"out": (0xFF, 0, 0, 0)}),
    "window_int_max": case(M=6, N=10, wl="INT_MAX", wr="INT_MAX", flags=("lse",)),
}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "tests", "fuzz",
                                                             "corpus")
    os.makedirs(out, exist_ok=True)
    for name, data in SEEDS.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
    print("wrote %d seeds to %s" % (len(SEEDS), os.path.normpath(out)))


if __name__ == "__main__":
    main()
