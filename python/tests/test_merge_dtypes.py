"""merge_states' out_dtype: float16 and bfloat16 outputs (bfloat16 as uint16
bits, or ml_dtypes.bfloat16 when that dtype is passed), each element the
float32 merge rounded to nearest even; FlashAttention's combine rule."""
import numpy as np
import pytest

from conftest import assert_fa_rule, bf16_to_f32, f32_to_bf16, reference, storage_rounding


def states(ctx, rng, B=2, H=3, M=7, N=53, d=24):
    q = rng.standard_normal((B, H, M, d)).astype(np.float32)
    k = rng.standard_normal((B, H, N, d)).astype(np.float32)
    v = rng.standard_normal((B, H, N, d)).astype(np.float32) * 10
    os_, ls_ = [], []
    for lo, hi in ((0, 20), (20, 21), (21, N)):
        o, lse = ctx.attention(q, k[:, :, lo:hi], v[:, :, lo:hi], return_lse=True)
        os_.append(o)
        ls_.append(lse)
    os_.append(np.full_like(os_[0], np.nan))  # a state that saw no key: adds nothing
    ls_.append(np.full_like(ls_[0], -np.inf))
    return np.stack(os_), np.stack(ls_), reference(q, k, v)[0]


@pytest.mark.parametrize("out_dtype", ["float16", np.float16, "bfloat16"])
def test_16bit_outputs_are_the_rounded_f32_merge(ctx, rng, out_dtype):
    o, lse, ref = states(ctx, rng)
    o32, lse32 = ctx.merge_states(o, lse, return_lse=True)
    o16, lse16 = ctx.merge_states(o, lse, out_dtype=out_dtype, return_lse=True)
    assert lse16.dtype == np.float32 and lse16.tobytes() == lse32.tobytes()
    if out_dtype == "bfloat16":
        assert o16.dtype == np.uint16 and o16.tobytes() == f32_to_bf16(o32).tobytes()
        assert_fa_rule(bf16_to_f32(o16), ref, storage_rounding("bfloat16")(ref), "O", slack=1e-4)
    else:
        assert o16.dtype == np.float16 and o16.tobytes() == o32.astype(np.float16).tobytes()
        assert_fa_rule(o16, ref, storage_rounding(np.float16)(ref), "O", slack=1e-4)


def test_ml_dtypes_bfloat16(ctx, rng):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    o, lse, _ = states(ctx, rng, B=1, H=1, M=3)
    got = ctx.merge_states(o, lse, out_dtype=ml_dtypes.bfloat16)
    bits = ctx.merge_states(o, lse, out_dtype="bfloat16")
    assert got.dtype == ml_dtypes.bfloat16 and got.view(np.uint16).tobytes() == bits.tobytes()


@pytest.mark.parametrize("bad", ["float64", "q8_0", np.int32, 3.5])
def test_bad_out_dtype(ctx, rng, bad):
    o = np.zeros((1, 1, 1, 2, 4), np.float32)
    lse = np.zeros((1, 1, 1, 2), np.float32)
    with pytest.raises((TypeError, ValueError)):
        ctx.merge_states(o, lse, out_dtype=bad)
