"""Dropout (attention's dropout_p, seed, offset) and left-padded caches
(cache_leftpad) from Python: clattn.dropout_mask against a Philox4x32-10
written here in numpy (and Random123's published answers), attention and
attention_backward with dropout against the fp64 reference on every
algorithm, and a left-padded batch against each row's keys alone."""
import numpy as np
import pytest

import clattn
from conftest import reference, reference_backward

TOL = dict(rtol=2e-4, atol=2e-5)
M0, M1, W0, W1 = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85


def philox4x32_10(c, k):
    """Philox4x32-10 over uint64 arrays holding 32-bit words (c: 4, k: 2)."""
    c = [np.asarray(x, np.uint64) & 0xFFFFFFFF for x in c]
    k0, k1 = (np.asarray(x, np.uint64) & 0xFFFFFFFF for x in k)
    for _ in range(10):
        p0, p1 = M0 * c[0], M1 * c[2]
        c = [((p1 >> 32) ^ c[1] ^ k0) & 0xFFFFFFFF, p1 & 0xFFFFFFFF, ((p0 >> 32) ^ c[3] ^ k1) & 0xFFFFFFFF,
             p0 & 0xFFFFFFFF]
        k0, k1 = (k0 + W0) & 0xFFFFFFFF, (k1 + W1) & 0xFFFFFFFF
    return c


def numpy_mask(B, H, M, N, p, seed, offset):
    """clattn's rule (docs/semantics.md): weight (b, h, i, j) kept when lane
    j % 4 of Philox at counter (offset + i 2^32 + j / 4, h, b) with key seed
    reaches floor(p 2^32)."""
    b, h, i, j = np.meshgrid(*(np.arange(n, dtype=np.uint64) for n in (B, H, M, N)), indexing="ij")
    at = (np.uint64(offset) + (i << np.uint64(32)) + (j >> np.uint64(2))) & np.uint64(2**64 - 1)
    r = philox4x32_10([at & 0xFFFFFFFF, at >> np.uint64(32), h, b], [seed & 0xFFFFFFFF, seed >> 32])
    lane = np.choose((j & 3).astype(np.int64), r)
    return lane >= np.uint64(int(np.floor(np.float64(np.float32(p)) * 2.0**32)))


def test_philox_random123_answers():
    for c, k, want in (((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
                       ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD))):
        assert [int(x) for x in philox4x32_10(c, k)] == list(want)


@pytest.mark.parametrize("p,seed,offset", [(0.1, 0, 0), (0.5, 2**64 - 1, 7), (0.9, 12345, 2**40 + 3)])
def test_dropout_mask_is_the_rule(p, seed, offset):
    got = clattn.dropout_mask(2, 3, 5, 37, p, seed=seed, offset=offset)
    assert got.dtype == np.bool_ and got.shape == (2, 3, 5, 37)
    assert (got == numpy_mask(2, 3, 5, 37, p, seed, offset)).all()
    assert clattn.dropout_mask(1, 1, 3, 3, 0.0).all()
    with pytest.raises(ValueError):
        clattn.dropout_mask(1, 1, 1, 1, 0.5, seed=-1)


@pytest.mark.parametrize("algo", ["fused", "staged", "gemm", "auto"])
def test_forward_and_backward_with_dropout(ctx, rng, algo):
    B, Hq, Hkv, M, N, d = 2, 4, 2, 37, 53, 16
    q = rng.standard_normal((B, Hq, M, d)).astype(np.float32)
    k = rng.standard_normal((B, Hkv, N, d)).astype(np.float32)
    v = rng.standard_normal((B, Hkv, N, d)).astype(np.float32)
    d_out = rng.standard_normal((B, Hq, M, d)).astype(np.float32)
    kw = dict(causal=True, sinks=rng.standard_normal(Hq).astype(np.float32), dropout_p=0.3, seed=99, offset=5)
    o, lse = ctx.attention(q, k, v, algo=algo, return_lse=True, **kw)
    want_o, want_lse, _ = reference(q, k, v, **kw)
    np.testing.assert_allclose(o, want_o, **TOL)
    np.testing.assert_allclose(lse, want_lse, **TOL)  # the softmax before dropout
    again = ctx.attention(q, k, v, algo=algo, **kw)
    assert again.tobytes() == o.tobytes()
    assert ctx.attention(q, k, v, algo=algo, **dict(kw, seed=100)).tobytes() != o.tobytes()
    if algo in ("fused", "staged"):
        got = ctx.attention_backward(q, k, v, o, lse, d_out, algo=algo, **kw)
        want = reference_backward(q, k, v, d_out, **kw)
        for g, w, name in zip(got[:3], want[:3], ("dq", "dk", "dv")):
            np.testing.assert_allclose(g, w, err_msg=name, **TOL)
        np.testing.assert_allclose(got[3], want[3], **TOL)


def test_weights_are_the_dropped_ones(ctx, rng):
    q, k, v = (rng.standard_normal((1, 2, 7, 8)).astype(np.float32) for _ in range(3))
    o, w = ctx.attention(q, k, v, return_weights=True, dropout_p=0.5, seed=3)
    want = reference(q, k, v, dropout_p=0.5, seed=3)[2]
    np.testing.assert_allclose(w, want, **TOL)
    assert ((w == 0) == ~clattn.dropout_mask(1, 2, 7, 7, 0.5, seed=3)).all()
    np.testing.assert_allclose(o, np.einsum("bhmn,bhnd->bhmd", w, v), **TOL)


def test_left_padded_rows_equal_their_keys_alone(ctx, rng):
    B, H, M, N, d = 3, 2, 4, 40, 16
    q = rng.standard_normal((B, H, M, d)).astype(np.float32)
    k = rng.standard_normal((B, H, N, d)).astype(np.float32)
    v = rng.standard_normal((B, H, N, d)).astype(np.float32)
    lens, pads = np.array([40, 25, 9], np.int32), np.array([5, 0, 9], np.int32)
    for b in range(B):  # the padding holds NaN and Inf: never read
        k[b, :, :pads[b]], v[b, :, :pads[b]] = np.nan, np.inf
    o = ctx.attention(q, k, v, causal=True, kv_lens=lens, cache_leftpad=pads)
    for b in range(B):
        keys = slice(pads[b], lens[b])
        if lens[b] == pads[b]:
            assert not o[b].any()  # no key left: an empty row
            continue
        want = reference(q[b:b + 1], k[b:b + 1, :, keys], v[b:b + 1, :, keys], causal=True)[0]
        np.testing.assert_allclose(o[b:b + 1], want, **TOL)
    with pytest.raises(ValueError):
        ctx.attention(q, k, v, cache_leftpad=pads)  # needs kv_lens


@pytest.mark.parametrize("p", [5.0, 1.0, -0.25, float("nan"), float("inf")])
def test_dropout_mask_refuses_a_probability_outside_0_1(p):
    with pytest.raises(ValueError, match="dropout_p"):
        clattn.dropout_mask(1, 1, 4, 4, p)


@pytest.mark.parametrize("p", ["0.5", None, True, np.array([0.5])])
def test_dropout_mask_refuses_a_probability_that_is_no_number(p):
    with pytest.raises(TypeError, match="dropout_p"):
        clattn.dropout_mask(1, 1, 4, 4, p)
