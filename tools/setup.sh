#!/usr/bin/env bash
# Installs what clattn needs from Debian's packages (only what is missing),
# then configures and builds it.
#
#   tools/setup.sh [BUILD_DIR [meson options...]]     default: build
#
# apt-get runs as root, or through sudo when not root.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(gcc pkg-config meson ninja-build python3 ocl-icd-opencl-dev opencl-headers
          libclblast-dev libopenblas-dev libpng-dev pocl-opencl-icd clinfo)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

build_dir=${1:-build}
shift || true
if [ -f "$build_dir/build.ninja" ]; then
  meson configure "$build_dir" "$@" >/dev/null
else
  meson setup "$build_dir" "$@" >/dev/null
fi
ninja -C "$build_dir" >/dev/null
