#!/usr/bin/env bash
# Instruction counts of the fused GPU kernels under Oclgrind (--inst-counts)
# for one small prefill shape: flash_block (cl/flash_block.cl) against the
# older flash_tiled (CLATTN_FLASH_BLOCK=0), both forced on with
# CLATTN_FLASH_WG=64, with a 64 KiB local memory as on AMD and NVIDIA GPUs
# (flash_block then takes its 4 x 4 tile at d=64). Prints per kernel the
# FMAs (fma calls, 4 per float4 fma, fmuladd), the fmul and fadd left, the
# local and global load operations (a vloadN or vload_halfN is one) and
# bytes, and the FMAs per load. The issue's target: at most one local load
# per 4 FMAs in the QK^T and PV loops (the figures here are whole kernels,
# softmax and tile loads included).
#
#   tools/scripts/oclgrind-counts.sh [BUILD_DIR] [clattn run options...]
#
# default shape: B1 H1 M=N=64 d=64, f32; e.g. add --dtype f16 (with
# CLATTN_BLOCK_HALF=1 in the environment: half K/V tiles).
set -uo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
shift || true
command -v oclgrind >/dev/null || { echo "oclgrind-counts: oclgrind not found: skipped"; exit 77; }
[ -x "$build/tools/clattn" ] || { echo "oclgrind-counts: $build/tools/clattn not built"; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export CLATTN_CACHE_DIR="$work/cache" # the simulator is its own device
shape=(--algo fused --heads 1 --kv-heads 1 --q-len 64 --kv-len 64 --head-dim 64 --value-dim 64 --reps 0 "$@")

# count KERNEL FILE: one line of figures from Oclgrind's histogram.
count() {
  awk -v k="$1" '
    /^Instructions executed for kernel/ { on = index($0, "'"'"'" k "'"'"'") > 0; next }
    !on || !/ - / { next }
    {
      n = $1; what = $0; sub(/^ *[0-9]+ - /, "", what)
      bytes = match(what, /\([0-9]+ bytes\)/) ? substr(what, RSTART + 1, RLENGTH - 8) + 0 : 0
      if (what ~ /^load local/)  { ll += n; lb += bytes }
      if (what ~ /^load global/) { gl += n; gb += bytes }
      if (what == "fmul") fm += n
      if (what == "fadd") fa += n
      if (what ~ /^call _Z[0-9]+fma/ || what ~ /^call llvm\.(fmuladd|fma)\./) {
        w = 1
        if (match(what, /Dv[0-9]+_/)) w = substr(what, RSTART + 2, RLENGTH - 3)
        else if (match(what, /\.v[0-9]+f32/)) w = substr(what, RSTART + 2, RLENGTH - 5)
        fma += n * w
      }
      if (what ~ /^call _Z[0-9]+vload(_half)?[0-9]*m/) {
        w = 1; if (match(what, /vload(_half)?[0-9]+m/)) { s = substr(what, RSTART, RLENGTH); gsub(/[^0-9]/, "", s); w = s + 0 }
        size = what ~ /vload_half/ ? 2 : 4
        if (what ~ /AS3/) { ll += n; lb += n * w * size }
        else if (what ~ /AS1/) { gl += n; gb += n * w * size }
      }
    }
    END {
      printf "%-12s %9d %7d %7d %9d %9d %9d %9d %8.2f %8.2f\n", k, fma, fm, fa, ll, lb, gl, gb,
             ll ? fma / ll : 0, gl ? fma / gl : 0
    }' "$2"
}

printf '%-12s %9s %7s %7s %9s %9s %9s %9s %8s %8s\n' kernel FMAs fmul fadd "local ld" "local B" "glob ld" "glob B" \
  "FMA/lld" "FMA/gld"
failed=0
for run in "flash_block|CLATTN_FLASH_WG=64" "flash_tiled|CLATTN_FLASH_WG=64 CLATTN_FLASH_BLOCK=0"; do
  IFS='|' read -r kernel env <<<"$run"
  out="$work/$kernel.txt"
  # shellcheck disable=SC2086
  if ! env $env oclgrind --inst-counts --local-mem-size 65536 "$build/tools/clattn" run "${shape[@]}" >"$out" 2>&1 ||
      ! grep -q "Instructions executed for kernel '$kernel'" "$out"; then
    echo "oclgrind-counts: $kernel did not run:"
    tail -20 "$out"
    failed=1
    continue
  fi
  count "$kernel" "$out"
done
echo "shape: ${shape[*]}"
exit $failed
