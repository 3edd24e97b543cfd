"""One ZeRO-3 rank of the generate-gather test (tests/test_train_zero3_gather.py), under torchrun.

Builds the trainer (tiny model, DeepSpeed ZeRO-3 with every parameter partitioned), then samples the
same rollout twice from the same seed: with DeepSpeed's per-layer gathers at every decode step (the
engine's ``gather`` off) and with the whole model gathered once (the backend's
``gathered_for_generation``), counting the all-gather collectives each makes; then one training step
(which must still train after the hooks were taken off and put back). Writes rank_R.json.

    python -m torch.distributed.run --nproc_per_node 2 tests/zero3_gather_worker.py OUT_DIR ZERO3_JSON
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import torch

from rftlib.config import make_config
from rftlib.eval import format_prompts
from rftlib.train.build import build_task
from rftlib.train.dist import init_dist, shutdown_dist
from rftlib.train.loop import Trainer
from toy_rewards import letter_a_share  # tests/toy_rewards.py: this script's directory is on sys.path

GATHERS = ("all_gather_into_tensor", "allgather_fn", "all_gather", "all_gather_base", "all_gather_coalesced")


def count_all_gathers() -> dict[str, int]:
    """Wrap deepspeed.comm's all-gather entry points: ZeRO-3's parameter fetches call them as ``dist.NAME``
    (deepspeed/runtime/zero/partition_parameters.py), looked up on the package at call time."""
    import deepspeed.comm as dscomm

    counts = {"n": 0}
    for name in GATHERS:
        real = getattr(dscomm, name, None)
        if real is None:
            continue

        def wrapped(*a, _real=real, **k):
            counts["n"] += 1
            return _real(*a, **k)

        setattr(dscomm, name, wrapped)
    return counts


def main() -> None:
    out, ds_json = Path(sys.argv[1]), sys.argv[2]
    cfg = make_config("tiny", {"runs_root": str(out / "runs"), "backend": "deepspeed", "zero_stage": 3,
                               "deepspeed_config": ds_json, "device": "cpu", "autocast": "none", "torch_threads": 1,
                               "zero3_gather_for_generation": "on", "max_new_tokens": 16, "lr": 1e-2,
                               "warmup_ratio": 0.0})
    dist = init_dist(cfg)
    # the config's task, scored by the share of the letter 'a' (varies within a group: the step has advantages)
    tr = Trainer(cfg, progress=False, dist=dist, task=dataclasses.replace(build_task(cfg), reward=letter_a_share))
    counts = count_all_gathers()
    res: dict = {"rank": dist.rank, "plan": tr.engine.gather_plan, "gather_set": tr.engine.gather is not None,
                 "param_tensors": len(list(tr.model.parameters()))}
    examples = tr.task.train[dist.rank * 2:(dist.rank + 1) * 2]
    prompts = format_prompts(tr.tok, examples, tr.task.system_prompt)
    gather = tr.engine.gather
    for name, g in (("per_layer", None), ("gathered", gather)):
        tr.engine.gather = g
        torch.manual_seed(1234 + dist.rank)
        before = counts["n"]
        ro = tr.engine.generate(prompts, group_size=4, max_new_tokens=cfg.max_new_tokens, temperature=1.0)
        res[name] = {"all_gathers": counts["n"] - before, "ids": ro.completion_ids.tolist(),
                     "mask": ro.completion_mask.tolist(), "logprobs": ro.behaviour_logprobs.tolist(),
                     "tokens": int(ro.completion_mask.sum())}
    tr.engine.gather = gather
    state0 = {k: v.clone() for k, v in tr.backend.trainable_state().items()}
    row = tr.step()
    state1 = tr.backend.trainable_state()
    res["advantage_std"] = row["advantage_std"]
    res["moved"] = max(float((state1[k] - v).abs().max()) for k, v in state0.items())
    tr.close()
    (out / f"rank_{dist.rank}.json").write_text(json.dumps(res))
    shutdown_dist()


if __name__ == "__main__":
    main()
