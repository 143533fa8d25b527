#!/usr/bin/env bash
# Sets clattn up (tools/scripts/setup.sh) and runs the main job on the default device:
# `clattn demo` (POCL's CPU device where there is no GPU).
set -euo pipefail
cd "$(dirname "$0")/../.."
tools/scripts/setup.sh build
exec build/tools/clattn demo "$@"
