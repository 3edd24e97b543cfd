"""Subprocess worker of tests/test_train_pipeline.py's kill -9 test: the tiny model on the CopyEngine at
max_staleness 1, 4 steps, a checkpoint every step; ``--resume`` continues the attempt.

usage: pipeline_worker.py RUNS_ROOT NAME [--resume]   (env: RFT_TOY_GEN_DELAY, RFT_TOY_CONTROL)
"""

from __future__ import annotations

import sys
from dataclasses import replace

import torch

from toy_engines import register_copy_engine
from toy_rewards import isdigit_share

from rftlib.config import make_config
from rftlib.train.build import build_task
from rftlib.train.loop import Trainer


def main() -> None:
    root, name, resume = sys.argv[1], sys.argv[2], "--resume" in sys.argv[3:]
    torch.set_num_threads(1)
    register_copy_engine()
    cfg = make_config("tiny", {"runs_root": root, "name": name, "rollout_engine": "copy", "max_staleness": 1,
                               "num_steps": 4, "save_steps": 1, "eval_steps": 0, "warmup_ratio": 0.0, "lr": 3e-3})
    task = replace(build_task(cfg), reward=isdigit_share)
    run_dir = f"{root}/attempt-01-{name}" if resume else None
    tr = Trainer(cfg, run_dir, resume=resume, task=task, progress=False)
    try:
        tr.train()
    finally:
        tr.close()


if __name__ == "__main__":
    main()
