#!/usr/bin/env bash
# Sets clattn up with warnings as errors (tools/setup.sh) and runs the whole
# test suite (suites unit and opencl) on the default device.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh build-test -Dwerror=true
status=0
meson test -C build-test --print-errorlogs --num-processes 2 "$@" || status=$?
python3 - build-test/meson-logs/testlog.json <<'PY'
import json, sys
counts = {"OK": 0, "FAIL": 0, "SKIP": 0}
for line in open(sys.argv[1]):
    r = json.loads(line)["result"]
    key = "OK" if r == "OK" else "SKIP" if r == "SKIP" else "FAIL"
    counts[key] += 1
print("tests: %d passed, %d failed, %d skipped" % (counts["OK"], counts["FAIL"], counts["SKIP"]))
PY
exit $status
