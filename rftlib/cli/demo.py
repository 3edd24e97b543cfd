"""``rft demo``: the embedded default run (GRPO on SmolLM2-135M-Instruct, arithmetic) via notebooks/train.ipynb."""

from __future__ import annotations

import time

from rftlib.cli.common import parse_sets, run_notebook
from rftlib.workbench import result_text

DEMO_GOAL_POINTS = 15.0  # the demo's goal: +15 points of held-out accuracy ...
DEMO_GOAL_MINUTES = 10.0  # ... within 10 minutes of training on the 2-core machine


def add_arguments(p) -> None:
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")


def run(args) -> int:
    t = time.time()
    print("[rft demo] GRPO on SmolLM2-135M-Instruct (embedded), arithmetic task, preset params/default.yaml,"
          " via papermill notebooks/train.ipynb", flush=True)
    run_dir, summary = run_notebook({"preset": "default", **parse_sets(args.set)})
    print(f"\n[rft demo] attempt {run_dir.name} ({time.time() - t:.0f} s wall in all, model load included)")
    print(f"[rft demo] executed notebook: {run_dir / 'notebook.ipynb'}")
    print(f"[rft demo] metrics: {run_dir / 'logs' / 'metrics.jsonl'}")
    print("[rft demo] " + result_text(summary, DEMO_GOAL_POINTS, DEMO_GOAL_MINUTES))
    samples = sorted((run_dir / "logs" / "samples").glob("*.jsonl"))
    print(f"[rft demo] sample completions: {len(samples)} file(s) in {run_dir / 'logs' / 'samples'}")
    return 0
