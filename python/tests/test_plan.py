"""clattn.Plan (Context.plan): an attention call made once, run per step;
each step bitwise the Context.attention of the same arguments."""
import numpy as np
import pytest

import clattn
from conftest import reference

TOL = dict(rtol=2e-4, atol=2e-5)


def _decode_problem(rng, B=1, Hq=4, Hkv=2, N=600, d=32):
    q = rng.standard_normal((B, Hq, 1, d)).astype(np.float32)
    k = rng.standard_normal((B, Hkv, N, d)).astype(np.float32)
    v = rng.standard_normal((B, Hkv, N, d)).astype(np.float32)
    return q, k, v


def test_steps_equal_attention_bitwise(ctx, rng):
    q, k, v = _decode_problem(rng)
    with ctx.plan(q, k, v, causal=True, return_lse=True) as plan:
        assert isinstance(plan, clattn.Plan)
        for n in (600, 599, 300, 513, 1, 600):  # the key split changes with the length
            o, lse = plan(kv_len=n)
            want_o, want_lse = ctx.attention(q, k[:, :, :n], v[:, :, :n], causal=True, return_lse=True)
            np.testing.assert_array_equal(o, want_o)
            np.testing.assert_array_equal(lse, want_lse)
            ref_o, ref_lse, _ = reference(q, k[:, :, :n], v[:, :, :n], causal=True)
            np.testing.assert_allclose(o, ref_o, **TOL)
        np.testing.assert_array_equal(plan.out, o)
        o2 = plan()  # as planned: all 600 keys
        np.testing.assert_array_equal(o2[0], ctx.attention(q, k, v, causal=True))


def test_refused_step_names_the_field_and_plan_keeps_working(ctx, rng):
    q, k, v = _decode_problem(rng, N=64)
    plan = ctx.plan(q, k, v)
    with pytest.raises(clattn.Error) as e:
        plan(kv_len=65)
    assert e.value.status == "INVALID_ARGUMENT" and "step.kv_len" in e.value.message
    with pytest.raises(clattn.Error) as e:
        plan(q_offset=10**6)
    assert e.value.status == "BUFFER_TOO_SMALL" and "step.q_offset" in e.value.message
    with pytest.raises(clattn.Error) as e:
        plan(lse_offset=0)  # no lse asked for
    assert "step.lse_offset" in e.value.message
    with pytest.raises(TypeError):
        plan(out_offset=1.5)
    with pytest.raises(ValueError):
        plan(kv_len=0)
    np.testing.assert_array_equal(plan(kv_len=40), ctx.attention(q, k[:, :, :40], v[:, :, :40]))
    plan.close()
    with pytest.raises(ValueError):
        plan()


def test_bad_params_are_refused_at_creation(ctx, rng):
    q, k, v = _decode_problem(rng, Hq=3, Hkv=2, N=16)  # kv_heads does not divide q_heads
    with pytest.raises(clattn.Error) as e:
        ctx.plan(q, k, v)
    assert e.value.status == "INVALID_ARGUMENT"
    with pytest.raises(TypeError):
        ctx.plan(q.astype(np.float64), k, v)


def test_closing_the_context_closes_its_plans(rng):
    c = clattn.Context()
    q, k, v = _decode_problem(rng, N=32)
    plan = c.plan(q, k, v)
    plan(kv_len=16)
    c.close()
    with pytest.raises(ValueError):
        plan()


cl = pytest.importorskip("pyopencl")
cla = pytest.importorskip("pyopencl.array")


@pytest.fixture(scope="module")
def queue():
    for p in cl.get_platforms():
        for d in p.get_devices():
            return cl.CommandQueue(cl.Context([d]))
    pytest.skip("pyopencl sees no OpenCL device")


@pytest.fixture(scope="module")
def embedded(queue):
    c = clattn.Context(queue=queue)
    yield c
    c.close()


def test_device_resident_decode_loop(embedded, queue, rng):
    """A decode loop over pyopencl arrays: q and the cache change between
    steps in place, q moves between slots, the output is written in place."""
    B, Hq, Hkv, N, d, slots = 1, 4, 2, 520, 32, 3
    q_all = cla.to_device(queue, rng.standard_normal((slots, B, Hq, 1, d)).astype(np.float32))
    k_host = rng.standard_normal((B, Hkv, N, d)).astype(np.float32)
    v_host = rng.standard_normal((B, Hkv, N, d)).astype(np.float32)
    k, v = cla.to_device(queue, k_host), cla.to_device(queue, v_host)
    plan = embedded.plan(q_all[0], k, v, causal=True)
    out = plan.out
    slot = B * Hq * d
    for step, n in enumerate((500, 501, 502, 520)):
        k_host[:, :, n - 1] = rng.standard_normal((B, Hkv, d))  # the new key of this step
        k.set(k_host)
        o = plan(kv_len=n, q_offset=plan.q_offset + (step % slots) * slot)
        assert o is out
        want = embedded.attention(q_all[step % slots], k[:, :, :n], v[:, :, :n], causal=True)
        np.testing.assert_array_equal(o.get(), want.get())
    plan.close()
