"""clattn.KVCache (Context.kv_cache): a K/V cache kept in device memory for
numpy callers. A decode loop through it returns what the same loop over
numpy caches returns, bitwise, and leaves the same cache behind; a step
moves no cache-sized buffer between host and device; the cache's arrays
serve attention, kv_append and plans in place; misuse is refused."""
import numpy as np
import pytest

import clattn
from test_kvcache_step import tables


def _storage(kind, rng, shape):
    """Initial K/V (and int8 scales) of a cache of shape [*, *, rows, d]."""
    d = shape[-1]
    if kind == "q8_0":
        k = np.zeros(shape[:-1] + (d // 32 * 34,), np.uint8)
        return dict(k=k, v=k.copy(), kv_dtype="q8_0")
    if kind == "int8":
        k = np.zeros(shape, np.int8)
        return dict(k=k, v=k.copy(), kv_dtype="int8", k_scale=np.zeros(shape[:-1], np.float32),
                    v_scale=np.zeros(shape[:-1], np.float32))
    k = np.zeros(shape, kind)
    return dict(k=k, v=k.copy())


def _numpy_args(st):
    """The same storage as attention_with_kvcache's numpy keywords."""
    return st["k"], st["v"], {n: st[n] for n in ("kv_dtype", "k_scale", "v_scale") if n in st}


@pytest.mark.parametrize("kind,paged,layout", [("float16", False, "bhsd"), ("float32", True, "bshd"),
                                               ("int8", False, "bhsd"), ("q8_0", True, "bshd")])
def test_decode_loop_equals_the_numpy_cache_loop_bitwise(ctx, rng, kind, paged, layout):
    B, Hq, Hkv, d, cap, page = 2, 4, 2, 32, 48, 16
    t = (lambda x: x) if layout == "bhsd" else (lambda x: x.swapaxes(1, 2))  # bhsd -> the layout
    if paged:
        table = np.array([[4, 0, 2], [1, 5, 3]], np.int32)
        shape = (6, Hkv, page, d)
        extra = dict(block_table=table)
    else:
        shape, extra = (B, Hkv, cap, d), {}
    init = _storage(kind, rng, t(np.empty(shape)).shape)
    host = {n: x.copy() for n, x in init.items() if isinstance(x, np.ndarray)}
    k_np, v_np, np_kw = _numpy_args(dict(init, **host))
    cache = ctx.kv_cache(init["k"], init["v"], kv_dtype=init.get("kv_dtype"), k_scale=init.get("k_scale"),
                         v_scale=init.get("v_scale"), layout=layout)
    assert isinstance(cache, clattn.KVCache) and isinstance(cache.k, clattn.DeviceArray)
    cos, sin = tables(cap, d)
    seqlens = np.zeros(B, np.int32)
    qdt = np.float16 if kind == "float16" else np.float32
    for m in (5, 1, 1, 3):  # a prompt, then tokens
        q = t(rng.standard_normal((B, Hq, m, d))).astype(qdt)
        k = t(rng.standard_normal((B, Hkv, m, d))).astype(qdt)
        v = t(rng.standard_normal((B, Hkv, m, d))).astype(qdt)
        kw = dict(rotary_cos=cos, rotary_sin=sin, cache_seqlens=seqlens, causal=True, return_lse=True, **extra)
        o, lse = cache.attention_with_kvcache(q, k, v, **kw)
        want_o, want_lse = ctx.attention_with_kvcache(q, k_np, v_np, k, v, layout=layout, **np_kw, **kw)
        assert isinstance(o, np.ndarray) and o.tobytes() == want_o.tobytes() and lse.tobytes() == want_lse.tobytes()
        seqlens += m
    got = cache.get()
    want = (k_np, v_np) + ((np_kw["k_scale"], np_kw["v_scale"]) if kind == "int8" else ())
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape and g.tobytes() == w.tobytes()
    assert init["k"].tobytes() == np.zeros_like(init["k"]).tobytes()  # the host array was a copy's source only
    cache.close()


def test_a_step_moves_no_cache_sized_buffer(ctx, rng, monkeypatch):
    """The cost of a decode step is the new rows, q and O, not the cache."""
    B, H, cap, d = 1, 2, 1024, 64
    cache = ctx.kv_cache(np.zeros((B, H, cap, d), np.float32), np.zeros((B, H, cap, d), np.float32))
    moved = []
    real_new, cl = ctx._new_buffer, ctx._cl
    real_read = cl.enqueue_read
    monkeypatch.setattr(ctx, "_new_buffer", lambda flags, n, *a: (moved.append(n), real_new(flags, n, *a))[1])
    monkeypatch.setattr(cl, "enqueue_read", lambda *a: (moved.append(a[4]), real_read(*a))[1])
    for n in range(3):
        x = rng.standard_normal((B, H, 1, d)).astype(np.float32)
        cache.attention_with_kvcache(x, x, x, cache_seqlens=np.array([n], np.int32))
    assert moved and max(moved) < cap * d * 4 // 8, moved
    monkeypatch.undo()
    k, v = cache.get()
    assert k[0, :, :3].any() and not k[0, :, 3:].any()


def test_the_arrays_serve_kv_append_attention_and_plans_in_place(ctx, rng):
    B, H, cap, d = 2, 2, 40, 32
    k0 = rng.standard_normal((B, H, cap, d)).astype(np.float32)
    v0 = rng.standard_normal((B, H, cap, d)).astype(np.float32)
    cache = ctx.kv_cache(k0, v0)
    assert cache.k.shape == (B, H, cap, d) and cache.k.dtype == np.float32
    q = rng.standard_normal((B, H, 1, d)).astype(np.float32)
    plan = ctx.plan(q, cache.k, cache.v)  # planned over the device arrays: later appends are seen
    new = rng.standard_normal((B, H, 4, d)).astype(np.float32)
    cache.kv_append(new, 2 * new, np.array([3, 30], np.int32))
    k0[0, :, 3:7], k0[1, :, 30:34] = new[0], new[1]
    v0[0, :, 3:7], v0[1, :, 30:34] = 2 * new[0], 2 * new[1]
    k, v = cache.get()
    assert k.tobytes() == k0.tobytes() and v.tobytes() == v0.tobytes()
    want = ctx.attention(q, k0, v0)
    assert ctx.attention(q, cache.k, cache.v).tobytes() == want.tobytes()
    assert plan().tobytes() == want.tobytes()
    plan.close()
    with cache:
        pass
    with pytest.raises(ValueError, match="released"):
        ctx.attention(q, cache.k, cache.v)
    with pytest.raises(ValueError, match="released"):
        cache.get()


def test_misuse_is_refused(ctx, rng):
    k = np.zeros((1, 2, 8, 32), np.float32)
    with pytest.raises(TypeError):
        ctx.kv_cache(k, k.astype(np.float16))
    with pytest.raises(ValueError):
        ctx.kv_cache(k, k[:, :, :4])
    with pytest.raises(ValueError):
        ctx.kv_cache(k[0], k[0])
    with pytest.raises(ValueError):
        ctx.kv_cache(k.astype(np.int8), k.astype(np.int8), kv_dtype="int8")  # no scales
    with pytest.raises(ValueError):
        ctx.kv_cache(k, k, layout="hbsd")
    cache = ctx.kv_cache(k, k)  # one source for both is fine: each is copied
    with pytest.raises(TypeError, match="layout"):
        cache.attention_with_kvcache(k[:, :, :1], cache_seqlens=np.array([1], np.int32), layout="bshd")
    with pytest.raises(clattn.Error) as e:  # the same device buffer as K and V: the library's aliasing rule
        x = np.ones((1, 2, 1, 32), np.float32)
        ctx.attention_with_kvcache(x, cache.k, cache.k, x, x, cache_seqlens=np.array([1], np.int32))
    assert e.value.status == "INVALID_ARGUMENT"
    with clattn.Context() as other:
        with pytest.raises(ValueError, match="another"):
            other.attention(k[:, :, :1], cache.k, cache.v)
    cache.close()
    cache.close()
