"""clattn.Error, and OpenCL failures of the binding's own calls as Errors."""


class Error(RuntimeError):
    """A clattn status other than OK. ``status`` is its name
    ("INVALID_ARGUMENT", "EMPTY_ROW", ...), ``message`` the library's detail
    (clattn_last_error)."""

    def __init__(self, status, message):
        self.status = status
        self.message = message
        super().__init__("%s: %s" % (status, message))


def cl_error(code, what):
    # the mapping clattn itself uses for OpenCL failures
    if code in (-4, -5, -6, -61):  # allocation failure, resources, host memory, buffer size
        return Error("OUT_OF_MEMORY", "%s failed: OpenCL error %d" % (what, code))
    return Error("OPENCL", "%s failed: OpenCL error %d" % (what, code))
