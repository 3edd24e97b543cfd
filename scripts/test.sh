#!/usr/bin/env bash
# make test: the whole suite, in two phases, then the forced-ISA pass (issue 41: CI's 90 minutes).
#   1. every test not marked `solo`, on both cores: pytest-xdist, two workers of one torch thread each
#      (tests/conftest.py), whole files handed out longest first;
#   2. the `solo` tests (tests/conftest.py SOLO_MODULES: trainer ranks, vLLM engines, launches), one at a time,
#      each with both cores, as they always ran;
#   3. the numeric tests again with the CPU kernels forced to another ISA (scripts/test_forced_isa.sh).
# Every phase runs even when one before it failed (CI's log shows all failures); the exit status is non-zero if
# any failed. Each phase ends with its slowest tests and its seconds per file; this script ends with each
# phase's wall time. Extra arguments go to every phase (e.g. -x, -k).
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
phase "1/3 both cores (not solo)" "$PY" -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder -m "not solo" \
  --durations=25 tests "$@"
phase "2/3 one at a time (solo)" "$PY" -m pytest -q -m solo --durations=25 tests "$@"
phase "3/3 forced ISA (numeric)" bash scripts/test_forced_isa.sh "$@"
echo "=== [make test] wall time per phase"
printf '%s\n' "${lines[@]}"
exit $status
