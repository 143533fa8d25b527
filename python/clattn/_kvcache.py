"""Context.attention_with_kvcache: an engine's decode step in one call
(FlashAttention's flash_attn_with_kvcache) through clattn_forward_kvcache:
new keys (rotated) and values appended to the cache in place, then
attention of q (rotated) over the cache. The attention's arguments are
attention's (_call.Call over the cache); the step's own are checked here.
KVCache keeps a numpy caller's cache on the device between steps."""
import numpy as np

from . import _ffi
from ._call import (Call, as_array, check_written_disjoint, head_dim_of, is_cl_array, kv_storage, scales_of,
                    small_array, tensor_of)
from ._device import DeviceArray


def _rotary_tables(cos, sin, head_dim):
    """cos, sin [rotary_len, rotary_dim / 2] as float32 (numpy: converted)."""
    cos, sin = as_array(cos), as_array(sin)
    if len(cos.shape) != 2 or tuple(cos.shape) != tuple(sin.shape) or min(cos.shape) == 0:
        raise ValueError("clattn: rotary_cos and rotary_sin must be one 2-D shape [rotary_len, rotary_dim / 2] "
                         "(got %s, %s)" % (tuple(cos.shape), tuple(sin.shape)))
    tables = []
    for name, x in (("rotary_cos", cos), ("rotary_sin", sin)):
        if x.dtype != np.float32:
            if is_cl_array(x) or x.dtype.kind != "f":
                raise TypeError("clattn: %s must be float32 (got %s)" % (name, x.dtype))
            x = x.astype(np.float32)
        tables.append(x)
    rotary_dim = 2 * int(cos.shape[1])
    if rotary_dim > head_dim:
        raise ValueError("clattn: rotary_dim %d (twice the tables' columns) exceeds head_dim %d"
                         % (rotary_dim, head_dim))
    return tables[0], tables[1], int(cos.shape[0]), rotary_dim


def attention_with_kvcache(self, q, k_cache, v_cache, k=None, v=None, *, rotary_cos=None, rotary_sin=None,
                           cache_seqlens, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                           page_size=None, causal=False, window=(-1, -1), softcap=0.0, alibi_slopes=None,
                           scale=None, rotary_interleaved=True, kv_dtype=None, k_scale=None, v_scale=None,
                           return_lse=False, algo="auto", layout="bhsd", score_mod=None, mask_mod=None,
                           block_mask=None, captures=(), floats=(), ints=()):
    """A decode (or chunked-prefill) step in one call, as FlashAttention's
    flash_attn_with_kvcache: k, v [B,Hkv,L,d] ("bshd": [B,L,Hkv,d]; q's
    dtype), keys rotated, are written into the caches at rows
    cache_seqlens[b] .. + L - 1 (int32 [B]: the rows in use before the call,
    a row's leftpad included), then q [B,Hq,M,dk] (rotated) attends over
    each row's cache rows cache_leftpad[b] (0 without) ..
    cache_seqlens[b] + L - 1, each row aligned on its own key count.

    Caches as attention takes them: contiguous [B,Hkv,capacity,d] ("bshd":
    [B,capacity,Hkv,d]), or with cache_batch_idx (int32 [B]) the slot each
    batch row uses, [slots,Hkv,capacity,d]; or paged with block_table
    (int32 [B, pages per sequence]) over [num_pages,Hkv,page_size,d]
    ("bshd": [num_pages,page_size,Hkv,d]). kv_dtype, k_scale, v_scale: the
    cache's storage as in attention (float, "q8_0" or "int8", whose scales
    are written too). numpy caches (and scales) are updated where they lie,
    pyopencl ones on the device (no copy).

    rotary_cos, rotary_sin [rotary_len, rotary_dim / 2] (float32; numpy
    floats converted; rotary_len at least the cache's rows): the leading
    rotary_dim dims of the new keys (at their positions) and of q are
    rotated, pairs (x[2t], x[2t+1]) with rotary_interleaved (GPT-J) or
    (x[t], x[t + rotary_dim/2]) (GPT-NeoX); query row i at position
    cache_seqlens[b] + i when causal or a window is set, else every query
    at cache_seqlens[b]. k=None, v=None appends nothing.

    causal, window, softcap, alibi_slopes, scale, algo, layout, and the
    modifiers (score_mod, mask_mod, block_mask, captures, floats, ints):
    attention's (q_idx counts each row's keys after the append).
    Returns O in q's dtype and layout, or (O, lse) with return_lse (lse
    float32 [B,Hq,M])."""
    if layout not in ("bhsd", "bshd"):
        raise ValueError("clattn: layout must be 'bhsd' or 'bshd' (got %r)" % (layout,))
    q, k_cache, v_cache = as_array(q), as_array(k_cache), as_array(v_cache)
    if len(q.shape) != 4 or len(k_cache.shape) != 4:
        raise ValueError("clattn: q and the caches must be 4-D (got shapes %s, %s)"
                         % (tuple(q.shape), tuple(k_cache.shape)))
    axes = (0, 1, 2, 3) if layout == "bhsd" else (0, 2, 1, 3)
    B, rows = int(q.shape[0]), int(k_cache.shape[axes[2]])
    seqlens = small_array(self, cache_seqlens, "cache_seqlens", (B,), np.int32)
    if cache_batch_idx is not None and block_table is not None:
        raise ValueError("clattn: cache_batch_idx with block_table: a paged cache's rows are found through its table")
    # the attention over the cache: attention's arguments, cache_seqlens
    # standing in for the lengths the call derives (cache_seqlens + L)
    kw = dict(causal=causal, window=window, scale=scale, softcap=softcap, alibi_slopes=alibi_slopes, algo=algo,
              layout=layout, kv_dtype=kv_dtype, k_scale=k_scale, v_scale=v_scale, kv_lens=seqlens,
              cache_leftpad=cache_leftpad, score_mod=score_mod, mask_mod=mask_mod, block_mask=block_mask,
              captures=captures, floats=floats, ints=ints)
    if block_table is not None:
        table = as_array(block_table)
        kw.update(block_table=table, page_size=page_size,
                  max_seqlen_k=int(table.shape[-1]) * rows if len(table.shape) == 2 else None)
    elif cache_batch_idx is not None:  # as clattn does: a paged cache of one page per slot
        idx = small_array(self, cache_batch_idx, "cache_batch_idx", (B,), np.int32)
        kw.update(block_table=idx.reshape(B, 1), max_seqlen_k=rows)
    # the lengths on the host as well, so the library checks every row
    # before anything is written (a new row with no place, a rotary
    # position past the tables)
    host_seqlens = np.ascontiguousarray(seqlens.get() if is_cl_array(seqlens) else seqlens, dtype=np.int32)
    c = Call(self, q, k_cache, v_cache, kw)

    if (k is None) != (v is None):
        raise ValueError("clattn: k and v come together (the new keys and values)")
    L = 0
    if k is not None:
        k, v = as_array(k), as_array(v)
        for name, x, d in (("k", k, c.dk), ("v", v, c.dv)):
            if x.dtype != c.q.dtype:
                raise TypeError("clattn: %s must be q's dtype %s (got %s)" % (name, c.q.dtype, x.dtype))
            if len(x.shape) != 4:
                raise ValueError("clattn: %s must be 4-D (got shape %s)" % (name, tuple(x.shape)))
            dims = [int(x.shape[a]) for a in axes]
            if dims[0] != B or dims[1] != c.Hkv or dims[3] != d or dims[2] != int(k.shape[axes[2]]):
                raise ValueError("clattn: %s must be [B, Hkv, L, %d] = [%d, %d, L, %d] in layout %s (got shape %s)"
                                 % (name, d, B, c.Hkv, d, layout, tuple(x.shape)))
            if is_cl_array(x) and x.context.int_ptr != self._cl_context:
                raise ValueError("clattn: %s is a pyopencl array from another OpenCL context" % name)
        L = int(k.shape[axes[2]])
    if (rotary_cos is None) != (rotary_sin is None):
        raise ValueError("clattn: rotary_cos and rotary_sin come together")
    rotary = rotary_cos is not None
    if rotary:
        rotary_cos, rotary_sin, rotary_len, rotary_dim = _rotary_tables(rotary_cos, rotary_sin, c.dk)

    if L:  # the caches (and int8 scales) are written
        check_written_disjoint((("k_cache", k_cache), ("v_cache", v_cache), ("k_scale", c.k_scale),
                                ("v_scale", c.v_scale)),
                               (("q", q), ("k", k), ("v", v), ("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin),
                                ("cache_seqlens", cache_seqlens), ("block_table", block_table),
                                ("cache_batch_idx", cache_batch_idx), ("cache_leftpad", cache_leftpad),
                                ("alibi_slopes", alibi_slopes)))

    outs, inplace = {}, []
    kp = self._lib.kvcache_params_default()
    with self._device_call(outs) as (views, waits, events):
        p = kp.attn
        c.fill(p, views, waits, inplace=inplace if L else None)  # the cache is written when rows are appended
        kp.cache_seqlens, p.kv_lens = p.kv_lens, None
        kp.host_seqlens = host_seqlens.ctypes.data
        if cache_batch_idx is not None:
            kp.cache_batch_idx, kp.num_slots = p.block_table, c.pages
            p.block_table, p.block_table_stride, p.page_size, p.num_pages = None, 0, 0, 0
        if L:
            kp.new_len = L
            kp.k_new = tensor_of(self, k, "k", axes, views, waits)[0]
            kp.v_new = tensor_of(self, v, "v", axes, views, waits)[0]
        if rotary:
            for field, x in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin)):
                vw = self._input(x, field, views, waits)
                t = getattr(kp, field)
                t.buf, t.offset = vw.buf, vw.offset
                t.stride[2], t.stride[3] = vw.strides
            kp.rotary_dim, kp.rotary_len = rotary_dim, rotary_len
            kp.rotary_interleaved = 1 if rotary_interleaved else 0
        o_shape, o_strides = c.out_spec()
        want = [("out", o_shape, c.q.dtype, o_strides)]
        if return_lse:
            row_shape, row_strides = c.row_spec()
            want.append(("lse", row_shape, np.dtype(np.float32), row_strides))
        for name, t in self._outputs(want, c.out_cl, outs).items():
            setattr(p, name, t)
        self._run(self._lib.forward_kvcache, kp, waits, outs, events, inplace)
    return (outs["out"][0], outs["lse"][0]) if return_lse else outs["out"][0]


class KVCache:
    """A K/V cache in a Context's device memory (Context.kv_cache), so that
    a numpy caller's decode step costs its new rows, not the cache: k, v
    (and, "int8", k_scale, v_scale) are clattn.DeviceArrays holding copies
    of the arrays given, contiguous [B,Hkv,capacity,d] or a page pool
    [num_pages,Hkv,page_size,d] ("bshd": [B,capacity,Hkv,d],
    [num_pages,page_size,Hkv,d]), stored as the arrays are (float32,
    float16, bfloat16; kv_dtype "q8_0" or "int8" as in attention).

    attention_with_kvcache(q, k, v, **kw) and kv_append(k_new, v_new,
    positions, **kw) are the Context's with this cache's arrays, storage
    and layout; the arrays also go wherever a call takes K/V (attention,
    plan), read in place. get() reads the cache back to numpy; close()
    (or a with block's end) frees it."""

    def __init__(self, ctx, k, v, *, kv_dtype=None, k_scale=None, v_scale=None, layout="bhsd"):
        if layout not in ("bhsd", "bshd"):
            raise ValueError("clattn: layout must be 'bhsd' or 'bshd' (got %r)" % (layout,))
        arrays = {"k": k, "v": v, "k_scale": k_scale, "v_scale": v_scale}
        for name, x in arrays.items():
            if x is not None and not isinstance(x, np.ndarray):
                raise TypeError("clattn: kv_cache's %s must be a numpy array (the cache's first contents; "
                                "pyopencl arrays are on the device already: pass them to the calls)" % name)
        if k.ndim != 4 or v.ndim != 4:
            raise ValueError("clattn: k and v must be 4-D (got shapes %s, %s)" % (k.shape, v.shape))
        kv = kv_storage(k, v, kv_dtype)
        axes = (0, 1, 2, 3) if layout == "bhsd" else (0, 2, 1, 3)
        if [k.shape[a] for a in axes[:3]] != [v.shape[a] for a in axes[:3]]:
            raise ValueError("clattn: k %s and v %s differ in their leading dimensions" % (k.shape, v.shape))
        for name, x in (("k", k), ("v", v)):
            head_dim_of(x.shape[-1], kv, name)
        if (kv == _ffi.INT8) != (k_scale is not None) or (k_scale is None) != (v_scale is None):
            raise ValueError("clattn: k_scale and v_scale come together, exactly with kv_dtype 'int8'")
        if kv == _ffi.INT8:
            scales_of(k_scale, "k_scale", k), scales_of(v_scale, "v_scale", v)
        self.layout = layout
        self.kv_dtype = kv_dtype if kv in (_ffi.Q8_0, _ffi.INT8) else None  # float storage: the arrays' dtype
        self._ctx = ctx
        self.k = self.v = self.k_scale = self.v_scale = None
        try:
            for name, x in arrays.items():
                if x is not None:
                    setattr(self, name, DeviceArray(ctx, x))
        except BaseException:
            self.close()
            raise

    def _arrays(self):
        return [x for x in (self.k, self.v, self.k_scale, self.v_scale) if x is not None]

    def _storage(self, kw):
        for name in ("kv_dtype", "k_scale", "v_scale", "layout"):
            if name in kw:
                raise TypeError("clattn: %s is the cache's own (given to kv_cache)" % name)
        return dict(kv_dtype=self.kv_dtype, k_scale=self.k_scale, v_scale=self.v_scale, layout=self.layout)

    def attention_with_kvcache(self, q, k=None, v=None, **kw):
        """Context.attention_with_kvcache over this cache: k, v (the new rows)
        written into it on the device, then q attends over it; O (and lse)
        come back as for numpy caches."""
        return self._ctx.attention_with_kvcache(q, self.k, self.v, k, v, **self._storage(kw), **kw)

    def kv_append(self, k_new, v_new, positions, **kw):
        """Context.kv_append into this cache on the device."""
        return self._ctx.kv_append(self.k, self.v, k_new, v_new, positions, **self._storage(kw), **kw)

    def get(self):
        """numpy copies: (k, v), or (k, v, k_scale, v_scale) for an int8 cache."""
        return tuple(x.get() for x in self._arrays())

    def close(self):
        """Frees the device arrays (after the context's calls under way)."""
        for x in self._arrays():
            x.release()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
