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
# All ranks share one kernel cache (the suite's, when set), so only the
# first build of each program is slow on POCL.
export CLATTN_CACHE_DIR=${CLATTN_CACHE_DIR:-${TMPDIR:-/tmp}/clattn-mpi-cache}
mkdir -p "$CLATTN_CACHE_DIR"
# Open MPI refuses root without --allow-run-as-root (CI containers run as
# root); --oversubscribe lets 4 ranks share 2 cores; single-copy through CMA
# is off because containers usually forbid ptrace between processes.
args=(--oversubscribe --bind-to none --mca btl_vader_single_copy_mechanism none -np "$ranks")
[ "$(id -u)" -eq 0 ] && args=(--allow-run-as-root "${args[@]}")
timeout --kill-after=10 "${CLATTN_MPI_TIMEOUT:-240}" mpirun "${args[@]}" "$program" "$@"
rc=$?
[ $rc -eq 124 ] && echo "FAIL: timed out after ${CLATTN_MPI_TIMEOUT:-240} s (a rank hung in a collective?)"
exit $rc
