#!/usr/bin/env bash
# The Python binding's stage: a virtual environment in BUILD_DIR/python-venv
# (it sees the system's site-packages, so an installed torch or pyopencl is
# used) with numpy, pytest and pytest-xdist from PyPI, pyopencl and ml_dtypes
# when PyPI has wheels for this Python (optional: their tests skip without
# them), the package installed from python/ with libclattn built in
# BUILD_DIR, then pytest python/tests, one process per core (at most four):
# cold kernel builds are most of its time, and a runtime builds one program
# at a time per process.
#
#   tools/scripts/python.sh [BUILD_DIR]        default: build-test (tools/scripts/setup.sh's)
#
# Exit status: 0 when pytest passed; 77 (skipped, with a message) when
# python3 cannot make a virtual environment with pip; 1 otherwise, including
# pytest's 5 (no tests collected).
set -uo pipefail
cd "$(dirname "$0")/../.."
build_dir=${1:-build-test}
venv=$build_dir/python-venv

if ! command -v python3 >/dev/null; then
  echo "python: SKIPPED: no python3" >&2
  exit 77
fi
if [ ! -x "$venv/bin/pip" ]; then
  rm -rf "$venv"
  if ! python3 -m venv --system-site-packages "$venv" >/dev/null 2>&1; then
    # Debian's python3 has venv and ensurepip in python3-venv
    command -v dpkg-query >/dev/null && tools/scripts/packages.sh python3-venv python3-pip
    rm -rf "$venv"
    if ! python3 -m venv --system-site-packages "$venv" || [ ! -x "$venv/bin/pip" ]; then
      rm -rf "$venv"
      echo "python: SKIPPED: python3 cannot make a virtual environment with pip (python3-venv missing)" >&2
      exit 77
    fi
  fi
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
"${pip[@]}" install numpy pytest pytest-xdist ||
  { echo "python: cannot install numpy, pytest and pytest-xdist with pip" >&2; exit 1; }
if ! "$venv/bin/python" -c "import pyopencl" 2>/dev/null; then
  "${pip[@]}" install --only-binary :all: pyopencl 2>/dev/null ||
    echo "python: no pyopencl wheel for this Python: the pyopencl tests will be skipped"
fi
if ! "$venv/bin/python" -c "import ml_dtypes" 2>/dev/null; then
  "${pip[@]}" install --only-binary :all: ml_dtypes 2>/dev/null ||
    echo "python: no ml_dtypes wheel for this Python: the ml_dtypes.bfloat16 tests will be skipped"
fi
CLATTN_MESON_BUILD_DIR=$build_dir "${pip[@]}" install --force-reinstall --no-deps ./python ||
  { echo "python: pip install ./python failed" >&2; exit 1; }

# From the repository root the installed package is the one imported
# (python/clattn, without its library, is not on sys.path).
workers=$(nproc 2>/dev/null || echo 1)
[ "$workers" -gt 4 ] && workers=4
"$venv/bin/python" -m pytest -q -p no:cacheprovider -n "$workers" python/tests
rc=$?
[ $rc -eq 5 ] && echo "python: pytest collected no tests" >&2
[ $rc -eq 0 ] || exit 1
