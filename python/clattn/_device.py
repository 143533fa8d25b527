"""clattn.DeviceArray: an array in a Context's device memory that the binding
made itself (one buffer through the ICD loader, as numpy arrays' uploads
are made; pyopencl is not needed). Every call of that context takes it
where it takes a numpy array, as a view of its buffer: nothing is copied,
and what a call writes stays on the device (KVCache's arrays). Only numpy
reads it back (get)."""
import ctypes

import numpy as np

from ._error import cl_error as _cl_error


class DeviceArray:
    """A dense C-ordered array in a clattn.Context's device memory: shape,
    dtype, strides (bytes), nbytes as numpy's. get() returns a numpy copy;
    release() frees the buffer after the context's calls under way (also
    when the array is collected)."""

    def __init__(self, ctx, a):
        a = np.ascontiguousarray(a)
        if a.size == 0:
            raise ValueError("clattn: a device array cannot be empty (shape %s)" % (a.shape,))
        self._ctx, self._buf = ctx, None
        self.shape, self.dtype, self.strides = a.shape, a.dtype, a.strides
        ctx._enter()
        try:
            self._buf = ctx._new_buffer(ctx._cl.MEM_READ_WRITE, a.nbytes, ctypes.c_void_p(a.ctypes.data))
        finally:
            ctx._leave()

    ndim = property(lambda self: len(self.shape))
    size = property(lambda self: int(np.prod(self.shape)))
    nbytes = property(lambda self: self.size * self.dtype.itemsize)

    def __repr__(self):
        return "clattn.DeviceArray(shape=%s, dtype=%s%s)" % (self.shape, self.dtype,
                                                            "" if self._buf else ", released")

    def buffer(self, ctx, name):
        """The cl_mem a call of ctx passes (ctx._input), checked to be ctx's and live."""
        if ctx is not self._ctx and ctx._cl_context != self._ctx._cl_context:
            raise ValueError("clattn: %s is a device array of another clattn.Context" % name)
        if not self._buf:
            raise ValueError("clattn: %s is a released device array" % name)
        return self._buf

    def get(self):
        """A numpy copy of the array (after the work enqueued before it)."""
        ctx = self._ctx
        out = np.empty(self.shape, self.dtype)
        ctx._enter()
        try:
            buf = self.buffer(ctx, "the array")
            r = ctx._cl.finish(ctx._cl_queue)  # an embedded queue may be out of order
            if r == 0:
                r = ctx._cl.enqueue_read(ctx._cl_queue, buf, 1, 0, self.nbytes, ctypes.c_void_p(out.ctypes.data),
                                         0, None, None)
            if r != 0:
                raise _cl_error(r, "clEnqueueReadBuffer")
        finally:
            ctx._leave()
        return out

    def release(self):
        """Frees the buffer once no call of the context is under way (a call
        may be using it); later calls given it raise ValueError."""
        ctx = self._ctx
        with ctx._cond:
            while ctx._active:
                ctx._cond.wait()
            buf, self._buf = self._buf, None
        if buf:
            ctx._cl.release_mem(buf)

    def __del__(self):
        try:  # nothing refers to it: no call is using it (a call's views keep it)
            if self._buf:
                self._ctx._cl.release_mem(self._buf)
                self._buf = None
        except Exception:
            pass
