"""clattn.Context.attention on numpy arrays against the fp64 reference."""
import threading

import numpy as np
import pytest

import clattn
from conftest import reference

TOL = dict(rtol=2e-4, atol=2e-5)


def qkv(rng, B, Hq, Hkv, M, N, dk=16, dv=16, dtype=np.float32):
    return (rng.standard_normal((B, Hq, M, dk)).astype(dtype),
            rng.standard_normal((B, Hkv, N, dk)).astype(dtype),
            rng.standard_normal((B, Hkv, N, dv)).astype(dtype))


SHAPES = [  # B, Hq, Hkv, M, N
    (1, 1, 1, 1, 1),
    (1, 2, 1, 7, 37),
    (2, 4, 2, 53, 7),
    (1, 3, 3, 37, 53),
    (2, 2, 2, 1, 53),
]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("algo", ["auto", "staged", "fused", "gemm"])
def test_odd_shapes_every_algo(ctx, rng, shape, algo):
    q, k, v = qkv(rng, *shape)
    o = ctx.attention(q, k, v, algo=algo)
    assert o.shape == shape[:3][:2] + (shape[3], 16) and o.dtype == np.float32
    np.testing.assert_allclose(o, reference(q, k, v)[0], **TOL)


def test_odd_head_dims(ctx, rng):
    q, k, v = qkv(rng, 1, 2, 1, 37, 53, dk=7, dv=5)
    o, lse = ctx.attention(q, k, v, causal=True, return_lse=True)
    ro, rl, _ = reference(q, k, v, causal=True)
    assert o.shape == (1, 2, 37, 5)
    np.testing.assert_allclose(o, ro, **TOL)
    np.testing.assert_allclose(lse, rl, **TOL)


@pytest.mark.parametrize("algo", ["staged", "fused", "gemm"])
def test_every_keyword(ctx, rng, algo):
    B, Hq, Hkv, M, N = 2, 4, 2, 37, 53
    q, k, v = qkv(rng, B, Hq, Hkv, M, N)
    mask = rng.random((B, 1, M, N)) < 0.8          # broadcast over heads
    bias = rng.standard_normal((Hq, 1, N)).astype(np.float32)  # broadcast over batch and rows
    kv_lens = np.array([50, 41], np.int32)
    slopes = np.array([0.5, 0.25, 0.125, 0.0625], np.float32)
    sinks = np.array([0.0, 1.0, -1.0, 2.0], np.float32)
    kw = dict(causal=True, window=(20, -1), mask=mask, bias=bias, kv_lens=kv_lens, scale=0.3,
              softcap=5.0, alibi_slopes=slopes, sinks=sinks)
    o, lse = ctx.attention(q, k, v, algo=algo, empty_rows="zero", return_lse=True, **kw)
    ro, rl, _ = reference(q, k, v, **kw)
    np.testing.assert_allclose(o, ro, **TOL)
    np.testing.assert_allclose(lse, rl, **TOL)


def test_return_values(ctx, rng):
    q, k, v = qkv(rng, 1, 2, 2, 7, 37)
    ro, rl, rw = reference(q, k, v, causal=True)
    o = ctx.attention(q, k, v, causal=True)
    assert isinstance(o, np.ndarray)
    o, lse = ctx.attention(q, k, v, causal=True, return_lse=True)
    assert lse.shape == (1, 2, 7) and lse.dtype == np.float32
    o2, w = ctx.attention(q, k, v, causal=True, return_weights=True)
    assert w.shape == (1, 2, 7, 37) and w.dtype == np.float32
    o3, lse3, w3 = ctx.attention(q, k, v, causal=True, return_lse=True, return_weights=True)
    for x in (o, o2, o3):
        np.testing.assert_allclose(x, ro, **TOL)
    for x in (lse, lse3):
        np.testing.assert_allclose(x, rl, **TOL)
    for x in (w, w3):
        np.testing.assert_allclose(x, rw, **TOL)
        np.testing.assert_allclose(x.sum(-1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("scale", [None, 0.0, 0.3])
def test_scale(ctx, rng, scale):
    q, k, v = qkv(rng, 1, 1, 1, 7, 7)
    np.testing.assert_allclose(ctx.attention(q, k, v, scale=scale), reference(q, k, v, scale=scale)[0], **TOL)


def test_window_and_mask_forms(ctx, rng):
    q, k, v = qkv(rng, 1, 2, 2, 37, 37)
    m2 = rng.random((37, 37)) < 0.7
    m2[:, 0] = True
    for mask in (m2, m2.astype(np.uint8) * 7, m2[None, None]):
        np.testing.assert_allclose(ctx.attention(q, k, v, mask=mask), reference(q, k, v, mask=mask)[0], **TOL)
    np.testing.assert_allclose(ctx.attention(q, k, v, window=None), ctx.attention(q, k, v), rtol=0, atol=0)
    for window in ((3, 2), (0, 0), (-1, 4)):
        np.testing.assert_allclose(ctx.attention(q, k, v, window=window),
                                   reference(q, k, v, window=window)[0], **TOL)


def test_bshd_layout(ctx, rng):
    B, Hq, Hkv, M, N = 2, 4, 2, 7, 37
    q, k, v = qkv(rng, B, Hq, Hkv, M, N)
    qs, ks, vs = (np.ascontiguousarray(x.transpose(0, 2, 1, 3)) for x in (q, k, v))
    o, lse = ctx.attention(qs, ks, vs, layout="bshd", causal=True, return_lse=True)
    ro, rl, _ = reference(q, k, v, causal=True)
    assert o.shape == (B, M, Hq, 16)
    np.testing.assert_allclose(o, ro.transpose(0, 2, 1, 3), **TOL)
    assert lse.shape == (B, Hq, M)
    np.testing.assert_allclose(lse, rl, **TOL)


def test_non_contiguous_inputs(ctx, rng):
    B, Hq, Hkv, M, N = 1, 2, 1, 7, 37
    big_q = rng.standard_normal((B, M, Hq, 32)).astype(np.float32)
    q = big_q.transpose(0, 2, 1, 3)[..., ::2]               # strided view, column stride 2
    k = rng.standard_normal((B, Hkv, 2 * N, 16)).astype(np.float32)[:, :, ::2]  # row gaps
    v1 = rng.standard_normal((1, 1, 1, 16)).astype(np.float32)
    v = np.broadcast_to(v1, (B, Hkv, N, 16))                  # stride 0, read-only
    o = ctx.attention(q, k, v)
    np.testing.assert_allclose(o, reference(q, k, v)[0], **TOL)
    qr = np.ascontiguousarray(q)[:, :, ::-1]                   # negative stride: packed copy
    np.testing.assert_allclose(ctx.attention(qr, k, v), reference(qr, k, v)[0], **TOL)
    kf = np.asfortranarray(k)
    np.testing.assert_allclose(ctx.attention(q, kf, v), reference(q, kf, v)[0], **TOL)


def test_float16(ctx, rng):
    q, k, v = qkv(rng, 1, 2, 1, 37, 53, dtype=np.float16)
    o, lse = ctx.attention(q, k, v, causal=True, return_lse=True)
    assert o.dtype == np.float16 and lse.dtype == np.float32
    ro, rl, _ = reference(q, k, v, causal=True)
    np.testing.assert_allclose(o.astype(np.float64), ro, rtol=2e-3, atol=2e-3)
    np.testing.assert_allclose(lse, rl, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("algo", ["staged", "fused", "gemm"])
def test_empty_rows(ctx, rng, algo):
    q, k, v = qkv(rng, 1, 2, 2, 7, 7)
    mask = np.ones((7, 7), bool)
    mask[3] = False
    o, lse, w = ctx.attention(q, k, v, mask=mask, algo="staged" if algo == "fused" else algo,
                              return_lse=True, return_weights=True)
    assert np.all(o[:, :, 3] == 0) and np.all(np.isneginf(lse[:, :, 3])) and np.all(w[:, :, 3] == 0)
    o = ctx.attention(q, k, v, mask=mask, algo=algo, empty_rows="zero")
    assert np.all(o[:, :, 3] == 0) and np.isfinite(o).all()
    np.testing.assert_allclose(o, reference(q, k, v, mask=mask)[0], **TOL)
    with pytest.raises(clattn.Error) as e:
        ctx.attention(q, k, v, mask=mask, algo=algo, empty_rows="error")
    assert e.value.status == "EMPTY_ROW" and isinstance(e.value, RuntimeError)
    sinks = np.array([0.5, -2.0], np.float32)
    o, lse = ctx.attention(q, k, v, mask=mask, algo=algo, sinks=sinks, return_lse=True)
    np.testing.assert_allclose(lse[0, :, 3], sinks)
    np.testing.assert_allclose(o, reference(q, k, v, mask=mask, sinks=sinks)[0], **TOL)


def test_determinism(ctx, rng):
    q, k, v = qkv(rng, 2, 4, 2, 37, 53)
    for algo in ("fused", "staged"):
        a = ctx.attention(q, k, v, causal=True, algo=algo)
        b = ctx.attention(q, k, v, causal=True, algo=algo)
        assert a.tobytes() == b.tobytes()


def test_threads_share_a_context(ctx, rng):
    probs = [qkv(rng, 1, 2, 1, m, n) for m, n in ((7, 37), (1, 53), (37, 7), (53, 53))]
    want = [ctx.attention(*p, causal=True) for p in probs]
    errors, got = [], {}

    def work(t):
        try:
            for r in range(3):
                i = (t + r) % len(probs)
                got[(t, r)] = (i, ctx.attention(*probs[i], causal=True))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(got) == 12
    for i, o in got.values():
        assert o.tobytes() == want[i].tobytes()


def test_device_name_and_describe(ctx):
    assert isinstance(ctx.device_name, str) and ctx.device_name
    assert isinstance(ctx.describe(), str)
