"""ALiBi slopes per (batch, head) on every algorithm, bfloat16 storage as
np.uint16 bits (and ml_dtypes.bfloat16 where installed) within
FlashAttention's rule, and dropout's keywords (their checks; dropout_p 0
is no dropout whatever the seed)."""
import numpy as np
import pytest

import clattn
from conftest import assert_fa_rule, bf16_to_f32, f32_to_bf16, reference, storage_rounding

TOL = dict(rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("algo", ["auto", "staged", "fused", "gemm"])
def test_alibi_slopes_per_batch_and_head(ctx, rng, algo):
    B, H, M, N = 3, 4, 7, 37
    q = rng.standard_normal((B, H, M, 16)).astype(np.float32)
    k = rng.standard_normal((B, 2, N, 16)).astype(np.float32)
    v = rng.standard_normal((B, 2, N, 16)).astype(np.float32)
    slopes = rng.random((B, H)).astype(np.float32)
    o, lse = ctx.attention(q, k, v, alibi_slopes=slopes, causal=True, algo=algo, return_lse=True)
    ro, rl, _ = reference(q, k, v, alibi_slopes=slopes, causal=True)
    np.testing.assert_allclose(o, ro, **TOL)
    np.testing.assert_allclose(lse, rl, **TOL)
    # each batch row's own: row 1 alone with its slopes gives the same
    one = ctx.attention(q[1:2], k[1:2], v[1:2], alibi_slopes=slopes[1], causal=True, algo=algo)
    np.testing.assert_allclose(o[1:2], one, **TOL)
    with pytest.raises(ValueError):
        ctx.attention(q, k, v, alibi_slopes=slopes[:2])


@pytest.mark.parametrize("algo", ["staged", "fused"])
def test_bfloat16_as_uint16_bits(ctx, rng, algo):
    q, k, v = (rng.standard_normal((2, 4, n, 32)).astype(np.float32) for n in (37, 53, 53))
    bits = [f32_to_bf16(x) for x in (q, k[:, :2], v[:, :2])]
    o, lse = ctx.attention(*bits, causal=True, algo=algo, return_lse=True)
    assert o.dtype == np.uint16 and o.shape == (2, 4, 37, 32)
    vals = [bf16_to_f32(x) for x in bits]
    ref = reference(*vals, causal=True)
    lowp = reference(*vals, causal=True, rounding=storage_rounding("bfloat16"))
    assert_fa_rule(bf16_to_f32(o), ref[0], lowp[0], "O")
    np.testing.assert_allclose(lse, ref[1], rtol=1e-4, atol=1e-4)


def test_ml_dtypes_bfloat16(ctx, rng):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    q, k, v = (rng.standard_normal((1, 2, 9, 16)).astype(np.float32) for _ in range(3))
    bits = [f32_to_bf16(x) for x in (q, k, v)]
    o = ctx.attention(*(x.view(ml_dtypes.bfloat16) for x in bits))
    assert o.dtype == ml_dtypes.bfloat16
    assert o.view(np.uint16).tobytes() == ctx.attention(*bits).tobytes()


def test_float16_within_flash_attention_rule(ctx, rng):
    q, k, v = (rng.standard_normal((2, 4, n, 32)).astype(np.float16) for n in (37, 53, 53))
    o = ctx.attention(q, k, v, causal=True, sinks=np.ones(4, np.float32))
    vals = [x.astype(np.float32) for x in (q, k, v)]
    ref = reference(*vals, causal=True, sinks=np.ones(4))[0]
    lowp = reference(*vals, causal=True, sinks=np.ones(4), rounding=storage_rounding(np.float16))[0]
    assert_fa_rule(o, ref, lowp, "O")


def test_dropout_keywords(ctx, rng):
    q, k, v = (rng.standard_normal((1, 1, 5, 16)).astype(np.float32) for _ in range(3))
    a = ctx.attention(q, k, v)
    assert ctx.attention(q, k, v, dropout_p=0.0, seed=7, offset=3).tobytes() == a.tobytes()
    for bad in (-0.1, 1.0, float("nan")):
        with pytest.raises(ValueError):
            ctx.attention(q, k, v, dropout_p=bad)
    with pytest.raises(TypeError):
        ctx.attention(q, k, v, dropout_p="0.1")
    with pytest.raises(TypeError):
        ctx.attention(q, k, v, seed=1.5)
