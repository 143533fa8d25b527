"""One attention call's arguments, checked and resolved on the host before
any device work: storage types (float32, float16, bfloat16; K/V also
"q8_0" and "int8"), layouts, packed sequences (cu_seqlens), paged caches
(block tables), the masks, biases and per-head arrays. Call.fill then
writes them into a clattn_params over the context's buffers. attention and
attention_backward share it."""
import math

import numpy as np

from . import _ffi
from ._device import DeviceArray

INT_MAX = 2**31 - 1
FLT_MAX = float(np.finfo(np.float32).max)

# the storage of q/out, k/v by name (kv_dtype, merge's out_dtype)
DTYPE_NAMES = {"float32": _ffi.F32, "float16": _ffi.F16, "bfloat16": _ffi.BF16}
KV_DTYPE_NAMES = dict(DTYPE_NAMES, q8_0=_ffi.Q8_0, int8=_ffi.INT8)
Q8_0_BLOCK, Q8_0_BYTES = 32, 34  # elements per ggml block_q8_0, its bytes (f16 d, 32 int8)

# attention's keywords and their defaults (attention_backward takes them too)
DEFAULTS = dict(causal=False, window=(-1, -1), mask=None, bias=None, kv_lens=None, scale=None, softcap=0.0,
                alibi_slopes=None, sinks=None, empty_rows="zero", algo="auto", layout="bhsd",
                cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
                block_table=None, page_size=None, kv_dtype=None, k_scale=None, v_scale=None,
                dropout_p=0.0, seed=0, offset=0, cache_leftpad=None,
                score_mod=None, mask_mod=None, block_mask=None, captures=(), floats=(), ints=())
UINT64_MAX = 2**64 - 1


def is_cl_array(a):
    # pyopencl is optional: a pyopencl array can only exist once its module
    # is imported, so numpy-only callers never pay for (or need) the import
    import sys
    m = sys.modules.get("pyopencl.array")
    t = getattr(m, "Array", None) if m is not None else None
    return t is not None and isinstance(a, t)


def as_array(x):
    """A numpy, pyopencl or clattn device array as it is; anything else
    through np.asarray."""
    return x if is_cl_array(x) or isinstance(x, (np.ndarray, DeviceArray)) else np.asarray(x)


def storage_code(dt, name):
    """The clattn storage of a float array: float32, float16, or bfloat16 as
    ml_dtypes.bfloat16 or as np.uint16 holding bfloat16 bit patterns."""
    dt = np.dtype(dt)
    if dt == np.float32:
        return _ffi.F32
    if dt == np.float16:
        return _ffi.F16
    if dt == np.uint16 or (dt.name == "bfloat16" and dt.itemsize == 2):
        return _ffi.BF16
    raise TypeError("clattn: %s must be float32, float16 or bfloat16 (ml_dtypes.bfloat16, or np.uint16 holding "
                    "bfloat16 bits; got %s)" % (name, dt))


def check_int(x, name, lo=None):
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)):
        raise TypeError("clattn: %s must be an int (got %r)" % (name, x))
    x = int(x)
    if x > INT_MAX or x < -INT_MAX - 1 or (lo is not None and x < lo):
        raise ValueError("clattn: %s = %d is out of range" % (name, x))
    return x


def to_float(x, name, why):
    """float(x): not a number is a TypeError; a Python int too large for any
    float (float() raises OverflowError) is out of range, ValueError(why)."""
    try:
        return float(x)
    except OverflowError:
        raise ValueError("clattn: %s %s (got an int of %d digits)" % (name, why, len(str(abs(int(x)))))) from None
    except (TypeError, ValueError):
        raise TypeError("clattn: %s must be a number (got %r)" % (name, x)) from None


def check_dropout_p(p):
    """dropout_p as a float in [0, 1): attention's and dropout_mask's rule."""
    if isinstance(p, (bool, np.bool_)) or not isinstance(p, (int, float, np.integer, np.floating)):
        raise TypeError("clattn: dropout_p must be a number (got %r)" % (p,))
    f = to_float(p, "dropout_p", "must be in [0, 1)")
    if not 0.0 <= f < 1.0:
        raise ValueError("clattn: dropout_p must be in [0, 1) (got %r)" % (p,))
    return f


def broadcast_strides(shape, strides, target, name):
    """Right-aligned numpy broadcasting of (shape, strides) to target; size-1
    dimensions broadcast with stride 0."""
    if len(shape) > len(target):
        raise ValueError("clattn: %s of shape %s does not broadcast to %s" % (name, tuple(shape), tuple(target)))
    pad = len(target) - len(shape)
    shape = (1,) * pad + tuple(shape)
    strides = (0,) * pad + tuple(strides)
    out = []
    for n, s, t in zip(shape, strides, target):
        if n == t:
            out.append(s if n > 1 else 0)
        elif n == 1:
            out.append(0)
        else:
            raise ValueError("clattn: %s of shape %s does not broadcast to %s" % (name, shape[pad:], tuple(target)))
    return out


def host_ints(a, name):
    """A small int array's values on the host (pyopencl arrays are read)."""
    arr = a.get() if is_cl_array(a) else np.asarray(a)
    if arr.dtype.kind not in "iu":
        raise TypeError("clattn: %s must be integers (int32), got %s" % (name, arr.dtype))
    return arr


def small_array(ctx, a, name, shape, dtype):
    """A small array (lengths, tables, slopes) checked before any device
    work: a dense, offset-0 pyopencl array of ctx's context (used as it
    is), else a contiguous numpy array."""
    if is_cl_array(a):
        if a.context.int_ptr != ctx._cl_context:
            raise ValueError("clattn: %s is a pyopencl array from another OpenCL context" % name)
        if tuple(a.shape) != shape:
            raise ValueError("clattn: %s must have shape %s (got %s)" % (name, shape, a.shape))
        if a.dtype != dtype:
            raise TypeError("clattn: %s must be %s (got %s)" % (name, np.dtype(dtype).name, a.dtype))
        if a.offset == 0 and a.flags.c_contiguous:
            return a
        a = a.get()
    arr = np.asarray(a)
    if arr.shape != shape:
        raise ValueError("clattn: %s must have shape %s (got %s)" % (name, shape, arr.shape))
    if dtype == np.int32:
        if arr.dtype.kind not in "iu":
            raise TypeError("clattn: %s must be integers (int32), got %s" % (name, arr.dtype))
        if arr.size and (arr.min() < -INT_MAX - 1 or arr.max() > INT_MAX):
            raise ValueError("clattn: %s does not fit int32" % name)
    elif isinstance(a, np.ndarray) or arr.dtype.kind not in "iuf":
        if arr.dtype not in (np.float32, np.float16):
            raise TypeError("clattn: %s must be float32 (got %s)" % (name, arr.dtype))
    return np.ascontiguousarray(arr, dtype=dtype)


def int_table(ctx, a, name, ndim):
    """A non-empty int32 array of ndim dimensions (cu_seqlens, block tables)."""
    a = as_array(a)
    if a.dtype.kind not in "iu":
        raise TypeError("clattn: %s must be integers (int32), got %s" % (name, a.dtype))
    if len(a.shape) != ndim or min(a.shape) == 0:
        raise ValueError("clattn: %s must be a non-empty %d-D array (got shape %s)" % (name, ndim, a.shape))
    return small_array(ctx, a, name, tuple(a.shape), np.int32)


def tensor_of(ctx, x, name, axes, views, waits, q8_0=False, writable=False):
    """An input (or in-place) array as a clattn_tensor over its logical
    [b, h, s, d] (axes None: a dimension of 1, stride 0). A q8_0 array's
    last axis holds whole 34-byte blocks: its view counts bytes with
    stride[3] = 34."""
    if q8_0 and not is_cl_array(x) and x.strides[-1] != 1 and not writable:
        x = np.ascontiguousarray(x)
    vw = ctx._input(x, name, views, waits, writable)
    strides = [0 if a is None else vw.strides[a] for a in axes]
    if q8_0:
        if vw.strides[-1] != 1:
            raise ValueError("clattn: %s: a q8_0 row's bytes must be contiguous" % name)
        strides[3] = Q8_0_BYTES
    t = _ffi.Tensor()
    t.buf, t.offset = vw.buf, vw.offset
    for i in range(4):
        t.stride[i] = strides[i]
    return t, vw


SHARE_WORK = 1 << 16  # np.shares_memory's budget per pair; past it counts as sharing, as clattn's own search
TOO_HARD = getattr(np, "exceptions", np).TooHardError  # numpy >= 1.25: np.exceptions


def check_written_disjoint(written, others):
    """Refuses (ValueError) a numpy array written in place that shares a byte
    with another numpy array of the call, written or read: clattn's rule for
    its views, which it cannot see here (each numpy array is uploaded to its
    own buffer, and one's copy-back would overwrite the other's elements).
    written, others: (name, array or None) pairs; device arrays are the
    library's to check."""
    arrays = [(n, x, True) for n, x in written] + [(n, x, False) for n, x in others]
    arrays = [a for a in arrays if isinstance(a[1], np.ndarray) and a[1].size]
    for i, (n1, a, w1) in enumerate(arrays):
        for n2, b, w2 in arrays[i + 1:]:
            if not (w1 or w2):
                continue
            try:
                shared = np.shares_memory(a, b, max_work=SHARE_WORK)
                why = "share memory"
            except TOO_HARD:
                shared, why = True, "may share memory (too costly to tell)"
            if shared:
                raise ValueError("clattn: %s and %s %s, and %s is written in place: pass separate arrays"
                                 % (n1, n2, why, n1 if w1 else n2))


def kv_storage(k, v, kv_dtype, names=("k", "v")):
    """The clattn storage of a K/V pair: float (kv_dtype None, or naming k's
    float storage) or quantised ("q8_0", "int8": 1-byte arrays)."""
    if kv_dtype is not None and kv_dtype not in KV_DTYPE_NAMES:
        raise ValueError("clattn: kv_dtype must be one of %s (got %r)" % (", ".join(KV_DTYPE_NAMES), kv_dtype))
    if k.dtype != v.dtype:
        raise TypeError("clattn: %s and %s must have one dtype (got %s, %s)" % (names + (k.dtype, v.dtype)))
    if kv_dtype in ("q8_0", "int8"):
        if k.dtype.itemsize != 1 or k.dtype.kind not in "iu":
            raise TypeError("clattn: kv_dtype %r takes %s and %s as int8 or uint8 arrays (got %s)"
                            % ((kv_dtype,) + names + (k.dtype,)))
        return KV_DTYPE_NAMES[kv_dtype]
    code = storage_code(k.dtype, names[0])
    if kv_dtype is not None and KV_DTYPE_NAMES[kv_dtype] != code:
        raise TypeError("clattn: kv_dtype %r but %s and %s are %s" % ((kv_dtype,) + names + (k.dtype,)))
    return code


def head_dim_of(cols, kv, name):
    """A K/V row's elements from its last axis (q8_0: whole 34-byte blocks)."""
    if kv != _ffi.Q8_0:
        return cols
    if cols % Q8_0_BYTES:
        raise ValueError("clattn: q8_0 %s rows are whole 34-byte blocks (the last dimension has %d bytes)"
                         % (name, cols))
    return cols // Q8_0_BYTES * Q8_0_BLOCK


def scales_of(x, name, ref):
    """An INT8 cache's scales: float32, ref's shape without its last axis."""
    x = as_array(x)
    if x.dtype != np.float32:
        raise TypeError("clattn: %s must be float32 (got %s)" % (name, x.dtype))
    if tuple(x.shape) != tuple(ref.shape[:-1]):
        raise ValueError("clattn: %s must have its cache's shape without the last axis, %s (got %s)"
                         % (name, tuple(ref.shape[:-1]), tuple(x.shape)))
    return x


# ---- modifiers (score_mod, mask_mod, their captures, a block mask) ----

MAX_CAPTURES = 4  # clattn_params' captures[4], capture_f[4], capture_i[4]


def modifier_text(x, name):
    """A modifier's OpenCL C source as the bytes clattn_params points at
    (None: none)."""
    if x is None:
        return None
    if isinstance(x, str):
        x = x.encode("utf-8")
    elif isinstance(x, (bytes, bytearray)):
        x = bytes(x)
    else:
        raise TypeError("clattn: %s must be OpenCL C source text (a str) or None (got %s)" % (name, type(x).__name__))
    if b"\0" in x:
        raise ValueError("clattn: %s holds a NUL character" % name)
    return x


def up_to_four(x, name):
    """captures / floats / ints as a tuple of at most four (a lone item is one)."""
    if x is None:
        return ()
    t = tuple(x) if isinstance(x, (list, tuple)) else (x,)
    if len(t) > MAX_CAPTURES:
        raise ValueError("clattn: %s holds at most %d items (got %d)" % (name, MAX_CAPTURES, len(t)))
    return t


def capture_floats(x):
    out = []
    for n, f in enumerate(up_to_four(x, "floats")):
        if isinstance(f, (bool, np.bool_)):
            raise TypeError("clattn: floats[%d] must be a number (got %r)" % (n, f))
        f = to_float(f, "floats[%d]" % n, "must fit float32")
        if math.isfinite(f) and abs(f) > FLT_MAX:
            raise ValueError("clattn: floats[%d] = %r does not fit float32" % (n, f))
        out.append(float(np.float32(f)))
    return tuple(out)


def capture_arrays(ctx, x):
    """captures as the call uploads them: None (an empty slot), a numpy
    array (C order, uploaded read-only as it lies: the modifier reads its
    bytes), a pyopencl array of ctx's context (dense at offset 0: its own
    buffer; else copied) or a clattn.DeviceArray (its buffer)."""
    out = []
    for n, a in enumerate(up_to_four(x, "captures")):
        name = "captures[%d]" % n
        if a is None or isinstance(a, DeviceArray):
            out.append(a)
            continue
        if is_cl_array(a):
            if a.context.int_ptr != ctx._cl_context:
                raise ValueError("clattn: %s is a pyopencl array from another OpenCL context than this "
                                 "clattn.Context's" % name)
            if a.offset == 0 and a.flags.c_contiguous and a.size:
                out.append(a)
                continue
            a = a.get()
        if not isinstance(a, np.ndarray):
            raise TypeError("clattn: %s must be a numpy array, a pyopencl array, a clattn.DeviceArray or None "
                            "(got %s: give an array of the dtype the modifier reads, e.g. int32)"
                            % (name, type(a).__name__))
        if a.size == 0:
            raise ValueError("clattn: %s is empty (shape %s)" % (name, a.shape))
        out.append(np.ascontiguousarray(a))
    return tuple(out)


def same_capture(a, b):
    """Whether two captures hold the same bytes for the modifier: the same
    device buffer, or numpy arrays equal in dtype, shape and contents."""
    if a is None or b is None:
        return a is b
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a.view(np.uint8), b.view(np.uint8))
    return a is b


class Modifiers:
    """A call's modifiers: score_mod and mask_mod (OpenCL C text, kept alive
    as bytes for the call), up to four captured arrays, floats and ints,
    and a clattn.BlockMask. With a block mask, mask_mod None takes the
    block mask's, and no captures, floats or ints at all take its
    captures; a numpy capture equal to the block mask's own is passed as
    the block mask's buffer (clattn compares buffers)."""

    def __init__(self, ctx, score_mod, mask_mod, block_mask, captures, floats, ints):
        self.ctx = ctx
        self.score_mod = modifier_text(score_mod, "score_mod")
        self.mask_mod = modifier_text(mask_mod, "mask_mod")
        self.captures = capture_arrays(ctx, captures)
        self.floats = capture_floats(floats)
        self.ints = tuple(check_int(x, "ints[%d]" % n) for n, x in enumerate(up_to_four(ints, "ints")))
        self.block_mask = block_mask
        if block_mask is not None:
            from ._flex import BlockMask
            if not isinstance(block_mask, BlockMask):
                raise TypeError("clattn: block_mask must be a clattn.BlockMask (Context.create_block_mask) or None "
                                "(got %s)" % type(block_mask).__name__)
            block_mask._usable_by(ctx)
            if self.mask_mod is None:
                self.mask_mod = block_mask._mask_mod
            if not (self.captures or self.floats or self.ints):
                self.captures, self.floats, self.ints = block_mask._captures, block_mask._floats, block_mask._ints
        self.on = self.score_mod is not None or self.mask_mod is not None
        if not self.on and (any(c is not None for c in self.captures) or any(self.floats) or any(self.ints)):
            raise ValueError("clattn: captures, floats or ints given without score_mod or mask_mod to read them")

    def fill(self, p, views, waits):
        """Sets p's modifier fields, uploading the numpy captures into views."""
        if not self.on:
            return
        p.score_mod, p.mask_mod = self.score_mod, self.mask_mod
        bm = self.block_mask
        for n, a in enumerate(self.captures):
            if a is None:
                continue
            if bm is not None and n < len(bm._captures) and isinstance(a, np.ndarray) and \
                    same_capture(a, bm._captures[n]):
                p.captures[n] = bm._buffers[n]
            else:
                p.captures[n] = self.ctx._input(a, "captures[%d]" % n, views, waits).buf
        for n, f in enumerate(self.floats):
            p.capture_f[n] = f
        for n, i in enumerate(self.ints):
            p.capture_i[n] = i
        if bm is not None:
            p.block_mask = bm._handle()


class Call:
    """The parsed call. Shapes in clattn's terms: batch B, heads Hq / Hkv,
    q_len M and kv_len N (the longest, with packed sequences or a paged
    cache), head_dim dk, value_dim dv; `axes` maps each array's logical
    [batch, head, row, column] onto its own axes (None: a packed batch of
    one)."""

    def __init__(self, ctx, q, k, v, kw):
        unknown = set(kw) - set(DEFAULTS)
        if unknown:
            raise TypeError("clattn: unexpected keyword argument(s) %s" % ", ".join(sorted(unknown)))
        o = dict(DEFAULTS, **kw)
        self.ctx = ctx
        self.q, self.k, self.v = (as_array(x) for x in (q, k, v))
        self.out_cl = is_cl_array(self.q)
        layout = o["layout"]
        if layout not in ("bhsd", "bshd"):
            raise ValueError("clattn: layout must be 'bhsd' or 'bshd' (got %r)" % (layout,))
        self.layout = layout
        self._dropout(o)
        self._storage(o)
        self._shapes(o)
        self._scalars(o)
        self._extras(o)
        self.mods = Modifiers(ctx, o["score_mod"], o["mask_mod"], o["block_mask"], o["captures"], o["floats"],
                              o["ints"])

    # -- storage types -----------------------------------------------------------

    def _dropout(self, o):
        p = check_dropout_p(o["dropout_p"])
        for name in ("seed", "offset"):  # 64-bit unsigned, as clattn_params' dropout_seed / dropout_offset
            x = o[name]
            if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)):
                raise TypeError("clattn: %s must be an int (got %r)" % (name, x))
            if not 0 <= int(x) <= UINT64_MAX:
                raise ValueError("clattn: %s = %d is outside [0, 2^64)" % (name, int(x)))
        self.dropout_p, self.seed, self.offset = p, int(o["seed"]), int(o["offset"])

    def _storage(self, o):
        self.dtype = storage_code(self.q.dtype, "q")
        self.kv = kv_storage(self.k, self.v, o["kv_dtype"])  # may differ from q's: a cache in another precision
        if (self.kv == _ffi.INT8) != (o["k_scale"] is not None) or (o["k_scale"] is None) != (o["v_scale"] is None):
            raise ValueError("clattn: k_scale and v_scale come together, exactly with kv_dtype 'int8'")
        self.kv_same = self.kv == self.dtype

    # -- shapes ------------------------------------------------------------------

    def _axes(self, x, name, packed):
        """The logical [b, h, s, d] dims of x and the axis each lies on."""
        want = 3 if packed else 4
        if len(x.shape) != want:
            raise ValueError("clattn: %s must be %d-D here (got shape %s)%s" % (
                name, want, tuple(x.shape), " (packed sequences: [heads, total, dim] or, bshd, [total, heads, dim])"
                if packed else ""))
        if packed:
            axes = (None, 0, 1, 2) if self.layout == "bhsd" else (None, 1, 0, 2)
        else:
            axes = (0, 1, 2, 3) if self.layout == "bhsd" else (0, 2, 1, 3)
        dims = [1 if a is None else int(x.shape[a]) for a in axes]
        if any(n == 0 for n in x.shape):
            raise ValueError("clattn: %s is empty (shape %s)" % (name, tuple(x.shape)))
        return dims, axes

    def _shapes(self, o):
        q, k, v = self.q, self.k, self.v
        self.packed_q = o["cu_seqlens_q"] is not None
        self.paged = o["block_table"] is not None
        self.packed_k = o["cu_seqlens_k"] is not None and not self.paged
        if o["cu_seqlens_k"] is not None and not self.packed_q:
            raise ValueError("clattn: cu_seqlens_k without cu_seqlens_q")
        if self.packed_q and not self.paged and o["cu_seqlens_k"] is None:
            raise ValueError("clattn: cu_seqlens_q without cu_seqlens_k needs a block table (paged K/V)")
        qd, self.q_axes = self._axes(q, "q", self.packed_q)
        kd, self.k_axes = self._axes(k, "k", self.packed_k)
        vd, self.v_axes = self._axes(v, "v", self.packed_k)
        _, Hq, rows_q, dk = qd
        kb, Hkv, rows_k, dk2 = kd
        dv = vd[3]
        dk2, dv = head_dim_of(dk2, self.kv, "k"), head_dim_of(dv, self.kv, "v")
        if dk2 != dk:
            raise ValueError("clattn: head_dim differs: q %d, k %d" % (dk, dk2))
        if vd[0] != kb or vd[1] != Hkv or vd[2] != rows_k:
            raise ValueError("clattn: k %s and v %s differ in their leading dimensions" % (k.shape, v.shape))
        if Hq % Hkv:
            raise ValueError("clattn: q_heads %d is not a multiple of kv_heads %d" % (Hq, Hkv))
        self.cu_q = self.cu_k = self.table = None
        self.kv_lens = o["kv_lens"]
        if self.packed_q:
            self.cu_q, cu_host = self._cu(o["cu_seqlens_q"], "cu_seqlens_q", rows_q)
            B = len(cu_host) - 1
            M = self._longest(o["max_seqlen_q"], "max_seqlen_q", np.diff(cu_host.astype(np.int64)))
        else:
            B, M = qd[0], rows_q
        if self.paged:
            self.table = int_table(self.ctx, o["block_table"], "block_table", 2)
            if self.table.shape[0] != B:
                raise ValueError("clattn: block_table has %d rows for a batch of %d" % (self.table.shape[0], B))
            pages, page_size = kb, rows_k
            if o["page_size"] is not None and check_int(o["page_size"], "page_size", 1) != page_size:
                raise ValueError("clattn: page_size %r but the cache's pages hold %d rows" % (o["page_size"], page_size))
            if o["cu_seqlens_k"] is not None:  # FlashAttention's form: the keys' lengths as offsets
                if self.kv_lens is not None:
                    raise ValueError("clattn: kv_lens and cu_seqlens_k both give the keys' lengths")
                _, cu_k = self._cu(o["cu_seqlens_k"], "cu_seqlens_k", None)
                if len(cu_k) != B + 1:
                    raise ValueError("clattn: cu_seqlens_k must have batch + 1 = %d entries" % (B + 1))
                self.kv_lens = np.diff(cu_k).astype(np.int32)
            if self.kv_lens is None:
                raise ValueError("clattn: a block table needs each sequence's key count (kv_lens or cu_seqlens_k)")
            entries = self.table.shape[1]
            if is_cl_array(self.kv_lens):  # the lengths stay on the device: the table's reach bounds them
                N = entries * page_size if o["max_seqlen_k"] is None else check_int(o["max_seqlen_k"], "max_seqlen_k", 1)
            else:
                N = self._longest(o["max_seqlen_k"], "max_seqlen_k", host_ints(self.kv_lens, "kv_lens"))
            self.pages, self.page_size, self.entries = pages, page_size, entries
        elif self.packed_k:
            self.cu_k, cu_host = self._cu(o["cu_seqlens_k"], "cu_seqlens_k", rows_k)
            if len(cu_host) != B + 1:
                raise ValueError("clattn: cu_seqlens_k must have batch + 1 = %d entries" % (B + 1))
            N = self._longest(o["max_seqlen_k"], "max_seqlen_k", np.diff(cu_host.astype(np.int64)))
        else:
            N = rows_k
            if kb != B:
                raise ValueError("clattn: batch differs: q %d, k %d" % (B, kb))
        if self.packed_q and not self.paged and self.kv_lens is not None:
            raise ValueError("clattn: kv_lens with packed sequences: cu_seqlens_k gives the keys' lengths")
        for nm, val in (("batch", B), ("q_len", M), ("kv_len", N), ("head_dim", dk), ("value_dim", dv),
                        ("batch*q_heads", B * Hq)):
            if val > INT_MAX:
                raise ValueError("clattn: %s = %d exceeds 2^31 - 1" % (nm, val))
        self.B, self.Hq, self.Hkv, self.M, self.N, self.dk, self.dv = B, Hq, Hkv, M, N, dk, dv
        self.total_q, self.total_k = rows_q, rows_k
        if self.kv_lens is not None:
            self.kv_lens = small_array(self.ctx, self.kv_lens, "kv_lens", (B,), np.int32)
        self.leftpad = o["cache_leftpad"]
        if self.leftpad is not None:
            if self.kv_lens is None:
                raise ValueError("clattn: cache_leftpad needs kv_lens (each row's keys end there)")
            if self.packed_k:
                raise ValueError("clattn: cache_leftpad with cu_seqlens_k: packed keys start where the offsets say")
            self.leftpad = small_array(self.ctx, self.leftpad, "cache_leftpad", (B,), np.int32)

    def _cu(self, a, name, total):
        """cu_seqlens as the call uses it, and its values on the host."""
        a = int_table(self.ctx, a, name, 1)
        host = host_ints(a, name)
        if len(host) < 2:
            raise ValueError("clattn: %s needs batch + 1 >= 2 entries" % name)
        if host[0] != 0 or np.any(np.diff(host.astype(np.int64)) < 0) or (total is not None and host[-1] > total):
            raise ValueError("clattn: %s must start at 0, not decrease, and end within the %s rows" % (name, total))
        return a, host

    @staticmethod
    def _longest(given, name, lengths):
        """max_seqlen_q / _k: as given (at least the longest sequence: a
        shorter bound would drop rows), else the longest."""
        longest = max(1, int(np.max(np.asarray(lengths, np.int64), initial=0)))
        if given is not None and check_int(given, name, 1) < longest:
            raise ValueError("clattn: %s = %d is below the longest sequence's %d" % (name, given, longest))
        return longest if given is None else int(given)

    # -- scalars and extras ------------------------------------------------------

    def _scalars(self, o):
        window = o["window"] if o["window"] is not None else (-1, -1)
        try:
            wl, wr = window
        except (TypeError, ValueError):
            raise TypeError("clattn: window must be a pair (left, right)") from None
        self.wl, self.wr = check_int(wl, "window[0]"), check_int(wr, "window[1]")
        if self.wl < -1 or self.wr < -1:
            raise ValueError("clattn: window bounds are >= 0, or -1 for unbounded (got %s)" % ((wl, wr),))
        if o["empty_rows"] not in _ffi.EMPTY_ROWS:
            raise ValueError("clattn: empty_rows must be 'zero' or 'error' (got %r)" % (o["empty_rows"],))
        if o["algo"] not in _ffi.ALGOS:
            raise ValueError("clattn: algo must be one of %s (got %r)" % (", ".join(_ffi.ALGOS), o["algo"]))
        self.empty_rows, self.algo, self.causal = o["empty_rows"], o["algo"], bool(o["causal"])
        scale = o["scale"]
        if scale is None:
            self.scale = float("nan")
        else:
            self.scale = to_float(scale, "scale", "must be finite in float32")
            if math.isinf(self.scale) or abs(self.scale) > FLT_MAX:
                raise ValueError("clattn: scale must be finite in float32 (got %r)" % (scale,))
        self.softcap = to_float(o["softcap"], "softcap", "must be 0 (off) or positive and finite")
        if not (0.0 <= self.softcap <= FLT_MAX):
            raise ValueError("clattn: softcap must be 0 (off) or positive and finite (got %r)" % (o["softcap"],))

    def _extras(self, o):
        s_shape = (self.B, self.Hq, self.M, self.N)
        mask, bias = o["mask"], o["bias"]
        if mask is not None:
            mask = as_array(mask)
            if mask.dtype == np.bool_:
                mask = mask.view(np.uint8)
            elif mask.dtype != np.uint8:
                raise TypeError("clattn: mask must be bool or uint8 (got %s)" % mask.dtype)
            broadcast_strides(mask.shape, [0] * len(mask.shape), s_shape, "mask")
        if bias is not None:
            bias = as_array(bias)
            if not is_cl_array(bias) and bias.dtype == np.float16:
                bias = bias.astype(np.float32)
            if bias.dtype != np.float32:
                raise TypeError("clattn: bias must be float32 (got %s)" % bias.dtype)
            broadcast_strides(bias.shape, [0] * len(bias.shape), s_shape, "bias")
        self.mask, self.bias = mask, bias
        self.alibi = o["alibi_slopes"]
        if self.alibi is not None:  # [Hq], or [B, Hq] per batch row
            per_batch = len(np.shape(self.alibi)) == 2
            self.alibi = small_array(self.ctx, self.alibi, "alibi_slopes", (self.B, self.Hq) if per_batch else (self.Hq,),
                                     np.float32)
        self.sinks = None if o["sinks"] is None else small_array(self.ctx, o["sinks"], "sinks", (self.Hq,), np.float32)
        self.k_scale = self.v_scale = None
        if self.kv == _ffi.INT8:  # one f32 per key row
            self.k_scale, self.v_scale = scales_of(o["k_scale"], "k_scale", self.k), scales_of(o["v_scale"],
                                                                                               "v_scale", self.v)
        for name in ("q", "k", "v", "mask", "bias", "k_scale", "v_scale"):
            x = getattr(self, name)
            if x is not None and is_cl_array(x) and x.context.int_ptr != self.ctx._cl_context:
                raise ValueError("clattn: %s is a pyopencl array from another OpenCL context than this "
                                 "clattn.Context's (create the Context with queue= in that context)" % name)

    # -- onto the device ---------------------------------------------------------

    def view(self, x, name, axes, views, waits, q8_0=False, inplace=None):
        """x's view; with inplace (a list) uploaded writable, (x, its view) added."""
        t, vw = tensor_of(self.ctx, x, name, axes, views, waits, q8_0, writable=inplace is not None)
        if inplace is not None:
            inplace.append((x, vw))
        return t

    def scale_axes(self):
        """k_scale / v_scale: k's axes without the last."""
        return tuple(self.k_axes[:3]) + (None,)

    def small(self, a, name, views, waits):
        return self.ctx._input(a, name, views, waits).buf

    def fill(self, p, views, waits, inplace=None):
        """Sets every input field of p (not the outputs) over uploaded views;
        with inplace (a list) k, v and their scales are written by the call
        (attention_with_kvcache's cache): uploaded writable and listed."""
        p.batch, p.q_heads, p.kv_heads, p.q_len, p.kv_len = self.B, self.Hq, self.Hkv, self.M, self.N
        p.head_dim, p.value_dim, p.dtype = self.dk, self.dv, self.dtype
        p.kv_dtype = _ffi.DTYPE_SAME if self.kv_same else self.kv
        q8 = self.kv == _ffi.Q8_0
        p.q = self.view(self.q, "q", self.q_axes, views, waits)
        p.k = self.view(self.k, "k", self.k_axes, views, waits, q8, inplace)
        p.v = self.view(self.v, "v", self.v_axes, views, waits, q8, inplace)
        s_shape = (self.B, self.Hq, self.M, self.N)
        for name, x in (("mask", self.mask), ("bias", self.bias)):
            if x is not None:
                vw = self.ctx._input(x, name, views, waits)
                t = _ffi.Tensor()
                t.buf, t.offset = vw.buf, vw.offset
                for i, s in enumerate(broadcast_strides(vw.shape, vw.strides, s_shape, name)):
                    t.stride[i] = s
                setattr(p, name, t)
        if self.kv_lens is not None:
            p.kv_lens = self.small(self.kv_lens, "kv_lens", views, waits)
        if self.leftpad is not None:
            p.cache_leftpad = self.small(self.leftpad, "cache_leftpad", views, waits)
        p.dropout_p, p.dropout_seed, p.dropout_offset = self.dropout_p, self.seed, self.offset
        if self.alibi is not None:
            p.alibi_slopes = self.small(self.alibi, "alibi_slopes", views, waits)
            p.alibi_batch_stride = self.Hq if len(self.alibi.shape) == 2 else 0
        if self.sinks is not None:
            p.sinks = self.small(self.sinks, "sinks", views, waits)
        if self.packed_q:
            p.cu_seqlens_q = self.small(self.cu_q, "cu_seqlens_q", views, waits)
            p.total_q = self.total_q
        if self.packed_k:
            p.cu_seqlens_k = self.small(self.cu_k, "cu_seqlens_k", views, waits)
            p.total_kv = self.total_k
        if self.paged:
            p.block_table = self.small(self.table, "block_table", views, waits)
            p.block_table_stride, p.page_size, p.num_pages = self.entries, self.page_size, self.pages
        if self.k_scale is not None:
            p.k_scale = self.view(self.k_scale, "k_scale", self.scale_axes(), views, waits, inplace=inplace)
            p.v_scale = self.view(self.v_scale, "v_scale", self.scale_axes(), views, waits, inplace=inplace)
        p.scale = self.scale
        p.causal = 1 if self.causal else 0
        p.window_left, p.window_right = self.wl, self.wr
        p.softcap = self.softcap
        p.empty_rows = _ffi.EMPTY_ROWS[self.empty_rows]
        p.algo = _ffi.ALGOS[self.algo]
        self.mods.fill(p, views, waits)

    def like(self, axes, dims):
        """A dense output's shape and its element strides over logical [b, h,
        s, d], with the array's axes ordered as `axes` says (a packed batch
        of one has no axis)."""
        n_axes = sum(a is not None for a in axes)
        shape = [0] * n_axes
        for a, n in zip(axes, dims):
            if a is not None:
                shape[a] = n
        dense = [0] * n_axes
        step = 1
        for a in reversed(range(n_axes)):
            dense[a] = step
            step *= shape[a]
        return tuple(shape), [0 if a is None else dense[a] for a in axes]

    def out_spec(self):
        """O's shape and strides: q's layout (packed: q's 3-D form) with dv columns."""
        rows = self.total_q if self.packed_q else self.M
        return self.like(self.q_axes, (self.B, self.Hq, rows, self.dv))

    def row_spec(self):
        """lse and the route diagnostics: [B, Hq, M] in every layout."""
        return (self.B, self.Hq, self.M), [self.Hq * self.M, self.M, 1, 0]
