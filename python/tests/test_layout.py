"""The ctypes structures against include/clattn.h: a C program compiled
against the header prints every offset (skipped without a C compiler or the
header, e.g. outside a checkout)."""
import ctypes
import os
import shutil
import subprocess

import pytest

from clattn import _ffi, _plan

HEADER_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "include")

STRUCTS = {"clattn_params": _ffi.Params, "clattn_options": _ffi.Options,
           "clattn_merge_params": _ffi.MergeParams, "clattn_tensor": _ffi.Tensor,
           "clattn_backward_params": _ffi.BackwardParams, "clattn_append_params": _ffi.AppendParams,
           "clattn_kvcache_params": _ffi.KvcacheParams, "clattn_step": _plan.Step}


def test_offsets_match_the_header(tmp_path):
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if not cc or not os.path.exists(os.path.join(HEADER_DIR, "clattn.h")):
        pytest.skip("no C compiler or no include/clattn.h")
    lines = ["#include <stdio.h>", "#include <stddef.h>", "#include <clattn.h>", "int main(void) {"]
    for cname, py in STRUCTS.items():
        lines.append('printf("%s sizeof %%zu\\n", sizeof(%s));' % (cname, cname))
        for f, _ in py._fields_:
            lines.append('printf("%s %s %%zu\\n", offsetof(%s, %s));' % (cname, f, cname, f))
    lines.append("return 0; }")
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines))
    exe = tmp_path / "layout"
    r = subprocess.run([cc, "-std=c11", "-I", HEADER_DIR, str(src), "-o", str(exe)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip("cannot compile against clattn.h here: " + r.stderr[-500:])
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split("\n")
    for line in filter(None, out):
        cname, field, value = line.split()
        py = STRUCTS[cname]
        if field == "sizeof":  # struct_size is the ctypes size: exactly the header's
            assert int(value) == ctypes.sizeof(py), cname
        else:
            assert getattr(py, field).offset == int(value), (cname, field)


def test_every_foreign_call_releases_the_gil():
    """ctypes releases the GIL around a call unless the function comes from a
    PyDLL (FUNCFLAG_PYTHONAPI): none of ours may, so the device wait
    (clWaitForEvents, and clattn_forward's own wait for EMPTY_ERROR) lets other
    Python threads run."""
    objs = [_ffi.lib(), _ffi.opencl()]
    n = 0
    for o in objs:
        for f in vars(o).values():
            if isinstance(f, ctypes._CFuncPtr):
                assert not (f._flags_ & ctypes._FUNCFLAG_PYTHONAPI), f.__name__
                n += 1
    assert n >= 15
