"""pyopencl arrays: accepted without a copy in an embedded Context, returned
as pyopencl arrays; arrays from another OpenCL context: ValueError."""
import numpy as np
import pytest

import clattn
from conftest import reference

cl = pytest.importorskip("pyopencl")
cla = pytest.importorskip("pyopencl.array")

TOL = dict(rtol=2e-4, atol=2e-5)


def _device():
    for p in cl.get_platforms():
        for d in p.get_devices():
            return d
    pytest.skip("pyopencl sees no OpenCL device")


@pytest.fixture(scope="module")
def queue():
    try:
        c = cl.Context([_device()])
    except cl.Error as e:  # pragma: no cover
        pytest.skip("pyopencl cannot create a context: %s" % e)
    return cl.CommandQueue(c)


@pytest.fixture(scope="module")
def embedded(queue):
    ctx = clattn.Context(queue=queue)
    yield ctx
    ctx.close()


def test_embedded_context_uses_the_queue(embedded, queue):
    assert embedded.device_name == queue.device.name.strip()


def test_zero_copy_inputs_and_outputs(embedded, queue, rng, monkeypatch):
    made = []
    real = embedded._new_buffer
    monkeypatch.setattr(embedded, "_new_buffer", lambda *a: made.append(a) or real(*a))
    B, Hq, Hkv, M, N = 1, 4, 2, 37, 53
    q = rng.standard_normal((B, Hq, M, 16)).astype(np.float32)
    # k and v live in one device buffer, as a strided [B,S,H,D] view of it
    kv = rng.standard_normal((B, N, 2, Hkv, 16)).astype(np.float32)
    mask = rng.random((M, N)) < 0.8
    dq, dkv = cla.to_device(queue, q), cla.to_device(queue, kv)
    dk, dv = dkv[:, :, 0], dkv[:, :, 1]
    assert dk.base_data.int_ptr == dkv.base_data.int_ptr and not dk.flags.c_contiguous
    dmask = cla.to_device(queue, mask.astype(np.uint8))
    k = kv[:, :, 0].transpose(0, 2, 1, 3)
    v = kv[:, :, 1].transpose(0, 2, 1, 3)
    dqs = cla.to_device(queue, np.ascontiguousarray(q.transpose(0, 2, 1, 3)))
    o, lse = embedded.attention(dqs, dk, dv, layout="bshd", mask=dmask, causal=True, return_lse=True)
    assert isinstance(o, cla.Array) and isinstance(lse, cla.Array)
    assert o.context.int_ptr == queue.context.int_ptr
    assert o.shape == (B, M, Hq, 16) and lse.shape == (B, Hq, M)
    ro, rl, _ = reference(q, k, v, mask=mask, causal=True)
    np.testing.assert_allclose(o.get(), ro.transpose(0, 2, 1, 3), **TOL)
    np.testing.assert_allclose(lse.get(), rl, **TOL)
    assert made == []                        # no buffer made: nothing copied in or out
    assert dq.get().tobytes() == q.tobytes()  # inputs untouched


def test_offset_views_and_small_arrays(embedded, queue, rng):
    q, k, v = (rng.standard_normal((2, 2, 7, 16)).astype(np.float32) for _ in range(3))
    big = cla.to_device(queue, np.concatenate([q.ravel(), q.ravel()]))
    dq = big[q.size:].reshape(q.shape)                    # a view at an element offset
    assert dq.offset == q.size * 4
    kv_lens = cla.to_device(queue, np.array([5, 7], np.int32))
    o = embedded.attention(dq, cla.to_device(queue, k), cla.to_device(queue, v), kv_lens=kv_lens)
    np.testing.assert_allclose(o.get(), reference(q, k, v, kv_lens=[5, 7])[0], **TOL)


def test_mixed_numpy_and_pyopencl(embedded, queue, rng):
    q, k, v = (rng.standard_normal((1, 1, 7, 16)).astype(np.float32) for _ in range(3))
    o = embedded.attention(q, cla.to_device(queue, k), v)
    assert isinstance(o, np.ndarray)
    np.testing.assert_allclose(o, reference(q, k, v)[0], **TOL)
    o = embedded.attention(cla.to_device(queue, q), k, v)
    assert isinstance(o, cla.Array)


def test_other_context_is_value_error(ctx, embedded, queue, rng):
    q = cla.to_device(queue, rng.standard_normal((1, 1, 7, 16)).astype(np.float32))
    with pytest.raises(ValueError):
        ctx.attention(q, q, q)           # ctx has its own OpenCL context
    other = cl.CommandQueue(cl.Context([queue.device]))
    k = cla.to_device(other, rng.standard_normal((1, 1, 7, 16)).astype(np.float32))
    with pytest.raises(ValueError):
        embedded.attention(q, k, q)
    with pytest.raises(ValueError):
        embedded.attention(q, q, q, mask=cla.to_device(other, np.ones((7, 7), np.uint8)))


def test_merge_states_on_pyopencl(embedded, queue, rng):
    q, k, v = (rng.standard_normal((1, 2, 7, 16)).astype(np.float32) for _ in range(3))
    dq = cla.to_device(queue, q)
    parts = [embedded.attention(dq, cla.to_device(queue, np.ascontiguousarray(k[:, :, lo:hi])),
                                cla.to_device(queue, np.ascontiguousarray(v[:, :, lo:hi])), return_lse=True)
             for lo, hi in ((0, 3), (3, 7))]
    o_states = cla.to_device(queue, np.stack([p[0].get() for p in parts]))
    l_states = cla.to_device(queue, np.stack([p[1].get() for p in parts]))
    o, lse = embedded.merge_states(o_states, l_states, return_lse=True)
    assert isinstance(o, cla.Array) and isinstance(lse, cla.Array)
    ro, rl, _ = reference(q, k, v)
    np.testing.assert_allclose(o.get(), ro, **TOL)
    np.testing.assert_allclose(lse.get(), rl, **TOL)
