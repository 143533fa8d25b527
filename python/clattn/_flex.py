"""Modifiers (FlexAttention's score_mod and mask_mod, in OpenCL C):
Context.flex_attention, Context.create_block_mask and clattn.BlockMask.
The call's side (the keywords every attention call takes) is _call.Modifiers."""
import ctypes

import numpy as np

from . import _ffi
from ._call import Modifiers, check_int, modifier_text
from ._error import Error

DEFAULT_BLOCK = 128  # clattn_block_mask_create's block size for 0


def _block_size(block_size):
    """(block_q, block_k) as given to the library (0: its default) and as
    reported."""
    if block_size is None:
        return (0, 0), (DEFAULT_BLOCK, DEFAULT_BLOCK)
    if isinstance(block_size, (list, tuple)):
        if len(block_size) != 2:
            raise ValueError("clattn: block_size must be an int or a (q, kv) pair (got %r)" % (block_size,))
        bq, bk = block_size
    else:
        bq = bk = block_size
    bq, bk = check_int(bq, "block_size (q)", 1), check_int(bk, "block_size (kv)", 1)
    return (bq, bk), (bq, bk)


class BlockMask:
    """A mask modifier's blocks classed on the device (Context.create_block_mask,
    clattn_block_mask_create): each (batch row, query head, block of
    block_size[0] query rows, block of block_size[1] keys) is empty (the
    modifier allows none of its pairs), full (all) or partial. Passed as
    block_mask= to a call with the same mask_mod and captures (the same
    lengths; its batch and heads the call's, or 1 for all), the call skips
    the empty blocks and evaluates the modifier only in the partial ones:
    the results are bitwise those without it.

    shape: (B, H, Q_LEN, KV_LEN) as made (1 where made for all);
    block_size: (q, kv); counts: {"empty": n, "partial": n, "full": n};
    mask_mod: the text. The block mask keeps its captures (numpy ones as
    copies on the device) for the calls that use it: a call that gives no
    captures, floats or ints takes these, and a call without mask_mod
    takes its mask_mod. close() (or a with block's end, or collection)
    releases it; close it after the plans made with it."""

    def __init__(self, ctx, mask_mod, B, H, q_len, kv_len, *, captures=(), floats=(), ints=(), block_size=None):
        self._ptr = None
        self._ctx = ctx
        self._views = []
        text = modifier_text(mask_mod, "mask_mod")
        if text is None:
            raise ValueError("clattn: create_block_mask needs a mask_mod (OpenCL C text defining clattn_mask_mod)")
        B = 1 if B is None else check_int(B, "B", 1)
        H = 1 if H is None else check_int(H, "H", 1)
        q_len, kv_len = check_int(q_len, "Q_LEN", 1), check_int(kv_len, "KV_LEN", 1)
        (bq, bk), self.block_size = _block_size(block_size)
        mods = Modifiers(ctx, None, text, None, captures, floats, ints)
        # numpy captures as copies: the classes describe the contents of now
        mods.captures = tuple(np.array(a, copy=True) if isinstance(a, np.ndarray) else a for a in mods.captures)
        self._mask_mod, self._captures, self._floats, self._ints = text, mods.captures, mods.floats, mods.ints
        self.shape = (B, H, q_len, kv_len)
        lib, cl = ctx._lib, ctx._cl
        ctx._enter()
        try:
            p = lib.params_default()
            p.batch, p.q_heads, p.kv_heads, p.q_len, p.kv_len = B, H, H, q_len, kv_len
            waits = []
            mods.fill(p, self._views, waits)
            self._buffers = tuple(p.captures[n] for n in range(4))
            if waits:  # pyopencl captures still being written
                r = cl.wait(len(waits), (ctypes.c_void_p * len(waits))(*waits))
                if r != 0:
                    raise Error("OPENCL", "clWaitForEvents failed: OpenCL error %d" % r)
            ptr = ctypes.c_void_p()
            st = lib.block_mask_create(ctx._ptr, ctypes.byref(p), bq, bk, ctypes.byref(ptr))
            if st != 0:
                raise Error(_ffi.STATUS_NAMES.get(st, str(st)), ctx._message())
            self._ptr = ptr.value
            n = [ctypes.c_size_t(0) for _ in range(3)]
            lib.block_mask_counts(self._ptr, *(ctypes.byref(x) for x in n))
            self.counts = dict(zip(("empty", "partial", "full"), (int(x.value) for x in n)))
        except BaseException:
            self._free()
            raise
        finally:
            ctx._leave()

    @property
    def mask_mod(self):
        return self._mask_mod.decode("utf-8", "replace")

    @property
    def num_blocks(self):
        """Blocks in all: B * H * ceil(Q_LEN / block_size[0]) * ceil(KV_LEN / block_size[1])."""
        B, H, M, N = self.shape
        return B * H * -(-M // self.block_size[0]) * -(-N // self.block_size[1])

    def __repr__(self):
        return "clattn.BlockMask(shape=%s, block_size=%s, counts=%s%s)" % (
            self.shape, self.block_size, self.counts if self._ptr else "?", "" if self._ptr else ", closed")

    def _usable_by(self, ctx):
        if not self._ptr:
            raise ValueError("clattn: block_mask is closed")
        if ctx is not self._ctx and ctx._cl_context != self._ctx._cl_context:
            raise ValueError("clattn: block_mask was made by a clattn.Context of another OpenCL context")

    def _handle(self):
        if not self._ptr:
            raise ValueError("clattn: block_mask is closed")
        return self._ptr

    def _free(self):
        ptr, self._ptr = self._ptr, None
        ctx = self._ctx
        if ptr:
            ctx._lib.block_mask_release(ptr)
        for vw in self._views:
            if vw.owned:
                ctx._cl.release_mem(vw.buf)
        self._views = []

    def close(self):
        """Releases the block mask and its captures' buffers once no call of
        the context is under way."""
        ctx = self._ctx
        with ctx._cond:
            while ctx._active:
                ctx._cond.wait()
            self._free()

    def __del__(self):
        try:  # nothing refers to it: no call is using it (a call's Modifiers keep it)
            self._free()
        except Exception:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def create_block_mask(self, mask_mod, B, H, Q_LEN, KV_LEN, *, captures=(), floats=(), ints=(), block_size=None):
    """A clattn.BlockMask of mask_mod (OpenCL C text defining int
    clattn_mask_mod(int b, int h, int q_idx, int kv_idx, const
    clattn_captures *cap), nonzero = allowed) over B batch rows, H query
    heads, Q_LEN queries and KV_LEN keys (B or H None: 1, standing for
    all), as FlexAttention's create_block_mask. q_idx is KV_LEN - Q_LEN + i
    for query row i. captures (up to 4 arrays: cap->buf[n]), floats
    (cap->f[n]) and ints (cap->i[n]) as the calls take them. block_size:
    None (128), an int, or a (q, kv) pair. The blocks are classed on the
    device before this returns."""
    return BlockMask(self, mask_mod, B, H, Q_LEN, KV_LEN, captures=captures, floats=floats, ints=ints,
                     block_size=block_size)


def flex_attention(self, q, k, v, score_mod=None, mask_mod=None, *, block_mask=None, captures=(), floats=(),
                   ints=(), scale=None, return_lse=False, **kw):
    """Attention with caller-programmed scores and masks, as FlexAttention:
    score_mod, OpenCL C text defining

        float clattn_score_mod(float score, int b, int h, int q_idx, int kv_idx,
                               const clattn_captures *cap)

    (and, for attention_backward, clattn_score_mod_grad with the same
    parameters: its derivative in score), rewrites each score scale *
    <q, k>; mask_mod, text defining

        int clattn_mask_mod(int b, int h, int q_idx, int kv_idx, const clattn_captures *cap)

    (nonzero = allowed), removes keys. b is the batch row, h the query head,
    kv_idx the key's index in its sequence, q_idx the query's position
    among the keys (row i of M queries over N keys: N - M + i, per
    sequence), so kv_idx <= q_idx is causal. cap->buf[n] is captures[n]
    (numpy arrays uploaded read-only as they lie, pyopencl arrays or
    clattn.DeviceArrays of this context: give the dtype the modifier
    reads), cap->f[n] floats[n], cap->i[n] ints[n] (up to 4 each).
    clattn.modifiers holds examples. block_mask: a clattn.BlockMask of the
    same mask_mod and captures (Context.create_block_mask), which skips the
    blocks the mask allows nothing of; without mask_mod the block mask's
    is used, and without captures, floats and ints its captures.

    A modifier that does not compile raises clattn.Error (INVALID_ARGUMENT,
    with the compiler's log). Every other keyword is attention's (causal,
    kv_lens, bias, algo, layout, cu_seqlens_q, ...), ANDed and applied as
    there. Returns O, or (O, lse) with return_lse (and what the other
    return_* keywords add, as attention)."""
    return self.attention(q, k, v, score_mod=score_mod, mask_mod=mask_mod, block_mask=block_mask,
                          captures=captures, floats=floats, ints=ints, scale=scale, return_lse=return_lse, **kw)
