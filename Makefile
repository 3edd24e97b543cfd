# The two commands README gives. Each does its own set-up (scripts/setup.sh is idempotent).
.PHONY: setup demo test bench clean-runs
PY := .venv/bin/python

setup:
	bash scripts/setup.sh

# The main job: one GRPO attempt on the embedded default (SmolLM2-135M-Instruct, arithmetic),
# executed headlessly through notebooks/train.ipynb by papermill.
demo: setup
	$(PY) -m rftlib.cli demo

# then the numeric tests again with the CPU kernels forced to another ISA (scripts/test_forced_isa.sh):
# tolerances must hold for any x86 CPU's summation order, not only this one's
test: setup
	$(PY) -m pytest -q tests
	bash scripts/test_forced_isa.sh

# Benchmarks print ratios against a peer measured in the same run (these machines are shared).
bench: setup
	$(PY) -m pip install -q -e ".[bench]" 2>&1 | grep -v "is ignored" || true
	for f in bench/bench_logprobs.py bench/bench_math_reward.py bench/bench_sandbox.py \
	         bench/memory_vs_estimate.py bench/check_gold.py; do echo "== $$f"; $(PY) $$f || exit 1; done
	echo "== bench/grpo_step.py"; $(PY) bench/grpo_step.py && $(PY) bench/grpo_step.py --mode update
