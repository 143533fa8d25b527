"""Packed variable-length batches (cu_seqlens), paged caches (block
tables), the two together (continuous batching: each sequence's queries are
its last positions), quantised and other-precision caches (kv_dtype), on
every algorithm against the fp64 reference of each sequence alone."""
import numpy as np
import pytest

import clattn
from conftest import reference

TOL = dict(rtol=2e-4, atol=2e-5)
ALGOS = ["fused", "staged", "gemm", "auto"]


def to_pages(rng, k, v, lens, page_size, spare=2, layout="bhsd"):
    """Scatters each sequence's first lens[b] keys of k, v [B,H,N,d] over
    shuffled pages of a pool (NaN in every unused row and page); returns the
    pools ([pages,H,page_size,d], or bshd [pages,page_size,H,d]) and the
    block table."""
    B, H, N, dk = k.shape
    per_seq = -(-N // page_size)
    used = [-(-n // page_size) for n in lens]
    n_pages = sum(used) + spare
    order = rng.permutation(n_pages)
    kp = np.full((n_pages, H, page_size, dk), np.nan, np.float32)
    vp = np.full((n_pages, H, page_size, v.shape[3]), np.nan, np.float32)
    table = np.full((B, per_seq), -1, np.int32)  # entries past a sequence: outside the pool
    at = 0
    for b in range(B):
        for e in range(used[b]):
            page = order[at]
            at += 1
            table[b, e] = page
            rows = slice(e * page_size, min((e + 1) * page_size, lens[b]))
            n = rows.stop - rows.start
            kp[page, :, :n] = k[b, :, rows]
            vp[page, :, :n] = v[b, :, rows]
    if layout == "bshd":
        kp, vp = (np.ascontiguousarray(x.transpose(0, 2, 1, 3)) for x in (kp, vp))
    return kp, vp, table


def packed(xs, layout):
    """[1, H, S, D] sequences to one packed array: [H, total, D] or bshd [total, H, D]."""
    cat = np.concatenate([x[0] for x in xs], axis=1)
    return cat if layout == "bhsd" else np.ascontiguousarray(cat.transpose(1, 0, 2))


def unpack(o, cu, b, layout):
    part = o[:, cu[b]:cu[b + 1]] if layout == "bhsd" else o[cu[b]:cu[b + 1]].transpose(1, 0, 2)
    return part[None]


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_packed_sequences(ctx, rng, algo, layout):
    lens_q, lens_k = [5, 1, 0, 13], [9, 30, 4, 13]
    H, Hkv, d = 4, 2, 16
    qs = [rng.standard_normal((1, H, m, d)).astype(np.float32) for m in lens_q]
    ks = [rng.standard_normal((1, Hkv, n, d)).astype(np.float32) for n in lens_k]
    vs = [rng.standard_normal((1, Hkv, n, d)).astype(np.float32) for n in lens_k]
    cu_q = np.cumsum([0] + lens_q).astype(np.int32)
    cu_k = np.cumsum([0] + lens_k).astype(np.int32)
    o, lse = ctx.attention(packed(qs, layout), packed(ks, layout), packed(vs, layout), cu_seqlens_q=cu_q,
                           cu_seqlens_k=cu_k, causal=True, layout=layout, algo=algo, return_lse=True)
    assert lse.shape == (4, H, 13)
    for b in range(4):
        if lens_q[b] == 0:
            continue
        ro, rl, _ = reference(qs[b], ks[b], vs[b], causal=True)
        np.testing.assert_allclose(unpack(o, cu_q, b, layout), ro, **TOL)
        np.testing.assert_allclose(lse[b, :, :lens_q[b]], rl[0], **TOL)


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_paged_cache(ctx, rng, algo, layout):
    B, H, Hkv, M, N, d, ps = 3, 4, 2, 5, 29, 16, 7
    lens = [29, 11, 17]
    q = rng.standard_normal((B, H, M, d)).astype(np.float32)
    k = rng.standard_normal((B, Hkv, N, d)).astype(np.float32)
    v = rng.standard_normal((B, Hkv, N, d)).astype(np.float32)
    kp, vp, table = to_pages(rng, k, v, lens, ps, layout=layout)
    qq = q if layout == "bhsd" else np.ascontiguousarray(q.transpose(0, 2, 1, 3))
    o = ctx.attention(qq, kp, vp, block_table=table, kv_lens=np.array(lens, np.int32), page_size=ps, causal=True,
                      layout=layout, algo=algo)
    if layout == "bshd":
        o = o.transpose(0, 2, 1, 3)
    for b in range(B):  # each sequence aligned on its own length
        ro = reference(q[b:b + 1], k[b:b + 1, :, :lens[b]], v[b:b + 1, :, :lens[b]], causal=True)[0]
        np.testing.assert_allclose(o[b:b + 1], ro, **TOL)


@pytest.mark.parametrize("algo", ALGOS)
def test_packed_queries_over_a_paged_cache(ctx, rng, algo):
    """Continuous batching: a chunked prefill, decodes and an idle slot in
    one call, each sequence's queries its last positions (FlashAttention's
    and vLLM's alignment), with a window, ALiBi per (batch, head) and sinks."""
    H, Hkv, d, ps = 4, 2, 16, 5
    lens_q, lens_k = [6, 1, 0, 1], [23, 9, 4, 1]
    B, N = 4, max(lens_k)
    qs = [rng.standard_normal((1, H, m, d)).astype(np.float32) for m in lens_q]
    k = rng.standard_normal((B, Hkv, N, d)).astype(np.float32)
    v = rng.standard_normal((B, Hkv, N, d)).astype(np.float32)
    kp, vp, table = to_pages(rng, k, v, lens_k, ps)
    cu_q = np.cumsum([0] + lens_q).astype(np.int32)
    slopes = rng.random((B, H)).astype(np.float32)
    sinks = rng.standard_normal(H).astype(np.float32)
    o = ctx.attention(packed(qs, "bhsd"), kp, vp, cu_seqlens_q=cu_q, block_table=table,
                      kv_lens=np.array(lens_k, np.int32), causal=True, window=(8, -1), alibi_slopes=slopes,
                      sinks=sinks, algo=algo)
    assert o.shape == (H, sum(lens_q), d)
    for b in range(B):
        if lens_q[b] == 0:
            continue
        ro = reference(qs[b], k[b:b + 1, :, :lens_k[b]], v[b:b + 1, :, :lens_k[b]], causal=True, window=(8, -1),
                       alibi_slopes=slopes[b], sinks=sinks)[0]
        np.testing.assert_allclose(unpack(o, cu_q, b, "bhsd"), ro, **TOL)


def test_flash_attention_forms_of_lengths(ctx, rng):
    """cu_seqlens_k with a block table gives the keys' lengths (FlashAttention's
    form), the same as kv_lens; max_seqlen_q/k may be given."""
    H, d, ps = 2, 16, 4
    lens_q, lens_k = [3, 2], [10, 7]
    qs = [rng.standard_normal((1, H, m, d)).astype(np.float32) for m in lens_q]
    k = rng.standard_normal((2, H, 10, d)).astype(np.float32)
    v = rng.standard_normal((2, H, 10, d)).astype(np.float32)
    kp, vp, table = to_pages(rng, k, v, lens_k, ps)
    q = packed(qs, "bhsd")
    cu_q = np.cumsum([0] + lens_q).astype(np.int32)
    a = ctx.attention(q, kp, vp, cu_seqlens_q=cu_q, block_table=table, kv_lens=np.array(lens_k, np.int32))
    b = ctx.attention(q, kp, vp, cu_seqlens_q=cu_q, cu_seqlens_k=np.cumsum([0] + lens_k).astype(np.int32),
                      block_table=table, max_seqlen_q=3, max_seqlen_k=10)
    assert a.tobytes() == b.tobytes()


def roundf(y):
    """C's roundf of float32 values: half away from zero (exact in float64)."""
    y = np.asarray(y, np.float64)
    return np.copysign(np.floor(np.abs(y) + 0.5), y)


def quantise_q8_0(x):
    """ggml's quantize_row_q8_0_reference over the last axis: rows of
    blocks of 34 bytes (f16 d = amax / 127, then 32 int8 round(x / d))."""
    blocks = x.reshape(x.shape[:-1] + (x.shape[-1] // 32, 32)).astype(np.float32)
    d = (np.abs(blocks).max(-1, keepdims=True) / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    qv = roundf((blocks * inv).astype(np.float32)).astype(np.int8)
    out = np.empty(blocks.shape[:-1] + (34,), np.uint8)
    out[..., :2] = d.astype(np.float16).view(np.uint8)
    out[..., 2:] = qv.view(np.uint8)
    return out.reshape(x.shape[:-1] + (x.shape[-1] // 32 * 34,))


def dequantise_q8_0(y):
    blocks = y.reshape(y.shape[:-1] + (y.shape[-1] // 34, 34))
    d = np.ascontiguousarray(blocks[..., :2]).view(np.float16).astype(np.float32)
    qv = np.ascontiguousarray(blocks[..., 2:]).view(np.int8).astype(np.float32)
    return (d * qv).reshape(y.shape[:-1] + (y.shape[-1] // 34 * 32,))


def quantise_int8(x):
    amax = np.abs(x).max(-1)
    scale = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(scale != 0, np.float32(1) / scale, np.float32(0)).astype(np.float32)
    return roundf((x * inv[..., None]).astype(np.float32)).astype(np.int8), scale


@pytest.mark.parametrize("algo", ["fused", "staged", "gemm"])
def test_quantised_and_other_precision_caches(ctx, rng, algo):
    B, H, M, N, d = 2, 2, 3, 19, 32
    q = rng.standard_normal((B, H, M, d)).astype(np.float32)
    k = rng.standard_normal((B, H, N, d)).astype(np.float32)
    v = rng.standard_normal((B, H, N, d)).astype(np.float32)
    kq, vq = quantise_q8_0(k), quantise_q8_0(v)
    o = ctx.attention(q, kq, vq, kv_dtype="q8_0", causal=True, algo=algo)
    np.testing.assert_allclose(o, reference(q, dequantise_q8_0(kq), dequantise_q8_0(vq), causal=True)[0], **TOL)
    (ki, ks), (vi, vs) = quantise_int8(k), quantise_int8(v)
    o = ctx.attention(q, ki, vi, kv_dtype="int8", k_scale=ks, v_scale=vs, algo=algo)
    np.testing.assert_allclose(o, reference(q, ki * ks[..., None], vi * vs[..., None])[0], **TOL)
    o = ctx.attention(q, k.astype(np.float16), v.astype(np.float16), algo=algo)  # a float16 cache, f32 queries
    assert o.dtype == np.float32
    np.testing.assert_allclose(o, reference(q, k.astype(np.float16), v.astype(np.float16))[0], **TOL)


def test_paged_int8_cache(ctx, rng):
    B, H, M, N, d, ps = 2, 2, 1, 21, 32, 8
    lens = [21, 6]
    q = rng.standard_normal((B, H, M, d)).astype(np.float32)
    k = rng.standard_normal((B, H, N, d)).astype(np.float32)
    v = rng.standard_normal((B, H, N, d)).astype(np.float32)
    kp, vp, table = to_pages(rng, k, v, lens, ps)
    kp, vp = np.nan_to_num(kp), np.nan_to_num(vp)
    (ki, ks), (vi, vs) = quantise_int8(kp), quantise_int8(vp)
    ks[table.max() + 1:] = np.nan  # spare pages' scales: never read
    o = ctx.attention(q, ki, vi, kv_dtype="int8", k_scale=ks, v_scale=vs, block_table=table,
                      kv_lens=np.array(lens, np.int32))
    kd, vd = ki * ks[..., None], vi * vs[..., None]
    for b in range(B):
        rows = [(table[b, j // ps], j % ps) for j in range(lens[b])]
        kb = np.stack([kd[p, :, r] for p, r in rows], axis=1)[None]
        vb = np.stack([vd[p, :, r] for p, r in rows], axis=1)[None]
        np.testing.assert_allclose(o[b:b + 1], reference(q[b:b + 1], kb, vb)[0], **TOL)


@pytest.mark.parametrize("case", ["cu_k_alone", "cu_q_alone", "kv_lens_and_cu_k", "table_rows", "page_size",
                                  "no_lengths", "q_4d", "cu_decreasing", "q8_0_rows", "int8_no_scales",
                                  "kv_dtype", "scales_float64", "cu_float"])
def test_errors(ctx, rng, case):
    q = rng.standard_normal((2, 5, 16)).astype(np.float32)
    k = rng.standard_normal((2, 9, 16)).astype(np.float32)
    cu = np.array([0, 2, 5], np.int32)
    pages = rng.standard_normal((3, 2, 4, 16)).astype(np.float32)
    table = np.array([[0, 1, 2], [2, 1, 0]], np.int32)
    lens = np.array([9, 3], np.int32)
    calls = {
        "cu_k_alone": lambda: ctx.attention(q, k, k, cu_seqlens_k=np.array([0, 9], np.int32)),
        "cu_q_alone": lambda: ctx.attention(q, k, k, cu_seqlens_q=cu),
        "kv_lens_and_cu_k": lambda: ctx.attention(q, pages, pages, cu_seqlens_q=cu, block_table=table,
                                                  kv_lens=lens, cu_seqlens_k=np.array([0, 9, 12], np.int32)),
        "table_rows": lambda: ctx.attention(q, pages, pages, cu_seqlens_q=cu, block_table=table[:1], kv_lens=lens),
        "page_size": lambda: ctx.attention(q, pages, pages, cu_seqlens_q=cu, block_table=table, kv_lens=lens,
                                           page_size=5),
        "no_lengths": lambda: ctx.attention(q, pages, pages, cu_seqlens_q=cu, block_table=table),
        "q_4d": lambda: ctx.attention(q[None], pages, pages, cu_seqlens_q=cu, block_table=table, kv_lens=lens),
        "cu_decreasing": lambda: ctx.attention(q, pages, pages, cu_seqlens_q=np.array([0, 4, 2], np.int32),
                                               block_table=table, kv_lens=lens),
        "q8_0_rows": lambda: ctx.attention(q[None], np.zeros((1, 2, 9, 33), np.uint8),
                                           np.zeros((1, 2, 9, 33), np.uint8), kv_dtype="q8_0"),
        "int8_no_scales": lambda: ctx.attention(q[None], k[None].astype(np.int8), k[None].astype(np.int8),
                                                kv_dtype="int8"),
        "kv_dtype": lambda: ctx.attention(q[None], k[None], k[None], kv_dtype="q4_0"),
        "scales_float64": lambda: ctx.attention(q[None], k[None].astype(np.int8), k[None].astype(np.int8),
                                                kv_dtype="int8", k_scale=np.ones((1, 2, 9)),
                                                v_scale=np.ones((1, 2, 9))),
        "cu_float": lambda: ctx.attention(q, k, k, cu_seqlens_q=cu.astype(np.float32), cu_seqlens_k=cu),
    }
    with pytest.raises((TypeError, ValueError, clattn.Error)):
        calls[case]()


def test_max_seqlen_below_the_longest(ctx, rng):
    q = rng.standard_normal((2, 5, 16)).astype(np.float32)
    cu = np.array([0, 2, 5], np.int32)
    with pytest.raises(ValueError):
        ctx.attention(q, q, q, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=2)
    pages = rng.standard_normal((2, 2, 4, 16)).astype(np.float32)
    with pytest.raises(ValueError):
        ctx.attention(q, pages, pages, cu_seqlens_q=cu, block_table=np.array([[0, 1], [1, 0]], np.int32),
                      kv_lens=np.array([8, 3], np.int32), max_seqlen_k=4)
