#!/usr/bin/env python3
"""Writes the fuzz harness's seed corpus (tests/fuzz/corpus): small inputs in
the format tests/fuzz/fuzz_case.c documents, one per feature, so the fuzzer
starts from calls that reach every path and every check. Seeds named ext_*
carry the format's extension (16-bit storage, quantised and paged K/V,
score shaping, packed sequences, dropout, left-padded caches), a few valid
and a few hostile per field.

    tools/scripts/fuzz_seeds.py [OUT_DIR]       default: tests/fuzz/corpus

and clattn_kv_append's (tests/fuzz/append_case.c) into corpus-append beside it.
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


MAGIC = bytes([0xC1, 0xA7, 0x7E, 0x02])
EXT_LEN = 32
DTYPE = {"f32": 0, "f16": 1, "bf16": 2, "q8_0": 3, "int8": 4}
KV = {"same": 0, "f32": 1, "f16": 2, "bf16": 3, "q8_0": 4, "int8": 5, "hostile": 6}
SCORE = {"softcap": 1, "alibi": 2, "sinks": 4, "additive": 8, "bad_score": 16, "w_mismatch": 32, "short": 64}
SOFTCAP = {5.0: 0, 1.0: 1, "nan": 8, -1.0: 9, "inf": 10, "-0": 11, 0.0: 12, "FLT_MIN": 13}
VARLEN = {"cu_q": 1, "cu_k": 2, "short": 4, "batch_stride": 8}
TOTAL = {"last": 0, "last+1": 1, "last-1": 2, "zero": 3}
DROPOUT = {0.0: 0, 0.5: 1, 0.1: 2, 0.9999999: 3, -0.1: 4, 1.0: 5, "nan": 6, "inf": 7, 0.25: 8, "-0": 9, 0.9: 10,
           1e-10: 11, "-inf": 12, 1.0000001: 13, 0.75: 14, "largest": 15}  # largest: the float below 1


def ext(dtype="f32", kv="same", score=(), softcap=5.0, varlen=(), total_q="last", total_kv="last", paged=False,
        table_short=False, page_size=4, num_pages=8, bt_stride=0, scale_flips=0, k_scale_view=(0, 0, 0, 0),
        v_scale_view=(0, 0, 0, 0), q8_k=0, q8_v=0, alibi_stride=0, dropout=0.0, seed=(0, 0), offset=(0, 0),
        leftpad=False, leftpad_short=False, **kw):
    """An input of the extended format: the magic, its header, then case(**kw).
    page_size 1..16, num_pages 1..32 (or a hostile byte >= 0xF0), bt_stride:
    0 the least entries, 1 / 2 more, 3 one too few (or a hostile byte).
    alibi_stride: 0 per head, 1 q_heads, 2 q_heads + 1 (or a hostile byte).
    seed, offset: the bytes of their low and high 32-bit words (< 0x80 the
    value, 0x80 + k: 2^32 - 1 - k, >= 0xF0 a spread pattern).
    leftpad: cache_leftpad, its entries in the data after additive_w's
    (< 0xF0 b % (end + 1), end = the row's kv_lens clamped to [0, kv_len])."""
    e = [0] * EXT_LEN
    e[0] = DTYPE[dtype]
    e[1] = KV[kv]
    e[2] = sum(SCORE[f] for f in score)
    e[3] = SOFTCAP[softcap]
    e[4] = sum(VARLEN[f] for f in varlen) | TOTAL[total_q] << 4 | TOTAL[total_kv] << 6
    e[5] = (1 if paged else 0) | (2 if table_short else 0)
    e[6] = page_size if page_size >= 0xF0 else page_size - 1
    e[7] = num_pages if num_pages >= 0xF0 else num_pages - 1
    e[8] = bt_stride
    e[9] = scale_flips
    e[10:14] = k_scale_view
    e[14:18] = v_scale_view
    e[18] = q8_k
    e[19] = q8_v
    e[20] = alibi_stride
    e[21] = DROPOUT[dropout]
    e[22:24] = seed
    e[24:26] = offset
    e[26] = (1 if leftpad else 0) | (2 if leftpad_short else 0)
    return MAGIC + bytes(e) + case(**kw)


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
    # --- the extension: storage types (K/V programs are built for head dims 32)
    "ext_f16_fused_lse": ext("f16", M=5, N=7, dk=32, dv=32, flags=("lse",)),
    "ext_bf16_staged_gqa_causal": ext("bf16", B=2, Hq=4, Hkv=2, M=3, N=6, dk=32, dv=32, algo=1, causal=1,
                                      flags=("weights", "lse")),
    "ext_f16_gemm_bshd_gaps": ext("f16", Hq=2, M=4, N=5, dk=32, dv=32, algo=3, views={
        "q": (1, 3, 2, 0), "v": (2, 1, 0, 2), "out": (2, 4, 6, 1)}),
    "ext_f16_nan_inf_data": ext("f16", M=3, N=5, dk=32, dv=32, flags=("lse",),
                                data=bytes([0xFD, 3, 0xFE, 1, 0xFF, 2] * 40)),
    "ext_kv_f16_under_f32_q": ext("f32", "f16", M=4, N=9, dk=32, dv=32, flags=("lse", "kv_lens"),
                                  data=bytes([6])),
    "ext_q8_0_fused": ext(kv="q8_0", M=3, N=11, dk=32, dv=32, algo=2, flags=("lse", "entropy")),
    "ext_q8_0_gemm_gaps": ext(kv="q8_0", Hq=2, M=4, N=6, dk=32, dv=32, algo=3,
                              views={"k": (2, 2, 0, 1), "v": (0, 4, 2, 0)}),
    "ext_q8_0_staged_f16": ext("f16", "q8_0", M=2, N=7, dk=32, dv=32, algo=1, flags=("weights",)),
    "ext_int8_fused_bf16": ext("bf16", "int8", Hq=2, Hkv=1, M=3, N=8, dk=32, dv=32, algo=2, flags=("lse",),
                               k_scale_view=(2, 1, 0, 3)),
    "ext_int8_staged": ext(kv="int8", M=5, N=5, dk=32, dv=32, algo=1, causal=1, flags=("weights", "argmax")),
    "ext_q8_0_dim17_invalid": ext(kv="q8_0", dk=17, dv=32),
    "ext_q8_0_stride3_invalid": ext(kv="q8_0", dk=32, dv=32, q8_k=4),
    "ext_q8_0_odd_offset_invalid": ext(kv="q8_0", dk=32, dv=32, q8_v=1),
    "ext_q8_0_odd_row_stride_invalid": ext(kv="q8_0", dk=32, dv=32, q8_k=2),
    "ext_q8_0_too_small": ext(kv="q8_0", dk=32, dv=32, views={"v": (0, 0, 3, 0)}),
    "ext_int8_without_scales_invalid": ext(kv="int8", dk=32, dv=32, scale_flips=1),
    "ext_int8_scale_too_small": ext(kv="int8", dk=32, dv=32, v_scale_view=(0, 0, 1, 0)),
    "ext_scales_without_int8_invalid": ext(kv="f16", dk=32, dv=32, scale_flips=2),
    "ext_dtype_q8_0_invalid": ext("q8_0", dk=32, dv=32),
    "ext_dtype_int8_invalid": ext("int8", dk=32, dv=32),
    "ext_kv_dtype_out_of_range": ext(kv="hostile", dk=32, dv=32),
    # score shaping (f32: any head dims)
    "ext_softcap_alibi_sinks": ext(score=("softcap", "alibi", "sinks"), Hq=2, M=6, N=9, dk=17, dv=3, causal=1,
                                   flags=("lse", "entropy", "max_weight", "argmax")),
    "ext_softcap_small_staged": ext(score=("softcap",), softcap="FLT_MIN", M=4, N=7, algo=1, flags=("weights",)),
    "ext_sinks_masked": ext(score=("sinks",), M=4, N=4, flags=("mask", "lse"), data=bytes([0] * 64)),
    "ext_additive_gemm": ext(score=("additive",), Hq=2, M=5, N=6, dk=16, dv=4, algo=3, flags=("lse",)),
    "ext_additive_fused_alibi": ext(score=("additive", "alibi"), M=3, N=8, dk=17, dv=16, algo=2, wl=2),
    "ext_softcap_nan_invalid": ext(score=("softcap",), softcap="nan"),
    "ext_softcap_negative_invalid": ext(score=("softcap",), softcap=-1.0),
    "ext_softcap_inf_invalid": ext(score=("softcap",), softcap="inf"),
    "ext_softcap_zero_is_off": ext(score=("softcap",), softcap=0.0, flags=("lse",)),
    "ext_softcap_minus_zero_is_off": ext(score=("softcap",), softcap="-0"),
    "ext_additive_without_w_invalid": ext(score=("additive", "w_mismatch")),
    "ext_w_with_dot_score_invalid": ext(score=("w_mismatch",)),
    "ext_score_out_of_range": ext(score=("bad_score",)),
    "ext_alibi_sinks_short": ext(score=("alibi", "sinks", "short"), Hq=4),
    # packed sequences: cu_q steps 3, 6, 2 of at most M = 6; cu_k steps 5, 0, 9 of at most N = 9
    "ext_varlen_packed": ext(varlen=("cu_q", "cu_k"), B=3, Hq=2, M=6, N=9, causal=1, flags=("lse", "entropy"),
                             data=bytes([0, 3, 6, 2, 0, 5, 0, 9])),
    "ext_varlen_mask_bias_staged": ext(varlen=("cu_q", "cu_k"), B=2, M=4, N=5, algo=1,
                                       flags=("mask", "bias", "weights"), data=bytes([0, 4, 1, 0, 2, 5])),
    "ext_varlen_total_past_last": ext(varlen=("cu_q", "cu_k"), total_q="last+1", total_kv="last+1", B=2, M=3,
                                      N=4, data=bytes([0, 3, 2, 0, 4, 1])),
    # malformed offsets (decreasing, too long, negative): kept inside the views
    "ext_varlen_non_monotone": ext(varlen=("cu_q", "cu_k"), B=3, M=5, N=6, flags=("lse",),
                                   data=bytes([0, 4, 0xF3, 5, 0, 0xF4, 0xF3, 3])),
    "ext_varlen_negative_entries": ext(varlen=("cu_q", "cu_k"), total_q="last-1", B=2, M=4, N=4,
                                       data=bytes([0xF0, 4, 2, 0xF6, 0xF0, 4])),
    "ext_varlen_with_kv_lens_invalid": ext(varlen=("cu_q", "cu_k"), B=2, flags=("kv_lens",)),
    "ext_varlen_only_q_invalid": ext(varlen=("cu_q",), B=2),
    "ext_varlen_batch_stride_invalid": ext(varlen=("cu_q", "cu_k", "batch_stride"), B=2),
    "ext_varlen_total_zero_invalid": ext(varlen=("cu_q", "cu_k"), total_kv="zero", B=2),
    "ext_varlen_short_buffer": ext(varlen=("cu_q", "cu_k", "short"), B=2),
    # paged K/V: B = 2 rows of kv_lens N = 20 and N/2 = 10 in pages of 4, pool of 10 pages,
    # tables {3 7 1 0 9} and {2 3 4 5 6} (page 3 shared)
    "ext_paged_f32": ext(paged=True, page_size=4, num_pages=10, B=2, M=3, N=20, flags=("kv_lens", "lse"),
                         causal=1, data=bytes([0, 6, 3, 7, 1, 0, 9, 2, 3, 4, 5, 6])),
    "ext_paged_q8_0_fused": ext(kv="q8_0", paged=True, page_size=5, num_pages=6, B=2, M=2, N=9, dk=32, dv=32,
                                algo=2, flags=("kv_lens", "lse"), data=bytes([0, 2, 5, 0, 1, 0, 3])),
    "ext_paged_int8_gqa_staged": ext(kv="int8", paged=True, page_size=3, num_pages=8, B=2, Hq=4, Hkv=2, M=2, N=7,
                                     dk=32, dv=32, algo=1, causal=1, flags=("kv_lens", "weights"),
                                     data=bytes([0, 3, 7, 6, 5, 1, 2, 0])),
    "ext_paged_f16_gemm_window": ext("f16", paged=True, page_size=2, num_pages=12, B=1, M=4, N=11, dk=32, dv=32,
                                     algo=3, wl=3, flags=("kv_lens",), data=bytes([0] + list(range(11, 5, -1)))),
    "ext_paged_entries_outside_pool": ext(paged=True, page_size=3, num_pages=4, B=2, M=2, N=9, bt_stride=1,
                                          flags=("kv_lens", "lse"),
                                          data=bytes([0, 0, 0xF0, 1, 0xF1, 0xF3, 2, 0xF2, 3, 0xF5])),
    "ext_paged_kv_lens_past_kv_len": ext(paged=True, page_size=4, num_pages=4, B=1, M=2, N=6,
                                         score=("alibi", "softcap"), flags=("kv_lens",), data=bytes([7, 1, 2])),
    "ext_paged_without_kv_lens_invalid": ext(paged=True, B=2, N=8),
    "ext_paged_page_size_0_invalid": ext(paged=True, page_size=0xF0, flags=("kv_lens",)),
    "ext_paged_num_pages_negative_invalid": ext(paged=True, num_pages=0xF1, flags=("kv_lens",)),
    "ext_paged_stride_too_small_invalid": ext(paged=True, page_size=2, N=9, bt_stride=3, flags=("kv_lens",)),
    "ext_paged_table_short": ext(paged=True, table_short=True, B=2, flags=("kv_lens",)),
    "ext_paged_pool_view_too_small": ext(paged=True, num_pages=5, flags=("kv_lens",), views={"k": (0, 0, 1, 0)}),
    "ext_paged_with_varlen_invalid": ext(paged=True, varlen=("cu_q", "cu_k"), B=2),
    # packed queries over the pages (continuous batching): kv_lens N = 20 and N/2 = 10, cu_q steps 3 and 1,
    # then the tables as ext_paged_f32's
    "ext_paged_packed_queries": ext(paged=True, varlen=("cu_q",), page_size=4, num_pages=10, B=2, M=3, N=20,
                                    causal=1, flags=("kv_lens", "lse"),
                                    data=bytes([0, 6, 0, 3, 1, 3, 7, 1, 0, 9, 2, 3, 4, 5, 6])),
    "ext_paged_packed_queries_q8_0_window": ext(kv="q8_0", paged=True, varlen=("cu_q",), page_size=5, num_pages=6,
                                                B=2, M=4, N=9, dk=32, dv=32, wl=2, algo=2, flags=("kv_lens",),
                                                data=bytes([0, 2, 0, 4, 2, 5, 0, 1, 0, 3])),
    "ext_paged_packed_queries_batch_stride_invalid": ext(paged=True, varlen=("cu_q", "batch_stride"), B=2,
                                                         flags=("kv_lens",)),
    "ext_paged_packed_queries_total_zero_invalid": ext(paged=True, varlen=("cu_q",), total_q="zero", B=2,
                                                       flags=("kv_lens",)),
    # ALiBi slopes per (batch, head): q_heads + 1 apart (a gap never read), q_heads apart with GQA
    "ext_alibi_per_batch_gaps": ext(score=("alibi",), alibi_stride=2, B=3, Hq=2, M=5, N=7, causal=1,
                                    flags=("lse",)),
    "ext_alibi_per_batch_paged_staged": ext(score=("alibi", "sinks"), alibi_stride=1, paged=True, page_size=4,
                                            num_pages=10, B=2, Hq=4, Hkv=2, M=3, N=20, algo=1,
                                            flags=("kv_lens", "weights"),
                                            data=bytes([0, 6, 3, 7, 1, 0, 9, 2, 3, 4, 5, 6])),
    "ext_alibi_stride_without_slopes_invalid": ext(alibi_stride=1, B=2),
    "ext_alibi_stride_negative_invalid": ext(score=("alibi",), alibi_stride=0xF1, B=2),
    "ext_alibi_per_batch_short": ext(score=("alibi", "short"), alibi_stride=1, B=3, Hq=2),
    "ext_alibi_stride_huge": ext(score=("alibi",), alibi_stride=0xF2, B=2),
    # dropout on every path (the fused programs with dropout are built for the dims the warm-up does)
    "ext_dropout_fused_diag": ext(dropout=0.5, seed=(0x2A, 0x11), offset=(3, 0), Hq=2, M=5, N=9, dk=16, dv=16,
                                  algo=2, flags=("lse", "entropy", "max_weight")),
    "ext_dropout_staged_weights": ext(dropout=0.1, seed=(0xF3, 0xF4), M=6, N=11, algo=1, causal=1,
                                      flags=("weights", "lse", "argmax")),
    "ext_dropout_gemm_gqa": ext(dropout=0.25, seed=(7, 0xF2), offset=(0, 1), B=2, Hq=4, Hkv=2, M=4, N=13, dk=16,
                                dv=4, algo=3, flags=("lse",)),
    "ext_dropout_auto": ext(dropout=0.75, seed=(0xFC, 0xFD), M=3, N=7),
    "ext_dropout_auto_weights": ext(dropout=0.9, M=4, N=6, dk=3, dv=17, flags=("weights",)),
    # offsets near 2^64: the low word 2^32 - 6 carries into the high word (j / 4 up to 8), the
    # high word 2^32 - 1 wraps past 2^64 from row 1 on
    "ext_dropout_offset_carries_staged": ext(dropout=0.5, seed=(0xFE, 0xF7), offset=(0x85, 0x80), M=8, N=33,
                                             algo=1, flags=("weights",)),
    "ext_dropout_offset_carries_fused": ext(dropout=0.5, seed=(0x85, 0x80), offset=(0x80, 0x81), Hq=2, M=6, N=40,
                                            dk=32, dv=32, algo=2, flags=("lse",)),
    "ext_dropout_offset_spread_gemm": ext(dropout=0.5, seed=(0xF0, 0xF1), offset=(0xFA, 0xF9), B=2, M=5, N=17,
                                          algo=3),
    "ext_dropout_largest_rate_staged": ext(dropout="largest", M=8, N=40, algo=1, flags=("weights", "entropy")),
    "ext_dropout_0_9999999_gemm": ext(dropout=0.9999999, M=6, N=30, algo=3, flags=("lse",)),
    "ext_dropout_tiny_rate_keeps_all": ext(dropout=1e-10, M=4, N=9, algo=2),
    "ext_dropout_minus_zero_is_off": ext(dropout="-0", M=4, N=5, algo=1, flags=("weights",)),
    "ext_dropout_varlen_packed": ext(dropout=0.5, varlen=("cu_q", "cu_k"), B=3, Hq=2, M=6, N=9, causal=1,
                                     flags=("lse", "entropy"), data=bytes([0, 3, 6, 2, 0, 5, 0, 9])),
    "ext_dropout_paged_packed_queries": ext(dropout=0.25, seed=(0x99, 0x42), paged=True, varlen=("cu_q",),
                                            page_size=4, num_pages=10, B=2, M=3, N=20, causal=1, algo=2,
                                            flags=("kv_lens", "lse"),
                                            data=bytes([0, 6, 0, 3, 1, 3, 7, 1, 0, 9, 2, 3, 4, 5, 6])),
    "ext_dropout_f16_q8_0_fused": ext("f16", "q8_0", dropout=0.5, M=3, N=11, dk=32, dv=32, algo=2,
                                      flags=("lse",)),
    "ext_dropout_bf16_int8_staged": ext("bf16", "int8", dropout=0.1, M=3, N=8, dk=32, dv=32, algo=1,
                                        flags=("weights",)),
    "ext_dropout_nan_inf_data": ext(dropout=0.5, M=3, N=5, algo=1, flags=("lse", "weights"),
                                    data=bytes([0xFD, 3, 0xFE, 1, 0xFF, 2] * 20)),
    "ext_dropout_sinks_empty_error": ext(dropout=0.5, score=("sinks",), M=4, N=4, empty=1, flags=("mask", "lse"),
                                         data=bytes([0] * 64)),
    "ext_dropout_negative_invalid": ext(dropout=-0.1),
    "ext_dropout_one_invalid": ext(dropout=1.0, algo=1),
    "ext_dropout_past_one_invalid": ext(dropout=1.0000001),
    "ext_dropout_nan_invalid": ext(dropout="nan", algo=2),
    "ext_dropout_inf_invalid": ext(dropout="inf", algo=3),
    "ext_dropout_minus_inf_invalid": ext(dropout="-inf"),
    # left-padded caches: kv_lens bytes (x % 12: 0 N, 6 N/2, 5 -1, 8 INT_MAX, 9 INT_MIN), then the starts
    # (x % (end + 1); 0xF0.. -1, INT_MIN, INT_MAX, end + 1, end, N + 1, -end - 1, 2^30)
    "ext_leftpad_fused_causal": ext(leftpad=True, B=3, Hq=2, M=4, N=17, dk=16, dv=16, algo=2, causal=1,
                                    flags=("kv_lens", "lse", "entropy", "argmax"), data=bytes([0, 6, 0, 5, 3, 0])),
    "ext_leftpad_staged_window_alibi_mask_bias": ext(leftpad=True, score=("alibi",), B=2, Hq=2, M=5, N=12,
                                                     algo=1, wl=3, flags=("kv_lens", "weights", "mask", "bias"),
                                                     data=bytes([0, 6, 1, 2, 7, 2])),
    "ext_leftpad_gemm_gqa_start_at_end": ext(leftpad=True, B=2, Hq=4, Hkv=2, M=3, N=9, algo=3,
                                             flags=("kv_lens", "lse"), data=bytes([0, 0, 4, 9])),
    "ext_leftpad_auto": ext(leftpad=True, B=2, M=2, N=10, flags=("kv_lens",), data=bytes([0, 2, 8, 1])),
    "ext_leftpad_empty_error": ext(leftpad=True, B=2, M=3, N=6, empty=1, flags=("kv_lens",),
                                   data=bytes([0, 0, 6, 2])),
    "ext_leftpad_hostile_starts": ext(leftpad=True, B=3, M=3, N=8, algo=1, flags=("kv_lens", "weights"),
                                      data=bytes([0, 0, 2, 0xF0, 0xF1, 0xF2])),
    "ext_leftpad_hostile_starts_past_end": ext(leftpad=True, B=3, M=3, N=8, algo=2, flags=("kv_lens", "lse"),
                                               data=bytes([0, 6, 0, 0xF3, 0xF5, 0xF6])),
    "ext_leftpad_hostile_kv_lens": ext(leftpad=True, B=3, M=2, N=7, algo=3, flags=("kv_lens",),
                                       data=bytes([8, 9, 5, 3, 0xF2, 0])),
    "ext_leftpad_q8_0_fused": ext(kv="q8_0", leftpad=True, B=2, M=2, N=11, dk=32, dv=32, algo=2,
                                  flags=("kv_lens", "lse"), data=bytes([0, 6, 4, 1])),
    "ext_leftpad_int8_staged": ext(kv="int8", leftpad=True, B=2, M=3, N=7, dk=32, dv=32, algo=1, causal=1,
                                   flags=("kv_lens", "weights"), data=bytes([0, 2, 3, 1])),
    "ext_leftpad_f16_gemm": ext("f16", leftpad=True, B=2, M=2, N=9, dk=32, dv=32, algo=3, flags=("kv_lens",),
                                data=bytes([0, 0, 5, 8])),
    # paged: ext_paged_f32's tables; starts 6 (page 1, row 2) and 9 (the last key of row 1)
    "ext_leftpad_paged": ext(leftpad=True, paged=True, page_size=4, num_pages=10, B=2, M=3, N=20, causal=1,
                             flags=("kv_lens", "lse"), data=bytes([0, 6, 3, 7, 1, 0, 9, 2, 3, 4, 5, 6, 6, 9])),
    "ext_leftpad_paged_staged_window": ext(leftpad=True, paged=True, page_size=3, num_pages=8, B=2, Hq=2, M=4,
                                           N=14, wl=2, algo=1, flags=("kv_lens", "weights"),
                                           data=bytes([0, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 4, 11])),
    "ext_leftpad_paged_gemm_q8_0": ext(kv="q8_0", leftpad=True, paged=True, page_size=5, num_pages=6, B=2, M=2,
                                       N=9, dk=32, dv=32, algo=3, flags=("kv_lens",),
                                       data=bytes([0, 2, 5, 0, 1, 0, 3, 7])),
    "ext_leftpad_paged_packed_queries": ext(leftpad=True, paged=True, varlen=("cu_q",), page_size=4,
                                            num_pages=10, B=2, M=3, N=20, causal=1, algo=2,
                                            flags=("kv_lens", "lse", "entropy"),
                                            data=bytes([0, 6, 0, 3, 1, 3, 7, 1, 0, 9, 2, 3, 4, 5, 6, 13, 2])),
    "ext_leftpad_paged_entries_outside_pool": ext(leftpad=True, paged=True, page_size=3, num_pages=4, B=2, M=2,
                                                  N=9, bt_stride=1, flags=("kv_lens", "lse"),
                                                  data=bytes([0, 0, 0xF0, 1, 0xF1, 0xF3, 2, 0xF2, 3, 0xF5, 2, 4])),
    "ext_leftpad_paged_hostile_starts": ext(leftpad=True, paged=True, page_size=2, num_pages=6, B=2, M=2, N=7,
                                            algo=1, flags=("kv_lens", "weights"),
                                            data=bytes([0, 6, 0, 1, 2, 3, 4, 5, 0, 1, 0xF2, 0xF1])),
    "ext_leftpad_dropout_staged": ext(leftpad=True, dropout=0.5, seed=(0x10, 0x20), B=2, Hq=2, M=4, N=12, algo=1,
                                      flags=("kv_lens", "weights", "lse"), data=bytes([0, 6, 5, 1])),
    "ext_leftpad_dropout_paged_fused": ext(leftpad=True, dropout=0.25, paged=True, page_size=4, num_pages=10, B=2,
                                           M=3, N=20, algo=2, flags=("kv_lens",),
                                           data=bytes([0, 6, 3, 7, 1, 0, 9, 2, 3, 4, 5, 6, 6, 9])),
    "ext_leftpad_without_kv_lens_invalid": ext(leftpad=True, B=2),
    "ext_leftpad_with_cu_seqlens_k_invalid": ext(leftpad=True, varlen=("cu_q", "cu_k"), B=2, flags=("kv_lens",)),
    "ext_leftpad_paged_with_cu_seqlens_k_invalid": ext(leftpad=True, paged=True, varlen=("cu_q", "cu_k"), B=2,
                                                       flags=("kv_lens",)),
    "ext_leftpad_short_buffer": ext(leftpad=True, leftpad_short=True, B=2, flags=("kv_lens",)),
    "ext_leftpad_short_buffer_paged": ext(leftpad=True, leftpad_short=True, paged=True, B=3, flags=("kv_lens",)),
}


APPEND_DIMS = {32: 0, 64: 1, 3: 2, 17: 3}
APPEND_SRC = {"f32": 0, "f16": 1, "bf16": 2, "q8_0": 3}
APPEND_FLAGS = {"paged": 1, "scale_flip": 2, "positions_null": 4, "positions_short": 8, "table_short": 16}


def append(B=1, H=1, new=3, dk=32, dv=32, src="f32", kv="same", flags=(), cap=8, ps=4, pages=6, bts=0,
           views=None, data=b""):
    """An input of tests/fuzz/append_case.c: views {name: (mode, offset, size, param)};
    data: positions (x % (rows + 3) - 1), then block-table entries (x % num_pages)."""
    head = [B - 1, H - 1, new, APPEND_DIMS[dk], APPEND_DIMS[dv], APPEND_SRC[src], KV[kv],
            sum(APPEND_FLAGS[f] for f in flags), cap - 1 if cap < 0xF0 else cap, ps - 1 if ps < 0xF0 else ps,
            pages - 1, bts]
    views = views or {}
    for name in ["k_new", "v_new", "k", "v", "k_scale", "v_scale"]:
        head += list(views.get(name, (0, 0, 0, 0)))
    assert len(head) == 36
    return bytes(head) + data


# positions byte x stands for x % (rows + 3) - 1: rows = capacity (8) or stride * page_size
APPEND_SEEDS = {
    "append_f32_contiguous": append(B=2, H=2, dv=17, data=bytes([3, 7])),
    "append_q8_0_contiguous_gqa_gaps": append(B=2, H=2, new=4, dk=64, kv="q8_0", cap=9,
                                              views={"k": (1, 2, 0, 1), "v_new": (1, 1, 2, 2)}, data=bytes([1, 6])),
    "append_int8_paged_shared_pages": append(B=2, H=2, new=5, kv="int8", flags=("paged",), ps=3, pages=5, bts=1,
                                             data=bytes([3, 7, 1, 4, 0, 2, 4, 1, 2, 3])),
    "append_f16_to_bf16": append(src="f16", kv="bf16", dk=3, dv=17, data=bytes([0])),
    "append_bf16_to_q8_0_paged": append(B=2, src="bf16", kv="q8_0", flags=("paged",), ps=2, pages=6, bts=2,
                                        data=bytes([5, 2, 0, 1, 2, 0xF0, 3, 4, 5, 0xF1])),
    "append_f16_same_paged_outside_pool": append(src="f16", flags=("paged",), ps=4, pages=3, bts=1,
                                                 data=bytes([2, 0xF1, 0xF3])),
    "append_hostile_positions": append(B=3, kv="q8_0", data=bytes([0xF0, 0xF1, 0xF3])),
    "append_positions_past_capacity": append(B=2, kv="int8", cap=4, data=bytes([4, 6])),
    "append_new_len_0": append(new=0, kv="q8_0"),
    "append_new_len_past_capacity_invalid": append(new=5, cap=4),
    "append_q8_0_dim17_invalid": append(kv="q8_0", dv=17),
    "append_q8_0_odd_offset_invalid": append(kv="q8_0", views={"v": (0, 0, 0, 0x80)}),
    "append_int8_without_scales_invalid": append(kv="int8", flags=("scale_flip",)),
    "append_scales_without_int8_invalid": append(kv="f16", flags=("scale_flip",)),
    "append_src_q8_0_invalid": append(src="q8_0"),
    "append_kv_dtype_out_of_range": append(kv="hostile"),
    "append_positions_null": append(flags=("positions_null",)),
    "append_positions_short": append(B=2, flags=("positions_short",)),
    "append_table_short": append(B=2, flags=("paged", "table_short")),
    "append_page_size_0": append(flags=("paged",), ps=0xF0),
    "append_table_stride_short": append(new=5, flags=("paged",), ps=2, bts=3),
    "append_cache_broadcast_rows": append(views={"k": (3, 0, 0, 0)}),
    "append_cache_too_small": append(kv="int8", views={"v": (0, 0, 1, 0)}),
    "append_k_new_null": append(views={"k_new": (0xFF, 0, 0, 0)}),
}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fuzz",
                                                             "corpus")
    os.makedirs(out, exist_ok=True)
    for name, data in SEEDS.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
    print("wrote %d seeds to %s" % (len(SEEDS), os.path.normpath(out)))
    append_out = os.path.join(os.path.dirname(out), "corpus-append")
    os.makedirs(append_out, exist_ok=True)
    for name, data in APPEND_SEEDS.items():
        with open(os.path.join(append_out, name), "wb") as f:
            f.write(data)
    print("wrote %d seeds to %s" % (len(APPEND_SEEDS), os.path.normpath(append_out)))


if __name__ == "__main__":
    main()
