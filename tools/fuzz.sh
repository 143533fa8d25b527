#!/usr/bin/env bash
# Fuzzes clattn_forward (or, with FUZZ_TARGET=npy, the .npy reader of
# `clattn run`: tests/fuzz/fuzz_npy.c, seeds in tests/fuzz/npy/) with
# libFuzzer for a bounded time.
#
#   tools/fuzz.sh [SECONDS] [libFuzzer flags...]     default: 60 seconds
#   FUZZ_TARGET=npy tools/fuzz.sh [SECONDS] ...
#
# Installs what is missing (clang, libclang-rt-14-dev and tools/setup.sh's
# packages; apt-get as root, else through sudo), configures build-fuzz with
# CC=clang, AddressSanitizer + UndefinedBehaviorSanitizer and libFuzzer's
# coverage instrumentation on the whole build, then runs
# build-fuzz/tests/fuzz_forward on a working corpus seeded from
# tests/fuzz/corpus (the committed seeds stay as they are). A failing input
# is written to build-fuzz/fuzz-artifacts/; copy it to tests/fuzz/regressions/
# under a name saying what it found, and the opencl suite replays it
# (test_fuzz_regressions). Exit status: 0 when the run ended without a
# failure, non-zero on a crash, a check's violation, a timeout or a leak.
#
# Environment: CLATTN_FUZZ_KNOWN=alias,nan-row-weights,ref-inf-row-diag tolerates known
# library bugs (tests/fuzz/fuzz_case.c names them), to explore past them.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-60}
shift || true
case "$seconds" in ''|*[!0-9]*) echo "usage: tools/fuzz.sh [SECONDS] [libFuzzer flags...]" >&2; exit 2;; esac
target=${FUZZ_TARGET:-forward}
case "$target" in
  forward) seeds=tests/fuzz/corpus regressions=tests/fuzz/regressions corpus_name=fuzz-corpus ;;
  npy) seeds=tests/fuzz/npy/corpus regressions=tests/fuzz/npy/regressions corpus_name=fuzz-npy-corpus ;;
  *) echo "fuzz: FUZZ_TARGET=$target: expected forward or npy" >&2; exit 2 ;;
esac

tools/packages.sh clang libclang-rt-14-dev

build=build-fuzz
opts=(-Db_sanitize=address,undefined -Db_lundef=false -Dbuildtype=debugoptimized
      "-Dc_args=-fsanitize=fuzzer-no-link -fno-sanitize-recover=undefined -fno-omit-frame-pointer")
if [ -f "$build/build.ninja" ]; then
  meson configure "$build" "${opts[@]}" >/dev/null
else
  CC=clang meson setup "$build" "${opts[@]}" >/dev/null
fi
fuzzer=$build/tests/fuzz_$target
ninja -C "$build" "tests/fuzz_$target" >/dev/null
if [ ! -x "$fuzzer" ]; then
  echo "fuzz: $fuzzer was not built (the compiler must be clang with -fsanitize=fuzzer)" >&2
  exit 1
fi

corpus=$build/$corpus_name
artifacts=$build/fuzz-artifacts
mkdir -p "$corpus" "$artifacts"
cp -n "$seeds"/* "$corpus"/ 2>/dev/null || true

# fast_unwind_on_malloc=0: full allocation stacks through POCL and LLVM (built
# without frame pointers), so the suppressions in tests/lsan.supp match.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:fast_unwind_on_malloc=0:malloc_context_size=30:abort_on_error=1:allocator_may_return_null=1:detect_odr_violation=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/tests/lsan.supp:print_suppressions=0}
# POCL's kernel builds happen once per process (program binaries are cached
# on disk by clattn and POCL); the context is created before the first input.
# libFuzzer counts -max_total_time from the process start, so the first
# kernel builds (seconds per program, once per machine thanks to the disk
# caches) go in a run of their own before the timed one.
warm=$(mktemp -d)
trap 'rm -rf "$warm"' EXIT
if [ "$target" = forward ]; then   # the .npy reader builds no kernels
  echo "fuzz: building the kernels the harness uses (slow only the first time)" >&2
  # Without leak checking: full allocation stacks make every allocation of
  # POCL's compiler unwind its stack, and the builds ten times slower.
  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:allocator_may_return_null=1:detect_odr_violation=0 \
    "$build/tests/fuzz_forward" -runs=0 "$warm" >"$build/fuzz-warm-up.log" 2>&1 || {
    echo "fuzz: the warm-up failed:" >&2
    grep -v "^    #" "$build/fuzz-warm-up.log" | tail -30 >&2
    exit 1
  }
fi
echo "fuzz: running $fuzzer for ${seconds}s (corpus $corpus, failures to $artifacts/)" >&2
status=0
"$fuzzer" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 -max_len=4096 \
  -print_final_stats=1 -artifact_prefix="$artifacts/" "$@" "$corpus" "$regressions" || status=$?
echo "fuzz: corpus now $(ls "$corpus" | wc -l) inputs; exit status $status" >&2
exit $status
