"""Context.kv_append: new K/V rows written into a cache in place through
clattn_kv_append (contiguous or paged, any storage, quantised on the way)."""
import numpy as np

from . import _ffi
from ._call import (as_array, check_int, check_written_disjoint, head_dim_of, int_table, is_cl_array, kv_storage,
                    scales_of, small_array, storage_code, tensor_of)


def kv_append(self, k_cache, v_cache, k_new, v_new, positions, *, block_table=None, page_size=None,
              kv_dtype=None, k_scale=None, v_scale=None, layout="bhsd"):
    """Writes k_new, v_new [B,Hkv,L,d] ("bshd": [B,L,Hkv,d]; float32, float16
    or bfloat16 as in attention) into the caches in place: new row r of
    batch row b goes to cache position positions[b] + r (int32 [B]).

    Contiguous caches: k_cache, v_cache [B,Hkv,capacity,d] ("bshd":
    [B,capacity,Hkv,d]). Paged caches (block_table int32 [B, pages per
    sequence]): [num_pages,Hkv,page_size,d] ("bshd": [num_pages,page_size,
    Hkv,d]); position j of sequence b is row j % page_size of page
    block_table[b, j // page_size]. The cache's storage: its float dtype, or
    kv_dtype "q8_0" (uint8 rows of d / 32 blocks of 34 bytes, ggml's
    block_q8_0, quantised with ggml's reference rules) or "int8" (int8 rows,
    with k_scale, v_scale float32 of the cache's shape without its last
    axis, written too). A row past the capacity, past the block table or on a
    page outside the pool is skipped (positions live on the device). numpy
    caches are updated where they lie; pyopencl caches on the device."""
    k_cache, v_cache, k_new, v_new = (as_array(x) for x in (k_cache, v_cache, k_new, v_new))
    if layout not in ("bhsd", "bshd"):
        raise ValueError("clattn: layout must be 'bhsd' or 'bshd' (got %r)" % (layout,))
    axes = (0, 1, 2, 3) if layout == "bhsd" else (0, 2, 1, 3)
    dims = {}
    for name, x in (("k_cache", k_cache), ("v_cache", v_cache), ("k_new", k_new), ("v_new", v_new)):
        if len(x.shape) != 4:
            raise ValueError("clattn: %s must be 4-D (got shape %s)" % (name, tuple(x.shape)))
        if is_cl_array(x) and x.context.int_ptr != self._cl_context:
            raise ValueError("clattn: %s is a pyopencl array from another OpenCL context" % name)
        dims[name] = [int(x.shape[a]) for a in axes]
    src = storage_code(k_new.dtype, "k_new")
    if v_new.dtype != k_new.dtype:
        raise TypeError("clattn: k_new and v_new must have one dtype (got %s, %s)" % (k_new.dtype, v_new.dtype))
    kv = kv_storage(k_cache, v_cache, kv_dtype, ("k_cache", "v_cache"))
    B, Hkv, L, dk = dims["k_new"]
    dv = dims["v_new"][3]
    slots, heads, rows, _ = dims["k_cache"]
    if dims["v_new"][:3] != [B, Hkv, L]:
        raise ValueError("clattn: k_new %s and v_new %s differ" % (k_new.shape, v_new.shape))
    if dims["v_cache"][:3] != [slots, heads, rows]:
        raise ValueError("clattn: k_cache %s and v_cache %s differ" % (k_cache.shape, v_cache.shape))
    if heads != Hkv:
        raise ValueError("clattn: the caches have %d heads, the new rows %d" % (heads, Hkv))
    if head_dim_of(dims["k_cache"][3], kv, "k_cache") != dk or head_dim_of(dims["v_cache"][3], kv, "v_cache") != dv:
        raise ValueError("clattn: the caches' rows and the new rows differ in length")
    if min(B, Hkv, dk, dv, slots, rows) == 0:
        raise ValueError("clattn: empty dimension in the caches or the new rows")
    if (kv == _ffi.INT8) != (k_scale is not None) or (k_scale is None) != (v_scale is None):
        raise ValueError("clattn: k_scale and v_scale come together, exactly with kv_dtype 'int8'")
    if kv == _ffi.INT8:
        k_scale, v_scale = scales_of(k_scale, "k_scale", k_cache), scales_of(v_scale, "v_scale", v_cache)
    positions = small_array(self, positions, "positions", (B,), np.int32)
    if block_table is not None:
        block_table = int_table(self, block_table, "block_table", 2)
        if block_table.shape[0] != B:
            raise ValueError("clattn: block_table has %d rows for a batch of %d" % (block_table.shape[0], B))
        if page_size is not None and check_int(page_size, "page_size", 1) != rows:
            raise ValueError("clattn: page_size %r but the cache's pages hold %d rows" % (page_size, rows))
    elif slots != B:
        raise ValueError("clattn: a contiguous cache has the batch's %d rows (got %d)" % (B, slots))
    if L == 0:
        return None  # nothing to write: a valid no-op
    check_written_disjoint((("k_cache", k_cache), ("v_cache", v_cache), ("k_scale", k_scale), ("v_scale", v_scale)),
                           (("k_new", k_new), ("v_new", v_new), ("positions", positions),
                            ("block_table", block_table)))
    scale_axes = axes[:3] + (None,)

    inplace = []
    ap = self._lib.append_params_default()
    with self._device_call({}) as (views, waits, events):
        ap.batch, ap.kv_heads, ap.new_len, ap.head_dim, ap.value_dim = B, Hkv, L, dk, dv
        ap.src_dtype = src
        ap.kv_dtype = kv
        ap.k_new = tensor_of(self, k_new, "k_new", axes, views, waits)[0]
        ap.v_new = tensor_of(self, v_new, "v_new", axes, views, waits)[0]
        for field, x, ax in (("k", k_cache, axes), ("v", v_cache, axes), ("k_scale", k_scale, scale_axes),
                             ("v_scale", v_scale, scale_axes)):
            if x is None:
                continue
            name = field if "scale" in field else field + "_cache"
            t, vw = tensor_of(self, x, name, ax, views, waits, q8_0=kv == _ffi.Q8_0 and "scale" not in field,
                              writable=True)
            setattr(ap, field, t)
            inplace.append((x, vw))
        ap.positions = self._input(positions, "positions", views, waits).buf
        if block_table is not None:
            ap.block_table = self._input(block_table, "block_table", views, waits).buf
            ap.block_table_stride, ap.page_size, ap.num_pages = block_table.shape[1], rows, slots
        else:
            ap.capacity = rows
        self._run(self._lib.kv_append, ap, waits, {}, events, inplace)
    return None
