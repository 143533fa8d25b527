#!/usr/bin/env bash
# Sets clattn up with warnings as errors (tools/scripts/setup.sh) and runs
# checks, each stage on its own, then one summary:
#
#   tools/scripts/test.sh           the README's test command, on two OpenCL runtimes:
#     suite (loopvec)   meson test, whole suite, POCL_WORK_GROUP_METHOD=loopvec
#                       (GPU code generation and the 'mpi' suite included)
#     python            the Python binding's pytest suite (tools/scripts/python.sh)
#     suite (intel)     on Intel's OpenCL CPU runtime (installed by
#                       tools/scripts/intel-runtime.sh into build-intel-rt/):
#                       suites 'quick' (each path's defaults) and 'intel' (what
#                       POCL cannot run: sub-groups, half arithmetic, mutable
#                       command buffers; flash_block; the plans), or the whole
#                       opencl suite with CLATTN_TEST_INTEL=all
#     python (intel)    the Python tests on it
#   tools/scripts/test.sh --quick   meson suites 'unit' and 'quick' (each path's
#                       defaults), then python (the default device only)
#   tools/scripts/test.sh --deep    the deep checks, which .ci/run adds:
#     suite (cbs)       suites 'quick' and 'gpu-kernels' again with
#                       POCL_WORK_GROUP_METHOD=cbs: each path's defaults and the
#                       kernels with barriers and local memory (flash_block, flash_tiled)
#     oclgrind          every kernel path at small shapes under Oclgrind
#     sanitizers        the suite under ASan+UBSan, the threads test under TSan
#     fuzz              libFuzzer on clattn_forward for 30 s
#     fuzz (npy)        libFuzzer on `clattn run`'s .npy reader for 15 s
#     ggml              llama.cpp's own tests over the ggml backend, and over llama.cpp's
#                       OpenCL backend with clattn on Intel's CPU runtime (tools/scripts/ggml.sh:
#                       the pinned llama.cpp fetched with pip, patched and built once into build-ggml/)
#
# The first two stages run on the default device (CLATTN_DEVICE's match, else
# the first GPU, else POCL's CPU device); CLATTN_TEST_LANES chooses the lanes
# of the test command: "default intel" (the default), "default" or "intel".
# Intel's lane is skipped (77, saying why) where pip cannot install the runtime.
#
# Times on 2 cores with cold kernel caches: docs/development.md.
# Exit status: 0 when every stage passed or was skipped (exit 77, named in
# the summary with its reason above it).
set -uo pipefail
cd "$(dirname "$0")/../.."
mode=${1:-main}
case "$mode" in
  main|--quick|--deep) ;;
  -h|--help) sed -n '2,37p' "$0"; exit 0 ;;
  *) echo "usage: tools/scripts/test.sh [--quick | --deep]" >&2; exit 2 ;;
esac

# clang-15, libclc and lld for the GPU code-generation test (tools/scripts/gpu-codegen.sh);
# Open MPI for the MPI layer and its tests (suite 'mpi', mpirun at 2 and 4 ranks)
if [ "$mode" = main ]; then
  tools/scripts/packages.sh clang-15 libclc-15 lld-15 libopenmpi-dev openmpi-bin || exit 1
fi
tools/scripts/setup.sh build-test -Dwerror=true || exit 1

# POCL keys its kernel cache by the work-group method as well (a run with
# the method unset builds every kernel anew over a cache that loopvec
# filled): every stage on POCL names loopvec, as the suite does, but for
# the cbs stage (a cache of its own) and Intel's lane (no POCL), so the
# Python, sanitizer, fuzzing and ggml stages reuse the suite's kernels.
export POCL_WORK_GROUP_METHOD=${POCL_WORK_GROUP_METHOD:-loopvec}

results=()
status=0
stage() {   # stage NAME COMMAND...: runs it, records the result
  local name=$1
  shift
  echo "==== $name"
  local t0=$SECONDS
  if "$@"; then
    results+=("$name: passed ($((SECONDS - t0)) s)")
  elif [ $? -eq 77 ]; then
    results+=("$name: SKIPPED, see its message above ($((SECONDS - t0)) s)")
  else
    results+=("$name: FAILED ($((SECONDS - t0)) s)")
    status=1
  fi
}

count() {   # count [LOGBASE]: the pass/fail line of build-test's last meson test run
  python3 - "build-test/meson-logs/${1:-testlog}.json" <<'PY'
import json, sys
counts = {"OK": 0, "EXPECTEDFAIL": 0, "FAIL": 0, "SKIP": 0}
for line in open(sys.argv[1]):
    r = json.loads(line)["result"]
    counts[r if r in counts else "FAIL"] += 1
print("tests: %d passed, %d failed, %d skipped (%d expected failures)"
      % (counts["OK"] + counts["EXPECTEDFAIL"], counts["FAIL"], counts["SKIP"], counts["EXPECTEDFAIL"]))
PY
}

# POCL 3.1 keys a cached work-group function by program and local size, not
# by work-group method, and a program binary carries those functions: a cbs
# run over loopvec's caches runs loopvec's compiled kernels. So cbs gets a
# POCL cache of its own, built anew by cbs (the build's cbs-cache, which
# tests/meson.build's decode-block-cbs uses too), and no clattn binaries.
cbs_cache=build-test/cbs-cache
suite() {   # suite METHOD [meson test args]
  local method=$1
  shift
  local caches=()
  [ "$method" = cbs ] && caches=(POCL_CACHE_DIR="$PWD/$cbs_cache/pocl" CLATTN_CACHE_DIR=)
  env "${caches[@]}" POCL_WORK_GROUP_METHOD=$method meson test -C build-test --print-errorlogs --num-processes 2 "$@"
  local rc=$?
  count
  return $rc
}

# Intel's OpenCL CPU runtime, selected for one command (tools/scripts/intel-runtime.sh:
# installed on first use; 77 where it cannot be). POCL's variables mean
# nothing there; a test that sets them for itself says it is skipped.
intel() {
  env -u POCL_WORK_GROUP_METHOD tools/scripts/intel-runtime.sh "$@"
}
intel_suite() {
  local which=(--suite quick --suite intel)
  [ "${CLATTN_TEST_INTEL:-}" = all ] && which=(--suite opencl)
  intel meson test -C build-test --print-errorlogs --num-processes 2 --logbase intel "${which[@]}"
  local rc=$?
  [ $rc -eq 77 ] || count intel
  return $rc
}

lanes=${CLATTN_TEST_LANES:-default intel}
lane() { [[ " ${lanes//,/ } " == *" $1 "* ]]; }
case "$mode" in
  main)
    if lane default; then
      stage "suite (loopvec)" suite loopvec
      stage "python" tools/scripts/python.sh build-test
    fi
    if lane intel; then
      stage "suite (intel)" intel_suite
      stage "python (intel)" intel tools/scripts/python.sh build-test
    fi ;;
  --quick)
    stage "suite (quick)" suite loopvec --suite unit --suite quick
    stage "python" tools/scripts/python.sh build-test ;;
  --deep)
    stage "suite (cbs)" suite cbs --suite quick --suite gpu-kernels
    stage "oclgrind" tools/scripts/oclgrind.sh build-test
    stage "sanitizers" tools/scripts/sanitize.sh all
    stage "fuzz" tools/scripts/fuzz.sh 30
    stage "fuzz (npy)" tools/scripts/fuzz.sh npy 15
    stage "ggml" tools/scripts/ggml.sh ;;
esac

echo "==== summary"
printf '%s\n' "${results[@]}"
exit $status
