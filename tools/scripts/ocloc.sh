#!/usr/bin/env bash
# Intel's offline OpenCL compiler for its GPUs (ocloc, from Debian's
# intel-opencl-icd, IGC inside): the one on PATH, else Debian's packages
# unpacked into build-ocloc/ of the repository (apt-get download and
# dpkg-deb -x: no root, and no ICD registered, so no OpenCL program on the
# machine sees a new platform).
#
#   tools/scripts/ocloc.sh ARGS...     runs ocloc ARGS (e.g. compile --help; query
#                                      OCL_DRIVER_VERSION exits 0 once it is there,
#                                      writing a file of that name)
#
# Exit status: ocloc's; 77 (skipped, with the reason) where neither ocloc
# nor apt-get download can provide it.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
dir=$root/build-ocloc

if command -v ocloc >/dev/null; then
  exec ocloc "$@"
fi
# ocloc and what it loads: IGC (libigc1, libigdfcl1 with its LLVM 14 front
# end and SPIR-V translator) and the memory manager (libigdgmm12).
packages=(intel-opencl-icd libigc1 libigdfcl1 libigdgmm12 libopencl-clang14 libllvmspirvlib14 libllvm14)
lib=$dir/root/usr/lib/x86_64-linux-gnu
if [ ! -x "$dir/root/usr/bin/ocloc" ]; then
  command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null ||
    { echo "ocloc: SKIPPED: no ocloc on PATH, and no apt-get/dpkg-deb to fetch Debian's intel-opencl-icd" >&2; exit 77; }
  rm -rf "$dir"
  mkdir -p "$dir/debs"
  echo "ocloc: fetching ${packages[*]} into $dir (apt-get download, about 40 MB)" >&2
  if ! (cd "$dir/debs" && apt-get download "${packages[@]}" >/dev/null 2>&1); then
    rm -rf "$dir"
    echo "ocloc: SKIPPED: apt-get download ${packages[*]} failed (no such packages here, or no network)" >&2
    exit 77
  fi
  for deb in "$dir"/debs/*.deb; do dpkg-deb -x "$deb" "$dir/root" || exit 1; done
fi
missing=$(LD_LIBRARY_PATH=$lib ldd "$dir/root/usr/bin/ocloc" "$lib"/libigc.so.1 "$lib"/libigdfcl.so.1 2>/dev/null |
            grep 'not found' | sort -u)
if [ -n "$missing" ]; then
  echo "ocloc: SKIPPED: libraries the unpacked ocloc needs are not installed:" >&2
  echo "$missing" >&2
  exit 77
fi
LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} exec "$dir/root/usr/bin/ocloc" "$@"
