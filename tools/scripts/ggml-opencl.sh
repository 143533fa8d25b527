#!/usr/bin/env bash
# The ggml-opencl lane: llama.cpp's own OpenCL backend (ggml-opencl, as
# tools/scripts/ggml.sh builds it: ggml/opencl/ggml-opencl.patch, its
# FLASH_ATTN_EXT through clattn) on Intel's OpenCL CPU runtime, which needs
# no GPU. The runtime's CPU device is taken as an Intel GPU by the patch's
# test-only switch, GGML_OPENCL_TEST_CPU_AS_INTEL=1 (docs/ggml.md says what
# it changes).
#
#   tools/scripts/ggml-opencl.sh            the default run (CI's):
#     ggml-opencl-fa-check what the cases below leave out: K/V views starting inside a
#                          cache, mask rows with no allowed key (ggml/opencl/fa_check.c)
#     test-backend-ops test -o FLASH_ATTN_EXT -b GPUOpenCL   with clattn, a slice of
#                          every K/V type, mask, sinks, ALiBi, views and permutes (head
#                          size 64, 4 heads, 512 keys) and the mixed-type and uneven head
#                          size cases: 0 failures, none "not supported" of the K/V
#                          types clattn stores (two processes, half the K/V types each)
#     test-llama-archs -b GPUOpenCL -a llama      flash attention through clattn
#     llama-simple         a random-weights llama (test-llama-archs -o): the same
#                          greedy text with GPUOpenCL as on the CPU backend alone
#   tools/scripts/ggml-opencl.sh --full [PART...]   every case, results in
#     build-ggml/opencl-full/; PARTs (default all, in this order):
#       ops        the backend's qualification: test-backend-ops test -b GPUOpenCL,
#                  natively (GGML_OPENCL_CLATTN=0), op by op (OP_TIMEOUT s each, 1200),
#                  but FLASH_ATTN_EXT, which fa-native counts
#       fa         FLASH_ATTN_EXT over every case with clattn
#       fa-native  the same natively, head size by head size (the sizes fa's run
#                  met); a slice the runtime's compiler crashes in, again type by type
#       archs      test-llama-archs over every architecture, through clattn, arch by arch
#   tools/scripts/ggml-opencl.sh --bench    speed, clattn against the backend's own
#     flash attention, rounds interleaved (results in build-ggml/opencl-bench/):
#     test-backend-ops perf -o FLASH_ATTN_EXT over BENCH_CASES (a -p pattern; default
#     the six head size 64 cases over 7680 keys: f16, q4_0, q8_0, decode and prefill)
#     and llama-bench -fa 1 (pp512, tg128, and both at depth 4096) on a small
#     random-weights llama of tools/scripts/ggml_model.py (n_embd 512, 8 heads over 2
#     KV heads of 64, 2 layers, f16), BENCH_ROUNDS rounds (2)
#
# Every run with clattn reports how many FLASH_ATTN_EXT nodes clattn_forward
# computed (CLATTN_GGML_REPORT); one with none fails the lane. Kernel binaries
# are kept in build-ggml/cl-cache (GGML_OPENCL_KERNEL_CACHE_DIR): a cold run
# compiles the backend's ~180 programs first (about a minute).
#
# Exit status: 0 when every check passed; 77 (skipped, saying why) where Intel's
# runtime or pip is missing; 1 otherwise.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
mode=${1:-default}
case "$mode" in
  default|--full|--bench) ;;
  *) echo "usage: tools/scripts/ggml-opencl.sh [--full | --bench]" >&2; exit 2 ;;
esac
work=$root/build-ggml
bin=$work/build/bin

fail() {
  echo "ggml-opencl: FAILED: $*" >&2
  exit 1
}

if [ ! -x "$bin/test-backend-ops" ] || [ ! -x "$work/clattn/ggml/ggml-opencl-fa-check" ]; then
  tools/scripts/ggml.sh --build || exit $?
fi
# Intel's runtime, selected by its own environment (installed on first use)
selected=$(tools/scripts/intel-runtime.sh) || exit $?
eval "$selected"
export GGML_OPENCL_TEST_CPU_AS_INTEL=1 GGML_OPENCL_PLATFORM="Intel(R) OpenCL"
export GGML_OPENCL_KERNEL_CACHE_DIR=$work/cl-cache CLATTN_GGML_REPORT=1
native=(env GGML_OPENCL_CLATTN=0)
kv_types='f32|f16|bf16|q8_0|q4_0|q4_1|q5_0|q5_1|iq4_nl' # the K/V types clattn stores

status=0
# Runs a llama.cpp program, stdout in OUT/NAME.out, stderr in OUT/NAME.log;
# prints its exit status, clattn's node count and its time.
out=$work/opencl
run() {   # NAME PROGRAM ARGS...
  local name=$1
  shift
  local t=$SECONDS
  "$@" >"$out/$name.out" 2>"$out/$name.log"
  local rc=$?
  nodes=$(grep -o '[0-9]* FLASH_ATTN_EXT nodes computed by clattn_forward' "$out/$name.log" | grep -o '^[0-9]*' | tail -1)
  nodes=${nodes:-0}
  echo "ggml-opencl: $name: exit $rc, $nodes nodes through clattn_forward ($((SECONDS - t)) s)"
  return $rc
}
# A run with clattn: it must pass and have computed at least one node.
check() {   # NAME PROGRAM ARGS...
  if ! run "$@" || [ "$nodes" -eq 0 ]; then
    tail -n 30 "$out/$1.out" "$out/$1.log"
    status=1
  fi
}
# test-backend-ops' counts in OUT/NAME.out: ok, failed, not supported, cases reached.
counts() {   # NAME
  local f=$out/$1.out ok fail ns
  ok=$(grep -c '): .*OK' "$f")
  fail=$(grep -c '): .*FAIL' "$f")
  ns=$(grep -c '): not supported' "$f")
  echo "$ok OK, $fail FAIL, $ns not supported ($((ok + fail + ns)) cases)"
}

case "$mode" in
  default)
    out=$work/opencl
    mkdir -p "$out"
    # fa-check first: its run compiles the backend's own programs into the
    # kernel cache, which the two processes of the slice then share.
    check fa-check "$root/build-ggml/clattn/ggml/ggml-opencl-fa-check"
    cat "$out/fa-check.out"
    # The slice in two processes, half the K/V types each: a process builds
    # clattn's kernels one at a time (cold, most of its time), so two build
    # side by side; their outputs are then read as one.
    slice='(hsk=64,hsv=64,nh=4,nr23=\[1,1\],kv=512,|nr23=\[1,1\],kv=(96|128|256),nb=2,)'
    half='type_K=(f32|f16|bf16|q8_0|q4_0|q1_0|q2_0),'
    fa=("$bin/test-backend-ops" test -o FLASH_ATTN_EXT -b GPUOpenCL -p)
    (check fa-clattn-1 "${fa[@]}" "^(?=.*$slice)(?=.*$half)"; exit $status) &
    first=$!
    (check fa-clattn-2 "${fa[@]}" "^(?=.*$slice)(?!.*$half)"; exit $status) &
    wait $! || status=1
    wait $first || status=1
    cat "$out"/fa-clattn-[12].out >"$out/fa-clattn.out"
    echo "ggml-opencl: FLASH_ATTN_EXT with clattn: $(counts fa-clattn)"
    # a case both of whose K/V types clattn stores is its (the others: q1_0, q2_0)
    left=$(grep 'not supported' "$out/fa-clattn.out" | grep -E "type_K=($kv_types),type_V=($kv_types)," || true)
    if [ -n "$left" ]; then
      echo "ggml-opencl: cases clattn computes left unsupported:"
      echo "$left" | head -5
      status=1
    fi
    check archs "$bin/test-llama-archs" -b GPUOpenCL -s 1 -a '^llama$'
    grep -E 'Summary' "$out/archs.out" "$out/archs.log"

    mkdir -p "$work/models"
    [ -f "$work/models/llama-dense.gguf" ] ||
      "$bin/test-llama-archs" -a '^llama$' -s 7 -o "$work/models" >"$out/models.log" 2>&1 ||
      fail "test-llama-archs could not write a model: $out/models.log"
    prompt="Once upon a time"
    env -u CLATTN_GGML_REPORT "$bin/llama-simple" -m "$work/models/llama-dense.gguf" -ngl 0 -n 48 "$prompt" \
      >"$out/simple-cpu.txt" 2>"$out/simple-cpu.log" || fail "llama-simple on the CPU backend: $out/simple-cpu.log"
    check simple "$bin/llama-simple" -m "$work/models/llama-dense.gguf" -n 48 "$prompt"
    if cmp -s "$out/simple-cpu.txt" "$out/simple.out"; then
      echo "ggml-opencl: llama-simple: the same 48 tokens with GPUOpenCL as on the CPU backend alone"
    else
      echo "ggml-opencl: llama-simple: the text differs from the CPU backend's:"
      diff "$out/simple-cpu.txt" "$out/simple.out" | head -6
      status=1
    fi ;;

  --full)
    out=$work/opencl-full
    mkdir -p "$out"
    shift
    parts=${*:-ops fa fa-native archs}
    part() { [[ " $parts " == *" $1 "* ]]; }
    if part ops; then
      # op by op: a crash or a compile error (ggml-opencl exits) ends only its op's run
      : >"$out/qualification.txt"
      for op in $("$bin/test-backend-ops" --list-ops 2>/dev/null | sed -n 's/^  \([A-Z0-9_]*\)$/\1/p'); do
        [ "$op" = FLASH_ATTN_EXT ] && continue # fa-native counts it, slice by slice
        run "op-$op" "${native[@]}" timeout "${OP_TIMEOUT:-1200}" "$bin/test-backend-ops" test -o "$op" -b GPUOpenCL
        rc=$?
        c=$(counts "op-$op")
        [ "$c" = "0 OK, 0 FAIL, 0 not supported (0 cases)" ] && [ $rc -eq 0 ] && continue
        echo "$op: $c$([ $rc -gt 1 ] && echo ", ended by exit $rc")" | tee -a "$out/qualification.txt"
      done
    fi
    if part fa; then
      check fa-clattn "$bin/test-backend-ops" test -o FLASH_ATTN_EXT -b GPUOpenCL
      echo "ggml-opencl: FLASH_ATTN_EXT with clattn: $(counts fa-clattn)"
      grep 'not supported' "$out/fa-clattn.out" | grep -o 'type_K=[a-z0-9_]*,type_V=[a-z0-9_]*' | sort | uniq -c
      check fa-check "$root/build-ggml/clattn/ggml/ggml-opencl-fa-check"
    fi
    if part fa-native; then
      [ -f "$out/fa-clattn.out" ] || fail "fa-native runs the head sizes of fa's run: run --full fa first"
      : >"$out/fa-native.txt"
      for hs in $(grep -o 'FLASH_ATTN_EXT(hsk=[0-9]*,hsv=[0-9]*' "$out/fa-clattn.out" | sed 's/.*(//' | sort -u); do
        name=fa-native-${hs//[=,]/_}
        run "$name" "${native[@]}" "$bin/test-backend-ops" test -o FLASH_ATTN_EXT -b GPUOpenCL -p "^$hs,"
        rc=$?
        if [ $rc -le 1 ]; then
          echo "$hs: $(counts "$name")" | tee -a "$out/fa-native.txt"
          continue
        fi
        echo "$hs: $(counts "$name"), ended by exit $rc: again type by type" | tee -a "$out/fa-native.txt"
        for t in $(grep -o "FLASH_ATTN_EXT($hs,.*type_K=[a-z0-9_]*" "$out/fa-clattn.out" | sed 's/.*type_K=//' | sort -u); do
          sub=$name-$t
          run "$sub" "${native[@]}" "$bin/test-backend-ops" test -o FLASH_ATTN_EXT -b GPUOpenCL -p "^$hs,.*type_K=$t,"
          rc=$?
          echo "  $hs type_K=$t: $(counts "$sub")$([ $rc -gt 1 ] && echo ", ended by exit $rc")" |
            tee -a "$out/fa-native.txt"
        done
      done
    fi
    if part archs; then
      # arch by arch: an abort in the backend's other ops ends only its arch's run
      : >"$out/archs.txt"
      names=$(grep -o '{ LLM_ARCH_[A-Z0-9_]*, *"[^"]*" *}' \
        "$work/llama_cpp_python-0.3.36/vendor/llama.cpp/src/llama-arch.cpp" | sed 's/.*"\(.*\)".*/\1/')
      total_nodes=0
      for a in $names; do
        run "arch-$a" "$bin/test-llama-archs" -b GPUOpenCL -s 1 -a "^$a\$" >/dev/null
        rc=$?
        total_nodes=$((total_nodes + nodes))
        rows=$(grep -E "^\| *$a\|" "$out/arch-$a.out" | sed 's/\x1b\[[0-9;]*m//g')
        [ -z "$rows" ] && [ $rc -eq 0 ] && continue # not an architecture the test runs
        echo "${rows:-|$a| (no row)}$([ $rc -gt 1 ] && echo " ended by exit $rc")" | tee -a "$out/archs.txt"
      done
      echo "ggml-opencl: test-llama-archs: $(grep -c '| *OK (' "$out/archs.txt") OK, $(grep -c 'FAIL' "$out/archs.txt")" \
        "FAIL, $(grep -c 'SKIP' "$out/archs.txt") SKIP, $(grep -c 'ended by exit' "$out/archs.txt") runs ended by a" \
        "signal; $total_nodes nodes through clattn_forward"
      [ "$total_nodes" -gt 0 ] || status=1
    fi ;;

  --bench)
    out=$work/opencl-bench
    mkdir -p "$out"
    rounds=${BENCH_ROUNDS:-2}
    cases=${BENCH_CASES:-'hsk=64,hsv=64,nh=8,nr23=\[8,1\],kv=7680,'}
    # small weights, so that attention is a visible part of each token: ggml-opencl's
    # matrix products on this runtime ran a 111 M-parameter f16 llama at 2 tokens/s
    model=$work/models/bench-small.gguf
    # ggml-opencl's fused kernel_rms_norm_mul faults on this runtime (n_embd 4096): both sides unfused
    export GGML_OPENCL_DISABLE_FUSION=1
    if [ ! -f "$model" ]; then
      # Debian's python3 with its numpy (a python3 earlier on PATH may lack it)
      tools/scripts/packages.sh python3-numpy || exit 1
      mkdir -p "$work/models"
      PYTHONPATH=$work/llama_cpp_python-0.3.36/vendor/llama.cpp/gguf-py /usr/bin/python3 tools/scripts/ggml_model.py \
        "$model" --embd 512 --heads 8 --kv-heads 2 --layers 2 --ff 512 --ctx 8192 || fail "cannot write $model"
    fi
    for r in $(seq 1 "$rounds"); do
      for side in clattn native; do
        pre=()
        [ $side = native ] && pre=("${native[@]}")
        run "perf-$side-$r" "${pre[@]}" "$bin/test-backend-ops" perf -o FLASH_ATTN_EXT -b GPUOpenCL -p "$cases" || status=1
        run "bench-$side-$r" "${pre[@]}" "$bin/llama-bench" -m "$model" -fa 1 -p 512 -n 128 -d 0,4096 -r 2 || status=1
      done
    done
    for f in "$out"/perf-*.out; do
      echo "== $(basename "$f" .out)"
      grep -E 'FLASH_ATTN_EXT\(' "$f" | sed -E 's/ +/ /g'
    done
    for f in "$out"/bench-*.out; do
      echo "== $(basename "$f" .out)"
      grep -E '^\|' "$f"
    done ;;
esac
exit $status
