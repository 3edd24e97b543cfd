"""Subprocess worker of tests/test_train_pipeline.py's kill -9 tests: the tiny model on the CopyEngine at
max_staleness 1, 4 steps, a checkpoint every step; ``--resume`` continues the attempt.

``--multi-turn``: two-turn episodes (issue 40: kill -9 mid-episode) through the multi_turn source against
``toy_envs.TwoTurnEnv``, which answers the model's first turn with a user message and scores its second. Every
turn ends after exactly ``TURN_TOKENS`` sampled tokens with the stop token (forced in the sampler: the random tiny
model rarely samples it), so no turn is cut by a length and every batch makes exactly two engine calls, one a
turn: the CopyEngine's in-flight marker ``inflight_<2b>`` is batch b's second turn.

usage: pipeline_worker.py RUNS_ROOT NAME [--resume] [--multi-turn]   (env: RFT_TOY_GEN_DELAY, RFT_TOY_CONTROL)
"""

from __future__ import annotations

import sys
from dataclasses import replace

import torch

from toy_engines import register_copy_engine
from toy_envs import TwoTurnEnv
from toy_rewards import isdigit_share

from rftlib.config import make_config
from rftlib.envs.base import ENVS
from rftlib.train.build import build_task
from rftlib.train.loop import Trainer


TURN_TOKENS = 3
"""sampled tokens of every model turn in --multi-turn (the stop token is forced after them)"""


def force_stop_after(n: int, stop: list[int]) -> None:
    """Every sampled turn ends with the stop token ``stop[0]`` (set once the tokenizer is loaded) after ``n``
    tokens: the sampler (rftlib.rollout.hf.SampleAndRecord, one per generate call) puts all the mass on it from
    the call's (n+1)-th token on."""
    import rftlib.rollout.hf as hf

    real = hf.SampleAndRecord.__call__

    def forced(self, input_ids, scores):
        start = self.__dict__.setdefault("_start", input_ids.shape[1])  # the left-padded contexts' width
        if input_ids.shape[1] - start >= n:
            scores = torch.full_like(scores, float("-inf"))
            scores[:, stop[0]] = 0.0
        return real(self, input_ids, scores)

    hf.SampleAndRecord.__call__ = forced


def main() -> None:
    root, name = sys.argv[1], sys.argv[2]
    resume, multi = "--resume" in sys.argv[3:], "--multi-turn" in sys.argv[3:]
    torch.set_num_threads(1)
    register_copy_engine()
    extra, stop = {}, []
    if multi:
        ENVS.register("two_turn_worker", TwoTurnEnv)
        force_stop_after(TURN_TOKENS, stop)
        extra = {"env": "two_turn_worker", "max_turns": 2, "max_trajectory_tokens": 96}
    cfg = make_config("tiny", {"runs_root": root, "name": name, "rollout_engine": "copy", "max_staleness": 1,
                               "num_steps": 4, "save_steps": 1, "eval_steps": 0, "warmup_ratio": 0.0, "lr": 3e-3,
                               **extra})
    task = replace(build_task(cfg), reward=isdigit_share)
    run_dir = f"{root}/attempt-01-{name}" if resume else None
    tr = Trainer(cfg, run_dir, resume=resume, task=task, progress=False)
    stop.append(tr.tok.eos_token_id)  # before train(): no batch is permitted before its first step
    try:
        tr.train()
    finally:
        tr.close()


if __name__ == "__main__":
    main()
