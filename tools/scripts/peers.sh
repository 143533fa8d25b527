#!/usr/bin/env bash
# clattn against the attention a CPU user would pick instead: `clattn bench`
# (FUSED) on POCL and on Intel's OpenCL runtime, PyTorch's
# scaled_dot_product_attention and OpenVINO's SDPA, on the same shapes in
# alternating rounds (tools/bench/peers.py). Prints the table; with --write
# puts it into docs/performance.md (between its peers:begin and peers:end
# markers), with the machine, its vector extensions, the date and the load.
#
#   tools/scripts/peers.sh [--rounds R] [--write] [--runtime pocl|intel]...
#                          [--shape H,HKV,M,N,D[,causal]]... [--cap SECONDS]
#   tools/scripts/peers.sh --flex [--rounds R] [--write]
#
# --flex compares clattn's modifiers (`clattn bench --modifiers`, POCL) with
# PyTorch's compiled flex_attention instead (tools/bench/peers_flex.py: the
# table between docs/performance.md's flex:begin and flex:end markers).
#
# Defaults: 3 rounds, both runtimes, the shapes PyTorch is compared on
# (prefill H8 N1024 d64, causal H8 N2048 d64, GQA H16/4 N1024 d128, d256,
# decode H32/8 N8192 and N32768 d128).
#
# The peers come from PyPI (torch, openvino, numpy) into build-peers/, a venv
# of their own (about 6 GB: PyPI's torch brings CUDA libraries it does not
# use here); nothing else needs them, CI never runs this. The build is
# build/ (tools/scripts/setup.sh's), Intel's runtime that of
# tools/scripts/intel-runtime.sh. Exit status 77 (skipped) where the venv
# cannot be made or PyPI is out of reach.
set -euo pipefail
cd "$(dirname "$0")/../.."

rounds=3 write=() runtimes=() rest=() flex=0
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
    --rounds) rounds=$2; shift 2 ;;
    --write) write=(--write docs/performance.md); shift ;;
    --flex) flex=1; shift ;;
    --runtime) runtimes+=(--runtime "$2"); shift 2 ;;
    --shape|--cap) rest+=("$1" "$2"); shift 2 ;;
    *) echo "peers: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ ${#runtimes[@]} -gt 0 ] || runtimes=(--runtime pocl --runtime intel)

venv=build-peers
if ! "$venv/bin/python" -c 'import torch, openvino, numpy' 2>/dev/null; then
  echo "peers: installing torch, openvino and numpy from PyPI into $venv (about 6 GB)" >&2
  python3 -m venv "$venv" >/dev/null 2>&1 && [ -x "$venv/bin/pip" ] ||
    { echo "peers: SKIPPED: python3 cannot make a venv (python3-venv missing)" >&2; exit 77; }
  "$venv/bin/pip" --disable-pip-version-check -q install torch openvino numpy ||
    { echo "peers: SKIPPED: pip could not install torch, openvino, numpy (is PyPI within reach?)" >&2; exit 77; }
fi
[ -x build/tools/clattn ] || tools/scripts/setup.sh build >/dev/null
ninja -C build tools/clattn >/dev/null

if [ $flex = 1 ]; then
  exec "$venv/bin/python" tools/bench/peers_flex.py --rounds "$rounds" --clattn build/tools/clattn "${write[@]}"
fi
exec "$venv/bin/python" tools/bench/peers.py --rounds "$rounds" --clattn build/tools/clattn "${runtimes[@]}" \
  "${write[@]}" "${rest[@]}"
