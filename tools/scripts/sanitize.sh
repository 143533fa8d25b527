#!/usr/bin/env bash
# Builds clattn with sanitizers and runs the tests under them.
#
#   tools/scripts/sanitize.sh [asan|tsan|all]          default: all
#
#   asan  build-asan: AddressSanitizer + UndefinedBehaviorSanitizer (and
#         LeakSanitizer at exit); runs the test suite but for the repeats
#         (suites gpu-kernels and repeat: a GPU kernel, a vector or
#         sub-group width forced, the same host code as their default runs,
#         half the suite's time on POCL) and the GPU code generation (suite
#         codegen: clang, not clattn, at work) and the program cache's
#         test (suite loopvec-only: LeakSanitizer's tracer crashes at its
#         children's exit; the cache's entry parser is fuzzed under ASan
#         and its corpus replayed here, fuzz-parsers);
#         the random sweep takes its first 40 cases (SWEEP_CASES; its fixed
#         cases cover each feature).
#   tsan  build-tsan: ThreadSanitizer; runs the threads test (eight host
#         threads, 1000 clattn_forward calls on shared and own queues) and
#         the first-use test (eight threads in clattn_create and in their
#         first GEMM calls at once, each in a fresh process) twice: on the
#         warm program cache and on an empty one.
#
# POCL, the OpenCL ICD loader, LLVM and CLBlast are not instrumented: the
# suppression files (tests/lsan.supp, tests/tsan.supp) name only those
# libraries, never clattn's own code. Extra arguments after the mode go to
# `meson test` in place of the default selection (e.g. a test name).
# Environment: CC (default gcc), SANITIZE_JOBS (parallel tests, default 2),
# SANITIZE_TIMEOUT_MULTIPLIER (default 1: the suite's own timeouts).
#
# Installs what is missing with apt-get (as root, or through sudo). Exits
# non-zero when a build or a test fails or a sanitizer reports anything.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD

mode=${1:-all}
shift || true
case "$mode" in
  asan|tsan|all) ;;
  -h|--help) sed -n '2,32p' "$0"; exit 0 ;;
  *) echo "usage: tools/scripts/sanitize.sh [asan|tsan|all] [meson test args...]" >&2; exit 2 ;;
esac

export CC=${CC:-gcc}
jobs=${SANITIZE_JOBS:-2}
multiplier=${SANITIZE_TIMEOUT_MULTIPLIER:-1}

# ---- packages: what tools/scripts/setup.sh installs, plus the sanitizer runtimes ----
if [ "$CC" = clang ]; then tools/scripts/packages.sh clang; else tools/scripts/packages.sh; fi

# The runtimes (libasan, libubsan, libtsan) come with the compiler's dev
# package (libgcc-N-dev for gcc, libclang-rt-N-dev for clang): probe them.
probe_dir=$(mktemp -d)
trap 'rm -rf "$probe_dir"' EXIT
probe() {
  echo 'int main(void) { return 0; }' > "$probe_dir/p.c"
  "$CC" -fsanitize="$1" "$probe_dir/p.c" -o "$probe_dir/p" 2>/dev/null && "$probe_dir/p"
}
need=()
[ "$mode" = tsan ] || need+=(address,undefined)
[ "$mode" = asan ] || need+=(thread)
for s in "${need[@]}"; do
  if ! probe "$s"; then
    if [ "$CC" = clang ]; then
      tools/scripts/packages.sh "libclang-rt-$(clang -dumpversion | cut -d. -f1)-dev"
    else
      tools/scripts/packages.sh "libgcc-$(gcc -dumpversion | cut -d. -f1)-dev"
    fi
    probe "$s" || { echo "sanitize: $CC cannot build with -fsanitize=$s" >&2; exit 1; }
  fi
done

# ---- build ----
configure() {   # build_dir, sanitizers[, targets: only those built]
  local dir=$1 san=$2
  shift 2
  local opts=(-Db_sanitize="$san" -Db_lundef=false --buildtype=debugoptimized
              -Dc_args=-fno-omit-frame-pointer)
  if [ -f "$dir/build.ninja" ]; then
    meson configure "$dir" "${opts[@]}" >/dev/null || return 1
  else
    meson setup "$dir" "${opts[@]}" >/dev/null || return 1
  fi
  ninja -C "$dir" "$@" >/dev/null || { ninja -C "$dir" "$@"; return 1; }   # the errors, visible
}

# Counts a sanitizer's reports in a test log.
count_reports() {   # log, pattern
  local log=$1 pattern=$2
  [ -f "$log" ] || { echo 0; return; }
  grep -c -E "$pattern" "$log" || true
}

status=0
summary=()

# Tests of a meson JSON log: "passed failed skipped" (an expected failure,
# a should_fail test that failed, counts as passed) and, one per line after
# them, the failed tests whose only trouble was LeakSanitizer's own crash
# at exit ("LeakSanitizer has encountered a fatal error": its tracer stops
# the threads while POCL's workers exit) with no sanitizer report.
log_results() {   # testlog.json
  python3 - "$1" <<'PY'
import json, sys
ok = fail = skip = 0
flaky = []
for line in open(sys.argv[1]):
    r = json.loads(line)
    res = r["result"]
    if res in ("OK", "EXPECTEDFAIL"): ok += 1   # should_fail tests that failed as declared
    elif res == "SKIP": skip += 1
    else:
        fail += 1
        out = r.get("stdout", "") + r.get("stderr", "")
        if ("LeakSanitizer has encountered a fatal error" in out and "ERROR: AddressSanitizer" not in out
                and "runtime error:" not in out and "ERROR: LeakSanitizer: detected" not in out):
            flaky.append(r["name"].split(" / ")[-1])
print(ok, fail, skip)
for n in flaky: print(n)
PY
}

run_asan() {
  echo "== ASan + UBSan: build-asan, the test suite (but suites gpu-kernels, repeat, codegen and loopvec-only) ==" >&2
  configure build-asan address,undefined || { summary+=("asan: build FAILED"); status=1; return; }
  # meson keeps these when set (its own defaults otherwise); suppressions by absolute path.
  # use_sigaltstack=0: POCL's LLVM installs its own alternate signal stack
  # (malloc'd) in the threads that compile, and ASan would munmap it at
  # thread exit ("failed to deallocate ... unable to unmap", an abort).
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:print_summary=1:strict_string_checks=1:detect_stack_use_after_return=1:use_sigaltstack=0
  export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:print_summary=1
  export LSAN_OPTIONS=suppressions=$root/tests/lsan.supp:print_suppressions=1
  rm -f build-asan/meson-logs/asan.json build-asan/meson-logs/asan.txt
  local only=(--no-suite gpu-kernels --no-suite repeat --no-suite codegen --no-suite loopvec-only)
  [ $# -eq 0 ] || only=("$@")
  SWEEP_CASES=${SWEEP_CASES:-40} meson test -C build-asan --print-errorlogs --num-processes "$jobs" --logbase asan \
    --timeout-multiplier "$multiplier" "${only[@]}" || true
  local log=build-asan/meson-logs/asan.txt
  if [ ! -f build-asan/meson-logs/asan.json ]; then
    summary+=("asan+ubsan: meson test did not run"); status=1; return
  fi
  local asan ubsan lsan
  asan=$(count_reports "$log" 'ERROR: AddressSanitizer')
  ubsan=$(count_reports "$log" 'runtime error:')
  lsan=$(count_reports "$log" 'ERROR: LeakSanitizer: detected')
  local results ok fail skip retried=()
  mapfile -t results < <(log_results build-asan/meson-logs/asan.json)
  read -r ok fail skip <<< "${results[0]}"
  # A test that failed only through LeakSanitizer's own crash runs once more.
  local name
  for name in "${results[@]:1}"; do
    echo "sanitize: $name: LeakSanitizer itself crashed at exit (no report); running it once more" >&2
    if meson test -C build-asan --no-rebuild --print-errorlogs --logbase "asan-retry-$name" \
        --timeout-multiplier "$multiplier" "$name"; then
      ok=$((ok + 1)); fail=$((fail - 1)); retried+=("$name")
    fi
  done
  local note=""
  [ ${#retried[@]} -eq 0 ] || note=" (passed on a second run after LeakSanitizer crashed at exit: ${retried[*]})"
  summary+=("asan+ubsan: tests $ok passed, $fail failed, $skip skipped$note; reports: AddressSanitizer $asan, UBSan $ubsan, LeakSanitizer $lsan")
  [ "$fail" -eq 0 ] && [ "$asan" -eq 0 ] && [ "$ubsan" -eq 0 ] && [ "$lsan" -eq 0 ] || status=1
  unset ASAN_OPTIONS UBSAN_OPTIONS LSAN_OPTIONS
}

run_tsan() {
  echo "== TSan: build-tsan, the threads and first-use tests ==" >&2
  local tests=("$@") targets=()
  # by default only what the two tests run is built (the library and them)
  [ ${#tests[@]} -gt 0 ] || { tests=(threads first-use); targets=(tests/test_threads tests/test_first_use); }
  configure build-tsan thread "${targets[@]}" || { summary+=("tsan: build FAILED"); status=1; return; }
  local rebuild=()
  [ ${#targets[@]} -eq 0 ] || rebuild=(--no-rebuild)
  # Twice: on the warm program cache, then on an empty one of its own, so
  # six clattn contexts build (and store) their programs from source at
  # once, and the shared context's fused programs are first asked for by
  # four threads together.
  local cold
  cold=$(mktemp -d "${TMPDIR:-/tmp}/clattn-tsan-cache.XXXXXX")
  local run
  for run in warm cold; do
    local rc=0 cache_env=()
    [ "$run" = cold ] && cache_env=(CLATTN_CACHE_DIR="$cold")
    # No ignore_noninstrumented_modules: POCL's own memcpys of our buffers
    # are checked too (and were clean); tsan.supp names POCL only.
    env "${cache_env[@]}" \
      TSAN_OPTIONS="suppressions=$root/tests/tsan.supp:report_signal_unsafe=0:halt_on_error=0:exitcode=66:second_deadlock_stack=1" \
      meson test -C build-tsan "${rebuild[@]}" --print-errorlogs --num-processes 1 --logbase "tsan-$run" \
        --timeout-multiplier "$multiplier" "${tests[@]}" || rc=$?
    local log=build-tsan/meson-logs/tsan-$run.txt
    local races line
    races=$(count_reports "$log" 'WARNING: ThreadSanitizer')
    line=$(grep -E '^ +[0-9]+ concurrent calls' "$log" | tail -1 | sed 's/^ *//' || true)
    summary+=("tsan ($run program cache): rc=$rc; ThreadSanitizer reports: $races${line:+; $line}")
    [ "$rc" -eq 0 ] && [ "$races" -eq 0 ] || status=1
  done
  rm -rf "$cold"
}

case "$mode" in
  asan) run_asan "$@" ;;
  tsan) run_tsan "$@" ;;
  all) run_asan "$@"; run_tsan "$@" ;;
esac

echo
for s in "${summary[@]}"; do echo "sanitize: $s"; done
[ "$status" -eq 0 ] && echo "sanitize: clean" || echo "sanitize: FAILED"
exit $status
