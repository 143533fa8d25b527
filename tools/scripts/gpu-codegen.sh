#!/usr/bin/env bash
# Compiles and links every program the library would build on a GPU, as the
# library assembles it (tests/gpu_programs.c), with Debian's clang-15 and
# libclc for AMD (gfx90a, gfx1100: ld.lld -shared) and NVIDIA (sm_80, and
# the fused programs for sm_90: PTX, then ptxas where the CUDA toolkit is
# present), and with Intel's ocloc (tools/scripts/ocloc.sh: Debian's
# intel-opencl-icd) for Intel Xe-HPG (dg2: acm-g10) and the fused programs
# for Xe-LP (tgllp), and
# prints per kernel and target: registers, spills, scratch or stack bytes
# per work-item, local memory and occupancy. A program that does not compile
# or link fails the run: that is what a clang-based GPU driver (or Intel's)
# would refuse. So does the fused kernel the library would pick at d=64 and
# d=128 (flash_block where the program holds it, else flash_tiled) when it
# spills or uses scratch on gfx90a, gfx1100, tgllp or dg2.
#
# Intel's figures come from the binary's zeInfo (tools/scripts/zeinfo.py),
# per hardware thread of SIMD lanes: regs = GRF registers, spills = scratch
# bytes (spills, and private arrays IGC put there), scratch = private memory
# bytes in global memory, occ = the SIMD width IGC compiled for.
#
#   tools/scripts/gpu-codegen.sh BUILD_DIR [WORK_DIR [clang|intel|all]]
#
# clang: the AMD and NVIDIA targets; intel: the Intel ones; all (the
# default): both. The meson tests gpu-codegen and gpu-codegen-intel run one
# each, in parallel.
#
# Exit status: 0 all built and the gate held, 1 a build failed or a gated
# kernel spilled, 77 when no target is left: clang-15, lld or libclc missing
# for the clang targets (tools/scripts/test.sh installs them: clang-15
# libclc-15 lld-15), ocloc for the Intel ones (tools/scripts/ocloc.sh); with
# all, a missing compiler's targets are left out, saying so.
set -uo pipefail
build=${1:?usage: tools/scripts/gpu-codegen.sh BUILD_DIR [WORK_DIR [clang|intel|all]]}
work=${2:-$build/gpu-codegen}
family=${3:-all}
case "$family" in clang|intel|all) ;; *) echo "gpu-codegen: unknown target family $family" >&2; exit 2 ;; esac
clc=/usr/lib/clc
clang=$(command -v clang-15 || true)
lld=$(command -v ld.lld-15 || command -v ld.lld || true)
ptxas=$(command -v ptxas || ls /usr/local/cuda/bin/ptxas 2>/dev/null || true)
ocloc="$(cd "$(dirname "$0")" && pwd)/ocloc.sh"
# Why each family's targets cannot be built ("" when they can); ocloc is
# fetched here, on first use, before the parallel compiles below.
why_clang="" why_intel=""
if [ "$family" != intel ]; then
  [ -n "$clang" ] || why_clang="clang-15 not found"
  [ -n "$lld" ] || why_clang="ld.lld not found"
  for lib in amdgcn--amdhsa.bc nvptx64--nvidiacl.bc; do
    [ -f "$clc/$lib" ] || why_clang="$clc/$lib not found (libclc-15)"
  done
fi
if [ "$family" != clang ]; then
  probe=$(mktemp -d) # ocloc query writes its answer into a file of that name
  if (cd "$probe" && "$ocloc" query OCL_DRIVER_VERSION >/dev/null); then
    echo "gpu-codegen: Intel targets through ocloc (Intel's compute runtime $(cat "$probe/OCL_DRIVER_VERSION"))"
  else
    why_intel="no ocloc (above)"
  fi
  rm -rf "$probe"
fi

# target  device profile  clang target flags, or ocloc and its device
all_targets=(
  "gfx90a  amd-wave64 -target amdgcn--amdhsa -mcpu=gfx90a -nogpulib"
  "gfx1100 amd-wave32 -target amdgcn--amdhsa -mcpu=gfx1100 -nogpulib"
  "sm_80   nvidia     -target nvptx64--nvidiacl -march=sm_80"
  "sm_90   nvidia     -target nvptx64--nvidiacl -march=sm_80"
  "tgllp   intel-xe-lp  ocloc tgllp"
  "dg2     intel-xe-hpg ocloc acm-g10"
)
# clang-15 knows no sm_90: its PTX for sm_80, assembled by ptxas for sm_90.
# The family's targets whose compiler is there; the others said.
targets=()
for t in "${all_targets[@]}"; do
  if [[ $t == *" ocloc "* ]]; then
    [ "$family" != clang ] && [ -z "$why_intel" ] && targets+=("$t")
  else
    [ "$family" != intel ] && [ -z "$why_clang" ] && targets+=("$t")
  fi
done
[ -n "$why_intel" ] && echo "gpu-codegen: the Intel targets are left out: $why_intel"
[ -n "$why_clang" ] && echo "gpu-codegen: the clang targets are left out: $why_clang"
if [ ${#targets[@]} -eq 0 ]; then
  echo "gpu-codegen: skipped: no target left"
  exit 77
fi
rm -rf "$work"
for t in "${targets[@]}"; do
  read -r target profile flags <<<"$t"
  mkdir -p "$work/$target"
  "$build/tests/gpu_programs" "$profile" "$work/$target" || exit 1
  # sm_90, gfx1100 and tgllp: the fused programs at d=64 and d=128 only
  # (the gate's; the rest as sm_80, gfx90a and dg2), and on tgllp the core
  # program with softmax_rows' sub-group variant. dg2: the backward programs
  # at d=64 in f32, bf16 and with one modifier, and at d=256 (IGC takes 20
  # to 30 s per backward program; gfx90a and sm_80 compile every one, and
  # IGC still meets f16 storage and dropout in dg2's forward programs).
  case "$target" in
    sm_90 | gfx1100 | tgllp)
      find "$work/$target" -type f ! -name 'flash-*-d64-64.*' ! -name 'flash-*-d128-128.*' \
        ! -name 'core-f32-softmax-sg*' -delete ;;
    dg2)
      find "$work/$target" -type f -name '*backward-*' ! -name 'backward-f32-d64-64.*' ! -name 'backward-bf16-d64-64.*' \
        ! -name 'backward-f32-modcausal-d64-64.*' ! -name 'backward-f32-d256-256.*' -delete ;;
  esac
  echo "$flags" >"$work/$target/flags"
done

# compile TARGET PROGRAM: one program for one target; writes PROGRAM.log
# (compiler, linker and assembler messages) and PROGRAM.ok on success.
compile() {
  local target=$1 base="$work/$1/$2" flags opts
  flags=$(cat "$work/$target/flags")
  opts=$(cat "$base.opts")
  local common=(-x cl -O3 -Xclang -finclude-default-header -Wno-pass-failed $flags $opts)
  if [[ $flags == ocloc* ]]; then
    # zebin (an ELF with .ze_info), which the figures are read from
    "$ocloc" compile -file "$base.cl" -device "${flags#ocloc }" -options "$opts" \
      -internal_options -cl-intel-allow-zebin -out_dir "$work/$target" -output "$2" -output_no_suffix -q \
      >"$base.log" 2>&1 && touch "$base.ok"
  elif [[ $target == gfx* ]]; then
    "$clang" "${common[@]}" -Xclang -mlink-bitcode-file -Xclang "$clc/amdgcn--amdhsa.bc" \
      -Rpass-analysis=kernel-resource-usage -c -o "$base.o" "$base.cl" >"$base.log" 2>&1 &&
      "$lld" -shared -o "$base.so" "$base.o" >>"$base.log" 2>&1 && touch "$base.ok"
  else
    "$clang" "${common[@]}" -Xclang -mlink-bitcode-file -Xclang "$clc/nvptx64--nvidiacl.bc" \
      -S -o "$base.ptx" "$base.cl" >"$base.log" 2>&1 || return 0
    if [ -n "$ptxas" ]; then
      "$ptxas" -arch="$target" -v -o "$base.cubin" "$base.ptx" >>"$base.log" 2>&1 && touch "$base.ok"
    else
      echo "ptxas not found: stopped at PTX" >>"$base.log"
      touch "$base.ok"
    fi
  fi
}
export -f compile
export work clang lld clc ptxas ocloc
for t in "${targets[@]}"; do
  target=${t%% *}
  for f in "$work/$target"/*.cl; do printf '%s %s\n' "$target" "$(basename "$f" .cl)"; done
done | xargs -P "$(nproc)" -n 2 bash -c 'compile "$0" "$1"'

# The figures, one line per kernel: amdgcn from clang's resource-usage
# remarks, nvptx from ptxas -v.
table="$work/table"
printf '%-8s %-22s %-20s %5s %6s %8s %6s %5s\n' target program kernel regs spills scratch local occ | tee "$table"
failed=0
for t in "${targets[@]}"; do
  target=${t%% *}
  for f in "$work/$target"/*.cl; do
    program=$(basename "$f" .cl)
    base="$work/$target/$program"
    if [ ! -f "$base.ok" ]; then
      echo "FAILED: $program for $target:"
      grep -v 'remark:' "$base.log" | head -20
      failed=1
      continue
    fi
    if grep -q '^ocloc' "$work/$target/flags"; then   # ocloc's binary
      "$(dirname "$ocloc")/zeinfo.py" "$base" | while read -r name simd grf scratch private slm; do
        printf '%-8s %-22s %-20s %5s %6s %8s %6s %5s\n' "$target" "$program" "$name" "$grf" "$scratch" "$private" \
          "$slm" "simd$simd"
      done | tee -a "$table"
    elif [[ $target == gfx* ]]; then
      awk -v t="$target" -v p="$program" '
        /remark: Function Name:/ { split($0, a, "Function Name: "); split(a[2], b, " "); name = b[1]; ag = "" }
        /remark: +VGPRs: /       { split($0, a, "VGPRs: "); split(a[2], b, " "); v = b[1] }
        /remark: +AGPRs: /       { split($0, a, "AGPRs: "); split(a[2], b, " "); ag = b[1] }
        /ScratchSize/            { split($0, a, "lane\\]: "); split(a[2], b, " "); s = b[1] }
        /Occupancy/              { split($0, a, "SIMD\\]: "); split(a[2], b, " "); o = b[1] }
        /VGPRs Spill:/           { split($0, a, "Spill: "); split(a[2], b, " "); sp = b[1] }
        /LDS Size/ { split($0, a, "block\\]: "); split(a[2], b, " ");
                     if (o > 0) printf "%-8s %-22s %-20s %5s %6s %8s %6s %5s\n", t, p, name, v (ag > 0 ? "+" ag : ""), sp, s, b[1], o }
      ' "$base.log" | tee -a "$table"
    elif [ -n "$ptxas" ]; then
      awk -v t="$target" -v p="$program" '
        /Compiling entry function/ { split($0, a, "'"'"'"); name = a[2] }
        /Function properties for/  { fn = $NF }
        /bytes stack frame/        { if (fn == name) { stack = $1; spill = $5 } }
        /Used [0-9]+ registers/    { for (i = 1; i <= NF; i++) if ($(i + 1) == "registers,") r = $i;
                                     smem = "0"; for (i = 1; i <= NF; i++) if ($(i) ~ /bytes/ && $(i + 1) ~ /^smem/) smem = $(i - 1);
                                     printf "%-8s %-22s %-20s %5s %6s %8s %6s %5s\n", t, p, name, r, spill, stack, smem, "-" }
      ' "$base.log" | tee -a "$table"
    else
      printf '%-8s %-22s %-20s %s\n' "$target" "$program" "(all)" "PTX only: ptxas not found"
    fi
  done
done
[ $failed -eq 0 ] && echo "gpu-codegen: every program compiled and linked for ${#targets[@]} targets"

# The gate: at d=64 and d=128 on gfx90a, gfx1100, tgllp and dg2, the fused
# kernel the library would pick (flash_block where the program holds it)
# neither spills nor uses scratch.
gated=0
while read -r target program kernel _ spills scratch _; do
  pick=flash_tiled
  grep -q -- '-D BLOCK_RM=' "$work/$target/$program.opts" && pick=flash_block
  [ "$kernel" = "$pick" ] || continue
  gated=$((gated + 1))
  if [ "$spills" != 0 ] || [ "$scratch" != 0 ]; then
    echo "FAILED: $pick in $program on $target spills $spills registers, $scratch bytes of scratch per lane"
    failed=1
  fi
done < <(grep -E '^(gfx90a|gfx1100|tgllp|dg2) +flash-[a-z0-9_-]+-d(64-64|128-128) ' "$table")
if [ $gated -eq 0 ]; then
  echo "FAILED: the gate found no fused kernel at d=64 or d=128 in the figures"
  failed=1
fi
gates=$(printf '%s\n' "${targets[@]}" | awk '$1 ~ /^(gfx90a|gfx1100|tgllp|dg2)$/ { printf "%s%s", sep, $1; sep = ", " }')
[ $failed -eq 0 ] && echo "gpu-codegen: $gated fused kernels at d=64/128 on $gates without spills or scratch"
exit $failed
