"""Shared fixtures: one clattn.Context for the whole run (kernel builds are
slow on POCL), the fp64 numpy reference and a seeded generator."""
import numpy as np
import pytest

import clattn


@pytest.fixture(scope="session")
def ctx():
    c = clattn.Context()
    yield c
    c.close()


@pytest.fixture
def cl_queue():
    """A pyopencl queue on the first device pyopencl sees (the test skipped
    without pyopencl or a device)."""
    cl = pytest.importorskip("pyopencl")
    try:
        dev = [d for p in cl.get_platforms() for d in p.get_devices()][0]
        return cl.CommandQueue(cl.Context([dev]))
    except (IndexError, cl.Error):
        pytest.skip("pyopencl sees no usable device")


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def dropout_factors(shape, dropout_p=0.0, seed=0, offset=0):
    """Dropout's factor of each weight [B,H,M,N]: 1 / (1 - p) where
    clattn.dropout_mask keeps it, else 0 (all 1 without dropout)."""
    if not dropout_p:
        return np.ones(shape)
    keep = clattn.dropout_mask(*shape, dropout_p, seed, offset)
    return np.where(keep, np.float64(np.float32(1.0 / (1.0 - np.float64(np.float32(dropout_p))))), 0.0)


def reference(q, k, v, causal=False, window=(-1, -1), mask=None, bias=None, kv_lens=None,
              scale=None, softcap=0.0, alibi_slopes=None, sinks=None, rounding=None, _parts=False,
              dropout_p=0.0, seed=0, offset=0):
    """fp64 attention over [B,H,S,D] arrays, following clattn's semantics:
    score, softcap, + bias − ALiBi (slopes [H] or [B, H]), disallowed keys
    removed, softmax with the sink in the denominator, dropout's factors on
    the weights that mix V. Returns (O, lse, weights: those that mixed V);
    empty rows give O = 0, weights 0 and lse −inf (or the sink).
    rounding: a function applied to the scores, weights and O (the same
    computation in a storage precision, FlashAttention's comparison)."""
    rnd = rounding or (lambda x: x)
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    B, H, M, dk = q.shape
    Hkv, N = k.shape[1], k.shape[2]
    k = np.repeat(k, H // Hkv, axis=1)
    v = np.repeat(v, H // Hkv, axis=1)
    sc = 1.0 / np.sqrt(dk) if scale is None else scale
    raw = rnd(sc * np.einsum("bhmd,bhnd->bhmn", q, k))
    s = raw
    if softcap:
        s = softcap * np.tanh(s / softcap)
    if bias is not None:
        s = s + np.asarray(bias, np.float64)
    i = np.arange(M)[:, None]
    j = np.arange(N)[None, :]
    p = i + (N - M)
    if alibi_slopes is not None:  # [H] per head, or [B, H] per batch row
        slopes = np.asarray(alibi_slopes, np.float64)
        slopes = slopes[None, :, None, None] if slopes.ndim == 1 else slopes[:, :, None, None]
        s = s - slopes * np.abs(p - j)
    allowed = np.ones((B, H, M, N), bool)
    wl, wr = window
    if causal:
        wr = 0
    if wl >= 0:
        allowed &= j >= p - wl
    if wr >= 0:
        allowed &= j <= p + wr
    if mask is not None:
        allowed &= np.broadcast_to(np.asarray(mask) != 0, (B, H, M, N))
    if kv_lens is not None:
        allowed &= j[None, None] < np.asarray(kv_lens)[:, None, None, None]
    s = np.where(allowed, s, -np.inf)
    m = s.max(axis=-1)
    if sinks is not None:
        sink = np.broadcast_to(np.asarray(sinks, np.float64)[None, :, None], m.shape)
        m = np.maximum(m, sink)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    e = np.where(allowed, np.exp(s - m_safe[..., None]), 0.0)
    l = e.sum(axis=-1)
    if sinks is not None:
        l = l + np.exp(sink - m_safe)
    with np.errstate(divide="ignore", invalid="ignore"):
        a = rnd(np.where(l[..., None] > 0, e / l[..., None], 0.0))
        lse = np.where(l > 0, np.log(l) + m_safe, -np.inf)
    z = dropout_factors(a.shape, dropout_p, seed, offset)
    o = rnd(np.einsum("bhmn,bhnd->bhmd", a * z, v))
    if _parts:
        return o, lse, a, dict(raw=raw, k=k, v=v, q=q, scale=sc, allowed=allowed, z=z)
    return o, lse, a * z


def reference_backward(q, k, v, d_out, rounding=None, **kw):
    """The gradients of reference() (same keywords) by L = sum dO . O, in
    fp64 (rounding: each product rounded, as reference's): dq, dk, dv, then
    d_sinks [H] (None without sinks) and d_scores [B,H,M,N], dL by each
    shaped score after the bias (the bias's gradient before any broadcast
    sum)."""
    rnd = rounding or (lambda x: x)
    Hkv = np.shape(k)[1]
    o, lse, a, pt = reference(q, k, v, rounding=rounding, _parts=True, **kw)
    d_out = np.asarray(d_out, np.float64)
    H = a.shape[1]
    group = H // Hkv
    dp = rnd(np.einsum("bhmd,bhnd->bhmn", d_out, pt["v"])) * pt["z"]
    D = (d_out * o).sum(-1)
    ds = rnd(np.where(a != 0, a * (dp - D[..., None]), 0.0))
    dsr = ds
    if kw.get("softcap"):
        t = np.tanh(pt["raw"] / kw["softcap"])
        dsr = ds * (1.0 - t * t)
    dq = rnd(pt["scale"] * np.einsum("bhmn,bhnd->bhmd", dsr, pt["k"]))
    dk_h = pt["scale"] * np.einsum("bhmn,bhmd->bhnd", dsr, pt["q"])
    dv_h = np.einsum("bhmn,bhmd->bhnd", a * pt["z"], d_out)
    B, _, N, _ = dk_h.shape
    dk = rnd(dk_h.reshape(B, Hkv, group, N, -1).sum(2))
    dv = rnd(dv_h.reshape(B, Hkv, group, N, -1).sum(2))
    d_sinks = None
    if kw.get("sinks") is not None:
        sink = np.asarray(kw["sinks"], np.float64)[None, :, None]
        with np.errstate(invalid="ignore"):
            p_sink = np.where(np.isfinite(lse), np.exp(sink - lse), 0.0)
        d_sinks = -(p_sink * D).sum(axis=(0, 2))
    return dq, dk, dv, d_sinks, ds


def storage_rounding(dtype):
    """x rounded to a 16-bit storage and back: float16, or bfloat16 (named
    "bfloat16": round to nearest even on the f32 bits)."""
    if dtype == np.float16:
        return lambda x: np.asarray(x, np.float64).astype(np.float16).astype(np.float64)

    def bf16(x):
        return bf16_to_f32(f32_to_bf16(np.asarray(x, np.float32))).astype(np.float64)
    return bf16


def f32_to_bf16(x):
    """float32 to bfloat16 bit patterns (np.uint16), round to nearest even."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(0x7FC0), r)


def bf16_to_f32(h):
    return (np.asarray(h, np.uint16).astype(np.uint32) << 16).view(np.float32)


def assert_fa_rule(got, ref, ref_lowp, name, slack=1e-5):
    """FlashAttention's tolerance rule: the error against the fp64 reference
    at most twice that of the same computation in the storage precision."""
    got, ref, ref_lowp = (np.asarray(x, np.float64) for x in (got, ref, ref_lowp))
    assert np.isfinite(got).all() == np.isfinite(ref).all(), name
    err = np.nanmax(np.abs(got - ref))
    allowed = 2 * np.nanmax(np.abs(ref_lowp - ref)) + slack
    assert err <= allowed, "%s: max error %.3g vs fp64, twice the storage precision's %.3g" % (name, err, allowed)


def pytest_report_header(config):
    from clattn import _ffi
    try:
        path = _ffi.lib().path
    except OSError as e:
        path = str(e)
    return "clattn: module %s, library %s" % (clattn.__file__, path)
