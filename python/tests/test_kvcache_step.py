"""Context.attention_with_kvcache, FlashAttention's flash_attn_with_kvcache:
the new keys rotated on the host in float32 (each product rounded, as clattn
does) and stored as the cache stores them, compared byte for byte with the
caches written in place (numpy where they lie, pyopencl on the device), the
rest of each cache untouched; O and lse against the fp64 reference of the
rotated queries over each row's keys (its own alignment), with NaN in the
rows no query may read."""
import numpy as np
import pytest

import clattn
from conftest import reference
from test_varlen_paged import dequantise_q8_0, quantise_int8, quantise_q8_0


def tables(n, rotary_dim):
    """cos, sin [n, rotary_dim / 2] of theta_t = 10000^(-2t / rotary_dim)."""
    angle = np.arange(n)[:, None] * 10000.0 ** (-2.0 * np.arange(rotary_dim // 2) / rotary_dim)
    return np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)


def rotate(x, pos, cos, sin, interleaved):
    """Rows x [..., d] at positions pos [...] (clamped to the tables), in
    float32: x c - y s and x s + y c, each product rounded."""
    x = np.asarray(x, np.float32)
    y = x.copy()
    half = cos.shape[1]
    pos = np.clip(np.asarray(pos), 0, cos.shape[0] - 1)
    c, s = cos[pos], sin[pos]
    ix = np.arange(half) * 2 if interleaved else np.arange(half)
    iy = ix + 1 if interleaved else ix + half
    a, b = x[..., ix], x[..., iy]
    y[..., ix] = a * c - b * s
    y[..., iy] = a * s + b * c
    return y


def row_reference(q, keys, values, causal=False, window=(-1, -1)):
    """fp64 O and lse of one batch row over its own keys ([H, n, d]): aligned on n."""
    o, lse, _ = reference(q[None], keys[None], values[None], causal=causal, window=window)
    return o[0], lse[0]


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("causal", [True, False])
def test_step_rotates_appends_and_attends(ctx, rng, layout, interleaved, causal):
    B, Hq, Hkv, M, L, cap, d, rd = 3, 4, 2, 2, 3, 40, 64, 32
    q = rng.standard_normal((B, Hq, M, d)).astype(np.float16)
    k_new = rng.standard_normal((B, Hkv, L, d)).astype(np.float16)
    v_new = rng.standard_normal((B, Hkv, L, d)).astype(np.float16)
    seqlens = np.array([cap - L, 5, 17], np.int32)
    k_cache = np.full((B, Hkv, cap, d), np.nan, np.float16)
    v_cache = np.full((B, Hkv, cap, d), np.nan, np.float16)
    for b in range(B):  # the rows in use; NaN past them
        k_cache[b, :, :seqlens[b]] = rng.standard_normal((Hkv, seqlens[b], d))
        v_cache[b, :, :seqlens[b]] = rng.standard_normal((Hkv, seqlens[b], d))
    cos, sin = tables(cap, rd)
    want_k, want_v = k_cache.copy(), v_cache.copy()
    for b in range(B):
        pos = seqlens[b] + np.arange(L)
        want_k[b, :, pos] = rotate(k_new[b], pos, cos, sin, interleaved).astype(np.float16).transpose(1, 0, 2)
        want_v[b, :, pos] = v_new[b].transpose(1, 0, 2)
    t = (lambda x: x) if layout == "bhsd" else (lambda x: x.transpose(0, 2, 1, 3))
    kc, vc = np.ascontiguousarray(t(k_cache)), np.ascontiguousarray(t(v_cache))  # the caches in the layout
    o, lse = ctx.attention_with_kvcache(t(q), kc, vc, t(k_new), t(v_new), rotary_cos=cos, rotary_sin=sin,
                                        cache_seqlens=seqlens, causal=causal, rotary_interleaved=interleaved,
                                        layout=layout, return_lse=True)
    assert "kv_append" in ctx.last_route() and "kvcache_rotary" in ctx.last_route()
    assert t(kc).tobytes() == np.ascontiguousarray(want_k).tobytes()
    assert t(vc).tobytes() == np.ascontiguousarray(want_v).tobytes()
    assert o.dtype == np.float16 and o.shape == t(q).shape
    for b in range(B):
        n = seqlens[b] + L
        pos = seqlens[b] + (np.arange(M) if causal else np.zeros(M, int))
        qb = rotate(q[b], pos, cos, sin, interleaved).astype(np.float16)
        ro, rl = row_reference(qb, want_k[b, :, :n], want_v[b, :, :n], causal=causal)
        np.testing.assert_allclose(t(o)[b].astype(np.float64), ro, rtol=2e-3, atol=2e-3)
        np.testing.assert_allclose(lse[b], rl, rtol=1e-4, atol=1e-4)


def test_paged_q8_0_with_leftpad(ctx, rng):
    """A paged q8_0 cache over shuffled pages (bshd, FlashAttention's page
    layout), left-padded rows (NaN there), float32 queries, causal."""
    B, Hq, Hkv, M, L, ps, d, rd = 2, 2, 1, 3, 3, 8, 32, 16
    entries, pages = 4, 10
    table = rng.permutation(pages)[:B * entries].reshape(B, entries).astype(np.int32)
    seqlens = np.array([20, 11], np.int32)
    leftpad = np.array([4, 0], np.int32)
    k_cache = np.zeros((pages, ps, Hkv, d // 32 * 34), np.uint8)
    k_cache[..., :2] = np.float16(np.nan).reshape(1).view(np.uint8)  # NaN scales in every block
    v_cache = k_cache.copy()
    for b in range(B):
        for j in range(leftpad[b], seqlens[b]):
            pg, r = table[b, j // ps], j % ps
            k_cache[pg, r] = quantise_q8_0(rng.standard_normal((Hkv, d)).astype(np.float32))
            v_cache[pg, r] = quantise_q8_0(rng.standard_normal((Hkv, d)).astype(np.float32))
    q = rng.standard_normal((B, M, Hq, d)).astype(np.float32)
    k_new = rng.standard_normal((B, L, Hkv, d)).astype(np.float32)
    v_new = rng.standard_normal((B, L, Hkv, d)).astype(np.float32)
    cos, sin = tables(entries * ps, rd)
    want_k, want_v = k_cache.copy(), v_cache.copy()
    for b in range(B):
        for r in range(L):
            pos = seqlens[b] + r
            pg, row = table[b, pos // ps], pos % ps
            want_k[pg, row] = quantise_q8_0(rotate(k_new[b, r], pos, cos, sin, False))
            want_v[pg, row] = quantise_q8_0(v_new[b, r])
    o = ctx.attention_with_kvcache(q, k_cache, v_cache, k_new, v_new, rotary_cos=cos, rotary_sin=sin,
                                   cache_seqlens=seqlens, cache_leftpad=leftpad, block_table=table, page_size=ps,
                                   causal=True, rotary_interleaved=False, kv_dtype="q8_0", layout="bshd")
    assert k_cache.tobytes() == want_k.tobytes() and v_cache.tobytes() == want_v.tobytes()
    for b in range(B):
        rows = [(table[b, j // ps], j % ps) for j in range(leftpad[b], seqlens[b] + L)]
        keys = np.stack([dequantise_q8_0(want_k[pg, r]) for pg, r in rows], 1)
        values = np.stack([dequantise_q8_0(want_v[pg, r]) for pg, r in rows], 1)
        qb = rotate(q[b].transpose(1, 0, 2), seqlens[b] + np.arange(M), cos, sin, False)
        ro, _ = row_reference(qb, keys, values, causal=True)
        np.testing.assert_allclose(o[b].transpose(1, 0, 2), ro, rtol=2e-4, atol=2e-5)


def test_int8_cache_through_cache_batch_idx(ctx, rng):
    """Batch rows on shuffled slots of an int8 cache (scales written too),
    without rotary tables: the stored rows are the new rows quantised."""
    B, slots, Hq, Hkv, M, L, cap, d = 2, 4, 4, 2, 1, 1, 12, 32
    idx = np.array([3, 1], np.int32)
    seqlens = np.array([6, 11], np.int32)
    k_cache = rng.integers(-127, 128, (slots, Hkv, cap, d)).astype(np.int8)
    v_cache = rng.integers(-127, 128, (slots, Hkv, cap, d)).astype(np.int8)
    k_scale = np.full((slots, Hkv, cap), 0.01, np.float32)
    v_scale = np.full((slots, Hkv, cap), 0.02, np.float32)
    k_scale[:, :, 12:] = np.nan
    q = rng.standard_normal((B, Hq, M, d)).astype(np.float32)
    k_new = rng.standard_normal((B, Hkv, L, d)).astype(np.float32)
    v_new = rng.standard_normal((B, Hkv, L, d)).astype(np.float32)
    want = [x.copy() for x in (k_cache, v_cache, k_scale, v_scale)]
    for b in range(B):
        for h in range(Hkv):
            s, r = idx[b], seqlens[b]
            want[0][s, h, r], want[2][s, h, r] = quantise_int8(k_new[b, h, 0])
            want[1][s, h, r], want[3][s, h, r] = quantise_int8(v_new[b, h, 0])
    o, lse = ctx.attention_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=seqlens,
                                        cache_batch_idx=idx, kv_dtype="int8", k_scale=k_scale, v_scale=v_scale,
                                        causal=True, return_lse=True, algo="staged")
    for got, w in zip((k_cache, v_cache, k_scale, v_scale), want):
        assert got.tobytes() == w.tobytes()
    for b in range(B):
        n = seqlens[b] + L
        keys = want[0][idx[b], :, :n] * want[2][idx[b], :, :n, None]
        values = want[1][idx[b], :, :n] * want[3][idx[b], :, :n, None]
        ro, rl = row_reference(q[b], keys, values, causal=True)
        np.testing.assert_allclose(o[b], ro, rtol=2e-4, atol=2e-5)
        np.testing.assert_allclose(lse[b], rl, rtol=1e-5, atol=1e-5)


def test_nothing_appended_attends_over_the_cache(ctx, rng):
    """k=None: the cache is read as it is (a read-only array will do), q rotated."""
    B, H, M, cap, d, rd = 1, 2, 4, 10, 32, 32
    k_cache = rng.standard_normal((B, H, cap, d)).astype(np.float32)
    v_cache = rng.standard_normal((B, H, cap, d)).astype(np.float32)
    k_cache.flags.writeable = v_cache.flags.writeable = False
    q = rng.standard_normal((B, H, M, d)).astype(np.float32)
    cos, sin = tables(cap, rd)
    o = ctx.attention_with_kvcache(q, k_cache, v_cache, rotary_cos=cos, rotary_sin=sin,
                                   cache_seqlens=np.array([7], np.int32))
    qb = rotate(q[0], np.full(M, 7), cos, sin, True)
    ro, _ = row_reference(qb, k_cache[0, :, :7], v_cache[0, :, :7])
    np.testing.assert_allclose(o[0], ro, rtol=2e-4, atol=2e-5)


def test_errors_touch_nothing(ctx, rng):
    B, H, cap, d = 1, 2, 8, 32
    k_cache = np.zeros((B, H, cap, d), np.float32)
    v_cache = np.zeros_like(k_cache)
    q = np.ones((B, H, 1, d), np.float32)
    new = np.ones((B, H, 1, d), np.float32)
    seq = np.array([3], np.int32)
    cos, sin = tables(cap, 16)
    call = ctx.attention_with_kvcache
    bad = [
        (ValueError, lambda: call(q, k_cache, v_cache, new, None, cache_seqlens=seq)),
        (TypeError, lambda: call(q, k_cache, v_cache, new.astype(np.float16), new, cache_seqlens=seq)),
        (ValueError, lambda: call(q, k_cache, v_cache, new[..., :16], new, cache_seqlens=seq)),
        (ValueError, lambda: call(q, k_cache, v_cache, new, new, cache_seqlens=np.array([1, 2], np.int32))),
        (TypeError, lambda: call(q, k_cache, v_cache, new, new, cache_seqlens=np.array([0.5]))),
        (ValueError, lambda: call(q, k_cache, v_cache, new, new, cache_seqlens=seq, rotary_cos=cos)),
        (ValueError, lambda: call(q, k_cache, v_cache, new, new, cache_seqlens=seq, rotary_cos=cos,
                                  rotary_sin=sin[:, :4])),
        (ValueError, lambda: call(q, k_cache, v_cache, new, new, cache_seqlens=seq, rotary_cos=np.ones((cap, 20)),
                                  rotary_sin=np.ones((cap, 20)))),
        (ValueError, lambda: call(q, k_cache, v_cache, new, new, cache_seqlens=seq, cache_batch_idx=seq,
                                  block_table=np.zeros((1, 1), np.int32))),
        (ValueError, lambda: call(q, k_cache, v_cache, new, new, cache_seqlens=seq, layout="hbsd")),
        (ValueError, lambda: call(q, k_cache, v_cache, new, new, cache_seqlens=np.array([40], np.int32),
                                  cache_batch_idx=np.array([0], np.int32))),
    ]
    read_only = k_cache.copy()
    read_only.flags.writeable = False
    bad.append((ValueError, lambda: call(q, read_only, v_cache, new, new, cache_seqlens=seq)))
    for exc, fn in bad:
        with pytest.raises(exc):
            fn()
    # the library's own refusals: tables too short for the cache, a new row past the capacity
    for kw in (dict(rotary_cos=cos[:4], rotary_sin=sin[:4]), dict()):
        n = 1 if kw else cap + 1
        with pytest.raises(clattn.Error) as e:
            call(q, k_cache, v_cache, np.ones((B, H, n, d), np.float32), np.ones((B, H, n, d), np.float32),
                 cache_seqlens=seq, **kw)
        assert e.value.status == "INVALID_ARGUMENT"
    assert not k_cache.any() and not v_cache.any()


def test_pyopencl_caches_in_place(cl_queue):
    cla = pytest.importorskip("pyopencl.array")
    queue = cl_queue
    rng = np.random.default_rng(5)
    B, H, M, cap, d, rd = 2, 2, 1, 9, 32, 32
    with clattn.Context(queue=queue) as ctx:
        host_k = rng.standard_normal((B, H, cap, d)).astype(np.float32)
        host_v = rng.standard_normal((B, H, cap, d)).astype(np.float32)
        k_cache, v_cache = cla.to_device(queue, host_k), cla.to_device(queue, host_v)
        q = rng.standard_normal((B, H, M, d)).astype(np.float32)
        new_k = rng.standard_normal((B, H, 1, d)).astype(np.float32)
        new_v = rng.standard_normal((B, H, 1, d)).astype(np.float32)
        seqlens = np.array([4, 8], np.int32)
        cos, sin = tables(cap, rd)
        o = ctx.attention_with_kvcache(cla.to_device(queue, q), k_cache, v_cache, cla.to_device(queue, new_k), new_v,
                                       rotary_cos=cla.to_device(queue, cos), rotary_sin=cla.to_device(queue, sin),
                                       cache_seqlens=cla.to_device(queue, seqlens), causal=True)
        assert isinstance(o, cla.Array)
        got_k, got_v = k_cache.get(), v_cache.get()
        for b in range(B):
            s = seqlens[b]
            host_k[b, :, s] = rotate(new_k[b, :, 0], np.full(H, s), cos, sin, True)
            host_v[b, :, s] = new_v[b, :, 0]
            ro, _ = row_reference(rotate(q[b], np.full(M, s), cos, sin, True), host_k[b, :, :s + 1],
                                  host_v[b, :, :s + 1], causal=True)
            np.testing.assert_allclose(o.get()[b], ro, rtol=2e-4, atol=2e-5)
        assert got_k.tobytes() == host_k.tobytes() and got_v.tobytes() == host_v.tobytes()


def _past_the_table(rng, B=2, H=2, d=32, page=256):
    """A paged cache of one page per sequence, sequence 1 full: one new row
    has no page to go to."""
    k_cache = rng.standard_normal((B, H, page, d)).astype(np.float32)
    v_cache = rng.standard_normal((B, H, page, d)).astype(np.float32)
    new = rng.standard_normal((B, H, 1, d)).astype(np.float32)
    return (np.ones((B, H, 1, d), np.float32), k_cache, v_cache, new, new.copy(),
            np.array([[1], [0]], np.int32), np.array([3, page], np.int32))


def test_new_rows_past_the_block_table_are_refused_naming_them_before_anything_is_written(ctx, rng):
    q, k_cache, v_cache, k, v, table, seqlens = _past_the_table(rng)
    before = k_cache.tobytes(), v_cache.tobytes()
    with pytest.raises((ValueError, clattn.Error)) as e:
        ctx.attention_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=seqlens, block_table=table)
    msg = str(e.value)
    assert "new_len" in msg and "cache_seqlens" in msg and "256" in msg, msg
    assert (k_cache.tobytes(), v_cache.tobytes()) == before


def test_new_rows_past_the_block_table_are_refused_with_device_lengths(cl_queue):
    cla = pytest.importorskip("pyopencl.array")
    queue = cl_queue
    q, k_cache, v_cache, k, v, table, seqlens = _past_the_table(np.random.default_rng(6))
    with clattn.Context(queue=queue) as c:
        kc, vc = cla.to_device(queue, k_cache), cla.to_device(queue, v_cache)
        with pytest.raises(clattn.Error) as e:
            c.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=cla.to_device(queue, seqlens), block_table=table)
        assert e.value.status == "INVALID_ARGUMENT"
        assert "new_len" in e.value.message and "cache_seqlens" in e.value.message and "256" in e.value.message
        assert kc.get().tobytes() == k_cache.tobytes() and vc.get().tobytes() == v_cache.tobytes()
