"""Context.kv_append: new rows into contiguous and paged caches of every
storage, in place (numpy where the array lies, pyopencl on the device),
byte for byte against ggml's quantisation rules; rows past the capacity,
past the table or on pages outside the pool skipped; then read back by
attention."""
import numpy as np
import pytest

import clattn
from conftest import bf16_to_f32, f32_to_bf16, reference
from test_varlen_paged import dequantise_q8_0, quantise_int8, quantise_q8_0

TOL = dict(rtol=2e-4, atol=2e-5)


def expected_contiguous(cache, new, positions, store):
    """cache [B,H,cap,c] after writing new [B,H,L,d] at positions (rows past
    the capacity skipped), each row stored by store(rows)."""
    out = cache.copy()
    cap = cache.shape[2]
    for b, p in enumerate(positions):
        for r in range(new.shape[2]):
            if 0 <= p + r < cap:
                out[b, :, p + r] = store(new[b, :, r])
    return out


@pytest.mark.parametrize("kind", ["float32", "float16", "bfloat16", "q8_0", "int8"])
def test_contiguous_cache_every_storage(ctx, rng, kind):
    B, H, L, d, cap = 2, 2, 3, 64, 8
    k_new = rng.standard_normal((B, H, L, d)).astype(np.float32) * 3
    v_new = rng.standard_normal((B, H, L, d)).astype(np.float32)
    positions = np.array([2, 6], np.int32)  # batch row 1's last new row is past the capacity
    kw = {}
    if kind in ("float32", "float16"):
        k_cache = np.full((B, H, cap, d), 7, kind)
        v_cache = k_cache.copy()
        store = lambda x: x.astype(kind)  # noqa: E731
    elif kind == "bfloat16":
        k_cache = np.full((B, H, cap, d), 0x4040, np.uint16)  # bfloat16 bits of 3.0
        v_cache = k_cache.copy()
        store = f32_to_bf16
    elif kind == "q8_0":
        k_cache = np.full((B, H, cap, d // 32 * 34), 0xA5, np.uint8)
        v_cache = k_cache.copy()
        store = quantise_q8_0
        kw["kv_dtype"] = "q8_0"
    else:
        k_cache = np.full((B, H, cap, d), 5, np.int8)
        v_cache = k_cache.copy()
        kw.update(kv_dtype="int8", k_scale=np.full((B, H, cap), -1, np.float32),
                  v_scale=np.full((B, H, cap), -1, np.float32))
        store = lambda x: quantise_int8(x)[0]  # noqa: E731
    want_k = expected_contiguous(k_cache, k_new, positions, store)
    want_v = expected_contiguous(v_cache, v_new, positions, store)
    ctx.kv_append(k_cache, v_cache, k_new, v_new, positions, **kw)
    assert k_cache.tobytes() == want_k.tobytes() and v_cache.tobytes() == want_v.tobytes()
    if kind == "int8":
        scale = lambda x: quantise_int8(x)[1][..., None]  # noqa: E731
        want = expected_contiguous(np.full((B, H, cap, 1), -1, np.float32), k_new, positions, scale)[..., 0]
        assert kw["k_scale"].tobytes() == want.tobytes()


def test_paged_cache_then_attention(ctx, rng):
    """Appends into a paged q8_0 cache (bshd, FlashAttention's page layout)
    across page boundaries, a row on an entry outside the pool skipped, then
    attention reads what was written (a decode step's two calls)."""
    B, H, d, ps, pages = 2, 2, 32, 4, 6
    k_cache = np.zeros((pages, ps, H, d // 32 * 34), np.uint8)
    v_cache = np.zeros_like(k_cache)
    table = np.array([[3, 0, 5], [1, 4, -1]], np.int32)
    k_all = rng.standard_normal((B, 10, H, d)).astype(np.float32)
    v_all = rng.standard_normal((B, 10, H, d)).astype(np.float32)
    # rows 0..5 at positions 0..5, then rows 6..9 at 6..9 and (sequence 1) at
    # 5..8: its position 8 is on entry 2, outside the pool, and skipped
    kw = dict(block_table=table, kv_dtype="q8_0", layout="bshd")
    ctx.kv_append(k_cache, v_cache, k_all[:, :6], v_all[:, :6], np.array([0, 0], np.int32), **kw)
    ctx.kv_append(k_cache, v_cache, k_all[:, 6:], v_all[:, 6:], np.array([6, 5], np.int32), **kw)
    keys = {0: list(range(10)), 1: [0, 1, 2, 3, 4, 6, 7, 8]}  # the row at each position
    for b in range(B):
        for j, r in enumerate(keys[b]):
            page, row = table[b, j // ps], j % ps
            assert k_cache[page, row].tobytes() == quantise_q8_0(k_all[b, r]).tobytes(), (b, j)
            assert v_cache[page, row].tobytes() == quantise_q8_0(v_all[b, r]).tobytes(), (b, j)
    assert not k_cache[2].any() and not v_cache[2].any()  # no entry names page 2
    lens = np.array([10, 8], np.int32)
    q = rng.standard_normal((B, 1, H, d)).astype(np.float32)
    o = ctx.attention(q, k_cache, v_cache, block_table=table, kv_lens=lens, kv_dtype="q8_0", layout="bshd")
    for b in range(B):
        kb = dequantise_q8_0(quantise_q8_0(k_all[b, keys[b]])).transpose(1, 0, 2)[None]
        vb = dequantise_q8_0(quantise_q8_0(v_all[b, keys[b]])).transpose(1, 0, 2)[None]
        ro = reference(q[b:b + 1].transpose(0, 2, 1, 3), kb, vb)[0]
        np.testing.assert_allclose(o[b:b + 1].transpose(0, 2, 1, 3), ro, **TOL)


def test_strided_caches_are_written_element_by_element(ctx, rng):
    """k and v caches interleaved in one array (a strided view each): each
    append writes its own elements and leaves the other's as they were."""
    B, H, cap, d = 1, 2, 5, 16
    kv = np.zeros((B, H, cap, 2, d), np.float32)
    k_cache, v_cache = kv[:, :, :, 0], kv[:, :, :, 1]
    k_new = rng.standard_normal((B, H, 2, d)).astype(np.float32)
    v_new = rng.standard_normal((B, H, 2, d)).astype(np.float32)
    ctx.kv_append(k_cache, v_cache, k_new, v_new, np.array([1], np.int32))
    assert np.array_equal(kv[:, :, 1:3, 0], k_new) and np.array_equal(kv[:, :, 1:3, 1], v_new)
    assert not kv[:, :, [0, 3, 4]].any()


def test_16bit_sources_and_bfloat16_bits(ctx, rng):
    B, H, L, d, cap = 1, 1, 2, 16, 4
    src = rng.standard_normal((B, H, L, d)).astype(np.float32)
    k_cache = np.zeros((B, H, cap, d), np.float32)
    v_cache = np.zeros_like(k_cache)
    bits = f32_to_bf16(src)  # bfloat16 new rows as uint16 bits, into an f32 cache
    ctx.kv_append(k_cache, v_cache, bits, bits, np.array([0], np.int32))
    assert np.array_equal(k_cache[:, :, :2], bf16_to_f32(bits))
    f16 = src.astype(np.float16)
    ctx.kv_append(k_cache, v_cache, f16, f16, np.array([2], np.int32))
    assert np.array_equal(v_cache[:, :, 2:], f16.astype(np.float32))


def test_nothing_new_and_errors(ctx, rng):
    k_cache = np.zeros((1, 1, 4, 16), np.float32)
    before = k_cache.copy()
    empty = np.zeros((1, 1, 0, 16), np.float32)
    ctx.kv_append(k_cache, k_cache.copy(), empty, empty, np.array([0], np.int32))
    assert k_cache.tobytes() == before.tobytes()
    new = np.ones((1, 1, 2, 16), np.float32)
    pos = np.array([0], np.int32)
    bad = [
        (TypeError, lambda: ctx.kv_append(k_cache, k_cache.copy(), new.astype(np.float64), new, pos)),
        (ValueError, lambda: ctx.kv_append(k_cache, k_cache.copy(), new[..., :8], new[..., :8], pos)),
        (ValueError, lambda: ctx.kv_append(k_cache, k_cache.copy(), new, new, np.array([0, 1], np.int32))),
        (TypeError, lambda: ctx.kv_append(k_cache, k_cache.copy(), new, new, np.array([0.5]))),
        (ValueError, lambda: ctx.kv_append(k_cache[0], k_cache[0], new, new, pos)),
        (ValueError, lambda: ctx.kv_append(k_cache, k_cache.copy(), new, new, pos, layout="hbsd")),
        (ValueError, lambda: ctx.kv_append(np.zeros((1, 1, 4, 16), np.int8), np.zeros((1, 1, 4, 16), np.int8),
                                           new, new, pos, kv_dtype="int8")),
        (ValueError, lambda: ctx.kv_append(np.zeros((3, 1, 4, 16), np.float32), np.zeros((3, 1, 4, 16), np.float32),
                                           new, new, pos, block_table=np.array([[0, 1]], np.int32), page_size=8)),
    ]
    read_only = k_cache.copy()
    read_only.flags.writeable = False
    bad.append((ValueError, lambda: ctx.kv_append(read_only, k_cache.copy(), new, new, pos)))
    for exc, call in bad:
        with pytest.raises(exc):
            call()
    assert k_cache.tobytes() == before.tobytes()
    # a library-side rejection: new_len past the capacity
    with pytest.raises(clattn.Error) as e:
        ctx.kv_append(k_cache, k_cache.copy(), np.ones((1, 1, 5, 16), np.float32),
                      np.ones((1, 1, 5, 16), np.float32), pos)
    assert e.value.status == "INVALID_ARGUMENT"
    assert k_cache.tobytes() == before.tobytes()


def test_pyopencl_caches_in_place(cl_queue):
    cla = pytest.importorskip("pyopencl.array")
    queue = cl_queue
    with clattn.Context(queue=queue) as ctx:
        rng = np.random.default_rng(3)
        k_cache = cla.zeros(queue, (1, 2, 6, 16), np.float32)
        v_cache = cla.zeros(queue, (1, 2, 6, 16), np.float32)
        new = rng.standard_normal((1, 2, 2, 16)).astype(np.float32)
        ctx.kv_append(k_cache, v_cache, cla.to_device(queue, new), new, np.array([3], np.int32))
        got = k_cache.get()
        assert np.array_equal(got[:, :, 3:5], new) and not got[:, :, [0, 1, 2, 5]].any()
        assert np.array_equal(v_cache.get()[:, :, 3:5], new)


@pytest.mark.parametrize("entry", ["kv_append", "attention_with_kvcache"])
@pytest.mark.parametrize("case", ["same_array", "overlapping_views", "same_int8_scales", "new_rows_in_the_cache"])
def test_caches_sharing_bytes_are_refused_before_anything_runs(ctx, rng, monkeypatch, entry, case):
    """An array written in place shares no byte with another array of the
    call (the library's rule for its buffers): numpy arrays are uploaded
    each on its own, so one's copy-back would overwrite the other's rows."""
    B, H, cap, d = 1, 2, 8, 32
    base = rng.standard_normal((B, H, cap + 1, d)).astype(np.float32)
    k_cache, v_cache = base[:, :, :cap], base[:, :, :cap].copy()
    k_new = rng.standard_normal((B, H, 1, d)).astype(np.float32)
    v_new = rng.standard_normal((B, H, 1, d)).astype(np.float32)
    kw, shared = {}, "k_cache"
    if case == "same_array":
        v_cache = k_cache
    elif case == "overlapping_views":
        v_cache = base[:, :, 1:]
    elif case == "same_int8_scales":
        k_cache, v_cache = (rng.integers(-9, 9, (B, H, cap, d)).astype(np.int8) for _ in range(2))
        scales = np.ones((B, H, cap), np.float32)
        kw, shared = dict(kv_dtype="int8", k_scale=scales, v_scale=scales), "k_scale"
    else:
        k_new = k_cache[:, :, 2:3]
    before = [x.copy() for x in (base, k_cache, v_cache)]

    def refuse(*a):
        raise AssertionError("a buffer was made before the call was refused")
    monkeypatch.setattr(ctx, "_new_buffer", refuse)
    seqlens = np.array([3], np.int32)
    with pytest.raises(ValueError, match=shared) as e:
        if entry == "kv_append":
            ctx.kv_append(k_cache, v_cache, k_new, v_new, seqlens, **kw)
        else:
            ctx.attention_with_kvcache(np.ones((B, H, 1, d), np.float32), k_cache, v_cache, k_new, v_new,
                                       cache_seqlens=seqlens, **kw)
    assert "share" in str(e.value)
    for got, want in zip((base, k_cache, v_cache), before):
        assert got.tobytes() == want.tobytes()
