"""Context and attention: argument checks, views, buffers, the call."""
import ctypes
import math
import sys
import threading

import numpy as np

from . import _ffi

__all__ = ["Error", "Context"]

INT_MAX = 2**31 - 1
FLT_MAX = float(np.finfo(np.float32).max)


class Error(RuntimeError):
    """A clattn status other than OK. ``status`` is its name
    ("INVALID_ARGUMENT", "EMPTY_ROW", ...), ``message`` the library's detail
    (clattn_last_error)."""

    def __init__(self, status, message):
        self.status = status
        self.message = message
        super().__init__("%s: %s" % (status, message))


def _cl_error(code, what):
    # the mapping clattn itself uses for OpenCL failures
    if code in (-4, -5, -6, -61):  # allocation failure, resources, host memory, buffer size
        return Error("OUT_OF_MEMORY", "%s failed: OpenCL error %d" % (what, code))
    return Error("OPENCL", "%s failed: OpenCL error %d" % (what, code))


def _pyopencl_array_type():
    # pyopencl is optional: a pyopencl array can only exist once its module
    # is imported, so numpy-only callers never pay for (or need) the import
    m = sys.modules.get("pyopencl.array")
    return getattr(m, "Array", None) if m is not None else None


def _is_cl_array(a):
    t = _pyopencl_array_type()
    return t is not None and isinstance(a, t)


def _dtype_code(dt, name):
    if dt == np.float32:
        return _ffi.F32
    if dt == np.float16:
        return _ffi.F16
    if dt.name == "bfloat16" and dt.itemsize == 2:  # ml_dtypes' bfloat16
        return _ffi.BF16
    raise TypeError("clattn: %s must be float32 or float16 (got %s)" % (name, dt))


def _int(x, name, lo=None):
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)):
        raise TypeError("clattn: %s must be an int (got %r)" % (name, x))
    x = int(x)
    if x > INT_MAX or x < -INT_MAX - 1 or (lo is not None and x < lo):
        raise ValueError("clattn: %s = %d is out of range" % (name, x))
    return x


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


def _broadcast(shape, strides, target, name):
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
        opt = _ffi.Options()
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
        """Destroys the context (waits for calls in flight in other threads)."""
        for plan in list(self.__dict__.get("_plans", ())):  # a context's plans go first (clattn._plan)
            plan.close()
        with self._cond:
            while self._active:
                self._cond.wait()
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
            if not self._ptr:
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

    def _np_view(self, a, name):
        """A numpy array: its memory span goes to one new buffer as it lies
        (one upload, no repacking), with its own strides as the view. Arrays
        whose strides clattn cannot express (negative, not whole elements) or
        whose span is far larger than their data are packed first."""
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
        buf = self._new_buffer(self._cl.MEM_READ_ONLY, span * item, ctypes.c_void_p(a.ctypes.data))
        return _View(buf, 0, a.shape, st, owned=True)

    def _input(self, a, name, views, waits):
        if _is_cl_array(a):
            v = self._cl_array_view(a, name, waits)
        else:
            v = self._np_view(a, name)
        views.append(v)
        return v

    def _prep_small(self, a, name, n, dtype):
        """kv_lens, alibi_slopes, sinks, checked before any device work: a
        dense, offset-0 pyopencl array of n dtype values in this context (used
        as it is), else a contiguous numpy array of them."""
        if _is_cl_array(a):
            if a.context.int_ptr != self._cl_context:
                raise ValueError("clattn: %s is a pyopencl array from another OpenCL context" % name)
            if a.shape != (n,):
                raise ValueError("clattn: %s must have shape (%d,) (got %s)" % (name, n, a.shape))
            if a.dtype != dtype:
                raise TypeError("clattn: %s must be %s (got %s)" % (name, np.dtype(dtype).name, a.dtype))
            if a.offset == 0 and a.flags.c_contiguous:
                return a
            a = a.get()
        arr = np.asarray(a)
        if arr.shape != (n,):
            raise ValueError("clattn: %s must have shape (%d,) (got %s)" % (name, n, arr.shape))
        if dtype == np.int32:
            if arr.dtype.kind not in "iu":
                raise TypeError("clattn: %s must be integers (int32), got %s" % (name, arr.dtype))
            if arr.size and (arr.min() < -INT_MAX - 1 or arr.max() > INT_MAX):
                raise ValueError("clattn: %s does not fit int32" % name)
        elif isinstance(a, np.ndarray) or arr.dtype.kind not in "iuf":
            if arr.dtype not in (np.float32, np.float16):
                raise TypeError("clattn: %s must be float32 (got %s)" % (name, arr.dtype))
        return np.ascontiguousarray(arr, dtype=dtype)

    def _small(self, a, name, views, waits):
        """The cl_mem of a _prep_small result."""
        return self._input(a, name, views, waits).buf

    def _run(self, fn, p, waits, outs, events):
        """Enqueues fn(ctx, p) after waits, reads the numpy outputs back after
        it and waits for all of it: the wait is a foreign call (GIL released).
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
        ev_arr = (ctypes.c_void_p * len(events))(*events)
        r = self._cl.wait(len(events), ev_arr)
        if r != 0:
            raise _cl_error(r, "clWaitForEvents")

    def _outputs(self, want, out_cl, outs):
        """Makes the output arrays (numpy with a new buffer, or pyopencl on
        the queue); returns {name: clattn_tensor}."""
        tensors = {}
        for name, shape, dt, strides in want:
            if out_cl:
                import pyopencl.array as cla
                arr = cla.empty(self._pyopencl_queue(), shape, dt)
                outs[name] = (arr, None)
                buf = arr.base_data.int_ptr
            else:
                arr = np.empty(shape, dt)
                buf = self._new_buffer(self._cl.MEM_WRITE_ONLY, arr.nbytes)
                outs[name] = (arr, buf)
            tensors[name] = _View(buf, 0, shape, strides, owned=False).tensor()
        return tensors

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

    def merge_states(self, o, lse, *, empty_rows="zero"):
        """Combines S partial attention states of the same query rows
        (clattn_merge_states): o float32 [S,B,H,M,dv], lse float32 [S,B,H,M]
        (natural-log sums, -inf for a state that saw no allowed key). Returns
        (O [B,H,M,dv], lse [B,H,M]), float32, numpy or pyopencl like o."""
        o_cl = _is_cl_array(o)
        if not o_cl and not isinstance(o, np.ndarray):
            o = np.asarray(o)
        if not _is_cl_array(lse) and not isinstance(lse, np.ndarray):
            lse = np.asarray(lse)
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
        self._enter()
        views, waits, events, outs = [], [], [], {}
        try:
            mp = _ffi.MergeParams()
            mp.n_states, mp.batch, mp.heads, mp.q_len, mp.value_dim = S, B, H, M, dv
            vo = self._input(o, "o", views, waits)
            vl = self._input(lse, "lse", views, waits)
            mp.o_state_stride, mp.lse_state_stride = vo.strides[0], vl.strides[0]
            mp.o = _View(vo.buf, vo.offset, o.shape[1:], vo.strides[1:], owned=False).tensor()
            mp.lse = _View(vl.buf, vl.offset, lse.shape[1:], vl.strides[1:] + [0], owned=False).tensor()
            t = self._outputs([("out", (B, H, M, dv), np.dtype(np.float32), [H * M * dv, M * dv, dv, 1]),
                               ("out_lse", (B, H, M), np.dtype(np.float32), [H * M, M, 1, 0])], o_cl, outs)
            mp.out, mp.out_lse = t["out"], t["out_lse"]
            mp.empty_rows = _ffi.EMPTY_ROWS[empty_rows]
            self._run(self._lib.merge_states, mp, waits, outs, events)
        except BaseException:
            if events:
                self._cl.finish(self._cl_queue)
            raise
        finally:
            self._release(events, views, outs)
            self._leave()
        return outs["out"][0], outs["out_lse"][0]

    # ---- attention -----------------------------------------------------------

    def attention(self, q, k, v, *, causal=False, window=(-1, -1), mask=None, bias=None,
                  kv_lens=None, scale=None, softcap=0.0, alibi_slopes=None, sinks=None,
                  empty_rows="zero", algo="auto", layout="bhsd", return_lse=False,
                  return_weights=False, return_diagnostics=False):
        """O = softmax(scale·QKᵀ + bias, restricted to the allowed keys) V.

        q [B,Hq,M,dk], k [B,Hkv,N,dk], v [B,Hkv,N,dv] (layout "bshd": [B,S,H,D]),
        float32 or float16, numpy arrays with any strides or pyopencl arrays in
        this context. Returns O in q's dtype and layout ([B,Hq,M,dv] or
        [B,M,Hq,dv]), or (O, lse), (O, weights), (O, lse, weights) when asked;
        lse is float32 [B,Hq,M], weights float32 [B,Hq,M,N] in both layouts.
        return_diagnostics adds, last, a dict of the route diagnostics per
        query row: "entropy" (nats) and "max_weight" float32 [B,Hq,M],
        "argmax" int32 [B,Hq,M] (empty rows: 0, 0, -1)."""
        # -- everything that needs no device: types, shapes, keywords
        kinds = [_is_cl_array(x) for x in (q, k, v)]
        arrs = []
        for name, x, is_cl in zip("qkv", (q, k, v), kinds):
            if not is_cl:
                if not isinstance(x, np.ndarray):
                    x = np.asarray(x)
            arrs.append(x)
        q, k, v = arrs
        codes = [_dtype_code(np.dtype(x.dtype), n) for n, x in zip("qkv", arrs)]
        if not (q.dtype == k.dtype == v.dtype):
            raise TypeError("clattn: q, k and v must have one dtype (got %s, %s, %s)" % (q.dtype, k.dtype, v.dtype))
        for n, x in zip("qkv", arrs):
            if len(x.shape) != 4:
                raise ValueError("clattn: %s must be 4-D (got shape %s)" % (n, tuple(x.shape)))
        if layout not in ("bhsd", "bshd"):
            raise ValueError("clattn: layout must be 'bhsd' or 'bshd' (got %r)" % (layout,))
        perm = (0, 1, 2, 3) if layout == "bhsd" else (0, 2, 1, 3)
        qs, ks, vs = ([x.shape[i] for i in perm] for x in arrs)
        B, Hq, M, dk = qs
        _, Hkv, N, dk2 = ks
        dv = vs[3]
        if any(n == 0 for s in (qs, ks, vs) for n in s):
            raise ValueError("clattn: empty dimension in q %s, k %s or v %s" % (q.shape, k.shape, v.shape))
        if ks[0] != B or vs[0] != B:
            raise ValueError("clattn: batch differs: q %d, k %d, v %d" % (B, ks[0], vs[0]))
        if dk2 != dk:
            raise ValueError("clattn: head_dim differs: q %d, k %d" % (dk, dk2))
        if vs[1] != Hkv or vs[2] != N:
            raise ValueError("clattn: k [B,%d heads,%d keys] and v [B,%d heads,%d keys] differ"
                             % (Hkv, N, vs[1], vs[2]))
        if Hq % Hkv:
            raise ValueError("clattn: q_heads %d is not a multiple of kv_heads %d" % (Hq, Hkv))
        for nm, val in (("batch", B), ("q_heads", Hq), ("q_len", M), ("kv_len", N), ("head_dim", dk),
                        ("value_dim", dv), ("batch*q_heads", B * Hq)):
            if val > INT_MAX:
                raise ValueError("clattn: %s = %d exceeds 2^31 - 1" % (nm, val))
        if window is None:
            window = (-1, -1)
        try:
            wl, wr = window
        except (TypeError, ValueError):
            raise TypeError("clattn: window must be a pair (left, right)") from None
        wl, wr = _int(wl, "window[0]"), _int(wr, "window[1]")
        if wl < -1 or wr < -1:
            raise ValueError("clattn: window bounds are >= 0, or -1 for unbounded (got %s)" % ((wl, wr),))
        if empty_rows not in _ffi.EMPTY_ROWS:
            raise ValueError("clattn: empty_rows must be 'zero' or 'error' (got %r)" % (empty_rows,))
        if algo not in _ffi.ALGOS:
            raise ValueError("clattn: algo must be one of %s (got %r)" % (", ".join(_ffi.ALGOS), algo))
        if scale is None:
            scale_f = float("nan")
        else:
            try:
                scale_f = float(scale)
            except (TypeError, ValueError):
                raise TypeError("clattn: scale must be a number or None") from None
            if math.isinf(scale_f) or abs(scale_f) > FLT_MAX:
                raise ValueError("clattn: scale must be finite in float32 (got %r)" % (scale,))
        try:
            softcap_f = float(softcap)
        except (TypeError, ValueError):
            raise TypeError("clattn: softcap must be a number") from None
        if not (0.0 <= softcap_f <= FLT_MAX):
            raise ValueError("clattn: softcap must be 0 (off) or positive and finite (got %r)" % (softcap,))
        s_shape = (B, Hq, M, N)
        if mask is not None and not _is_cl_array(mask):
            mask = np.asarray(mask)
        if mask is not None:
            if mask.dtype == np.bool_:
                mask = mask.view(np.uint8)
            elif mask.dtype != np.uint8:
                raise TypeError("clattn: mask must be bool or uint8 (got %s)" % mask.dtype)
            _broadcast(mask.shape, [0] * len(mask.shape), s_shape, "mask")
        if bias is not None and not _is_cl_array(bias):
            bias = np.asarray(bias)
            if bias.dtype == np.float16:
                bias = bias.astype(np.float32)
        if bias is not None:
            if bias.dtype != np.float32:
                raise TypeError("clattn: bias must be float32 (got %s)" % bias.dtype)
            _broadcast(bias.shape, [0] * len(bias.shape), s_shape, "bias")
        if kv_lens is not None:
            kv_lens = self._prep_small(kv_lens, "kv_lens", B, np.int32)
        if alibi_slopes is not None:
            alibi_slopes = self._prep_small(alibi_slopes, "alibi_slopes", Hq, np.float32)
        if sinks is not None:
            sinks = self._prep_small(sinks, "sinks", Hq, np.float32)
        out_cl = kinds[0]
        for name, x in (("q", q), ("k", k), ("v", v), ("mask", mask), ("bias", bias), ("kv_lens", kv_lens),
                        ("alibi_slopes", alibi_slopes), ("sinks", sinks)):
            if x is not None and _is_cl_array(x) and x.context.int_ptr != self._cl_context:
                raise ValueError("clattn: %s is a pyopencl array from another OpenCL context than this "
                                 "clattn.Context's (create the Context with queue= in that context)" % name)

        # -- buffers and the call
        self._enter()
        views, waits, events = [], [], []
        outs = {}
        p = self._lib.params_default()
        try:
            p.batch, p.q_heads, p.kv_heads, p.q_len, p.kv_len = B, Hq, Hkv, M, N
            p.head_dim, p.value_dim, p.dtype = dk, dv, codes[0]
            for name, x, t in (("q", q, "q"), ("k", k, "k"), ("v", v, "v")):
                vw = self._input(x, name, views, waits)
                vw.shape = tuple(vw.shape[i] for i in perm)
                vw.strides = [vw.strides[i] for i in perm]
                setattr(p, t, vw.tensor())
            for name, x in (("mask", mask), ("bias", bias)):
                if x is not None:
                    vw = self._input(x, name, views, waits)
                    vw.strides = _broadcast(vw.shape, vw.strides, s_shape, name)
                    setattr(p, name, vw.tensor())
            if kv_lens is not None:
                p.kv_lens = self._small(kv_lens, "kv_lens", views, waits)
            if alibi_slopes is not None:
                p.alibi_slopes = self._small(alibi_slopes, "alibi_slopes", views, waits)
            if sinks is not None:
                p.sinks = self._small(sinks, "sinks", views, waits)
            p.scale = scale_f
            p.causal = 1 if causal else 0
            p.window_left, p.window_right = wl, wr
            p.softcap = softcap_f
            p.empty_rows = _ffi.EMPTY_ROWS[empty_rows]
            p.algo = _ffi.ALGOS[algo]

            # outputs: dense, in q's layout for O
            o_shape = (B, Hq, M, dv) if layout == "bhsd" else (B, M, Hq, dv)
            o_strides = ([Hq * M * dv, M * dv, dv, 1] if layout == "bhsd" else [M * Hq * dv, dv, Hq * dv, 1])
            want = [("out", o_shape, q.dtype, o_strides)]
            if return_lse:
                want.append(("lse", (B, Hq, M), np.dtype(np.float32), [Hq * M, M, 1, 0]))
            if return_weights:
                want.append(("weights", s_shape, np.dtype(np.float32), [Hq * M * N, M * N, N, 1]))
            if return_diagnostics:
                for name, dt in (("entropy", np.float32), ("max_weight", np.float32), ("argmax", np.int32)):
                    want.append((name, (B, Hq, M), np.dtype(dt), [Hq * M, M, 1, 0]))
            for name, t in self._outputs(want, out_cl, outs).items():
                setattr(p, name, t)

            self._run(self._lib.forward, p, waits, outs, events)
        except BaseException:
            if events:
                self._cl.finish(self._cl_queue)  # nothing may still write into our arrays
            raise
        finally:
            self._release(events, views, outs)
            self._leave()

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
