#!/usr/bin/env bash
# The gate under load: .ci/run from this checkout while gate/busy_core.py
# holds one core busy (a single thread that stops by itself after LIMIT
# seconds, default 7200, and is stopped when the gate ends). Prints the
# gate's wall and exits with its status.
#
#   bash gate/ci-under-load.sh [LIMIT]
set -uo pipefail
cd "$(dirname "$0")/.."
limit="${1:-7200}"
python3 gate/busy_core.py "$limit" &
busy=$!
start=$(date +%s)
bash .ci/run
rc=$?
kill "$busy" 2>/dev/null
wait "$busy" 2>/dev/null
echo "ci-under-load: .ci/run exit $rc, wall $(( $(date +%s) - start )) s, one core busy"
exit "$rc"
