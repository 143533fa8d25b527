"""Against torch.nn.functional.scaled_dot_product_attention where torch is
importable (not a dependency: skipped otherwise)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("M,N", [(7, 37), (37, 37), (53, 7)])
def test_matches_torch(ctx, rng, causal, M, N):
    if causal and M > N:
        pytest.skip("torch's causal mask is top-left aligned; clattn's bottom-right differs when M > N")
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((2, 4, M, 16), (2, 4, N, 16), (2, 4, N, 16)))
    tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
    if causal:
        # bottom-right alignment, as clattn: key j is allowed for row i when j <= i + N - M
        allowed = torch.ones(M, N, dtype=torch.bool).tril(diagonal=N - M)
        want = F.scaled_dot_product_attention(tq, tk, tv, attn_mask=allowed)
    else:
        want = F.scaled_dot_product_attention(tq, tk, tv)
    np.testing.assert_allclose(ctx.attention(q, k, v, causal=causal), want.numpy(), rtol=2e-4, atol=2e-5)


def test_matches_torch_bias_and_mask(ctx, rng):
    q, k, v = (rng.standard_normal((1, 2, 37, 16)).astype(np.float32) for _ in range(3))
    bias = rng.standard_normal((37, 37)).astype(np.float32)
    mask = rng.random((37, 37)) < 0.7
    mask[:, 0] = True
    got = ctx.attention(q, k, v, bias=np.where(mask, bias, np.float32(0)), mask=mask, scale=0.2)
    tb = torch.from_numpy(np.where(mask, bias, -np.inf).astype(np.float32))
    want = F.scaled_dot_product_attention(*(torch.from_numpy(x) for x in (q, k, v)), attn_mask=tb, scale=0.2)
    np.testing.assert_allclose(got, want.numpy(), rtol=2e-4, atol=2e-5)
