"""ctypes declarations: clattn's public C API (include/clattn.h) and the few
OpenCL calls the numpy path needs, from the ICD loader (libOpenCL.so.1).

Nothing here uses a private header: the structures mirror clattn.h field by
field (tests/test_layout.py compiles a C program against the header and
checks every offset). Each begins with struct_size, set to its ctypes size
by the library's *_init functions: a newer library reads no byte past it
and takes the fields it does not know as their defaults (clattn.h, "ABI").
"""
import ctypes
import ctypes.util
import os
import threading

c_int, c_uint, c_float, c_size_t, c_void_p, c_char_p = (
    ctypes.c_int, ctypes.c_uint, ctypes.c_float, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_char_p)
cl_int = ctypes.c_int32
cl_uint = ctypes.c_uint32
cl_ulong = ctypes.c_uint64
cl_bitfield = ctypes.c_uint64

STATUS_NAMES = {
    0: "OK",
    1: "INVALID_ARGUMENT",
    2: "UNSUPPORTED",
    3: "BUFFER_TOO_SMALL",
    4: "EMPTY_ROW",
    5: "OUT_OF_MEMORY",
    6: "BUILD",
    7: "NO_DEVICE",
    8: "OPENCL",
}
F32, F16, BF16 = 0, 1, 2
ALGOS = {"auto": 0, "staged": 1, "fused": 2, "gemm": 3}
EMPTY_ROWS = {"zero": 0, "error": 1}


class Tensor(ctypes.Structure):
    _fields_ = [("buf", c_void_p), ("offset", c_size_t), ("stride", c_size_t * 4)]


class Options(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("context", c_void_p),
        ("device", c_void_p),
        ("queue", c_void_p),
        ("device_match", c_char_p),
        ("cache_dir", c_char_p),
        ("tuning_file", c_char_p),
    ]


class Params(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        # the problem
        ("batch", c_int), ("q_heads", c_int), ("kv_heads", c_int),
        ("q_len", c_int), ("kv_len", c_int),
        ("head_dim", c_int), ("value_dim", c_int),
        ("dtype", c_int), ("algo", c_int),
        # the views
        ("q", Tensor), ("k", Tensor), ("v", Tensor), ("out", Tensor),
        # which keys each query may see
        ("causal", c_int), ("window_left", c_int), ("window_right", c_int),
        ("kv_lens", c_void_p),
        ("mask", Tensor),
        ("empty_rows", c_int),
        # score shaping
        ("scale", c_float), ("softcap", c_float),
        ("score", c_int), ("additive_w", c_void_p),
        ("bias", Tensor), ("bias_dtype", c_int), ("bias_scale", c_void_p),
        ("alibi_slopes", c_void_p), ("alibi_batch_stride", c_int),
        ("sinks", c_void_p), ("sinks_offset", c_size_t),
        # the K/V cache
        ("kv_dtype", c_int), ("v_dtype", c_int),
        ("k_scale", Tensor), ("v_scale", Tensor),
        ("block_table", c_void_p),
        ("block_table_stride", c_int), ("page_size", c_int), ("num_pages", c_int),
        ("cache_leftpad", c_void_p),
        # packed variable-length batches
        ("cu_seqlens_q", c_void_p), ("cu_seqlens_k", c_void_p),
        ("total_q", c_int), ("total_kv", c_int),
        # dropout
        ("dropout_p", c_float), ("dropout_seed", cl_ulong), ("dropout_offset", cl_ulong),
        # optional outputs
        ("lse", Tensor), ("weights", Tensor),
        ("entropy", Tensor), ("max_weight", Tensor), ("argmax", Tensor),
        # modifiers: OpenCL C text, their captures, a block mask (clattn_block_mask *)
        ("score_mod", c_char_p), ("mask_mod", c_char_p),
        ("captures", c_void_p * 4), ("capture_f", c_float * 4), ("capture_i", c_int * 4),
        ("block_mask", c_void_p),
    ]


class MergeParams(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("n_states", c_int),
        ("batch", c_int), ("heads", c_int), ("q_len", c_int), ("value_dim", c_int),
        ("o", Tensor), ("lse", Tensor),
        ("o_state_stride", c_size_t), ("lse_state_stride", c_size_t),
        ("out", Tensor), ("out_lse", Tensor),
        ("empty_rows", c_int),
        ("out_dtype", c_int),
    ]


# ---- the backward, the cache append, the decode step ----

Q8_0, INT8, DTYPE_SAME = 3, 4, -1


class BackwardParams(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("fwd", Params),
        ("d_out", Tensor), ("d_q", Tensor), ("d_k", Tensor), ("d_v", Tensor),
        ("d_sinks", c_void_p), ("d_additive_w", c_void_p),
        ("deterministic", c_int),
        ("d_bias", Tensor),
    ]


class AppendParams(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("batch", c_int), ("kv_heads", c_int), ("new_len", c_int), ("head_dim", c_int), ("value_dim", c_int),
        ("src_dtype", c_int),
        ("k_new", Tensor), ("v_new", Tensor),
        ("positions", c_void_p),
        ("kv_dtype", c_int),
        ("k", Tensor), ("v", Tensor), ("k_scale", Tensor), ("v_scale", Tensor),
        ("block_table", c_void_p),
        ("block_table_stride", c_int), ("page_size", c_int), ("num_pages", c_int),
        ("capacity", c_int),
    ]


class KvcacheParams(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("attn", Params),
        ("cache_seqlens", c_void_p),
        ("k_new", Tensor), ("v_new", Tensor),
        ("new_len", c_int),
        ("cache_batch_idx", c_void_p),
        ("num_slots", c_int),
        ("rotary_cos", Tensor), ("rotary_sin", Tensor),
        ("rotary_dim", c_int), ("rotary_len", c_int), ("rotary_interleaved", c_int),
        ("host_seqlens", c_void_p),
    ]


def _fn(lib, name, restype, *argtypes):
    f = getattr(lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


def _defaults(lib, name, struct):
    """clattn_*_default() (inline in clattn.h): the exported initialiser with
    the structure's size."""
    init = _fn(lib, name, None, ctypes.POINTER(struct), c_size_t)

    def make():
        s = struct()
        init(ctypes.byref(s), ctypes.sizeof(s))
        return s
    return make


class _Lib:
    """clattn's functions. ctypes.CDLL releases the GIL around every call."""

    def __init__(self, path):
        self.path = path
        lib = ctypes.CDLL(path)
        self.create = _fn(lib, "clattn_create", c_int, ctypes.POINTER(Options), ctypes.POINTER(c_void_p))
        self.destroy = _fn(lib, "clattn_destroy", None, c_void_p)
        self.cl_context = _fn(lib, "clattn_cl_context", c_void_p, c_void_p)
        self.cl_queue = _fn(lib, "clattn_cl_queue", c_void_p, c_void_p)
        self.cl_device = _fn(lib, "clattn_cl_device", c_void_p, c_void_p)
        self.status_string = _fn(lib, "clattn_status_string", c_char_p, c_int)
        self.last_error = _fn(lib, "clattn_last_error", c_char_p, c_void_p)
        self.last_route = _fn(lib, "clattn_last_route", c_char_p)
        self.params_default = _defaults(lib, "clattn_params_init", Params)
        self.forward = _fn(lib, "clattn_forward", c_int, c_void_p, ctypes.POINTER(Params),
                           cl_uint, c_void_p, ctypes.POINTER(c_void_p))
        self.merge_states = _fn(lib, "clattn_merge_states", c_int, c_void_p, ctypes.POINTER(MergeParams),
                                cl_uint, c_void_p, ctypes.POINTER(c_void_p))
        self.describe = _fn(lib, "clattn_describe", c_char_p, c_void_p)
        # the backward and the cache append
        self.backward_params_default = _defaults(lib, "clattn_backward_params_init", BackwardParams)
        self.backward = _fn(lib, "clattn_backward", c_int, c_void_p, ctypes.POINTER(BackwardParams),
                            cl_uint, c_void_p, ctypes.POINTER(c_void_p))
        self.append_params_default = _defaults(lib, "clattn_append_params_init", AppendParams)
        self.kv_append = _fn(lib, "clattn_kv_append", c_int, c_void_p, ctypes.POINTER(AppendParams),
                             cl_uint, c_void_p, ctypes.POINTER(c_void_p))
        self.kvcache_params_default = _defaults(lib, "clattn_kvcache_params_init", KvcacheParams)
        self.forward_kvcache = _fn(lib, "clattn_forward_kvcache", c_int, c_void_p, ctypes.POINTER(KvcacheParams),
                                   cl_uint, c_void_p, ctypes.POINTER(c_void_p))
        self.peak_scratch_bytes = _fn(lib, "clattn_peak_scratch_bytes", c_size_t, c_void_p, c_int)
        self.dropout_mask = _fn(lib, "clattn_dropout_mask", c_int, ctypes.POINTER(Params), c_int, c_int, c_int, c_int,
                                c_int, c_int, c_void_p)
        # modifiers: block masks, and the modifiers evaluated at given points
        P = ctypes.POINTER
        self.block_mask_create = _fn(lib, "clattn_block_mask_create", c_int, c_void_p, P(Params), c_int, c_int,
                                     P(c_void_p))
        self.block_mask_counts = _fn(lib, "clattn_block_mask_counts", None, c_void_p, P(c_size_t), P(c_size_t),
                                     P(c_size_t))
        self.block_mask_release = _fn(lib, "clattn_block_mask_release", None, c_void_p)
        self.modifier_eval = _fn(lib, "clattn_modifier_eval", c_int, c_void_p, P(Params), c_size_t, c_void_p,
                                 c_void_p, c_void_p, c_void_p)


class _OpenCL:
    """The OpenCL calls the binding makes itself, through the ICD loader."""

    MEM_READ_WRITE = 1 << 0
    MEM_WRITE_ONLY = 1 << 1
    MEM_READ_ONLY = 1 << 2
    MEM_COPY_HOST_PTR = 1 << 5
    DEVICE_NAME = 0x102B
    DEVICE_MAX_MEM_ALLOC_SIZE = 0x1010
    MEM_SIZE = 0x1102
    MEM_CONTEXT = 0x1106

    def __init__(self):
        names = [os.environ.get("CLATTN_OPENCL_LIBRARY"), "libOpenCL.so.1",
                 ctypes.util.find_library("OpenCL"), "libOpenCL.so", "OpenCL.dll",
                 "/System/Library/Frameworks/OpenCL.framework/OpenCL"]
        errors = []
        lib = None
        for n in names:
            if not n:
                continue
            try:
                lib = ctypes.CDLL(n)
                break
            except OSError as e:
                errors.append(str(e))
        if lib is None:
            raise OSError("clattn: cannot load the OpenCL ICD loader (libOpenCL.so.1): " + "; ".join(errors))
        P = ctypes.POINTER
        self.create_buffer = _fn(lib, "clCreateBuffer", c_void_p, c_void_p, cl_bitfield, c_size_t, c_void_p, P(cl_int))
        self.release_mem = _fn(lib, "clReleaseMemObject", cl_int, c_void_p)
        self.enqueue_read = _fn(lib, "clEnqueueReadBuffer", cl_int, c_void_p, c_void_p, cl_uint, c_size_t,
                                c_size_t, c_void_p, cl_uint, c_void_p, P(c_void_p))
        self.wait = _fn(lib, "clWaitForEvents", cl_int, cl_uint, c_void_p)
        self.release_event = _fn(lib, "clReleaseEvent", cl_int, c_void_p)
        self.finish = _fn(lib, "clFinish", cl_int, c_void_p)
        self.device_info = _fn(lib, "clGetDeviceInfo", cl_int, c_void_p, cl_uint, c_size_t, c_void_p, P(c_size_t))
        self.mem_info = _fn(lib, "clGetMemObjectInfo", cl_int, c_void_p, cl_uint, c_size_t, c_void_p, P(c_size_t))


_lock = threading.Lock()
_lib = None
_cl = None


def _library_candidates():
    env = os.environ.get("CLATTN_LIBRARY")
    if env:
        return [env], True
    here = os.path.dirname(os.path.abspath(__file__))
    cands = [os.path.join(here, n) for n in ("libclattn.so", "libclattn.dylib", "clattn.dll")]
    cands = [c for c in cands if os.path.exists(c)]
    found = ctypes.util.find_library("clattn")
    cands += [c for c in (found, "libclattn.so.5", "libclattn.so") if c]  # the soname: ABI 5
    return cands, False


def lib():
    """Loads libclattn once: $CLATTN_LIBRARY, else the copy installed inside
    the package, else the system loader (an installed libclattn.so.5)."""
    global _lib
    if _lib is None:
        with _lock:
            if _lib is None:
                cands, from_env = _library_candidates()
                errors = []
                for c in cands:
                    try:
                        _lib = _Lib(c)
                        break
                    except (OSError, AttributeError) as e:
                        errors.append("%s: %s" % (c, e))
                if _lib is None:
                    where = "CLATTN_LIBRARY" if from_env else "the package, then the system loader"
                    raise OSError("clattn: cannot load libclattn (looked in %s): %s"
                                  % (where, "; ".join(errors) or "not found"))
    return _lib


def opencl():
    global _cl
    if _cl is None:
        with _lock:
            if _cl is None:
                _cl = _OpenCL()
    return _cl
