"""Plans (clattn_plan_*): an attention call checked and prepared once, then
run per step with only what a step may change (the KV length, the q, out
and lse offsets). Made by Context.plan; see Plan.

    plan = ctx.plan(q, k_cache, v_cache, causal=True)   # pyopencl arrays
    for step in ...:
        ...                                              # write q, grow the cache
        o = plan(kv_len=n)                               # plan.out, written in place

Inputs that change between steps must be pyopencl arrays in the context
(their buffers are the plan's); a numpy input is copied to the device once,
at creation. The outputs are the plan's own: pyopencl arrays written in
place each step (asynchronously, with the step's event on them) when q is
one, else numpy arrays read back for each step.
"""
import ctypes
import threading
import weakref

import numpy as np

from . import _ffi
from ._call import Call, check_int, is_cl_array
from ._error import Error, cl_error as _cl_error

c_int, c_size_t, c_void_p = ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p
PLANNED = 2**(8 * ctypes.sizeof(c_size_t)) - 1  # CLATTN_STEP_PLANNED


class Step(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("kv_len", c_int), ("q_offset", c_size_t), ("out_offset", c_size_t),
                ("lse_offset", c_size_t), ("host_seqlens", c_void_p)]


class _PlanLib:
    """clattn_plan_* from the library the binding loaded."""

    def __init__(self, path):
        lib = ctypes.CDLL(path)
        P = ctypes.POINTER
        self.create = _ffi._fn(lib, "clattn_plan_create", c_int, c_void_p, P(_ffi.Params), P(c_void_p))
        self.enqueue = _ffi._fn(lib, "clattn_plan_enqueue", c_int, c_void_p, P(Step), _ffi.cl_uint, c_void_p,
                                P(c_void_p))
        self.release = _ffi._fn(lib, "clattn_plan_release", None, c_void_p)
        self.step_default = _ffi._defaults(lib, "clattn_step_init", Step)


_plan_lib = None


def _lib():
    global _plan_lib
    if _plan_lib is None:
        _plan_lib = _PlanLib(_ffi.lib().path)
    return _plan_lib


class Plan:
    """A plan of one attention call (Context.plan). Call it for a step:

        plan(kv_len=None, q_offset=None, out_offset=None, lse_offset=None)

    kv_len: the step's keys, at most the planned N (k's length); the offsets,
    in elements, of the q, out and lse views in their buffers (None: as
    planned; plan.q_offset and friends give the planned ones). Returns O (or
    (O, lse) with return_lse) as Context.attention does, bitwise its result
    for the same arguments. A step the plan cannot take raises clattn.Error
    naming the field, and the plan stays usable. Steps from several threads
    run one at a time (each returns its own step's output). close() releases
    it (a Context closes its plans, after the steps under way)."""

    def __init__(self, ctx, q, k, v, *, return_lse=False, **kw):
        self._ptr = None
        self._ctx = ctx
        self._lock = threading.Lock()  # one step at a time: the outputs are one buffer; close waits for a step
        self._views, self._outs = [], {}
        c = Call(ctx, q, k, v, kw)  # attention's keywords, checked as attention checks them
        self._return_lse = bool(return_lse)
        self._out_cl = c.out_cl
        plib = _lib()
        ctx._enter()
        try:
            p = ctx._lib.params_default()
            c.fill(p, self._views, [])
            o_shape, o_strides = c.out_spec()
            row_shape, row_strides = c.row_spec()
            want = [("out", o_shape, c.q.dtype, o_strides)]
            if return_lse:
                want.append(("lse", row_shape, np.dtype(np.float32), row_strides))
            # packed rows no sequence covers are never written: they read 0
            for name, t in ctx._outputs(want, self._out_cl, self._outs, zeroed=("out",) if c.packed_q else ()).items():
                setattr(p, name, t)
            self.q_offset, self.out_offset, self.lse_offset = p.q.offset, p.out.offset, p.lse.offset
            ptr = c_void_p()
            st = plib.create(ctx._ptr, ctypes.byref(p), ctypes.byref(ptr))
            if st != 0:
                raise Error(_ffi.STATUS_NAMES.get(st, str(st)), ctx._message())
            self._ptr = ptr.value
            self._inputs = [a for a in (c.q, c.k, c.v) + c.mods.captures if is_cl_array(a)]
            self._mods = c.mods  # the modifiers' text, captures and block mask, which the plan reads
            ctx.__dict__.setdefault("_plans", weakref.WeakSet()).add(self)  # closed before the context
        except BaseException:
            self._free()
            raise
        finally:
            ctx._leave()

    @property
    def out(self):
        """The output the steps write: a pyopencl array (numpy plans: the
        last step's array)."""
        return self._outs["out"][0]

    def __call__(self, kv_len=None, q_offset=None, out_offset=None, lse_offset=None):
        if not self._ptr:
            raise ValueError("clattn: the plan is closed")
        plib, ctx, cl = _lib(), self._ctx, self._ctx._cl
        s = plib.step_default()
        if kv_len is not None:
            s.kv_len = check_int(kv_len, "kv_len", 1)
        for field, value in (("q_offset", q_offset), ("out_offset", out_offset), ("lse_offset", lse_offset)):
            if value is None:
                continue
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
                raise TypeError("clattn: %s must be an int (got %r)" % (field, value))
            if not 0 <= int(value) < PLANNED:
                raise ValueError("clattn: %s = %d is out of range" % (field, value))
            setattr(s, field, int(value))
        # a step's enqueue and the read-back of the plan's one output buffer
        # are one unit: another thread's step would overwrite it in between
        with self._lock:
            if not self._ptr:
                raise ValueError("clattn: the plan is closed")
            waits = []
            for a in self._inputs:  # as Context.attention orders its inputs
                if a.queue is not None and a.queue.int_ptr != ctx._cl_queue:
                    a.queue.finish()
                waits += [ev.int_ptr for ev in getattr(a, "events", None) or ()]
            ctx._enter()
            done = c_void_p()
            try:
                wait_arr = (c_void_p * len(waits))(*waits) if waits else None
                st = plib.enqueue(self._ptr, ctypes.byref(s), len(waits), wait_arr, ctypes.byref(done))
                if st != 0:
                    raise Error(_ffi.STATUS_NAMES.get(st, str(st)), ctx._message())
                if self._out_cl:
                    return self._mark_outputs(done)
                return self._read_outputs(done)
            finally:
                if done.value:
                    cl.release_event(done.value)
                ctx._leave()

    def _mark_outputs(self, done):
        """The pyopencl outputs, with the step's event on them."""
        import pyopencl as pcl
        res = []
        for name in ("out", "lse") if self._return_lse else ("out",):
            arr = self._outs[name][0]
            arr.add_event(pcl.Event.from_int_ptr(done.value, retain=True))
            res.append(arr)
        return res[0] if len(res) == 1 else tuple(res)

    def _read_outputs(self, done):
        """Numpy copies of the outputs after the step."""
        cl, ctx = self._ctx._cl, self._ctx
        res, events = [], []
        try:
            for name in ("out", "lse") if self._return_lse else ("out",):
                arr, buf = self._outs[name]
                host = np.empty_like(arr)
                ev = c_void_p()
                r = cl.enqueue_read(ctx._cl_queue, buf, 0, 0, host.nbytes, c_void_p(host.ctypes.data), 1,
                                    ctypes.byref(done), ctypes.byref(ev))
                if r != 0:
                    raise _cl_error(r, "clEnqueueReadBuffer")
                events.append(ev.value)
                res.append(host)
            r = cl.wait(len(events), (c_void_p * len(events))(*events))
            if r != 0:
                raise _cl_error(r, "clWaitForEvents")
        finally:
            for e in events:
                cl.release_event(e)
        for name, host in zip(("out", "lse"), res):
            self._outs[name] = (host, self._outs[name][1])
        return res[0] if len(res) == 1 else tuple(res)

    def _free(self):
        if self._ptr:
            _lib().release(self._ptr)
            self._ptr = None
        cl = self._ctx._cl
        for vw in self._views:
            if vw.owned:
                cl.release_mem(vw.buf)
        for arr, buf in self._outs.values():
            if buf is not None:
                cl.release_mem(buf)
        self._views, self._outs = [], {k: (a, None) for k, (a, b) in self._outs.items()}

    def close(self):
        """Releases the plan after the step under way in another thread, if
        any, returns (steps enqueued still run)."""
        with self._lock:
            self._free()
        getattr(self._ctx, "_plans", set()).discard(self)

    def __del__(self):
        try:
            if getattr(self, "_ptr", None) and self._ctx._ptr:
                self.close()
        except Exception:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
