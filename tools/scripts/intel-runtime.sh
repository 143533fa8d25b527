#!/usr/bin/env bash
# Intel's OpenCL CPU runtime (oneAPI, from PyPI: intel-opencl-rt with
# intel-cmplr-lib-rt) in a virtual environment of the repository's own,
# build-intel-rt/ (ignored; about 800 MB; no system change): clattn's second
# OpenCL implementation besides POCL, run through the ICD loader.
#
#   tools/scripts/intel-runtime.sh               installs it when missing, then
#                                                prints the environment that selects it
#   tools/scripts/intel-runtime.sh COMMAND...    installs it when missing, then runs
#                                                COMMAND with it selected
#
# Selected means: OCL_ICD_FILENAMES names its ICD (the loader lists it before
# the system's platforms), LD_LIBRARY_PATH finds its libraries, and
# CLATTN_DEVICE (clattn's device rule) matches its platform, "Intel(R) OpenCL".
# CLATTN_INTEL_RT=DIR uses a runtime installed elsewhere (DIR/lib/libintelocl.so).
#
# Exit status: COMMAND's; 77 (skipped, with the reason) when the runtime is
# not installed and pip cannot install it (no python3 venv, or PyPI out of
# reach); 1 when the ICD loader lists no device on its platform.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
rt=${CLATTN_INTEL_RT:-$root/build-intel-rt}
versions=(intel-opencl-rt==2026.2.0 intel-cmplr-lib-rt==2026.2.0)

skip() {
  echo "intel-runtime: SKIPPED: $*" >&2
  exit 77
}

if [ ! -f "$rt/lib/libintelocl.so" ]; then
  [ -n "${CLATTN_INTEL_RT:-}" ] && skip "CLATTN_INTEL_RT=$rt has no lib/libintelocl.so"
  command -v python3 >/dev/null || skip "no python3 to make a virtual environment with"
  echo "intel-runtime: installing ${versions[*]} into $rt (pip, about 700 MB)" >&2
  rm -rf "$rt"
  python3 -m venv "$rt" >/dev/null 2>&1 && [ -x "$rt/bin/pip" ] ||
    { rm -rf "$rt"; skip "python3 cannot make a virtual environment with pip (python3-venv missing)"; }
  if ! "$rt/bin/python" -m pip --disable-pip-version-check -q install "${versions[@]}"; then
    rm -rf "$rt"
    skip "pip could not install ${versions[*]} (is PyPI within reach?)"
  fi
fi

export OCL_ICD_FILENAMES=$rt/lib/libintelocl.so
export LD_LIBRARY_PATH=$rt/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export CLATTN_DEVICE="Intel(R) OpenCL"

if ! clinfo -l 2>/dev/null | grep -A1 -F "$CLATTN_DEVICE" | grep -q Device; then
  echo "intel-runtime: the ICD loader lists no device of $CLATTN_DEVICE ($OCL_ICD_FILENAMES)" >&2
  exit 1
fi
if [ $# -eq 0 ]; then
  printf 'export OCL_ICD_FILENAMES=%q\n' "$OCL_ICD_FILENAMES"
  printf 'export LD_LIBRARY_PATH=%q\n' "$LD_LIBRARY_PATH"
  printf 'export CLATTN_DEVICE=%q\n' "$CLATTN_DEVICE"
  exit 0
fi
exec "$@"
