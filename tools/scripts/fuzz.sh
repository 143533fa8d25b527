#!/usr/bin/env bash
# Fuzzes clattn with libFuzzer for a bounded time.
#
#   tools/scripts/fuzz.sh [TARGET] [SECONDS] [libFuzzer flags...]     default: forward, 60 seconds
#
# TARGET: forward (clattn_forward, tests/fuzz/fuzz_forward.c), append
# (clattn_kv_append, tests/fuzz/fuzz_append.c, seeds in tests/fuzz/corpus-append,
# checked byte for byte against the test kit's ggml quantisation), npy (the
# .npy reader of `clattn run`, tests/fuzz/fuzz_npy.c, seeds in
# tests/fuzz/npy/), cache-entry or tuning-file (the parsers of program cache
# entries and tuning files, tests/fuzz/fuzz_parsers.c). All but forward and
# append take bytes in, need no device, and must never crash or hang.
#
# Installs what is missing (clang, libclang-rt-14-dev and tools/scripts/setup.sh's
# packages; apt-get as root, else through sudo), configures build-fuzz with
# CC=clang, AddressSanitizer + UndefinedBehaviorSanitizer and libFuzzer's
# coverage instrumentation on the whole build, then runs
# build-fuzz/tests/fuzz_<target> on a working corpus seeded from
# tests/fuzz/corpus (forward) or tests/fuzz/corpus-<target> (the committed
# seeds stay as they are). A failing input is written to
# build-fuzz/fuzz-artifacts/; copy it to tests/fuzz/regressions/ (forward),
# tests/fuzz/corpus-append/ under a name saying what it found (append) or
# tests/fuzz/corpus-<target>/ under a name saying what it found (starting
# with "valid" when the parser must accept it), and test_fuzz_regressions
# replays it (the opencl suite for forward, the unit suite's fuzz-parsers
# for the parsers). Exit status: 0 when the run ended without a failure,
# non-zero on a crash, a check's violation, a timeout or a leak.
#
# Environment: CLATTN_FUZZ_KNOWN=alias,nan-row-weights,ref-inf-row-diag tolerates known
# library bugs (tests/fuzz/fuzz_case.c names them), to explore past them.
set -euo pipefail
cd "$(dirname "$0")/../.."

case "${1:-}" in -h|--help) sed -n '2,30p' "$0"; exit 0;; esac
target=forward
case "${1:-}" in forward|append|npy|cache-entry|tuning-file) target=$1; shift;; esac
seconds=${1:-60}
shift || true
case "$seconds" in ''|*[!0-9]*)
  echo "usage: tools/scripts/fuzz.sh [forward|append|npy|cache-entry|tuning-file] [SECONDS] [libFuzzer flags...]" >&2; exit 2;; esac
exe=fuzz_${target//-/_}

tools/scripts/packages.sh clang libclang-rt-14-dev

build=build-fuzz
opts=(-Db_sanitize=address,undefined -Db_lundef=false -Dbuildtype=debugoptimized
      "-Dc_args=-fsanitize=fuzzer-no-link -fno-sanitize-recover=undefined -fno-omit-frame-pointer")
if [ -f "$build/build.ninja" ]; then
  meson configure "$build" "${opts[@]}" >/dev/null
else
  CC=clang meson setup "$build" "${opts[@]}" >/dev/null
fi
ninja -C "$build" "tests/$exe" >/dev/null
if [ ! -x "$build/tests/$exe" ]; then
  echo "fuzz: $build/tests/$exe was not built (the compiler must be clang with -fsanitize=fuzzer)" >&2
  exit 1
fi

artifacts=$build/fuzz-artifacts
regressions=()
case "$target" in
  forward) corpus=$build/fuzz-corpus seeds=tests/fuzz/corpus ;;
  append) corpus=$build/fuzz-corpus-append seeds=tests/fuzz/corpus-append ;;
  npy) corpus=$build/fuzz-corpus-npy seeds=tests/fuzz/npy/corpus regressions=(tests/fuzz/npy/regressions) ;;
  *) corpus=$build/fuzz-corpus-$target seeds=tests/fuzz/corpus-$target ;;
esac
mkdir -p "$corpus" "$artifacts"
cp -n "$seeds"/* "$corpus"/ 2>/dev/null || true

# fast_unwind_on_malloc=0: full allocation stacks through POCL and LLVM (built
# without frame pointers), so the suppressions in tests/lsan.supp match.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:fast_unwind_on_malloc=0:malloc_context_size=30:abort_on_error=1:allocator_may_return_null=1:detect_odr_violation=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/tests/lsan.supp:print_suppressions=0}
# libFuzzer exits 77 on a crash or a leak by default: the status test.sh
# (and meson) read as "skipped". A finding must fail the run.
found=(-error_exitcode=1 -timeout_exitcode=1)
if [ "$target" = append ]; then
  # The append programs (one per source and cache storage) are built on first
  # use: fuzz_append's initialisation builds them all (fz_append_warm_up), in a
  # run of its own over the seeds before the timed one (whose clock starts with
  # the process).
  echo "fuzz: building the append kernels (slow only the first time)" >&2
  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:allocator_may_return_null=1:detect_odr_violation=0 \
    "$build/tests/$exe" "${found[@]}" -runs=0 -timeout=0 "$seeds" >"$build/fuzz-append-warm-up.log" 2>&1 || {
    echo "fuzz: the append warm-up failed:" >&2
    grep -v "^    #" "$build/fuzz-append-warm-up.log" | tail -30 >&2
    exit 1
  }
  echo "fuzz: running $build/tests/$exe for ${seconds}s (corpus $corpus, failures to $artifacts/)" >&2
  status=0
  "$build/tests/$exe" "${found[@]}" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 -max_len=1024 \
    -print_final_stats=1 -artifact_prefix="$artifacts/append-" "$@" "$corpus" || status=$?
  echo "fuzz: corpus now $(ls "$corpus" | wc -l) inputs; exit status $status" >&2
  exit $status
fi
if [ "$target" != forward ]; then
  # The parsers need no device and no warm-up; inputs up to 8 KiB reach
  # past the 1023-byte line limit and the 48-byte headers alike.
  echo "fuzz: running $build/tests/$exe for ${seconds}s (corpus $corpus, failures to $artifacts/)" >&2
  status=0
  "$build/tests/$exe" "${found[@]}" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=8192 \
    -print_final_stats=1 -artifact_prefix="$artifacts/$target-" "$@" "$corpus" "${regressions[@]}" || status=$?
  echo "fuzz: corpus now $(ls "$corpus" | wc -l) inputs; exit status $status" >&2
  exit $status
fi
# POCL's kernel builds happen once per process (program binaries are cached
# on disk by clattn and POCL); the context is created before the first input.
# libFuzzer counts -max_total_time from the process start, so the first
# kernel builds (seconds per program, once per machine thanks to the disk
# caches) go in a run of their own before the timed one.
warm=$(mktemp -d)
trap 'rm -rf "$warm"' EXIT
echo "fuzz: building the kernels the harness uses (slow only the first time)" >&2
# Without leak checking: full allocation stacks make every allocation of
# POCL's compiler unwind its stack, and the builds ten times slower. One
# process per core, each building its share of the programs (a process
# builds one program at a time; at most four) into the disk caches the
# timed run reads.
parts=$(nproc 2>/dev/null || echo 1)
[ "$parts" -gt 4 ] && parts=4
pids=()
for ((part = 0; part < parts; part++)); do
  CLATTN_FUZZ_WARM_PART=$part/$parts \
    ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:allocator_may_return_null=1:detect_odr_violation=0 \
    "$build/tests/fuzz_forward" "${found[@]}" -runs=0 "$warm" >"$build/fuzz-warm-up-$part.log" 2>&1 &
  pids+=($!)
done
for ((part = 0; part < parts; part++)); do
  wait "${pids[$part]}" && continue
  echo "fuzz: the warm-up failed:" >&2
  grep -v "^    #" "$build/fuzz-warm-up-$part.log" | tail -30 >&2
  exit 1
done
echo "fuzz: running $build/tests/fuzz_forward for ${seconds}s (corpus $corpus, failures to $artifacts/)" >&2
status=0
# -timeout=30: an input that reaches a kernel entry the warm-up did not
# launch waits for POCL to compile its work-group function, under this
# run's full allocation stacks: 10 to 15 s on 2 cores for the decode
# kernels (2.3 s once cached); a hang still shows.
"$build/tests/fuzz_forward" "${found[@]}" -max_total_time="$seconds" -timeout=30 -rss_limit_mb=4096 -max_len=4096 \
  -print_final_stats=1 -artifact_prefix="$artifacts/" "$@" "$corpus" tests/fuzz/regressions || status=$?
echo "fuzz: corpus now $(ls "$corpus" | wc -l) inputs; exit status $status" >&2
exit $status
