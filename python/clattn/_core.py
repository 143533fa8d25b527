"""Context: the device, its buffers and the calls (attention here; the
backward in _backward.py, the cache append in _append.py, the decode step
in _kvcache.py; the arguments of an attention call in _call.py)."""
import contextlib
import ctypes
import threading

import numpy as np

from . import _append, _backward, _ffi, _flex, _kvcache
from ._call import DEFAULTS, DTYPE_NAMES, Call, as_array, is_cl_array as _is_cl_array, storage_code
from ._device import DeviceArray
from ._error import Error, cl_error as _cl_error

__all__ = ["Error", "Context"]

INT_MAX = 2**31 - 1


class _View:
    """One operand as clattn sees it: a cl_mem, an element offset and element
    strides over a logical shape (up to 4 dimensions)."""

    __slots__ = ("buf", "offset", "shape", "strides", "owned", "keep")

    def __init__(self, buf, offset, shape, strides, owned, keep=None):
        self.buf, self.offset, self.shape, self.strides = buf, offset, tuple(shape), list(strides)
        self.owned, self.keep = owned, keep

    def tensor(self):
        t = _ffi.Tensor()
        t.buf = self.buf
        t.offset = self.offset
        st = [0] * (4 - len(self.strides)) + self.strides
        for i in range(4):
            t.stride[i] = st[i]
        return t


def _elem_strides(byte_strides, shape, itemsize):
    """Element strides, or None when numpy's strides cannot be clattn's
    (negative, or not a multiple of the item size). Size-1 dimensions get 0."""
    out = []
    for n, s in zip(shape, byte_strides):
        if n == 1:
            out.append(0)
        elif s < 0 or s % itemsize:
            return None
        else:
            out.append(s // itemsize)
    return out


def _merge_out_dtype(out_dtype):
    """merge_states' out_dtype: (clattn storage, the numpy dtype O comes back in)."""
    if out_dtype is None:
        return _ffi.F32, np.dtype(np.float32)
    if isinstance(out_dtype, str):
        if out_dtype not in DTYPE_NAMES:
            raise ValueError("clattn: out_dtype must be one of %s (got %r)" % (", ".join(DTYPE_NAMES), out_dtype))
        code = DTYPE_NAMES[out_dtype]
        return code, np.dtype({_ffi.F32: np.float32, _ffi.F16: np.float16, _ffi.BF16: np.uint16}[code])
    try:
        dt = np.dtype(out_dtype)
    except TypeError:
        raise TypeError("clattn: out_dtype must be a dtype name or a numpy dtype (got %r)" % (out_dtype,)) from None
    if dt == np.float32 or dt == np.float16 or dt.name == "bfloat16":
        return storage_code(dt, "out_dtype"), dt
    raise TypeError("clattn: out_dtype must be float32, float16 or bfloat16 (got %s)" % dt)


class Context:
    """A clattn context: one OpenCL device, its queue and its kernels.

    device: a substring of the platform or device name (None: $CLATTN_DEVICE,
    else the first GPU, else the first device). cache_dir: the program binary
    cache (None: $CLATTN_CACHE_DIR, else the XDG cache, which on POCL leaves
    binaries to POCL's own cache; "" = none). queue: a
    pyopencl CommandQueue to embed in (its context and device), so that
    pyopencl arrays in that context pass without a copy.

    A context may be used from several Python threads at once; the GIL is
    released while the device works."""

    def __init__(self, device=None, cache_dir=None, queue=None):
        self._ptr = None
        self._lib = _ffi.lib()
        self._cl = _ffi.opencl()
        self._pyqueue = queue
        self._cond = threading.Condition()
        self._active = 0
        self._closing = False
        opt = _ffi.Options()
        opt.struct_size = ctypes.sizeof(opt)
        if device is not None:
            if not isinstance(device, str):
                raise TypeError("clattn: device must be a str or None")
            opt.device_match = device.encode()
        if cache_dir is not None:
            if not isinstance(cache_dir, (str, bytes)) and not hasattr(cache_dir, "__fspath__"):
                raise TypeError("clattn: cache_dir must be a path or None")
            import os
            opt.cache_dir = os.fsencode(cache_dir)
        if queue is not None:
            try:
                q_ptr, c_ptr, d_ptr = queue.int_ptr, queue.context.int_ptr, queue.device.int_ptr
            except AttributeError:
                raise TypeError("clattn: queue must be a pyopencl.CommandQueue") from None
            opt.queue, opt.context, opt.device = q_ptr, c_ptr, d_ptr
        self._opt = opt  # keeps the strings alive during create
        ptr = ctypes.c_void_p()
        st = self._lib.create(ctypes.byref(opt), ctypes.byref(ptr))
        if st != 0:
            raise Error(_ffi.STATUS_NAMES.get(st, str(st)), self._message())
        self._ptr = ptr.value
        self._cl_context = self._lib.cl_context(self._ptr)
        self._cl_queue = self._lib.cl_queue(self._ptr)
        self._cl_device = self._lib.cl_device(self._ptr)
        size = ctypes.c_uint64(0)
        self._max_alloc = (size.value if self._cl.device_info(
            self._cl_device, self._cl.DEVICE_MAX_MEM_ALLOC_SIZE, 8, ctypes.byref(size), None) == 0
            else 1 << 62)

    # ---- life ---------------------------------------------------------------

    def close(self):
        """Destroys the context: refuses new calls, waits for the calls in
        flight in other threads (plan steps included), then releases its
        plans and itself."""
        with self._cond:
            self._closing = True
            while self._active:
                self._cond.wait()
        # nothing runs now: a plan's step enters the context first
        for plan in list(self.__dict__.get("_plans", ())):  # a context's plans go before it (clattn._plan)
            plan.close()
        with self._cond:
            ptr, self._ptr = self._ptr, None
        if ptr:
            self._lib.destroy(ptr)

    def __del__(self):
        try:
            if getattr(self, "_ptr", None):
                self._lib.destroy(self._ptr)
                self._ptr = None
        except Exception:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _enter(self):
        with self._cond:
            if not self._ptr or self._closing:
                raise ValueError("clattn: the context is closed")
            self._active += 1

    def _leave(self):
        with self._cond:
            self._active -= 1
            self._cond.notify_all()

    def _message(self):
        m = self._lib.last_error(None)
        return m.decode("utf-8", "replace") if m else ""

    def _check(self, st):
        if st != 0:
            raise Error(_ffi.STATUS_NAMES.get(st, str(st)), self._message())

    # ---- facts --------------------------------------------------------------

    @property
    def device_name(self):
        self._enter()
        try:
            n = ctypes.c_size_t(0)
            r = self._cl.device_info(self._cl_device, self._cl.DEVICE_NAME, 0, None, ctypes.byref(n))
            if r != 0:
                raise _cl_error(r, "clGetDeviceInfo")
            buf = ctypes.create_string_buffer(n.value + 1)
            r = self._cl.device_info(self._cl_device, self._cl.DEVICE_NAME, n.value, buf, None)
            if r != 0:
                raise _cl_error(r, "clGetDeviceInfo")
            return buf.value.decode("utf-8", "replace").strip()
        finally:
            self._leave()

    def describe(self):
        """clattn_describe: platform, device, tiles and where they came from."""
        self._enter()
        try:
            return self._lib.describe(self._ptr).decode("utf-8", "replace")
        finally:
            self._leave()

    def last_route(self):
        """clattn_last_route: the algorithm and kernels this thread's last
        call enqueued, e.g. "fused: flash_rows_direct4, merge_states"."""
        return self._lib.last_route().decode("utf-8", "replace")

    def peak_scratch_bytes(self, reset=False):
        self._enter()
        try:
            return int(self._lib.peak_scratch_bytes(self._ptr, 1 if reset else 0))
        finally:
            self._leave()

    # ---- buffers --------------------------------------------------------------

    def _new_buffer(self, flags, nbytes, host_ptr=None):
        nbytes = max(int(nbytes), 1)
        if nbytes > self._max_alloc:
            raise Error("OUT_OF_MEMORY", "a buffer of %d bytes is larger than the device's largest "
                        "allocation (%d bytes)" % (nbytes, self._max_alloc))
        err = _ffi.cl_int(0)
        if host_ptr is not None:
            flags |= self._cl.MEM_COPY_HOST_PTR
        buf = self._cl.create_buffer(self._cl_context, flags, nbytes, host_ptr, ctypes.byref(err))
        if err.value != 0 or not buf:
            raise _cl_error(err.value or -5, "clCreateBuffer")
        return buf

    def _pyopencl_queue(self):
        if self._pyqueue is None:
            import pyopencl as cl
            self._pyqueue = cl.CommandQueue.from_int_ptr(self._cl_queue, retain=True)
        return self._pyqueue

    def _cl_array_view(self, a, name, waits):
        """A pyopencl array in this context: its buffer, offset and strides as
        they are (no copy)."""
        if a.context.int_ptr != self._cl_context:
            raise ValueError("clattn: %s is a pyopencl array from another OpenCL context than this "
                             "clattn.Context's (create the Context with queue= in that context)" % name)
        item = a.dtype.itemsize
        st = _elem_strides(a.strides, a.shape, item)
        if st is None or a.offset % item:
            raise ValueError("clattn: %s's strides or offset are not whole non-negative elements" % name)
        if a.size == 0 or a.base_data is None:
            raise ValueError("clattn: %s is empty" % name)
        q = a.queue
        if q is not None and q.int_ptr != self._cl_queue:
            q.finish()  # ordered before our queue
        for ev in getattr(a, "events", None) or ():
            waits.append(ev.int_ptr)
        return _View(a.base_data.int_ptr, a.offset // item, a.shape, st, owned=False, keep=a)

    def _np_view(self, a, name, flags=None):
        """A numpy array: its memory span goes to one new buffer as it lies
        (one upload, no repacking), with its own strides as the view. Arrays
        whose strides clattn cannot express (negative, not whole elements) or
        whose span is far larger than their data are packed first. The view
        keeps the array uploaded, so an in-place call can copy its elements
        back (_run's inplace)."""
        if a.size == 0:
            raise ValueError("clattn: %s is empty (shape %s)" % (name, a.shape))
        item = a.itemsize
        st = _elem_strides(a.strides, a.shape, item)
        if st is not None:
            span = 1 + sum((n - 1) * s for n, s in zip(a.shape, st))
            if span > 2 * a.size + 1024:
                st = None
        if st is None:
            a = np.ascontiguousarray(a)
            st = _elem_strides(a.strides, a.shape, item)
            span = a.size
        flags = self._cl.MEM_READ_ONLY if flags is None else flags
        buf = self._new_buffer(flags, span * item, ctypes.c_void_p(a.ctypes.data))
        return _View(buf, 0, a.shape, st, owned=True, keep=(a, span * item))

    def _input(self, a, name, views, waits, writable=False):
        """An array as a view of a cl_mem: a pyopencl array's or a
        DeviceArray's own buffer, a numpy array's upload (read-write when
        the call writes it in place)."""
        if _is_cl_array(a):
            v = self._cl_array_view(a, name, waits)
        elif isinstance(a, DeviceArray):  # the binding's own device memory: its buffer as it is
            v = _View(a.buffer(self, name), 0, a.shape, _elem_strides(a.strides, a.shape, a.dtype.itemsize),
                      owned=False, keep=a)
        else:
            if writable and not a.flags.writeable:
                raise ValueError("clattn: %s is written in place but is a read-only array" % name)
            v = self._np_view(a, name, self._cl.MEM_READ_WRITE if writable else None)
        views.append(v)
        return v

    def _run(self, fn, p, waits, outs, events, inplace=()):
        """Enqueues fn(ctx, p) after waits, reads the numpy outputs back after
        it and waits for all of it: the wait is a foreign call (GIL released).
        inplace: (numpy array, its _View) pairs the call wrote, copied back
        element by element (the span may hold other arrays' elements).
        Every event made goes to events (the caller releases them)."""
        wait_arr = (ctypes.c_void_p * len(waits))(*waits) if waits else None
        done = ctypes.c_void_p()
        st = fn(self._ptr, ctypes.byref(p), len(waits), wait_arr, ctypes.byref(done))
        if done.value:
            events.append(done.value)
        self._check(st)
        for name, (arr, buf) in outs.items():
            if buf is None:
                continue
            ev = ctypes.c_void_p()
            r = self._cl.enqueue_read(self._cl_queue, buf, 0, 0, arr.nbytes, ctypes.c_void_p(arr.ctypes.data),
                                      1, ctypes.byref(done), ctypes.byref(ev))
            if r != 0:
                raise _cl_error(r, "clEnqueueReadBuffer")
            events.append(ev.value)
        back = []
        for target, vw in inplace:
            if not vw.owned:
                continue  # a pyopencl array: written where it lies
            up, nbytes = vw.keep
            tmp = np.empty(nbytes, np.uint8)
            ev = ctypes.c_void_p()
            r = self._cl.enqueue_read(self._cl_queue, vw.buf, 0, 0, nbytes, ctypes.c_void_p(tmp.ctypes.data),
                                      1, ctypes.byref(done), ctypes.byref(ev))
            if r != 0:
                raise _cl_error(r, "clEnqueueReadBuffer")
            events.append(ev.value)
            back.append((target, np.lib.stride_tricks.as_strided(tmp.view(up.dtype), up.shape, up.strides)))
        ev_arr = (ctypes.c_void_p * len(events))(*events)
        r = self._cl.wait(len(events), ev_arr)
        if r != 0:
            raise _cl_error(r, "clWaitForEvents")
        for target, written in back:
            np.copyto(target, written)

    def _outputs(self, want, out_cl, outs, zeroed=()):
        """Makes the output arrays (numpy with a new buffer, or pyopencl on
        the queue), those named in zeroed filled with 0 (elements the call
        may leave unwritten); returns {name: clattn_tensor}."""
        tensors = {}
        for name, shape, dt, strides in want:
            if out_cl:
                import pyopencl.array as cla
                arr = (cla.zeros if name in zeroed else cla.empty)(self._pyopencl_queue(), shape, dt)
                outs[name] = (arr, None)
                buf = arr.base_data.int_ptr
            else:
                arr = np.zeros(shape, dt) if name in zeroed else np.empty(shape, dt)
                buf = self._new_buffer(self._cl.MEM_WRITE_ONLY, arr.nbytes,
                                       ctypes.c_void_p(arr.ctypes.data) if name in zeroed else None)
                outs[name] = (arr, buf)
            tensors[name] = _View(buf, 0, shape, strides, owned=False).tensor()
        return tensors

    @contextlib.contextmanager
    def _device_call(self, outs):
        """The frame of a call that makes buffers and enqueues: yields the
        (views, waits, events) lists the call fills; afterwards releases
        them all and the numpy outputs' buffers of outs, after waiting for
        the queue when the call failed with work enqueued (nothing may still
        write into the caller's arrays)."""
        self._enter()
        views, waits, events = [], [], []
        try:
            yield views, waits, events
        except BaseException:
            if events:
                self._cl.finish(self._cl_queue)
            raise
        finally:
            self._release(events, views, outs)
            self._leave()

    def _release(self, events, views, outs):
        for e in events:
            self._cl.release_event(e)
        for vw in views:
            if vw.owned:
                self._cl.release_mem(vw.buf)
        for arr, buf in outs.values():
            if buf is not None:
                self._cl.release_mem(buf)

    def plan(self, q, k, v, **kwargs):
        """An attention call made once and run per step (clattn_plan_create):
        Context.attention's arguments (no weights or diagnostics); see clattn.Plan."""
        from ._plan import Plan
        return Plan(self, q, k, v, **kwargs)

    # ---- merge_states ----------------------------------------------------------

    def merge_states(self, o, lse, *, empty_rows="zero", out_dtype=None, return_lse=False):
        """Combines S partial attention states of the same query rows
        (clattn_merge_states): o float32 [S,B,H,M,dv], lse float32 [S,B,H,M]
        (natural-log sums, -inf for a state that saw no allowed key). Returns
        O [B,H,M,dv], or (O, lse [B,H,M]) with return_lse=True (as attention
        does), numpy or pyopencl like o; lse float32, O stored as out_dtype: None or "float32", "float16", or "bfloat16"
        (numpy has no bfloat16: O comes back as np.uint16 holding bfloat16
        bit patterns; view it with ml_dtypes.bfloat16 or torch.bfloat16, or
        pass the ml_dtypes.bfloat16 dtype itself to get that dtype), rounded
        to nearest even from the f32 merge."""
        o, lse = as_array(o), as_array(lse)
        o_cl = _is_cl_array(o)
        for name, x in (("o", o), ("lse", lse)):
            if x.dtype != np.float32:
                raise TypeError("clattn: %s must be float32 (got %s)" % (name, x.dtype))
            if _is_cl_array(x) and x.context.int_ptr != self._cl_context:
                raise ValueError("clattn: %s is a pyopencl array from another OpenCL context" % name)
        if len(o.shape) != 5:
            raise ValueError("clattn: o must be [S,B,H,M,dv] (got shape %s)" % (tuple(o.shape),))
        if tuple(lse.shape) != tuple(o.shape[:4]):
            raise ValueError("clattn: lse must be [S,B,H,M] = %s (got %s)" % (tuple(o.shape[:4]), tuple(lse.shape)))
        S, B, H, M, dv = o.shape
        if min(o.shape) == 0:
            raise ValueError("clattn: empty dimension in o %s" % (tuple(o.shape),))
        if max(o.shape) > INT_MAX or B * H > INT_MAX:
            raise ValueError("clattn: o's dimensions exceed 2^31 - 1")
        if empty_rows not in _ffi.EMPTY_ROWS:
            raise ValueError("clattn: empty_rows must be 'zero' or 'error' (got %r)" % (empty_rows,))
        out_code, out_np = _merge_out_dtype(out_dtype)
        outs = {}
        with self._device_call(outs) as (views, waits, events):
            mp = _ffi.MergeParams()
            mp.struct_size = ctypes.sizeof(mp)
            mp.n_states, mp.batch, mp.heads, mp.q_len, mp.value_dim = S, B, H, M, dv
            vo = self._input(o, "o", views, waits)
            vl = self._input(lse, "lse", views, waits)
            mp.o_state_stride, mp.lse_state_stride = vo.strides[0], vl.strides[0]
            mp.o = _View(vo.buf, vo.offset, o.shape[1:], vo.strides[1:], owned=False).tensor()
            mp.lse = _View(vl.buf, vl.offset, lse.shape[1:], vl.strides[1:] + [0], owned=False).tensor()
            t = self._outputs([("out", (B, H, M, dv), out_np, [H * M * dv, M * dv, dv, 1]),
                               ("out_lse", (B, H, M), np.dtype(np.float32), [H * M, M, 1, 0])], o_cl, outs)
            mp.out, mp.out_lse = t["out"], t["out_lse"]
            mp.empty_rows = _ffi.EMPTY_ROWS[empty_rows]
            mp.out_dtype = out_code
            self._run(self._lib.merge_states, mp, waits, outs, events)
        return (outs["out"][0], outs["out_lse"][0]) if return_lse else outs["out"][0]

    # ---- attention -----------------------------------------------------------

    def attention(self, q, k, v, *, causal=False, window=(-1, -1), mask=None, bias=None,
                  kv_lens=None, scale=None, softcap=0.0, alibi_slopes=None, sinks=None,
                  empty_rows="zero", algo="auto", layout="bhsd", return_lse=False,
                  return_weights=False, return_diagnostics=False,
                  cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
                  block_table=None, page_size=None, kv_dtype=None, k_scale=None, v_scale=None,
                  dropout_p=0.0, seed=0, offset=0, cache_leftpad=None,
                  score_mod=None, mask_mod=None, block_mask=None, captures=(), floats=(), ints=()):
        """O = softmax(scale·QKᵀ + bias, restricted to the allowed keys) V.

        q [B,Hq,M,dk], k [B,Hkv,N,dk], v [B,Hkv,N,dv] (layout "bshd": [B,S,H,D]),
        numpy arrays with any strides or pyopencl arrays in this context.
        Storage: float32, float16 or bfloat16 (numpy has none: pass
        ml_dtypes.bfloat16 arrays, or np.uint16 arrays holding bfloat16 bit
        patterns, e.g. torch's ``t.view(torch.int16).numpy().view(np.uint16)``;
        O then comes back in that same dtype). k and v may be stored
        otherwise than q (a float16 cache under float32 queries), or
        quantised with kv_dtype:
          "q8_0"  ggml's block_q8_0: k, v uint8 (or int8) with rows of
                  head_dim / 32 blocks of 34 bytes (the last axis holds
                  head_dim / 32 * 34 bytes: an f16 scale, then 32 int8)
          "int8"  int8 k, v with k_scale, v_scale float32 of k's shape without
                  its last axis (one scale per key row)
        Returns O in q's dtype and layout ([B,Hq,M,dv] or [B,M,Hq,dv]), or
        (O, lse), (O, weights), (O, lse, weights) when asked; lse is float32
        [B,Hq,M], weights float32 [B,Hq,M,N] in both layouts.
        return_diagnostics adds, last, a dict of the route diagnostics per
        query row: "entropy" (nats) and "max_weight" float32 [B,Hq,M],
        "argmax" int32 [B,Hq,M] (empty rows: 0, 0, -1).

        Packed variable-length batches (FlashAttention's varlen form):
        cu_seqlens_q int32 [B+1] and q, O 3-D, [Hq, total_q, dk] ("bshd":
        [total_q, Hq, dk]); sequence b is rows cu_seqlens_q[b] ..
        cu_seqlens_q[b+1]-1. Keys likewise with cu_seqlens_k (k, v 3-D).
        max_seqlen_q / max_seqlen_k: the longest (computed from the offsets
        when None). lse and the diagnostics are [B, Hq, max_seqlen_q],
        indexed by the row within its sequence.

        Paged K/V (vLLM / FlashInfer form): block_table int32 [B, pages per
        sequence] and k, v [num_pages, Hkv, page_size, d] ("bshd":
        [num_pages, page_size, Hkv, d], FlashAttention's); key j of sequence
        b is row j % page_size of page block_table[b, j // page_size]; each
        sequence's key count in kv_lens (or, FlashAttention's form, as
        offsets in cu_seqlens_k); page_size, when given, must be the pages'.
        With packed queries (cu_seqlens_q) each sequence's queries are its
        last positions (continuous batching).

        alibi_slopes: float32 [Hq], or [B, Hq] per batch row. sinks: float32
        [Hq]. mask (bool/uint8) and bias (float32) broadcast to [B,Hq,M,N].
        dropout_p in [0, 1): each weight dropped with that probability, the
        kept ones scaled by 1 / (1 - dropout_p), the mask a pure function of
        seed and offset (ints in [0, 2^64)) and the weight's (batch, head,
        row, key): clattn.dropout_mask gives it; lse describes the softmax
        before dropout, weights the dropped matrix. cache_leftpad int32 [B]
        (with kv_lens): row b's keys are cache rows cache_leftpad[b] ..
        kv_lens[b] - 1, each row aligned on its own key count.

        Modifiers (FlexAttention's, in OpenCL C; see flex_attention):
        score_mod rewrites each score scale·<q, k> (after softcap, before
        bias and ALiBi), mask_mod removes keys (ANDed with every other mask);
        captures (up to 4 arrays), floats and ints are what they read;
        block_mask a clattn.BlockMask of the same mask_mod and captures."""
        loc = locals()
        c = Call(self, q, k, v, {n: loc[n] for n in DEFAULTS})
        outs = {}
        p = self._lib.params_default()
        with self._device_call(outs) as (views, waits, events):
            c.fill(p, views, waits)
            o_shape, o_strides = c.out_spec()
            row_shape, row_strides = c.row_spec()
            want = [("out", o_shape, c.q.dtype, o_strides)]
            if return_lse:
                want.append(("lse", row_shape, np.dtype(np.float32), row_strides))
            if return_weights:
                want.append(("weights", row_shape + (c.N,), np.dtype(np.float32),
                             [c.Hq * c.M * c.N, c.M * c.N, c.N, 1]))
            if return_diagnostics:
                for name, dt in (("entropy", np.float32), ("max_weight", np.float32), ("argmax", np.int32)):
                    want.append((name, row_shape, np.dtype(dt), row_strides))
            # packed rows no sequence covers are never written: they read 0
            for name, t in self._outputs(want, c.out_cl, outs, zeroed=("out",) if c.packed_q else ()).items():
                setattr(p, name, t)
            self._run(self._lib.forward, p, waits, outs, events)

        o = outs["out"][0]
        if not (return_lse or return_weights or return_diagnostics):
            return o
        res = [o]
        if return_lse:
            res.append(outs["lse"][0])
        if return_weights:
            res.append(outs["weights"][0])
        if return_diagnostics:
            res.append({n: outs[n][0] for n in ("entropy", "max_weight", "argmax")})
        return tuple(res)

    attention_backward = _backward.attention_backward
    flex_attention = _flex.flex_attention
    create_block_mask = _flex.create_block_mask
    kv_append = _append.kv_append
    attention_with_kvcache = _kvcache.attention_with_kvcache

    def kv_cache(self, k, v, *, kv_dtype=None, k_scale=None, v_scale=None, layout="bhsd"):
        """A K/V cache in device memory (clattn.KVCache) holding copies of
        numpy k, v (and int8 scales): decode steps append to it and attend
        over it in place, with no copy of the cache per call."""
        return _kvcache.KVCache(self, k, v, kv_dtype=kv_dtype, k_scale=k_scale, v_scale=v_scale, layout=layout)
