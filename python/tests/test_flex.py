"""Modifiers (FlexAttention's score_mod / mask_mod in OpenCL C):
Context.flex_attention with each of clattn.modifiers against an fp64 numpy
reference of the same function, on every path, odd shapes, GQA, batch 2,
decode and packed sequences; block masks (bitwise the same output, their
counts); the backward through modifiers against the built-in features they
equal; errors; and torch's flex_attention where torch has it.

Kernel programs are built per modifier, path and head dim, slowly on POCL:
the forward tests use one head dim, 48 (not a power of two; one of
tests/test_modifiers.c's), the backward ones 16 (test_backward.py's)."""
import os

import numpy as np
import pytest

import clattn
from clattn import modifiers

TOL = dict(rtol=2e-4, atol=2e-5)
B, HQ, HKV = 2, 4, 2


def qkv(rng, M, N, d, b=B, hq=HQ, hkv=HKV):
    return (rng.standard_normal((b, hq, M, d)).astype(np.float32),
            rng.standard_normal((b, hkv, N, d)).astype(np.float32),
            rng.standard_normal((b, hkv, N, d)).astype(np.float32))


def flex_reference(q, k, v, score_fn=None, mask_fn=None, scale=None):
    """fp64 attention of [B,H,S,D] arrays with a score function
    score_fn(s, b, h, q_idx, kv_idx) and a mask function
    mask_fn(b, h, q_idx, kv_idx) of broadcast index grids, q_idx = N - M + i.
    Returns (O, lse); a row with no allowed key gives O = 0, lse = -inf."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    nb, H, M, dk = q.shape
    N = k.shape[2]
    k = np.repeat(k, H // k.shape[1], axis=1)
    v = np.repeat(v, H // v.shape[1], axis=1)
    s = (1.0 / np.sqrt(dk) if scale is None else scale) * np.einsum("bhmd,bhnd->bhmn", q, k)
    b = np.arange(nb)[:, None, None, None]
    h = np.arange(H)[None, :, None, None]
    qi = (N - M + np.arange(M))[None, None, :, None]
    kj = np.arange(N)[None, None, None, :]
    if score_fn is not None:
        s = np.broadcast_to(score_fn(s, b, h, qi, kj), s.shape)
    allowed = np.ones(s.shape, bool)
    if mask_fn is not None:
        allowed &= np.broadcast_to(mask_fn(b, h, qi, kj), s.shape)
    s = np.where(allowed, s, -np.inf)
    m = s.max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.where(allowed, np.exp(s - m), 0.0)
    l = e.sum(-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.where(l > 0, e / l, 0.0)
        lse = np.where(l > 0, np.log(l) + m, -np.inf)[..., 0]
    return np.einsum("bhmn,bhnd->bhmd", a, v), lse


def documents(n, rng):
    """int32 document ids of n positions: runs of 1 to 16."""
    ids, d = [], 0
    while len(ids) < n:
        ids += [d] * int(rng.integers(1, 17))
        d += 1
    return np.array(ids[:n], np.int32)


def alibi_slopes(H=HQ):
    """ALiBi's slopes, 2^(-8 (h + 1) / H), float32 [H]."""
    return np.exp2(-8.0 * np.arange(1, H + 1) / H).astype(np.float32)


def example(name, rng, N):
    """(modifier keywords of flex_attention, score_fn, mask_fn) of example
    `name` with its captures for N key positions."""
    if name == "causal":
        return dict(mask_mod=modifiers.CAUSAL), None, lambda b, h, qi, kj: kj <= qi
    if name == "sliding_window":
        w = 5
        return (dict(mask_mod=modifiers.SLIDING_WINDOW, ints=(w,)), None,
                lambda b, h, qi, kj: (kj <= qi) & (qi - kj <= w))
    if name == "prefix_lm":
        pre = 11
        return (dict(mask_mod=modifiers.PREFIX_LM, ints=(pre,)), None,
                lambda b, h, qi, kj: (kj < pre) | (kj <= qi))
    if name == "document":
        doc = documents(N, rng)
        return (dict(mask_mod=modifiers.DOCUMENT, captures=(doc,)), None,
                lambda b, h, qi, kj: doc[qi] == doc[kj])
    if name == "alibi":
        slopes = alibi_slopes()
        return (dict(score_mod=modifiers.ALIBI, captures=(slopes,)),
                lambda s, b, h, qi, kj: s - slopes[h].astype(np.float64) * np.abs(qi - kj), None)
    if name == "tanh_softcap":
        cap = 2.5
        return (dict(score_mod=modifiers.TANH_SOFTCAP, floats=(cap,)),
                lambda s, b, h, qi, kj: cap * np.tanh(s / cap), None)
    if name == "relative_bias":
        R = 8
        table = rng.standard_normal(2 * R - 1).astype(np.float32)
        return (dict(score_mod=modifiers.RELATIVE_BIAS, captures=(table,), ints=(R,)),
                lambda s, b, h, qi, kj: s + table[np.clip(qi - kj, 1 - R, R - 1) + R - 1].astype(np.float64), None)
    raise KeyError(name)


EXAMPLES = ["causal", "sliding_window", "prefix_lm", "document", "alibi", "tanh_softcap", "relative_bias"]
SHAPES = [(37, 53, 48), (64, 64, 48), (1, 300, 48)]  # M, N, head dim: one program per modifier and path
TREE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "modifiers")


def test_modifiers_are_the_example_files():
    assert set(modifiers.NAMES) == {n.upper() for n in EXAMPLES}
    for name in EXAMPLES:
        text = getattr(modifiers, name.upper())
        assert text == modifiers.source(name)
        if os.path.isdir(TREE):  # from a checkout: the installed copies are its files
            with open(os.path.join(TREE, name + ".cl"), encoding="utf-8") as f:
                assert text == f.read(), name
        assert ("clattn_score_mod" in text) == (name in ("alibi", "tanh_softcap", "relative_bias"))
    assert "clattn_score_mod_grad" in modifiers.ALIBI and "clattn_mask_mod" in modifiers.CAUSAL
    with pytest.raises(AttributeError):
        modifiers.NO_SUCH_MODIFIER


@pytest.mark.parametrize("algo", ["fused", "staged", "auto"])
@pytest.mark.parametrize("shape", SHAPES, ids=["37x53", "64x64", "decode1x300"])
@pytest.mark.parametrize("name", EXAMPLES)
def test_example_against_reference(ctx, rng, name, shape, algo):
    M, N, d = shape
    q, k, v = qkv(rng, M, N, d)
    kw, score_fn, mask_fn = example(name, rng, N)
    o, lse = ctx.flex_attention(q, k, v, algo=algo, return_lse=True, **kw)
    assert o.shape == q.shape and o.dtype == np.float32 and lse.shape == (B, HQ, M)
    ro, rl = flex_reference(q, k, v, score_fn, mask_fn)
    np.testing.assert_allclose(o, ro, **TOL)
    np.testing.assert_allclose(lse, rl, **TOL)


def test_return_lse_and_other_keywords(ctx, rng):
    """return_lse, scale and attention's own keywords ANDed with a modifier."""
    q, k, v = qkv(rng, 37, 53, 48)
    kw, _, mask_fn = example("prefix_lm", rng, 53)
    o = ctx.flex_attention(q, k, v, scale=0.3, **kw)
    o2, lse = ctx.flex_attention(q, k, v, scale=0.3, return_lse=True, **kw)
    np.testing.assert_array_equal(o, o2)
    ro, rl = flex_reference(q, k, v, mask_fn=mask_fn, scale=0.3)
    np.testing.assert_allclose(o2, ro, **TOL)
    np.testing.assert_allclose(lse, rl, **TOL)
    # kv_lens (padding) and the modifier together: keys past a row's length
    # are gone, q_idx still counts from kv_len as causal does
    kv_lens = np.array([53, 40], np.int32)
    o3 = ctx.flex_attention(q, k, v, kv_lens=kv_lens, **kw)
    ro3, _ = flex_reference(q, k, v, mask_fn=lambda b, h, i, j: mask_fn(b, h, i, j) & (j < kv_lens[b]))
    np.testing.assert_allclose(o3, ro3, **TOL)


def test_packed_sequences(ctx, rng):
    """cu_seqlens: q_idx and kv_idx count within each sequence."""
    lens_q, lens_k = [7, 13, 1], [9, 20, 5]
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    d = 48
    q = rng.standard_normal((cu_q[-1], HQ, d)).astype(np.float32)  # bshd: [total, heads, dim]
    k = rng.standard_normal((cu_k[-1], HKV, d)).astype(np.float32)
    v = rng.standard_normal((cu_k[-1], HKV, d)).astype(np.float32)
    kw, _, mask_fn = example("sliding_window", rng, 0)
    for algo in ("auto", "staged"):
        o = ctx.flex_attention(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, layout="bshd", algo=algo, **kw)
        for s in range(3):
            t = lambda x, c: x[c[s]:c[s + 1]].transpose(1, 0, 2)[None]  # noqa: E731
            ro, _ = flex_reference(t(q, cu_q), t(k, cu_k), t(v, cu_k), mask_fn=mask_fn)
            np.testing.assert_allclose(o[cu_q[s]:cu_q[s + 1]], ro[0].transpose(1, 0, 2), err_msg=algo, **TOL)


def block_classes(allowed, bq, bk):
    """(empty, partial, full) blocks of a [.., M, N] boolean mask."""
    M, N = allowed.shape[-2:]
    counts = [0, 0, 0]
    for i in range(0, M, bq):
        for j in range(0, N, bk):
            blk = allowed[..., i:i + bq, j:j + bk].reshape(-1, min(bq, M - i) * min(bk, N - j))
            for row in blk:
                counts[0 if not row.any() else 2 if row.all() else 1] += 1
    return dict(zip(("empty", "partial", "full"), counts))


@pytest.mark.parametrize("M", [512, 1], ids=["prefill", "decode"])
def test_document_block_mask_changes_no_bit(ctx, rng, M):
    N, d = 512, 48
    doc = np.repeat(np.arange(4, dtype=np.int32), N // 4)  # four documents of 128
    q, k, v = qkv(rng, M, N, d)
    with ctx.create_block_mask(modifiers.DOCUMENT, None, HQ, M, N, captures=(doc,), block_size=64) as bm:
        assert bm.shape == (1, HQ, M, N) and bm.block_size == (64, 64)
        qi = np.arange(N - M, N)
        allowed = np.broadcast_to(doc[qi][:, None] == doc[None, :], (1, HQ, M, N))
        assert bm.counts == block_classes(allowed, 64, 64)
        assert bm.counts["partial"] == 0 and sum(bm.counts.values()) == bm.num_blocks
        for algo in ("fused", "staged", "auto"):
            plain = ctx.flex_attention(q, k, v, mask_mod=modifiers.DOCUMENT, captures=(doc,), algo=algo)
            skipped = ctx.flex_attention(q, k, v, mask_mod=modifiers.DOCUMENT, captures=(doc.copy(),),
                                         block_mask=bm, algo=algo)
            np.testing.assert_array_equal(plain, skipped, err_msg=algo)
            # the block mask's own mask_mod and captures when the call gives none
            np.testing.assert_array_equal(plain, ctx.flex_attention(q, k, v, block_mask=bm, algo=algo), err_msg=algo)
        ro, _ = flex_reference(q, k, v, mask_fn=lambda b, h, i, j: doc[i] == doc[j])
        np.testing.assert_allclose(plain, ro, **TOL)
        # other captures, another mask_mod, another length: refused by the library
        for kw in (dict(mask_mod=modifiers.DOCUMENT, captures=(doc[::-1].copy(),)),
                   dict(mask_mod=modifiers.CAUSAL, captures=(doc,)),
                   dict(captures=(doc,), ints=(1,))):
            with pytest.raises(clattn.Error) as e:
                ctx.flex_attention(q, k, v, block_mask=bm, **kw)
            assert e.value.status == "INVALID_ARGUMENT"
        with pytest.raises(clattn.Error):
            ctx.flex_attention(np.concatenate([q, q], axis=2), k, v, block_mask=bm, captures=(doc,))
    with pytest.raises(ValueError, match="closed"):
        ctx.flex_attention(q, k, v, block_mask=bm)


def test_plan_with_modifiers(ctx, rng):
    """A plan keeps its modifiers' text, captures and block mask: its steps
    give flex_attention's bits, at the planned length and a shorter one."""
    M, N = 37, 53
    q, k, v = qkv(rng, M, N, 48)
    kw, _, _ = example("document", rng, N)
    bm = ctx.create_block_mask(kw["mask_mod"], None, None, M, N, captures=kw["captures"], block_size=32)
    with ctx.plan(q, k, v, block_mask=bm) as plan:
        del bm  # the plan holds it
        np.testing.assert_array_equal(plan(), ctx.flex_attention(q, k, v, **kw))
    with ctx.plan(q, k, v, score_mod=modifiers.TANH_SOFTCAP, floats=(2.5,), algo="staged") as plan:
        np.testing.assert_array_equal(plan(kv_len=40), ctx.flex_attention(q, k[:, :, :40], v[:, :, :40],
                                                                          modifiers.TANH_SOFTCAP, floats=(2.5,),
                                                                          algo="staged"))


def test_causal_block_mask(ctx, rng):
    M, N = 200, 300
    bm = ctx.create_block_mask(modifiers.CAUSAL, B, None, M, N, block_size=(64, 32))
    assert bm.shape == (B, 1, M, N) and bm.block_size == (64, 32)
    qi = np.arange(N - M, N)[:, None]
    want = block_classes(np.broadcast_to(np.arange(N)[None, :] <= qi, (B, 1, M, N)), 64, 32)
    assert bm.counts == want and min(want.values()) > 0
    default = ctx.create_block_mask(modifiers.CAUSAL, None, None, M, N)
    assert default.block_size == (128, 128)
    assert default.counts == block_classes((np.arange(N)[None, :] <= qi)[None, None], 128, 128)
    q, k, v = qkv(rng, M, N, 48)
    plain = ctx.flex_attention(q, k, v, mask_mod=modifiers.CAUSAL)
    np.testing.assert_array_equal(plain, ctx.flex_attention(q, k, v, block_mask=bm))
    np.testing.assert_allclose(plain, flex_reference(q, k, v, mask_fn=lambda b, h, i, j: j <= i)[0], **TOL)
    # with a score modifier too: the captures (here ALiBi's slopes) are the
    # call's, so the block mask's (an equal numpy array passes as its copy)
    q, k, v = qkv(rng, M, N, 32)
    kw = dict(score_mod=modifiers.ALIBI, mask_mod=modifiers.CAUSAL, captures=(alibi_slopes(),))
    with ctx.create_block_mask(modifiers.CAUSAL, None, None, M, N, captures=(alibi_slopes(),)) as bm2:
        np.testing.assert_array_equal(ctx.flex_attention(q, k, v, block_mask=bm2, **kw),
                                      ctx.flex_attention(q, k, v, **kw))
    bm.close()
    bm.close()  # twice is fine
    default.close()


def test_device_captures(ctx, cl_queue, rng):
    """Captures already on the device: a clattn.DeviceArray, and pyopencl
    arrays (q, k, v and the capture) in a Context embedded in their queue;
    their buffers are passed as they are, so a block mask made with them
    matches the calls that give them."""
    M = N = 64
    doc = documents(N, rng)
    q, k, v = qkv(rng, M, N, 48)
    want = ctx.flex_attention(q, k, v, mask_mod=modifiers.DOCUMENT, captures=(doc,))
    ids = clattn.DeviceArray(ctx, doc)
    with ctx.create_block_mask(modifiers.DOCUMENT, None, None, M, N, captures=(ids,), block_size=32) as bm:
        np.testing.assert_array_equal(ctx.flex_attention(q, k, v, mask_mod=modifiers.DOCUMENT, captures=(ids,),
                                                         block_mask=bm), want)
    ids.release()
    import pyopencl.array as cla
    with clattn.Context(queue=cl_queue) as emb:
        dq, dk, dv, dids = (cla.to_device(cl_queue, x) for x in (q, k, v, doc))
        with emb.create_block_mask(modifiers.DOCUMENT, None, None, M, N, captures=(dids,), block_size=32) as bm:
            o = emb.flex_attention(dq, dk, dv, mask_mod=modifiers.DOCUMENT, captures=(dids,), block_mask=bm)
            assert isinstance(o, cla.Array)
            np.testing.assert_allclose(o.get(), want, **TOL)  # pyopencl's first device may be another


# ---- the backward: through the modifiers, against the built-ins they equal ----

def backward_problem(rng, M=37, N=53, d=16):
    q, k, v = qkv(rng, M, N, d)
    return q, k, v, rng.standard_normal((B, HQ, M, d)).astype(np.float32)


def assert_same_grads(got, want):
    for g, w, name in zip(got, want, ("dq", "dk", "dv")):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6, err_msg=name)


def test_backward_through_causal_mask_mod(ctx, rng):
    q, k, v, d_out = backward_problem(rng)
    o, lse = ctx.attention(q, k, v, causal=True, return_lse=True)
    want = ctx.attention_backward(q, k, v, o, lse, d_out, causal=True)
    assert_same_grads(ctx.attention_backward(q, k, v, o, lse, d_out, mask_mod=modifiers.CAUSAL), want)


def test_backward_through_alibi_score_mod(ctx, rng):
    q, k, v, d_out = backward_problem(rng)
    slopes = alibi_slopes()
    o, lse = ctx.attention(q, k, v, alibi_slopes=slopes, return_lse=True)
    want = ctx.attention_backward(q, k, v, o, lse, d_out, alibi_slopes=slopes)
    got = ctx.attention_backward(q, k, v, o, lse, d_out, score_mod=modifiers.ALIBI, captures=(slopes,))
    assert_same_grads(got, want)


def test_backward_through_tanh_softcap_score_mod(ctx, rng):
    q, k, v, d_out = backward_problem(rng)
    q *= 3  # scores past the cap's knee
    o, lse = ctx.attention(q, k, v, softcap=2.5, return_lse=True)
    want = ctx.attention_backward(q, k, v, o, lse, d_out, softcap=2.5)
    got = ctx.attention_backward(q, k, v, o, lse, d_out, score_mod=modifiers.TANH_SOFTCAP, floats=(2.5,))
    assert_same_grads(got, want)


def test_backward_needs_the_score_mod_grad(ctx, rng):
    q, k, v, d_out = backward_problem(rng)
    o, lse = ctx.attention(q, k, v, return_lse=True)
    no_grad = ("float clattn_score_mod(float score, int b, int h, int q_idx, int kv_idx, "
               "const clattn_captures *cap) { return 2.0f * score; }")
    with pytest.raises(clattn.Error) as e:
        ctx.attention_backward(q, k, v, o, lse, d_out, score_mod=no_grad)
    assert e.value.status == "UNSUPPORTED" and "clattn_score_mod_grad" in str(e.value)


# ---- errors ----

def test_a_modifier_that_does_not_compile(ctx, rng):
    q, k, v = qkv(rng, 5, 7, 16)
    bad = "int clattn_mask_mod(int b, int h, int q_idx, int kv_idx, const clattn_captures *cap) { return nope; }"
    with pytest.raises(clattn.Error, match="compile") as e:
        ctx.flex_attention(q, k, v, mask_mod=bad)
    assert e.value.status == "INVALID_ARGUMENT"
    with pytest.raises(clattn.Error, match="compile"):
        ctx.create_block_mask(bad, None, None, 5, 7)


def test_argument_errors(ctx, rng):
    q, k, v = qkv(rng, 5, 7, 16)
    with pytest.raises(TypeError, match="score_mod"):
        ctx.flex_attention(q, k, v, score_mod=42)
    with pytest.raises(ValueError, match="without score_mod or mask_mod"):
        ctx.flex_attention(q, k, v, ints=(3,))
    with pytest.raises(ValueError, match="at most 4"):
        ctx.flex_attention(q, k, v, mask_mod=modifiers.CAUSAL, ints=(1, 2, 3, 4, 5))
    with pytest.raises(TypeError, match="captures"):
        ctx.flex_attention(q, k, v, mask_mod=modifiers.DOCUMENT, captures=([0, 0, 1],))
    with pytest.raises(TypeError, match="block_mask"):
        ctx.flex_attention(q, k, v, block_mask="causal")
    with pytest.raises(ValueError, match="mask_mod"):
        ctx.create_block_mask(None, 1, 1, 5, 7)
    with pytest.raises(ValueError, match="block_size"):
        ctx.create_block_mask(modifiers.CAUSAL, 1, 1, 5, 7, block_size=(16, 16, 16))


# ---- torch's flex_attention, where torch has it (torch is not a dependency) ----

def torch_flex():
    try:
        import torch
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError as e:
        pytest.skip("torch with torch.nn.attention.flex_attention is not importable (%s); torch is not a "
                    "dependency of clattn" % e)
    return torch, flex_attention, create_block_mask


@pytest.mark.parametrize("name", ["causal", "alibi", "document"])
def test_matches_torch_flex_attention(ctx, rng, name):
    torch, flex_attention, create_block_mask = torch_flex()
    M = N = 64  # torch's q_idx is the row; clattn's N - M + row: the same when M == N
    q, k, v = qkv(rng, M, N, 64, hq=HQ, hkv=HQ)
    tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
    kw, score_mod, block_mask = example(name, rng, N)[0], None, None
    if name == "causal":
        block_mask = create_block_mask(lambda b, h, q_idx, kv_idx: kv_idx <= q_idx, None, None, M, N, device="cpu")
    elif name == "document":
        doc = torch.from_numpy(kw["captures"][0].astype(np.int64))
        block_mask = create_block_mask(lambda b, h, q_idx, kv_idx: doc[q_idx] == doc[kv_idx], None, None, M, N,
                                       device="cpu")
    else:
        slopes = torch.from_numpy(kw["captures"][0])

        def score_mod(score, b, h, q_idx, kv_idx):
            return score - slopes[h] * (q_idx - kv_idx).abs()
    want = flex_attention(tq, tk, tv, score_mod=score_mod, block_mask=block_mask)
    np.testing.assert_allclose(ctx.flex_attention(q, k, v, **kw), want.numpy(), **TOL)
