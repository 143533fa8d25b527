"""Random, often invalid, calls: each returns or raises TypeError, ValueError
or clattn.Error; none crashes the interpreter, and the context keeps working."""
import numpy as np

import clattn
from conftest import reference


def test_random_calls_never_crash(ctx):
    rng = np.random.default_rng(7)
    outcomes = {"ok": 0, "TypeError": 0, "ValueError": 0, "Error": 0}

    def pick(*xs):
        return xs[rng.integers(len(xs))]

    for _ in range(120):
        B, Hkv = pick(1, 2), pick(1, 2)
        # one head-dim pair only: each new pair is a kernel build (seconds on POCL)
        Hq, M, N, dk, dv = Hkv * pick(1, 2), pick(0, 1, 7, 37), pick(0, 1, 7, 53), 16, 16
        dt = pick(np.float32, np.float32, np.float16, np.float64, np.int32)
        q = rng.standard_normal((B, Hq, M, dk)).astype(dt)
        k = rng.standard_normal((B, Hkv, N, dk)).astype(dt)
        v = rng.standard_normal((B, Hkv, N, dv)).astype(dt)
        if rng.random() < 0.2:
            q = q[:, :, ::-1]
        if rng.random() < 0.2:
            k = np.swapaxes(k, 1, 2)                   # wrong layout on purpose
        if rng.random() < 0.1:
            v = v[:, :, :1]                            # keys and values differ in count
        kw = {}
        if rng.random() < 0.3:
            kw["mask"] = rng.random(pick((M, N), (N,), (B, 1, M, N), (3, M, N))) < pick(0.0, 0.5, 1.0)
        if rng.random() < 0.3:
            kw["bias"] = rng.standard_normal(pick((M, N), (Hq, 1, N), (2, 2))).astype(pick(np.float32, np.float64))
        if rng.random() < 0.3:
            kw["kv_lens"] = rng.integers(-3, N + 3, size=pick(B, B + 1)).astype(pick(np.int32, np.int64, np.float32))
        if rng.random() < 0.3:
            kw["window"] = (int(rng.integers(-3, 9)), int(rng.integers(-3, 9)))
        if rng.random() < 0.2:
            kw["softcap"] = pick(0.0, 5.0, -1.0, float("nan"), float("inf"))
        if rng.random() < 0.2:
            kw["scale"] = pick(None, 0.0, 1e30, 1e300, float("nan"), -2.0)
        if rng.random() < 0.2:
            kw["sinks"] = rng.standard_normal(pick(Hq, Hq + 1)).astype(np.float32)
        if rng.random() < 0.2:
            kw["alibi_slopes"] = np.abs(rng.standard_normal(pick(Hq, 1))).astype(np.float32)
        kw["causal"] = bool(rng.random() < 0.3)
        kw["empty_rows"] = pick("zero", "error", "zero")
        kw["algo"] = pick("auto", "staged", "fused", "gemm")
        kw["return_lse"] = bool(rng.random() < 0.3)
        kw["return_weights"] = bool(rng.random() < 0.2)
        try:
            r = ctx.attention(q, k, v, **kw)
            o = r[0] if isinstance(r, tuple) else r
            assert o.shape == (B, Hq, M, dv) and o.dtype == q.dtype
            outcomes["ok"] += 1
        except clattn.Error as e:
            assert e.status in ("INVALID_ARGUMENT", "UNSUPPORTED", "EMPTY_ROW", "BUFFER_TOO_SMALL") and e.message
            outcomes["Error"] += 1
        except TypeError:
            outcomes["TypeError"] += 1
        except ValueError:
            outcomes["ValueError"] += 1
    print(outcomes)
    assert all(outcomes.values()), outcomes   # every outcome was reached
    q = np.ones((1, 1, 7, 16), np.float32)
    np.testing.assert_allclose(ctx.attention(q, q, q), reference(q, q, q)[0], rtol=1e-5)
