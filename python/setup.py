"""Builds libclattn with meson from the source tree this folder sits in
(python/.. : the clattn checkout) and puts the shared library inside the
package, with the example modifiers (examples/modifiers/*.cl, which
clattn.modifiers reads), so `pip install ./python` gives a self-contained
module.

Environment:
  CLATTN_MESON_BUILD_DIR  an existing meson build directory of this tree to
                          build the library in (tools/scripts/test.sh passes its own)
  CLATTN_NO_BUILD=1       build nothing: the module then loads libclattn from
                          $CLATTN_LIBRARY or the system loader at run time
Without a clattn source tree next to this folder (an sdist), nothing is built
either, with the same run-time fallback.
"""
import glob
import os
import shutil
import subprocess
import sys

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _is_clattn_tree(root):
    try:
        with open(os.path.join(root, "meson.build")) as f:
            head = f.read(200)
    except OSError:
        return False
    return "project('clattn'" in head and os.path.exists(os.path.join(root, "include", "clattn.h"))


def _run(cmd):
    print("clattn: " + " ".join(cmd), flush=True)
    subprocess.check_call(cmd)


def build_library():
    """Returns the path of the built libclattn shared library, or None."""
    if os.environ.get("CLATTN_NO_BUILD"):
        return None
    if not _is_clattn_tree(ROOT):
        print("clattn: no clattn source tree at %s; not building libclattn "
              "(set CLATTN_LIBRARY or install it system-wide)" % ROOT, file=sys.stderr)
        return None
    meson = shutil.which("meson")
    if meson is None:
        raise RuntimeError("clattn: meson is needed to build libclattn (Debian: meson ninja-build; "
                           "or tools/scripts/packages.sh in the checkout)")
    build_dir = os.environ.get("CLATTN_MESON_BUILD_DIR")
    if build_dir:
        build_dir = os.path.abspath(os.path.join(ROOT, build_dir))
    else:
        build_dir = os.path.join(HERE, "build", "meson")
    if not os.path.exists(os.path.join(build_dir, "build.ninja")):
        _run([meson, "setup", build_dir, ROOT, "-Dbuildtype=release"])
    _run([meson, "compile", "-C", build_dir, "clattn:shared_library"])
    libs = sorted(p for p in glob.glob(os.path.join(build_dir, "libclattn.so.*.*.*")) +
                  glob.glob(os.path.join(build_dir, "libclattn.*.dylib"))
                  if os.path.isfile(p) and not p.endswith(".p"))
    if not libs:
        raise RuntimeError("clattn: meson built no libclattn shared library in " + build_dir)
    return libs[-1]


def copy_modifiers(build_lib):
    """The example modifiers (examples/modifiers/*.cl) into the package, as
    clattn.modifiers reads them: the files stay their one source."""
    files = sorted(glob.glob(os.path.join(ROOT, "examples", "modifiers", "*.cl")))
    dest = os.path.join(build_lib, "clattn", "modifiers")
    os.makedirs(dest, exist_ok=True)
    for f in files:
        shutil.copyfile(f, os.path.join(dest, os.path.basename(f)))


class BuildPyWithLibrary(build_py):
    def run(self):
        super().run()
        copy_modifiers(self.build_lib)
        lib = build_library()
        if lib:
            name = "libclattn.dylib" if lib.endswith(".dylib") else "libclattn.so"
            dest = os.path.join(self.build_lib, "clattn", name)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            shutil.copyfile(lib, dest)
            os.chmod(dest, 0o755)


class BinaryDistribution(Distribution):
    """The wheel carries a shared library: tag it for this platform."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildPyWithLibrary}, distclass=BinaryDistribution)
