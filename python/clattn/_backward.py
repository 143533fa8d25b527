"""Context.attention_backward: the gradients of Context.attention through
clattn_backward."""
import numpy as np

from ._call import Call, as_array, broadcast_strides, is_cl_array

# keywords of attention that ask for outputs: accepted (one dict of keywords
# serves both calls) and without effect here
_RETURNS = ("return_lse", "return_weights", "return_diagnostics")


def attention_backward(self, q, k, v, o, lse, d_out, *, deterministic=True, **kw):
    """The gradients of attention: (dq, dk, dv), then d_sinks when sinks are
    given and d_bias when bias is given, in that order.

    q, k, v and the keywords are the forward call's (every keyword of
    attention; return_* are accepted and ignored); o is its output (q's
    dtype and layout: [B,Hq,M,dv], "bshd" [B,M,Hq,dv], packed [Hq,total_q,dv]
    or [total_q,Hq,dv]), lse its log-sum-exp (float32 [B,Hq,M], return_lse),
    d_out the loss's gradient by O (like o). dq, dk, dv come back like q, k
    and v (dtype, layout, packed form; numpy or pyopencl like q); d_sinks
    float32 [Hq]; d_bias float32 of the bias's shape as given, each element
    the sum of dL/dbias over every (batch, head, row, key) it was
    broadcast to. Exact derivatives of the forward (causal/window, masks,
    kv_lens, softcap, ALiBi, sinks, GQA, packed sequences, float16 and
    bfloat16 storage with f32 arithmetic). deterministic=True: bitwise
    repeatable; False lets the fused path add dQ atomically. Dropout
    (dropout_p, seed, offset as in the forward) drops the same weights.
    Modifiers (score_mod, mask_mod, block_mask, captures, floats, ints) as
    the forward's: the gradient flows through score_mod by its
    clattn_score_mod_grad, and a score_mod without one raises clattn.Error
    "UNSUPPORTED". Paged, quantised or left-padded K/V raise clattn.Error
    "UNSUPPORTED" (the backward does not take them)."""
    for name in _RETURNS:
        kw.pop(name, None)
    c = Call(self, q, k, v, kw)
    o, lse, d_out = as_array(o), as_array(lse), as_array(d_out)
    o_shape, _ = c.out_spec()
    row_shape, row_strides = c.row_spec()
    for name, x in (("o", o), ("d_out", d_out)):
        if tuple(x.shape) != o_shape:
            raise ValueError("clattn: %s must have the forward output's shape %s (got %s)"
                             % (name, o_shape, tuple(x.shape)))
        if x.dtype != c.q.dtype:
            raise TypeError("clattn: %s must be q's dtype %s (got %s)" % (name, c.q.dtype, x.dtype))
    if tuple(lse.shape) != row_shape:
        raise ValueError("clattn: lse must be the forward's [B,Hq,M] = %s (got %s)" % (row_shape, tuple(lse.shape)))
    if lse.dtype != np.float32:
        raise TypeError("clattn: lse must be float32 (got %s)" % lse.dtype)
    for name, x in (("o", o), ("lse", lse), ("d_out", d_out)):
        if is_cl_array(x) and x.context.int_ptr != self._cl_context:
            raise ValueError("clattn: %s is a pyopencl array from another OpenCL context" % name)
    bias_shape = None if c.bias is None else tuple(c.bias.shape)

    outs = {}
    bp = self._lib.backward_params_default()
    with self._device_call(outs) as (views, waits, events):
        p = bp.fwd
        c.fill(p, views, waits)
        p.out = c.view(o, "o", c.q_axes, views, waits)
        lv = self._input(lse, "lse", views, waits)
        for i, s in enumerate(lv.strides + [0]):
            p.lse.stride[i] = s
        p.lse.buf, p.lse.offset = lv.buf, lv.offset
        bp.d_out = c.view(d_out, "d_out", c.q_axes, views, waits)
        bp.deterministic = 1 if deterministic else 0
        k_rows = c.page_size if c.paged else c.total_k if c.packed_k else c.N
        k_dims0 = c.pages if c.paged else c.B
        want = [("d_q",) + c.like(c.q_axes, (c.B, c.Hq, c.total_q if c.packed_q else c.M, c.dk)),
                ("d_k",) + c.like(c.k_axes, (k_dims0, c.Hkv, k_rows, c.dk)),
                ("d_v",) + c.like(c.v_axes, (k_dims0, c.Hkv, k_rows, c.dv))]
        want = [(name, shape, dt, strides) for (name, shape, strides), dt in
                zip(want, (c.q.dtype, c.k.dtype, c.v.dtype))]
        if c.sinks is not None:
            want.append(("d_sinks", (c.Hq,), np.dtype(np.float32), [0, 0, 0, 1]))
        if bias_shape is not None:  # summed over the dimensions the bias broadcasts: stride 0 there
            dense = np.empty(bias_shape, np.float32).strides
            strides = broadcast_strides(bias_shape, [s // 4 for s in dense], (c.B, c.Hq, c.M, c.N), "bias")
            want.append(("d_bias", bias_shape, np.dtype(np.float32), strides))
        t = self._outputs(want, c.out_cl, outs)
        bp.d_q, bp.d_k, bp.d_v = t["d_q"], t["d_k"], t["d_v"]
        if "d_sinks" in t:
            bp.d_sinks = t["d_sinks"].buf
        if "d_bias" in t:
            bp.d_bias = t["d_bias"]
        self._run(self._lib.backward, bp, waits, outs, events)
    res = [outs["d_q"][0], outs["d_k"][0], outs["d_v"][0]]
    if c.sinks is not None:
        res.append(outs["d_sinks"][0])
    if bias_shape is not None:
        res.append(outs["d_bias"][0])
    return tuple(res)

