"""Context.attention_backward against the fp64 reference gradients (and, for
16-bit storage, FlashAttention's rule): every forward keyword, GQA, odd
shapes, d_sinks and d_bias over broadcast biases, packed sequences,
bfloat16 as uint16 bits, determinism, NaN in disallowed keys, errors."""
import numpy as np
import pytest

import clattn
from conftest import (assert_fa_rule, bf16_to_f32, f32_to_bf16, reference, reference_backward,
                      storage_rounding)

TOL = dict(rtol=2e-4, atol=2e-5)


def problem(rng, B=2, Hq=4, Hkv=2, M=37, N=53, dk=16, dv=16, dtype=np.float32):
    q = rng.standard_normal((B, Hq, M, dk)).astype(dtype)
    k = rng.standard_normal((B, Hkv, N, dk)).astype(dtype)
    v = rng.standard_normal((B, Hkv, N, dv)).astype(dtype)
    d_out = rng.standard_normal((B, Hq, M, dv)).astype(dtype)
    return q, k, v, d_out


def check_grads(got, want):
    for g, w, name in zip(got, want, ("dq", "dk", "dv")):
        assert g.shape == w.shape, name
        np.testing.assert_allclose(g, w, err_msg=name, **TOL)


@pytest.mark.parametrize("algo", ["fused", "staged"])
def test_every_forward_keyword(ctx, rng, algo):
    B, Hq, Hkv, M, N = 2, 4, 2, 37, 53
    q, k, v, d_out = problem(rng, B, Hq, Hkv, M, N)
    kw = dict(causal=True, window=(20, -1), mask=rng.random((B, 1, M, N)) < 0.8,
              bias=rng.standard_normal((Hq, 1, N)).astype(np.float32), kv_lens=np.array([50, 41], np.int32),
              scale=0.3, softcap=5.0, alibi_slopes=rng.random((B, Hq)).astype(np.float32),
              sinks=rng.standard_normal(Hq).astype(np.float32))
    o, lse = ctx.attention(q, k, v, algo=algo, return_lse=True, **kw)
    got = ctx.attention_backward(q, k, v, o, lse, d_out, algo=algo, **kw)
    dq, dk, dv, d_sinks, ds = reference_backward(q, k, v, d_out, **kw)
    assert len(got) == 5  # dq, dk, dv, d_sinks, d_bias
    check_grads(got[:3], (dq, dk, dv))
    np.testing.assert_allclose(got[3], d_sinks, **TOL)
    assert got[4].shape == (Hq, 1, N) and got[4].dtype == np.float32
    np.testing.assert_allclose(got[4], ds.sum(axis=(0, 2))[:, None, :], **TOL)


@pytest.mark.parametrize("shape", [(1, 1, 1, 1, 1), (1, 2, 1, 7, 37), (2, 3, 3, 53, 7), (1, 4, 1, 1, 129)])
def test_odd_shapes_and_layouts(ctx, rng, shape):
    B, Hq, Hkv, M, N = shape
    q, k, v, d_out = problem(rng, B, Hq, Hkv, M, N, dk=16, dv=8)
    want = reference_backward(q, k, v, d_out, causal=True)[:3]
    o, lse = ctx.attention(q, k, v, causal=True, return_lse=True)
    check_grads(ctx.attention_backward(q, k, v, o, lse, d_out, causal=True), want)
    t = lambda x: np.ascontiguousarray(x.transpose(0, 2, 1, 3))  # noqa: E731
    o, lse = ctx.attention(t(q), t(k), t(v), causal=True, layout="bshd", return_lse=True)
    got = ctx.attention_backward(t(q), t(k), t(v), o, lse, t(d_out), causal=True, layout="bshd")
    check_grads([g.transpose(0, 2, 1, 3) for g in got], want)


@pytest.mark.parametrize("bias_shape", [(2, 4, 37, 53), (37, 53), (53,), (1, 4, 37, 1), (2, 1, 1, 53)])
def test_d_bias_sums_over_broadcast_dims(ctx, rng, bias_shape):
    q, k, v, d_out = problem(rng)
    bias = rng.standard_normal(bias_shape).astype(np.float32)
    kw = dict(bias=bias, causal=True, mask=rng.random((37, 53)) < 0.9)
    o, lse = ctx.attention(q, k, v, return_lse=True, **kw)
    got = ctx.attention_backward(q, k, v, o, lse, d_out, **kw)
    ds = reference_backward(q, k, v, d_out, **kw)[4]
    full = (2, 4, 37, 53)
    padded = (1,) * (4 - len(bias_shape)) + bias_shape
    axes = tuple(i for i in range(4) if padded[i] == 1 and full[i] > 1)
    want = ds.sum(axis=axes, keepdims=True).reshape(bias_shape)
    assert len(got) == 4 and got[3].shape == bias_shape
    np.testing.assert_allclose(got[3], want, **TOL)


def test_d_bias_is_the_finite_difference(ctx, rng):
    """dL/dbias for L = sum dO . O, against central differences of the
    forward itself (float32, a small problem)."""
    q, k, v, d_out = problem(rng, B=1, Hq=2, Hkv=1, M=5, N=6)
    bias = rng.standard_normal((5, 6)).astype(np.float32)
    o, lse = ctx.attention(q, k, v, bias=bias, return_lse=True)
    d_bias = ctx.attention_backward(q, k, v, o, lse, d_out, bias=bias)[3]
    h = 1e-2
    for i, j in [(0, 0), (2, 3), (4, 5)]:
        up, down = bias.copy(), bias.copy()
        up[i, j] += h
        down[i, j] -= h
        fd = ((ctx.attention(q, k, v, bias=up) - ctx.attention(q, k, v, bias=down)) * d_out).sum() / (2 * h)
        assert abs(d_bias[i, j] - fd) <= 2e-3 * max(1.0, abs(fd)), (i, j, d_bias[i, j], fd)


@pytest.mark.parametrize("dtype", [np.float16, "bfloat16"])
def test_16bit_storage_within_flash_attention_rule(ctx, rng, dtype):
    q, k, v, d_out = problem(rng, dk=32, dv=32)
    if dtype == "bfloat16":  # numpy has no bfloat16: uint16 arrays of its bits
        rnd = storage_rounding("bfloat16")
        arrs = [f32_to_bf16(x) for x in (q, k, v, d_out)]
        vals = [bf16_to_f32(x) for x in arrs]
    else:
        rnd = storage_rounding(np.float16)
        arrs = [x.astype(np.float16) for x in (q, k, v, d_out)]
        vals = [x.astype(np.float32) for x in arrs]
    kw = dict(causal=True, sinks=np.zeros(4, np.float32))
    o, lse = ctx.attention(*arrs[:3], return_lse=True, **kw)
    got = ctx.attention_backward(*arrs[:3], o, lse, arrs[3], **kw)
    assert all(g.dtype == arrs[0].dtype for g in got[:3])
    exact = reference_backward(*vals, **kw)
    lowp = reference_backward(*vals, rounding=rnd, **kw)
    as_f = (lambda x: bf16_to_f32(x)) if dtype == "bfloat16" else (lambda x: x.astype(np.float32))
    for g, e, lp, name in zip(got[:3], exact[:3], lowp[:3], ("dq", "dk", "dv")):
        assert_fa_rule(as_f(g), e, lp, name)


def test_packed_sequences(ctx, rng):
    lens_q, lens_k = [7, 0, 13, 1], [9, 5, 20, 1]
    Hq, Hkv, dk = 4, 2, 16
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    q = rng.standard_normal((cu_q[-1], Hq, dk)).astype(np.float32)  # bshd: [total, heads, dim]
    k = rng.standard_normal((cu_k[-1], Hkv, dk)).astype(np.float32)
    v = rng.standard_normal((cu_k[-1], Hkv, dk)).astype(np.float32)
    d_out = rng.standard_normal(q.shape).astype(np.float32)
    kw = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=True, layout="bshd")
    o, lse = ctx.attention(q, k, v, return_lse=True, **kw)
    dq, dk_, dv = ctx.attention_backward(q, k, v, o, lse, d_out, **kw)
    assert dq.shape == q.shape and dk_.shape == k.shape
    for b in range(4):
        sq, sk = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        if lens_q[b] == 0:
            continue
        t = lambda x: x[None].transpose(0, 2, 1, 3)  # noqa: E731  [total, H, D] -> [1, H, total, D]
        want = reference_backward(t(q[sq]), t(k[sk]), t(v[sk]), t(d_out[sq]), causal=True)
        np.testing.assert_allclose(t(dq[sq]), want[0], **TOL)
        np.testing.assert_allclose(t(dk_[sk]), want[1], **TOL)
        np.testing.assert_allclose(t(dv[sk]), want[2], **TOL)
    # keys of a sequence with no queries get zero gradients
    assert not dk_[cu_k[1]:cu_k[2]].any() and not dv[cu_k[1]:cu_k[2]].any()


def test_deterministic_and_nan_in_disallowed_keys(ctx, rng):
    q, k, v, d_out = problem(rng, B=1)
    kv_lens = np.array([40], np.int32)
    k[:, :, 40:] = np.nan  # past kv_lens: never read
    v[:, :, 40:] = np.inf
    o, lse = ctx.attention(q, k, v, kv_lens=kv_lens, return_lse=True)
    a = ctx.attention_backward(q, k, v, o, lse, d_out, kv_lens=kv_lens)
    b = ctx.attention_backward(q, k, v, o, lse, d_out, kv_lens=kv_lens)
    for x, y in zip(a, b):
        assert x.tobytes() == y.tobytes()
    assert all(np.isfinite(x).all() for x in a)
    assert not a[1][:, :, 40:].any() and not a[2][:, :, 40:].any()
    want = reference_backward(q[:, :, :, :], k[:, :, :40], v[:, :, :40], d_out)
    np.testing.assert_allclose(a[0], want[0], **TOL)
    fast = ctx.attention_backward(q, k, v, o, lse, d_out, kv_lens=kv_lens, deterministic=False)
    np.testing.assert_allclose(fast[0], want[0], **TOL)


def test_one_keyword_dict_serves_both_calls(ctx, rng):
    q, k, v, d_out = problem(rng, B=1, M=7, N=9)
    kw = dict(causal=True, return_lse=True, scale=0.5)
    o, lse = ctx.attention(q, k, v, **kw)
    got = ctx.attention_backward(q, k, v, o, lse, d_out, **kw)
    check_grads(got, reference_backward(q, k, v, d_out, causal=True, scale=0.5)[:3])


def test_errors(ctx, rng):
    q, k, v, d_out = problem(rng, B=1, M=7, N=9)
    o, lse = ctx.attention(q, k, v, return_lse=True)
    with pytest.raises(ValueError):
        ctx.attention_backward(q, k, v, o[:, :, :3], lse, d_out)
    with pytest.raises(ValueError):
        ctx.attention_backward(q, k, v, o, lse[:, :1], d_out)
    with pytest.raises(TypeError):
        ctx.attention_backward(q, k, v, o, lse.astype(np.float64), d_out)
    with pytest.raises(TypeError):
        ctx.attention_backward(q, k, v, o, lse, d_out.astype(np.float16))
    with pytest.raises(TypeError):
        ctx.attention_backward(q, k, v, o, lse, d_out, no_such_keyword=1)
    with pytest.raises(clattn.Error) as e:  # the backward takes no paged K/V
        table = np.array([[0, 1]], np.int32)
        pages = np.repeat(k[:, :1], 2, axis=0)  # [2 pages, 1 head, 9 rows, 16]
        ctx.attention_backward(q, pages, pages, o, lse, d_out, block_table=table, kv_lens=np.array([9], np.int32))
    assert e.value.status == "UNSUPPORTED"
    with pytest.raises(clattn.Error) as e:  # nor a left-padded cache
        ctx.attention_backward(q, k, v, o, lse, d_out, kv_lens=np.array([9], np.int32),
                               cache_leftpad=np.array([2], np.int32))
    assert e.value.status == "UNSUPPORTED"
