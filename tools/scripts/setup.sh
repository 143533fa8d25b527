#!/usr/bin/env bash
# Installs what clattn needs from Debian's packages (only what is missing),
# then configures and builds it.
#
#   tools/scripts/setup.sh [BUILD_DIR [meson options...]]     default: build
#
# apt-get runs as root, or through sudo when not root.
set -euo pipefail
cd "$(dirname "$0")/../.."

tools/scripts/packages.sh

build_dir=${1:-build}
shift || true
if [ -f "$build_dir/build.ninja" ]; then
  meson configure "$build_dir" "$@" >/dev/null
else
  # Everything on: a missing dependency fails here instead of leaving its
  # tests skipped (pass -Dclblast=disabled / -Dtools=disabled to leave out).
  meson setup "$build_dir" -Dclblast=enabled -Dtools=enabled "$@" >/dev/null
fi
ninja -C "$build_dir" >/dev/null
