"""merge_states and the route diagnostics (return_diagnostics)."""
import numpy as np
import pytest

import clattn
from conftest import reference

TOL = dict(rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("algo", ["staged", "fused", "gemm"])
def test_diagnostics(ctx, rng, algo):
    q = rng.standard_normal((2, 2, 37, 16)).astype(np.float32)
    k = rng.standard_normal((2, 1, 53, 16)).astype(np.float32)
    v = rng.standard_normal((2, 1, 53, 16)).astype(np.float32)
    mask = np.ones((37, 53), bool)
    mask[5] = False                                     # one empty row
    o, lse, d = ctx.attention(q, k, v, mask=mask, causal=True, algo=algo, return_lse=True,
                              return_diagnostics=True)
    _, _, a = reference(q, k, v, mask=mask, causal=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        ent = -np.where(a > 0, a * np.log(a), 0.0).sum(-1)
    assert set(d) == {"entropy", "max_weight", "argmax"}
    assert d["entropy"].shape == (2, 2, 37) and d["argmax"].dtype == np.int32
    np.testing.assert_allclose(d["entropy"], ent, rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(d["max_weight"], a.max(-1), **TOL)
    want = np.where(a.max(-1) > 0, a.argmax(-1), -1)
    assert np.array_equal(d["argmax"], want)
    assert np.all(d["entropy"][:, :, 5] == 0) and np.all(d["argmax"][:, :, 5] == -1)


def test_diagnostics_with_weights_order(ctx, rng):
    q, k, v = (rng.standard_normal((1, 1, 7, 16)).astype(np.float32) for _ in range(3))
    r = ctx.attention(q, k, v, return_weights=True, return_diagnostics=True)
    assert len(r) == 3 and r[1].shape == (1, 1, 7, 7) and isinstance(r[2], dict)


def test_merge_states_equals_the_whole(ctx, rng):
    B, H, M, N, d = 1, 2, 7, 53, 16
    q = rng.standard_normal((B, H, M, d)).astype(np.float32)
    k = rng.standard_normal((B, H, N, d)).astype(np.float32)
    v = rng.standard_normal((B, H, N, d)).astype(np.float32)
    parts = [(0, 20), (20, 37), (37, 53)]
    os_, ls_ = [], []
    for lo, hi in parts:
        o, lse = ctx.attention(q, k[:, :, lo:hi], v[:, :, lo:hi], return_lse=True)
        os_.append(o)
        ls_.append(lse)
    # a state that saw no key adds nothing, whatever its O holds
    os_.append(np.full_like(os_[0], np.nan))
    ls_.append(np.full_like(ls_[0], -np.inf))
    o, lse = ctx.merge_states(np.stack(os_), np.stack(ls_), return_lse=True)
    ro, rl, _ = reference(q, k, v)
    np.testing.assert_allclose(o, ro, **TOL)
    np.testing.assert_allclose(lse, rl, **TOL)
    # without return_lse the call returns O alone (the third-wave contract: o = ctx.merge_states(...))
    alone = ctx.merge_states(np.stack(os_), np.stack(ls_))
    assert isinstance(alone, np.ndarray) and alone.shape == (B, H, M, d)
    np.testing.assert_array_equal(alone, o)


def test_merge_states_empty_rows_and_errors(ctx):
    o = np.zeros((2, 1, 1, 3, 4), np.float32)
    lse = np.full((2, 1, 1, 3), -np.inf, np.float32)
    out, out_lse = ctx.merge_states(o, lse, return_lse=True)
    assert np.all(out == 0) and np.all(np.isneginf(out_lse))
    with pytest.raises(clattn.Error) as e:
        ctx.merge_states(o, lse, empty_rows="error")
    assert e.value.status == "EMPTY_ROW"
    with pytest.raises(TypeError):
        ctx.merge_states(o.astype(np.float64), lse)
    with pytest.raises(ValueError):
        ctx.merge_states(o, lse[:, :, :, :2])
    with pytest.raises(ValueError):
        ctx.merge_states(o[0], lse[0])


@pytest.mark.parametrize("algo", ["staged", "fused", "gemm"])
def test_last_route_names_the_algorithm_and_kernels(ctx, rng, algo):
    q, k, v = (rng.standard_normal((1, 2, 7, 16)).astype(np.float32) for _ in range(3))
    ctx.attention(q, k, v, algo=algo)
    name, _, kernels = ctx.last_route().partition(": ")
    assert name == algo and kernels
    if algo == "staged":
        assert kernels == "qk_score, softmax_rows, mix_values"
