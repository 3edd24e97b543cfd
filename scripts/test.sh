#!/usr/bin/env bash
# make test: the whole suite in one phase on both cores, then the forced-ISA pass (issue 41: CI's 90 minutes).
#   1. every test, pytest-xdist with two workers of one torch thread each (tests/conftest.py): the `solo` tests
#      (tests/conftest.py SOLO_MODULES: trainer ranks, vLLM engines, launches) are one work unit that one worker
#      runs one at a time, in that list's order, while the other worker takes the remaining files (each a unit, longest
#      first) and then stops; the solo tests whose checks ride on timing run last, when they have the cores alone;
#   2. the numeric tests again with the CPU kernels forced to another ISA (scripts/test_forced_isa.sh).
# Both phases run even when the first failed (CI's log shows all failures); the exit status is non-zero if either
# failed. Each phase ends with its slowest tests and its seconds per file; this script ends with each phase's wall
# time. Extra arguments go to both phases (e.g. -x, -k).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
status=0
declare -a lines
phase() {
  local name=$1; shift
  local t0=$SECONDS
  echo "=== [make test] $name: $*"
  "$@"
  local rc=$?
  # pytest's 5: nothing collected (e.g. -k selected nothing in this phase): not a failure
  if [ $rc -ne 0 ] && [ $rc -ne 5 ]; then status=1; fi
  lines+=("$(printf '%-40s %5d s  (exit %d)' "$name" $((SECONDS - t0)) $rc)")
}
phase "1/2 both cores (solo on one worker)" "$PY" -m pytest -q -n 2 --solo-worker --dist loadfile --no-loadscope-reorder \
  --durations=25 tests "$@"
phase "2/2 forced ISA (numeric)" bash scripts/test_forced_isa.sh "$@"
echo "=== [make test] wall time per phase"
printf '%s\n' "${lines[@]}"
exit $status
