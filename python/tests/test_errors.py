"""Bad inputs: TypeError, ValueError or clattn.Error, never a crash; checked
before any device work."""
import numpy as np
import pytest

import clattn


def ok(rng, dtype=np.float32, B=1, Hq=2, Hkv=1, M=7, N=9, dk=16, dv=16):
    return (rng.standard_normal((B, Hq, M, dk)).astype(dtype),
            rng.standard_normal((B, Hkv, N, dk)).astype(dtype),
            rng.standard_normal((B, Hkv, N, dv)).astype(dtype))


@pytest.fixture
def no_buffers(ctx, monkeypatch):
    """Fails the test if the binding makes any OpenCL buffer: bad input must
    be refused before any device work."""
    def refuse(*a):
        raise AssertionError("a buffer was made before the input was refused")
    monkeypatch.setattr(ctx, "_new_buffer", refuse)


def test_error_class():
    assert issubclass(clattn.Error, RuntimeError)


@pytest.mark.parametrize("dtype", [np.float64, np.int32, np.int8, np.complex64, bool])
def test_wrong_dtypes(ctx, rng, dtype, no_buffers):
    q, k, v = ok(rng)
    with pytest.raises(TypeError):
        ctx.attention(q.astype(dtype), k, v)
    with pytest.raises(TypeError):
        ctx.attention(*(x.astype(dtype) for x in (q, k, v)))


def test_mixed_dtypes(ctx, rng):
    q, k, v = ok(rng)
    with pytest.raises(TypeError):
        ctx.attention(q, k.astype(np.float16), v)


@pytest.mark.parametrize("case", [
    "q3d", "batch", "head_dim", "kv_len", "kv_heads", "gqa", "empty", "mask_shape", "bias_shape",
    "kv_lens_shape", "slopes_shape", "sinks_shape", "window", "window_arity", "layout", "algo",
    "empty_rows", "softcap", "scale_inf"])
def test_value_errors(ctx, rng, case, no_buffers):
    q, k, v = ok(rng)
    kw = {}
    if case == "q3d":
        q = q[0]
    elif case == "batch":
        k = np.concatenate([k, k])
    elif case == "head_dim":
        k = k[..., :8]
    elif case == "kv_len":
        v = v[:, :, :5]
    elif case == "kv_heads":
        v = np.concatenate([v, v], axis=1)
    elif case == "gqa":
        q = np.concatenate([q, q[:, :1]], axis=1)
        k = np.concatenate([k, k], axis=1)
        v = np.concatenate([v, v], axis=1)
    elif case == "empty":
        q = q[:, :, :0]
    elif case == "mask_shape":
        kw["mask"] = np.ones((7, 8), bool)
    elif case == "bias_shape":
        kw["bias"] = np.zeros((3, 7, 9), np.float32)
    elif case == "kv_lens_shape":
        kw["kv_lens"] = np.array([3, 4], np.int32)
    elif case == "slopes_shape":
        kw["alibi_slopes"] = np.ones(3, np.float32)
    elif case == "sinks_shape":
        kw["sinks"] = np.ones((2, 1), np.float32)
    elif case == "window":
        kw["window"] = (-2, 0)
    elif case == "window_arity":
        kw["window"] = (1, 2, 3)
    elif case == "layout":
        kw["layout"] = "bhds"
    elif case == "algo":
        kw["algo"] = "fastest"
    elif case == "empty_rows":
        kw["empty_rows"] = "nan"
    elif case == "softcap":
        kw["softcap"] = -1.0
    elif case == "scale_inf":
        kw["scale"] = float("inf")
    with pytest.raises((ValueError, TypeError)):
        ctx.attention(q, k, v, **kw)


@pytest.mark.parametrize("case", ["mask_float", "bias_f64", "kv_lens_float", "slopes_f64", "window_float"])
def test_type_errors(ctx, rng, case, no_buffers):
    q, k, v = ok(rng)
    kw = {"mask_float": dict(mask=np.ones((7, 9), np.float32)),
          "bias_f64": dict(bias=np.zeros((7, 9))),
          "kv_lens_float": dict(kv_lens=np.array([3.0], np.float32)),
          "slopes_f64": dict(alibi_slopes=np.ones(2)),
          "window_float": dict(window=(1.5, 0))}[case]
    with pytest.raises(TypeError):
        ctx.attention(q, k, v, **kw)


def test_library_error_has_status_and_message(ctx, rng):
    q, k, v = ok(rng)
    # the fused path cannot return the routing matrix: a status from the library
    with pytest.raises(clattn.Error) as e:
        ctx.attention(q, k, v, algo="fused", return_weights=True)
    assert e.value.status in ("INVALID_ARGUMENT", "UNSUPPORTED")
    assert e.value.message and e.value.status in str(e.value)
    # the context still works
    assert np.isfinite(ctx.attention(q, k, v)).all()


def test_no_device():
    with pytest.raises(clattn.Error) as e:
        clattn.Context(device="no such device, surely")
    assert e.value.status == "NO_DEVICE" and e.value.message


def test_bad_context_arguments():
    with pytest.raises(TypeError):
        clattn.Context(device=3)
    with pytest.raises(TypeError):
        clattn.Context(queue="not a queue")


def test_closed_context(rng):
    c = clattn.Context()
    c.close()
    c.close()
    with pytest.raises(ValueError):
        c.attention(*ok(rng))


def test_inputs_untouched(ctx, rng):
    q, k, v = ok(rng)
    before = [x.copy() for x in (q, k, v)]
    ctx.attention(q, k, v, causal=True)
    for a, b in zip(before, (q, k, v)):
        assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("name", ["dropout_p", "scale", "softcap"])
@pytest.mark.parametrize("huge", [10**400, -10**400], ids=["plus", "minus"])
def test_huge_ints_for_float_keywords_raise_the_documented_errors(ctx, rng, name, huge, no_buffers):
    """Python ints past any float (float() overflows) are refused as out of
    range, through every entry point that takes the keyword."""
    q, k, v = ok(rng)
    calls = [lambda: ctx.attention(q, k, v, **{name: huge}), lambda: ctx.plan(q, k, v, **{name: huge})]
    if name == "dropout_p":
        calls.append(lambda: clattn.dropout_mask(1, 2, 7, 9, huge))
    else:
        calls.append(lambda: ctx.attention_with_kvcache(q, k, v, cache_seqlens=np.array([9], np.int32),
                                                         **{name: huge}))
    for call in calls:
        with pytest.raises((TypeError, ValueError, clattn.Error)) as e:
            call()
        assert not isinstance(e.value, OverflowError) and name in str(e.value)
