#!/usr/bin/env bash
# Packs what tools/scripts/gpu-check.sh needs on a lent GPU machine, which has the
# NVIDIA driver, CUDA and PyTorch but no OpenCL loader, CLBlast or OpenBLAS,
# and reaches no package registry: the clattn tool and the device test
# programs, built here (release), with the shared libraries they load.
#
#   tools/scripts/gpu-bundle.sh        writes .gpu-bundle.tar.xz (git-ignored)
#
# Then, with the device tool: run `tools/scripts/gpu-check.sh` with carry
# [".gpu-bundle.tar.xz"]. Binaries built on Debian 12 need glibc 2.34 and
# GLIBCXX 3.4.29, which the GPU image (Ubuntu, Python 3.12) has.
set -euo pipefail
cd "$(dirname "$0")/../.."
tools/scripts/setup.sh build-gpu
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib"
cp build-gpu/tools/clattn "$stage/bin/"
for t in validation semantics fused varlen precision index_width chunking sweep; do
  cp "build-gpu/tests/test_$t" "$stage/bin/"
done
strip "$stage"/bin/*
# What the binaries load beyond glibc and libstdc++
for lib in libOpenCL.so.1 libclblast.so.1 libopenblas.so.0 libgfortran.so.5 libquadmath.so.0 libpng16.so.16; do
  path=$(ldconfig -p | awk -v l="$lib" '$1 == l && /x86-64/ { print $NF; exit }')
  [ -n "$path" ] || { echo "gpu-bundle: $lib not found" >&2; exit 1; }
  cp -L "$path" "$stage/lib/$lib"
done
tar -C "$stage" -cJf .gpu-bundle.tar.xz .
ls -la .gpu-bundle.tar.xz
