#!/usr/bin/env bash
# Runs an MPI program of the suite: tests/mpi_run.sh RANKS PROGRAM [ARGS...]
# Exit 77 (skipped) when the build has no MPI layer or mpirun is absent.
# Every run has a deadline, so a collective that never completes fails the
# test instead of hanging the suite.
set -uo pipefail
ranks=$1
program=${2:-}
shift 2 || shift $#
if [ -z "$program" ] || [ ! -x "$program" ]; then
  echo "skipped: this build has no MPI layer (meson found no MPI)"
  exit 77
fi
if ! command -v mpirun >/dev/null; then
  echo "skipped: mpirun is not installed"
  exit 77
fi
# All ranks share the kernel caches (POCL's, and clattn's where one is
# named), so only the first build of each program is slow on POCL.
# Under tools/scripts/sanitize.sh: Open MPI's own allocations kept until exit are not
# ours; add tests/lsan-mpi.supp to the run's suppressions.
if [[ "${LSAN_OPTIONS:-}" =~ (^|:)suppressions=([^:]*) ]]; then
  whole=${BASH_REMATCH[0]} lead=${BASH_REMATCH[1]} supp=${BASH_REMATCH[2]}
  both=$(mktemp "${TMPDIR:-/tmp}/clattn-lsan-XXXXXX")
  trap 'rm -f "$both"' EXIT
  cat "$supp" "$(dirname "$0")/lsan-mpi.supp" > "$both" 2>/dev/null
  export LSAN_OPTIONS=${LSAN_OPTIONS/"$whole"/"${lead}suppressions=$both"}
  # Open MPI unloads its plugins at MPI_Finalize, so a leak's first frames
  # name no module; the slow unwinder reaches the libraries that loaded them.
  export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}fast_unwind_on_malloc=0
  # Those unloaded plugins leave stale dynamic-TLS entries behind (one read
  # "DTLS 8 at 0x8f18-0x80000a01a"), and LeakSanitizer's tracer, scanning
  # thread-local storage for roots, crashes on them at exit ("Tracer caught
  # signal 11"): the ranks' leak check takes no TLS roots. That can only add
  # reports (a block held from TLS alone would show as a leak), never hide one.
  export LSAN_OPTIONS=$LSAN_OPTIONS:use_tls=0
fi
# Open MPI refuses root without --allow-run-as-root (CI containers run as
# root); --oversubscribe lets 4 ranks share 2 cores; single-copy through CMA
# is off because containers usually forbid ptrace between processes; a rank
# waiting in MPI yields its core, which a CPU device's threads (POCL) need
# (Open MPI only does so by itself when it sees more ranks than cores).
args=(--oversubscribe --bind-to none --mca btl_vader_single_copy_mechanism none --mca mpi_yield_when_idle 1
      -np "$ranks")
[ "$(id -u)" -eq 0 ] && args=(--allow-run-as-root "${args[@]}")
# -x passes the sanitizer settings to every rank (mpirun forwards only some).
for v in ASAN_OPTIONS UBSAN_OPTIONS LSAN_OPTIONS TSAN_OPTIONS CLATTN_DEVICE CLATTN_CACHE_DIR POCL_CACHE_DIR \
         POCL_WORK_GROUP_METHOD; do
  [ -n "${!v+set}" ] && args+=(-x "$v")
done
timeout --kill-after=10 "${CLATTN_MPI_TIMEOUT:-240}" mpirun "${args[@]}" "$program" "$@"
rc=$?
[ $rc -eq 124 ] && echo "FAIL: timed out after ${CLATTN_MPI_TIMEOUT:-240} s (a rank hung in a collective?)"
exit $rc
