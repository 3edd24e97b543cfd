# The two commands README gives. Each does its own set-up (scripts/setup.sh is idempotent).
.PHONY: setup demo test bench clean-runs
PY := .venv/bin/python

setup:
	bash scripts/setup.sh

# The main job: one GRPO attempt on the embedded default (SmolLM2-135M-Instruct, arithmetic),
# executed headlessly through notebooks/train.ipynb by papermill.
demo: setup
	$(PY) -m rftlib.cli demo

test: setup
	$(PY) -m pytest -q tests

bench: setup
	$(PY) bench/run_all.py
