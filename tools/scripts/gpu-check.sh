#!/usr/bin/env bash
# The one device check, for a session lent a GPU machine (NVIDIA H200): runs
# there from the repository root, with the bundle tools/scripts/gpu-bundle.sh made
# here (carry: .gpu-bundle.tar.xz), and writes everything it measures to
# $OUT/gpu-results.txt. Within about 8 minutes:
#   1. points the bundled OpenCL loader at the driver's libnvidia-opencl
#   2. `clattn info` (devices, tiles, program build)
#   3. the device test programs (exact semantics on the GPU, fp64 reference)
#   4. `clattn bench` on prefill and decode shapes, f32 and 16-bit storage
#   5. PyTorch's scaled_dot_product_attention on the same shapes, fp32 and
#      fp16, as the anchor
# Nothing here is estimated: each figure is printed by the program that
# measured it.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/gpu-check}
mkdir -p "$out"
exec > >(tee "$out/gpu-results.txt") 2>&1
section() { echo; echo "==== $1 ($(date -u +%T))"; }

work=/tmp/clattn-gpu
rm -rf "$work"
mkdir -p "$work/icd" "$work/cache"
[ -f .gpu-bundle.tar.xz ] || { echo "no .gpu-bundle.tar.xz: run tools/scripts/gpu-bundle.sh first and carry it"; exit 1; }
tar -C "$work" -xJf .gpu-bundle.tar.xz

section "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 | head -3
icd=${GPU_CHECK_ICD:-}   # another vendor's library, for a dry run where there is no NVIDIA GPU
for dir in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu /usr/lib64; do
  [ -z "$icd" ] && [ -e "$dir/libnvidia-opencl.so.1" ] && icd=$dir/libnvidia-opencl.so.1
done
[ -n "$icd" ] || icd=$(find / -maxdepth 6 -name 'libnvidia-opencl.so.1' 2>/dev/null | head -n 1)
[ -n "$icd" ] || { echo "libnvidia-opencl.so.1 not found: no OpenCL on this machine"; exit 1; }
echo "NVIDIA OpenCL: $icd"
echo "$icd" >"$work/icd/nvidia.icd"
export OCL_ICD_VENDORS=$work/icd OCL_ICD_FILENAMES=$icd
export LD_LIBRARY_PATH=$work/lib:$(dirname "$icd"):${LD_LIBRARY_PATH:-}
export CLATTN_CACHE_DIR=$work/cache
bin=$work/bin

section "clattn info"
timeout 120 "$bin/clattn" info

section "device tests"
for t in validation semantics fused varlen precision index_width chunking sweep; do
  t0=$SECONDS
  timeout 120 "$bin/test_$t" >"$out/test.log" 2>&1
  rc=$?
  echo "test_$t: exit $rc ($((SECONDS - t0)) s): $(grep -E 'passed|failed' "$out/test.log" | tail -n 1)"
  [ $rc -eq 0 ] || tail -n 15 "$out/test.log"
done
rm -f "$out/test.log"

section "clattn bench (FUSED against CLBlast staged on the GPU; OpenBLAS on the host)"
timeout 300 "$bin/clattn" bench --no-host --cap 20 \
  --shape 16,16,4096,4096,64 --shape 16,16,4096,4096,128 --shape 16,16,4096,4096,64,causal \
  --shape 16,16,4096,4096,128,causal --shape 32,8,4096,4096,128,causal \
  --shape 32,8,1,8192,128 --shape 32,8,1,32768,128 --shape 32,8,1,131072,128

section "PyTorch scaled_dot_product_attention, the anchor"
timeout 180 python3 - <<'PY'
import time, torch
import torch.nn.functional as F
dev = "cuda"
print("torch", torch.__version__, torch.cuda.get_device_name(0))
def timed(fn, reps=10):
    fn(); torch.cuda.synchronize()
    t = []
    for _ in range(reps):
        s = time.perf_counter(); fn(); torch.cuda.synchronize(); t.append(time.perf_counter() - s)
    return sorted(t)[len(t) // 2]
shapes = [(16, 16, 4096, 4096, 64, False), (16, 16, 4096, 4096, 128, False), (16, 16, 4096, 4096, 64, True),
          (16, 16, 4096, 4096, 128, True), (32, 8, 4096, 4096, 128, True),
          (32, 8, 1, 8192, 128, False), (32, 8, 1, 32768, 128, False), (32, 8, 1, 131072, 128, False)]
for dtype in (torch.float32, torch.float16):
    for h, hk, m, n, d, causal in shapes:
        q = torch.randn(1, h, m, d, device=dev, dtype=dtype)
        k = torch.randn(1, hk, n, d, device=dev, dtype=dtype)
        v = torch.randn(1, hk, n, d, device=dev, dtype=dtype)
        fn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal and m > 1, enable_gqa=h != hk)
        sec = timed(fn)
        flops = 4 * h * m * n * d / (2 if causal else 1)
        bytes_ = (q.numel() + k.numel() + v.numel() + q.numel() * 1) * q.element_size()
        print(f"{str(dtype):14s} H{h}/{hk} M={m} N={n} d{d}{' causal' if causal else ''}: "
              f"{sec * 1e3:8.3f} ms  {flops / sec / 1e12:7.2f} TFLOP/s  {bytes_ / sec / 1e9:8.1f} GB/s")
PY
section "done"
