"""clattn.dropout_mask: which weights attention's dropout keeps, computed on
the host (clattn_dropout_mask), for tests and for reproducing a run."""
import ctypes

import numpy as np

from . import _ffi
from ._call import UINT64_MAX, check_dropout_p, check_int
from ._error import Error


def dropout_mask(batch, heads, q_len, kv_len, dropout_p, seed=0, offset=0):
    """bool [batch, heads, q_len, kv_len]: True where attention(...,
    dropout_p=dropout_p, seed=seed, offset=offset) keeps weight (b, h, i, j)
    (i the row within its sequence, j the key); a kept weight is scaled by
    1 / (1 - dropout_p), a dropped one mixes nothing in. The same mask on
    every path and device (Philox4x32-10, docs/semantics.md)."""
    dropout_p = check_dropout_p(dropout_p)  # as attention refuses it (the C call would give an empty mask)
    dims = [check_int(x, n, 0) for x, n in ((batch, "batch"), (heads, "heads"), (q_len, "q_len"), (kv_len, "kv_len"))]
    for name, x in (("seed", seed), ("offset", offset)):
        if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)) or not 0 <= int(x) <= UINT64_MAX:
            raise ValueError("clattn: %s must be an int in [0, 2^64) (got %r)" % (name, x))
    lib = _ffi.lib()
    p = lib.params_default()
    p.dropout_p, p.dropout_seed, p.dropout_offset = dropout_p, int(seed), int(offset)
    out = np.empty(dims, dtype=np.uint8)
    for b in range(dims[0]):
        for h in range(dims[1]):
            st = lib.dropout_mask(ctypes.byref(p), b, h, 0, dims[2], 0, dims[3], out[b, h].ctypes.data)
            if st != 0:
                raise Error(_ffi.STATUS_NAMES.get(st, str(st)), lib.last_error(None).decode())
    return out.view(np.bool_)
