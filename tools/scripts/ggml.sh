#!/usr/bin/env bash
# The ggml lanes: clattn inside llama.cpp, checked by llama.cpp's own tests.
#
#   tools/scripts/ggml.sh [--quick | --full | --build]
#
# 1. llama.cpp as PyPI's llama-cpp-python==0.3.36 sdist vendors it (ggml
#    0.25.3, backend API 2), fetched with `pip download --no-deps
#    --no-binary :all:` into build-ggml/ (once: nothing of llama.cpp is in
#    the repository), its OpenCL backend patched (ggml/opencl/ggml-opencl.patch,
#    applied anew to the sdist's files whenever the patch changes) and built
#    there with cmake, once for both lanes: GGML_NATIVE (the CPU backend for
#    this CPU), GGML_OPENCL with GGML_OPENCL_USE_ADRENO_KERNELS=OFF, and
#    GGML_OPENCL_CLATTN naming ggml/opencl (FLASH_ATTN_EXT through clattn,
#    libclattn from build-ggml/clattn found by pkg-config): test-backend-ops,
#    test-llama-archs, llama-simple and llama-bench.
# 2. clattn's own backend in build-ggml/clattn, configured with -Dggml and
#    -Dggml_lib naming that tree and its libraries:
#    build-ggml/clattn/ggml/libggml-clattn.so (and ggml-bench-fa,
#    ggml-fa-supported-check, and ggml-opencl-fa-check for the ggml-opencl
#    lane).
#    --build stops here.
# 3. On the default OpenCL device (CLATTN_DEVICE's match, else the first
#    GPU, else POCL's CPU device), the backend loaded as ggml loads one:
#      test-backend-ops test -o FLASH_ATTN_EXT -b CLATTN    the cases ggml generates at
#                                 batch sizes 1 and 75 (every head size, K/V type, mask and
#                                 feature; half of the 5,308 cases, cold kernel builds are
#                                 most of the time); --full: every case; --quick: those
#                                 with head sizes 64/64 and 576/512. GGML_BACKEND_PATH
#                                 names the backend
#      test-llama-archs -b CLATTN  every architecture against the CPU backend
#                                 (--quick: llama, qwen2, gemma2)
#      llama-simple               a random-weights llama model that test-llama-archs
#                                 writes: the same greedy text on the CPU backend
#                                 alone and with CLATTN
#    (the last two read no GGML_BACKEND_PATH with ggml's CPU backend built in:
#    the backend is preloaded and registers itself, CLATTN_GGML_REGISTER=1).
#      ggml-fa-supported-check    the nodes both backends leave to ggml over op
#                                 parameters test-backend-ops never varies (a NaN scale)
#    Each run reports how many FLASH_ATTN_EXT nodes clattn_forward computed
#    (CLATTN_GGML_REPORT); a run in which it computed none fails the lane.
# 4. Where Intel's OpenCL CPU runtime is installed (build-intel-rt/, by the
#    test command's second lane), the ggml-opencl lane there: llama.cpp's
#    OpenCL backend with clattn (tools/scripts/ggml-opencl.sh, its default
#    slice). CLATTN_GGML_INTEL=all runs test-backend-ops over the --quick
#    cases with CLATTN on that runtime first (the same kernels as on POCL's
#    CPU device: the lane's time is better spent on the other backend).
#
# Installs cmake, g++ and patch with apt-get when missing (tools/scripts/packages.sh).
# Exit status: 0 when every run passed; 77 (skipped, saying why) when pip
# cannot fetch the sdist; 1 otherwise.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
quick=0 full=0 build_only=0
[ "${1:-}" = --quick ] && quick=1
[ "${1:-}" = --full ] && full=1
[ "${1:-}" = --build ] && build_only=1
work=$root/build-ggml
build_dir=$work/clattn
sdist=llama-cpp-python==0.3.36
tree=$work/llama_cpp_python-0.3.36/vendor/llama.cpp
bin=$work/build/bin

skip() {
  echo "ggml: SKIPPED: $*" >&2
  exit 77
}
fail() {
  echo "ggml: FAILED: $*" >&2
  exit 1
}

tools/scripts/packages.sh cmake g++ patch || exit 1

# ---- 1. llama.cpp, fetched once, patched, built ----
t0=$SECONDS
if [ ! -f "$tree/CMakeLists.txt" ]; then
  mkdir -p "$work"
  python3 -m pip --version >/dev/null 2>&1 || tools/scripts/packages.sh python3-pip || true
  echo "ggml: fetching $sdist (pip download)" >&2
  python3 -m pip download --disable-pip-version-check -q --no-deps --no-binary :all: -d "$work" "$sdist" ||
    skip "pip could not download the $sdist sdist (is PyPI within reach?)"
  tar -xzf "$work"/llama_cpp_python-0.3.36.tar.gz -C "$work" || fail "cannot unpack the sdist"
fi
patch_file=$root/ggml/opencl/ggml-opencl.patch
stamp=$work/ggml-opencl.patched
want=$(sha256sum "$patch_file" | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  rm -rf "$tree/ggml/src/ggml-opencl"
  tar -xzf "$work"/llama_cpp_python-0.3.36.tar.gz -C "$work" llama_cpp_python-0.3.36/vendor/llama.cpp/ggml/src/ggml-opencl ||
    fail "cannot unpack ggml-opencl from the sdist"
  patch -p1 -s -d "$tree" <"$patch_file" || fail "ggml/opencl/ggml-opencl.patch does not apply"
  echo "$want" >"$stamp"
fi
# libclattn first: ggml-opencl links it (pkg-config: the build's uninstalled clattn.pc)
if [ ! -f "$build_dir/build.ninja" ]; then
  meson setup "$build_dir" -Dwerror=true >/dev/null || fail "meson setup $build_dir"
fi
meson compile -C "$build_dir" clattn:shared_library >/dev/null || fail "libclattn did not build in $build_dir"
glue=$root/ggml/opencl
if ! grep -qxF "GGML_OPENCL_CLATTN:PATH=$glue" "$work/build/CMakeCache.txt" 2>/dev/null; then
  PKG_CONFIG_PATH=$build_dir/meson-uninstalled${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH} \
    cmake -S "$tree" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=ON \
    -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=OFF -DLLAMA_OPENSSL=OFF \
    -DGGML_OPENCL=ON -DGGML_OPENCL_USE_ADRENO_KERNELS=OFF -DGGML_OPENCL_CLATTN="$glue" \
    >"$work/cmake.log" 2>&1 || fail "cmake could not configure llama.cpp: $work/cmake.log"
fi
echo "ggml: building llama.cpp (cmake, $(nproc) jobs)" >&2
cmake --build "$work/build" -j "$(nproc)" --target test-backend-ops test-llama-archs llama-simple llama-bench \
  >"$work/build.log" 2>&1 || fail "llama.cpp did not build: $work/build.log"
echo "ggml: llama.cpp ready ($((SECONDS - t0)) s)" >&2

# ---- 2. the backend ----
meson configure "$build_dir" -Dggml="$tree" -Dggml_lib="$bin" >/dev/null || fail "meson configure $build_dir"
targets=(ggml/libggml-clattn.so ggml/ggml-bench-fa ggml/ggml-fa-supported-check ggml/ggml-opencl-fa-check
         ggml/libggml-opencl-glue.a)
ninja -C "$build_dir" "${targets[@]}" >/dev/null || { ninja -C "$build_dir" "${targets[@]}"; fail "the backend did not build"; }
[ $build_only -eq 1 ] && exit 0
backend=$build_dir/ggml/libggml-clattn.so
export CLATTN_GGML_REPORT=1
preloaded=(env LD_PRELOAD="$backend" CLATTN_GGML_REGISTER=1)

status=0
# Runs a llama.cpp program, its stdout in $work/NAME.out and stderr in
# $work/NAME.log; fails when it fails or clattn computed no node.
run() {   # NAME PROGRAM ARGS...
  run_only "$@"
  report "$1"
}
run_only() {   # NAME PROGRAM ARGS...: runs it, its exit status and time in $work/NAME.rc
  local name=$1
  shift
  local t=$SECONDS
  "$@" >"$work/$name.out" 2>"$work/$name.log"
  echo "$? $((SECONDS - t))" >"$work/$name.rc"
}
report() {   # NAME: says how run_only's run went
  local name=$1 rc secs nodes
  read -r rc secs <"$work/$name.rc"
  nodes=$(grep -o '[0-9]* FLASH_ATTN_EXT nodes computed by clattn_forward' "$work/$name.log" | grep -o '^[0-9]*' | tail -1)
  echo "ggml: $name: exit $rc, ${nodes:-0} nodes through clattn_forward ($secs s)"
  if [ "$rc" -ne 0 ] || [ "${nodes:-0}" -eq 0 ]; then
    tail -40 "$work/$name.out" "$work/$name.log"
    status=1
  fi
}

# ---- 3. llama.cpp's tests ----
cases='nb=(1|75),'
[ $full -eq 1 ] && cases=''
[ $quick -eq 1 ] && cases='hsk=(64,hsv=64|576,hsv=512),'
# Two processes, the head sizes split so that each takes about as long
# (head size 64 holds most cases): a process builds its kernels one at a
# time (cold, most of its time), so two build side by side; their outputs
# are then read as one.
half='hsk=(64|320|512|65),'
run_only test-backend-ops-1 env GGML_BACKEND_PATH="$backend" "$bin/test-backend-ops" test -o FLASH_ATTN_EXT \
  -b CLATTN -p "^(?=.*$cases)(?=.*$half)" &
run_only test-backend-ops-2 env GGML_BACKEND_PATH="$backend" "$bin/test-backend-ops" test -o FLASH_ATTN_EXT \
  -b CLATTN -p "^(?=.*$cases)(?!.*$half)" &
wait
report test-backend-ops-1
report test-backend-ops-2
cat "$work"/test-backend-ops-[12].out >"$work/test-backend-ops.out"
grep -E 'tests passed' "$work/test-backend-ops.out"
echo "ggml: test-backend-ops: $(grep -c 'not supported' "$work/test-backend-ops.out") cases not supported"
grep 'not supported' "$work/test-backend-ops.out" | grep -o 'type_K=[a-z0-9_]*,type_V=[a-z0-9_]*' | sort | uniq -c
if "$build_dir/ggml/ggml-fa-supported-check" >"$work/fa-supported.out" 2>&1; then
  echo "ggml: ggml-fa-supported-check: every node taken or left as expected"
else
  cat "$work/fa-supported.out"
  echo "ggml: ggml-fa-supported-check: FAILED"
  status=1
fi

archs=()
[ $quick -eq 1 ] && archs=(-a '^(llama|qwen2|gemma2)$')
run test-llama-archs "${preloaded[@]}" "$bin/test-llama-archs" -b CLATTN -s 1 "${archs[@]}"
grep -E 'Summary' "$work/test-llama-archs.out" "$work/test-llama-archs.log"

# The same greedy text on the CPU backend alone and with CLATTN.
mkdir -p "$work/models"
"$bin/test-llama-archs" -a '^llama$' -s 7 -o "$work/models" >"$work/models.log" 2>&1 ||
  fail "test-llama-archs could not write a model: $work/models.log"
prompt="Once upon a time"
env -u CLATTN_GGML_REPORT "$bin/llama-simple" -m "$work/models/llama-dense.gguf" -n 48 "$prompt" \
  >"$work/simple-cpu.txt" 2>"$work/simple-cpu.log" || fail "llama-simple on the CPU backend: $work/simple-cpu.log"
run llama-simple "${preloaded[@]}" "$bin/llama-simple" -m "$work/models/llama-dense.gguf" -n 48 "$prompt"
if cmp -s "$work/simple-cpu.txt" "$work/llama-simple.out"; then
  echo "ggml: llama-simple: the same 48 tokens on CLATTN as on the CPU backend: $(head -c 80 "$work/simple-cpu.txt")"
else
  echo "ggml: llama-simple: the text differs from the CPU backend's:"
  diff "$work/simple-cpu.txt" "$work/llama-simple.out" | head -6
  status=1
fi
# ---- 4. the second OpenCL runtime ----
if [ -f "$root/build-intel-rt/lib/libintelocl.so" ]; then
  if [ "${CLATTN_GGML_INTEL:-}" = all ]; then
    run test-backend-ops-intel tools/scripts/intel-runtime.sh env GGML_BACKEND_PATH="$backend" "$bin/test-backend-ops" \
      test -o FLASH_ATTN_EXT -b CLATTN -j "$(nproc)" -p 'hsk=(64,hsv=64|576,hsv=512),'
    grep -E 'tests passed|Device description' "$work/test-backend-ops-intel.out"
  fi
  tools/scripts/ggml-opencl.sh || status=1
else
  echo "ggml: Intel's OpenCL runtime is not installed (build-intel-rt/): the ggml-opencl lane did not run"
fi
exit $status
