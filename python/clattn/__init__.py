"""clattn: exact scaled dot-product attention on any OpenCL 1.2 device.

    import clattn
    ctx = clattn.Context()                       # or Context(queue=pyopencl_queue)
    o = ctx.attention(q, k, v, causal=True)      # numpy float32/float16 [B,H,S,D]

A ctypes binding over clattn's public C API (clattn.h); see docs/python.md.
"""
from . import modifiers
from ._core import Context, Error
from ._device import DeviceArray
from ._dropout import dropout_mask
from ._flex import BlockMask
from ._kvcache import KVCache
from ._plan import Plan

__all__ = ["BlockMask", "Context", "DeviceArray", "Error", "KVCache", "Plan", "dropout_mask", "modifiers"]
__version__ = "0.1.0"
