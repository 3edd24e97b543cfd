# The two commands README gives. Each does its own set-up (scripts/setup.sh is idempotent).
.PHONY: setup demo test test-fast test-parallel bench clean-runs
PY := .venv/bin/python

setup:
	bash scripts/setup.sh

# The main job: one GRPO attempt on the embedded default (SmolLM2-135M-Instruct, arithmetic),
# executed headlessly through notebooks/train.ipynb by papermill.
demo: setup
	$(PY) -m rftlib.cli demo

# The whole suite (CI's budget: 90 minutes for all of .ci/run), in scripts/test.sh's two phases, each on both cores
# (pytest-xdist --solo-worker: one worker runs the tests that start ranks or engines, marked solo, one at a time,
# the other every other file): every test, then the numeric tests again with the CPU kernels forced to another ISA
# (tolerances must hold for any x86 CPU's summation order, not only this one's). Each phase ends with its slowest
# tests and seconds per test file.
test: setup
	bash scripts/test.sh

# Everything on both cores at once, solo tests included (ranks beside ranks): not CI's command (see scripts/test.sh)
test-parallel: setup
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=25 tests

# The inner loop (a subset of `make test`, never a replacement): the pure and light modules (algo, config,
# data, rewards, units, envs): 871 tests in 50 s of pytest, 99 s with the set-up check, on 2 cores. tests/conftest.py:
# FAST_MODULES.
test-fast: setup
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=10 -m fast tests

# Benchmarks print ratios against a peer measured in the same run (these machines are shared).
bench: setup
	$(PY) -m pip install -q -e ".[bench]" 2>&1 | grep -v "is ignored" || true
	for f in bench/bench_logprobs.py bench/bench_math_reward.py bench/bench_sandbox.py \
	         bench/memory_vs_estimate.py bench/check_gold.py; do echo "== $$f"; $(PY) $$f || exit 1; done
	echo "== bench/grpo_step.py"; $(PY) bench/grpo_step.py && $(PY) bench/grpo_step.py --mode update
