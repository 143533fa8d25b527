"""clattn.Plan (Context.plan): an attention call made once, run per step;
each step bitwise the Context.attention of the same arguments."""
import threading
import time

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
    with pytest.raises(ValueError, match="not a multiple"):  # checked on the host, as attention checks it
        ctx.plan(q, k, v)
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


def _slow_steps(monkeypatch, seconds, inside=None):
    """Wraps the plan library's enqueue: each step sleeps `seconds` after
    enqueuing, widening the window a descheduled thread would leave between
    a step's enqueue and its read-back; inside (a list) counts the steps
    under way."""
    from clattn import _plan
    plib = _plan._lib()
    real = plib.enqueue

    def enqueue(*args):
        if inside is not None:
            inside.append(1)
        try:
            st = real(*args)
            time.sleep(seconds)
            return st
        finally:
            if inside is not None:
                inside.pop()
    monkeypatch.setattr(plib, "enqueue", enqueue)
    return plib


def test_context_close_waits_for_a_step_in_flight_before_releasing_its_plan(rng, monkeypatch):
    c = clattn.Context()
    q, k, v = _decode_problem(rng, N=64)
    plan = c.plan(q, k, v)
    want = plan()
    inside, released_during_step = [], []
    plib = _slow_steps(monkeypatch, 0.3, inside)
    real_release = plib.release
    monkeypatch.setattr(plib, "release", lambda ptr: (released_during_step.append(bool(inside)), real_release(ptr)))
    res = {}

    def step():
        try:
            res["o"] = plan()
        except BaseException as e:  # noqa: B902 - reported below
            res["e"] = e
    th = threading.Thread(target=step)
    th.start()
    while not inside and th.is_alive():
        time.sleep(0.001)
    c.close()  # a step is under way: close waits for it
    th.join()
    assert released_during_step == [False], "the plan was released while a step was under way"
    np.testing.assert_array_equal(res.get("o"), want)
    with pytest.raises(ValueError):
        plan()


def test_steps_of_one_plan_from_two_threads_each_get_their_own_output(ctx, rng, monkeypatch):
    q, k, v = _decode_problem(rng, N=64)
    plan = ctx.plan(q, k, v)
    want = {n: plan(kv_len=n) for n in (20, 64)}
    _slow_steps(monkeypatch, 0.01)
    wrong = []

    def steps(n):
        for _ in range(25):
            if not np.array_equal(plan(kv_len=n), want[n]):
                wrong.append(n)
    threads = [threading.Thread(target=steps, args=(n,)) for n in want]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    plan.close()
    assert not wrong, "%d of 50 steps returned the other thread's output" % len(wrong)


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
