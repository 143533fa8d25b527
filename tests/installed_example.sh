#!/usr/bin/env bash
# README's C example (examples/basic.c) as a user builds it: the library
# installed (into a staging root), the example compiled with `pkg-config
# --cflags --libs clattn` and run. (tests/doc_check.py keeps the documents'
# excerpts of it verbatim.)
#
#   tests/installed_example.sh SOURCE_DIR BUILD_DIR WORK_DIR
set -euo pipefail
src=$1 build=$2 work=$3

rm -rf "$work"
meson install -C "$build" --destdir "$work/root" --no-rebuild --quiet
pc_dir=$(dirname "$(find "$work/root" -name clattn.pc | head -n 1)")
export PKG_CONFIG_PATH=$pc_dir PKG_CONFIG_SYSROOT_DIR=$work/root
flags=$(pkg-config --cflags --libs clattn)
echo "pkg-config --cflags --libs clattn: $flags"
lib_dir=$(dirname "$(find "$work/root" -name 'libclattn.so' | head -n 1)")
# A sanitizer build (tools/scripts/sanitize.sh) installs an instrumented library:
# the program links the same runtime first.
sanitize=()
ldd "$lib_dir/libclattn.so" | grep -q libasan && sanitize+=(-fsanitize=address)
ldd "$lib_dir/libclattn.so" | grep -q libubsan && sanitize+=(-fsanitize=undefined)
ldd "$lib_dir/libclattn.so" | grep -q libtsan && sanitize+=(-fsanitize=thread)
cc -std=c11 -Wall -Wextra -Werror "${sanitize[@]}" "$src/examples/basic.c" $flags -lm -o "$work/basic"
# The caller's library path stays after it: an OpenCL runtime outside the
# system's (tools/scripts/intel-runtime.sh) loads its libraries through it.
LD_LIBRARY_PATH=$lib_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$work/basic"
