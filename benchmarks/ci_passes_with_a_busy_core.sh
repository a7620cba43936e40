#!/usr/bin/env bash
# The test command's wall time on a loaded machine (docs/benchmarks.md, "How long the tests take"): three passes of
# `.ci/run`, each from a fresh clone of this checkout's HEAD, one after another, with another process keeping one
# core busy the whole time. Stops at the first failing pass. Logs go to ${LOGS:-/tmp}/ci_pass_N.log.
#   bash benchmarks/ci_passes_with_a_busy_core.sh
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
logs=${LOGS:-/tmp}
python3 -c "while True: pass" &
spinner=$!
trap 'kill $spinner' EXIT
for pass in 1 2 3; do
  dir=$(mktemp -d)/clone
  git clone -q "$repo" "$dir"
  start=$(date +%s)
  echo "pass $pass: $(git -C "$dir" rev-parse --short HEAD) started $(date -u +%H:%M:%S)"
  (cd "$dir" && bash .ci/run > "$logs/ci_pass_$pass.log" 2>&1)
  rc=$?
  echo "pass $pass: rc=$rc, .ci/run $(( $(date +%s) - start )) s; $(grep -E 'passed|failed' "$logs/ci_pass_$pass.log" | tail -1)"
  rm -rf "$(dirname "$dir")"
  [ $rc -eq 0 ] || exit $rc
done
