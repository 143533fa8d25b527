#!/usr/bin/env bash
# Installs, from Debian's packages, what clattn needs and the extra packages
# named on the command line, only those missing.
#
#   tools/scripts/packages.sh [EXTRA_PACKAGE...]
#
# apt-get runs as root, or through sudo when not root.
set -euo pipefail

packages=(gcc pkg-config meson ninja-build python3 ocl-icd-opencl-dev opencl-headers
          libclblast-dev libopenblas-dev libpng-dev pocl-opencl-icd clinfo "$@")

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "packages: installing ${missing[*]}" >&2
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
