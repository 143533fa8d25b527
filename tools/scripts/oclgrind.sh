#!/usr/bin/env bash
# Runs every kernel path at small shapes under Oclgrind (a simulator that
# checks each memory access, barrier and work-group): fails on any
# out-of-bounds access, data race, barrier divergence or API error it logs,
# and on any result that does not match the fp64 reference.
#
#   tools/scripts/oclgrind.sh [BUILD_DIR]        default: build (set up by tools/scripts/setup.sh)
#
# Shapes are not tile multiples (1, 7, 37, 53...). Oclgrind's uninitialised-
# value plugin is not used: Debian's oclgrind 21.10 stops on the LLVM
# `freeze` instruction its own front end emits.
set -uo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}

tools/scripts/packages.sh oclgrind
[ -x "$build/tools/clattn" ] || tools/scripts/setup.sh "$build"

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
# The simulator is its own device: keep clattn's binary cache apart from POCL's.
export CLATTN_CACHE_DIR="$logs/cache"
common=(--reps 0 --poison --lse)
cases=(
  "staged|--algo staged --heads 4 --kv-heads 2 --q-len 7 --kv-len 37 --head-dim 24 --value-dim 20 --causal --weights --diag --mask random --bias --kv-lens"
  "staged-bshd|--algo staged --batch 2 --heads 3 --kv-heads 1 --q-len 53 --kv-len 9 --head-dim 5 --value-dim 3 --layout bshd --window 4,2 --weights"
  "gemm|--algo gemm --heads 4 --kv-heads 2 --q-len 7 --kv-len 37 --head-dim 24 --value-dim 20 --causal --weights --diag --kv-lens --bias"
  "fused-rows|--algo fused --heads 4 --kv-heads 2 --q-len 37 --kv-len 53 --head-dim 24 --value-dim 20 --causal --diag --mask random --bias --kv-lens"
  "fused-bshd|--algo fused --batch 2 --heads 3 --kv-heads 3 --q-len 1 --kv-len 7 --head-dim 1 --value-dim 1 --layout bshd --empty error"
  "fused-decode-split|--algo fused --heads 8 --kv-heads 2 --q-len 1 --kv-len 600 --head-dim 32 --value-dim 16 --kv-lens"
  "fused-decode-diag|--algo fused --heads 4 --kv-heads 4 --q-len 2 --kv-len 300 --head-dim 16 --value-dim 16 --diag --window 100,-1"
  "fused-tiled|--algo fused --heads 2 --kv-heads 1 --q-len 37 --kv-len 53 --head-dim 24 --value-dim 20 --causal --diag --mask random --bias|CLATTN_FLASH_WG=16"
  "fused-block|--algo fused --heads 4 --kv-heads 2 --q-len 37 --kv-len 53 --head-dim 24 --value-dim 20 --causal --mask random --bias --kv-lens --softcap 4 --alibi --sinks|CLATTN_FLASH_WG=64"
  "fused-block-half|--algo fused --dtype f16 --heads 2 --kv-heads 1 --q-len 37 --kv-len 53 --head-dim 40 --value-dim 24 --causal --window 9,3 --tol 2e-3|CLATTN_FLASH_WG=64 CLATTN_BLOCK_HALF=1"
  "fused-tiled-decode-split|--algo fused --heads 8 --kv-heads 2 --q-len 1 --kv-len 600 --head-dim 32 --value-dim 16 --kv-lens|CLATTN_FLASH_WG=16"
  "staged-chunks|--algo staged --heads 3 --kv-heads 1 --q-len 53 --kv-len 37 --head-dim 8 --value-dim 8 --weights --diag|CLATTN_SCRATCH_BYTES=2048"
  "gemm-chunks|--algo gemm --heads 3 --kv-heads 1 --q-len 53 --kv-len 37 --head-dim 8 --value-dim 8 --layout bshd|CLATTN_SCRATCH_BYTES=2048"
  "varlen-staged|--algo staged --varlen --batch 3 --heads 2 --kv-heads 1 --q-len 9 --kv-len 13 --head-dim 8 --value-dim 8 --causal --weights --diag"
  "varlen-fused|--algo fused --varlen --batch 3 --heads 2 --kv-heads 1 --q-len 9 --kv-len 13 --head-dim 16 --value-dim 16 --causal --diag"
  "varlen-gemm|--algo gemm --varlen --batch 3 --heads 2 --kv-heads 1 --q-len 9 --kv-len 13 --head-dim 8 --value-dim 8 --layout bshd"
  "f16-fused|--algo fused --dtype f16 --heads 2 --kv-heads 1 --q-len 7 --kv-len 37 --head-dim 16 --value-dim 16 --tol 2e-3"
  "bf16-staged|--algo staged --dtype bf16 --heads 2 --kv-heads 1 --q-len 7 --kv-len 37 --head-dim 24 --value-dim 20 --tol 1e-2"
  "shaping|--heads 2 --kv-heads 1 --q-len 7 --kv-len 37 --head-dim 16 --value-dim 16 --softcap 4 --alibi --sinks --additive --algo fused"
  "auto|--heads 2 --kv-heads 1 --q-len 7 --kv-len 37 --head-dim 24 --value-dim 20 --mask block --empty zero"
  "modifiers-block|--algo fused --heads 2 --kv-heads 1 --q-len 37 --kv-len 53 --head-dim 16 --value-dim 16 --mask-mod examples/modifiers/prefix_lm.cl --ints 9 --score-mod examples/modifiers/tanh_softcap.cl --floats 4 --block-mask|CLATTN_FLASH_WG=64"
)
ran=0 failed=0
# under_oclgrind LABEL FILE ENV COMMAND...: runs COMMAND under Oclgrind with
# the variables in ENV ("" for none); ok when it exits 0 and Oclgrind logged
# nothing, else FAILED with the tail of its output and of Oclgrind's log.
under_oclgrind() {
  local label=$1 file=$logs/$2 env=$3
  shift 3
  ran=$((ran + 1))
  # shellcheck disable=SC2086
  if env $env oclgrind --data-races --check-api --max-errors 20 --log "$file.log" "$@" >"$file.out" 2>&1 &&
      [ ! -s "$file.log" ]; then
    echo "oclgrind: $label: ok"
  else
    echo "oclgrind: $label: FAILED"
    cat "$file.out" "$file.log" | tail -30
    failed=$((failed + 1))
  fi
}
for c in "${cases[@]}"; do
  IFS='|' read -r name args env <<<"$c"
  # shellcheck disable=SC2086
  under_oclgrind "$name" "$name" "$env" "$build/tools/clattn" run ${args} "${common[@]}"
done
# The decode kernels' _step entries run where a call wants no lse.
under_oclgrind "fused-decode-step" "fused-decode-step" "" "$build/tools/clattn" run --algo fused --heads 8 --kv-heads 2 \
  --q-len 1 --kv-len 37 --head-dim 32 --value-dim 16 --reps 0 --poison
# The backward pass: the tests of tests/test_backward.c small enough for the
# simulator (Oclgrind reports a GPU, so this is the GPU-style launch).
backward_tests=(packed_sequences causal_window_kv_lens_mask_bias_poisoned empty_rows_give_zero
                nan_in_allowed_key_stays_in_its_rows softcap_alibi_sinks f16_and_bf16_storage additive_scores
                validation_rejects_before_enqueue)
# Each on the FA2 path, the staged one and with atomic dQ. The staged one's
# weights get half the scratch, 19 rows of 53 keys, so most tests' 37 rows
# per head take two chunks (19 + 18, neither a multiple of its 8-row
# tiles). At 4096 bytes (five chunks of 9 rows, each padded to 16) its
# eight tests took 487 s of the stage's 10 minutes; at 8192, 272 s.
backward_paths=("" "CLATTN_TEST_BACKWARD=staged CLATTN_SCRATCH_BYTES=8192" "CLATTN_TEST_BACKWARD=atomics")
for path in "${backward_paths[@]}"; do
  for t in "${backward_tests[@]}"; do
    under_oclgrind "backward $t ${path:-FA2}" "backward-$t" "$path" "$build/tests/test_backward" "$t"
  done
done
# Paged and quantised K/V (tests/test_kvcache.c's groups, each on the fused,
# staged and GEMM paths): block tables with entries outside the pool,
# hostile positions and lengths, clattn_kv_append into every cache storage.
kv_groups=(append_matches append_skips forward_rejects paged_prefill every_feature 16bit contiguous hostile_tables)
[ -x "$build/tests/test_kvcache" ] || ninja -C "$build" tests/test_kvcache >/dev/null
for g in "${kv_groups[@]}"; do
  under_oclgrind "kvcache $g" "kvcache-$g" "" "$build/tests/test_kvcache" "$g"
done
# A GEMM call from a program linked to libclattn alone (the tool and the
# tests link CLBlast themselves, which changes the order libraries are torn
# down at exit): clattn_destroy must release CLBlast's cached programs while
# Oclgrind's runtime is still there, or the process aborts at exit.
[ -x "$build/tests/gemm_at_exit" ] && under_oclgrind "gemm at exit" gemm-at-exit "" "$build/tests/gemm_at_exit"
echo "oclgrind: $ran cases, $failed failed"
[ "$failed" -eq 0 ]
