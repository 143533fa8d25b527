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
def rng():
    return np.random.default_rng(1234)


def reference(q, k, v, causal=False, window=(-1, -1), mask=None, bias=None, kv_lens=None,
              scale=None, softcap=0.0, alibi_slopes=None, sinks=None):
    """fp64 attention over [B,H,S,D] arrays, following clattn's semantics:
    score, softcap, + bias − ALiBi, disallowed keys removed, softmax with the
    sink in the denominator. Returns (O, lse, weights); empty rows give O = 0,
    weights 0 and lse −inf (or the sink)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    B, H, M, dk = q.shape
    Hkv, N = k.shape[1], k.shape[2]
    k = np.repeat(k, H // Hkv, axis=1)
    v = np.repeat(v, H // Hkv, axis=1)
    sc = 1.0 / np.sqrt(dk) if scale is None else scale
    s = sc * np.einsum("bhmd,bhnd->bhmn", q, k)
    if softcap:
        s = softcap * np.tanh(s / softcap)
    if bias is not None:
        s = s + np.asarray(bias, np.float64)
    i = np.arange(M)[:, None]
    j = np.arange(N)[None, :]
    p = i + (N - M)
    if alibi_slopes is not None:
        s = s - np.asarray(alibi_slopes, np.float64)[None, :, None, None] * np.abs(p - j)
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
        a = np.where(l[..., None] > 0, e / l[..., None], 0.0)
        lse = np.where(l > 0, np.log(l) + m_safe, -np.inf)
    o = np.einsum("bhmn,bhnd->bhmd", a, v)
    return o, lse, a


def pytest_report_header(config):
    from clattn import _ffi
    try:
        path = _ffi.lib().path
    except OSError as e:
        path = str(e)
    return "clattn: module %s, library %s" % (clattn.__file__, path)
