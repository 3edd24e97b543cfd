"""The rollout-source seam (issue 40 item 1): the step's rollout comes from a named source
(rftlib.rollout.sources), and moving today's single-turn rollout there changed nothing.

The fingerprint's expected values were captured by running the trainer *before* the move (branch seam at
beec961, the 2-core development machine): a seeded tiny run of two steps, its per-step sampled token ids
(a digest of each rollout's completion ids), losses, rewards, grad norms, KL and a digest of every metrics
key that does not measure the machine. Exact equality: the move must not change a bit. Like
bench/metrics_fingerprint.py these are this machine's numbers (another CPU's kernels may round differently).
"""

from __future__ import annotations

import hashlib
import json

from toy_rewards import isdigit_share

MACHINE_KEYS = ("timing/", "memory/", "throughput/")


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def test_single_turn_source_keeps_the_trainer_bit_for_bit(tiny_dir, tiny_cfg, task_with):
    """tiny_dir first: building the tiny model draws from torch's RNG, so a run that builds it sees other
    LoRA initial weights than one that finds it cached; the values below are the cached model's."""
    from rftlib.train.loop import Trainer

    cfg = tiny_cfg(num_steps=2, save_steps=0, lr=3e-2, warmup_ratio=0.0, beta=0.04, seed=5)
    ids = []

    def hook(name, seconds, result):
        if name == "rollout":
            ids.append(_digest(result.items[0][0].completion_ids.tolist()))

    tr = Trainer(cfg, progress=False, task=task_with(cfg, isdigit_share), hooks=[hook])
    try:
        rows = [tr.step() for _ in range(2)]
    finally:
        tr.close()
    got = {"ids": ids, "loss": [r["loss"] for r in rows], "reward": [r["reward_mean"] for r in rows],
           "grad_norm": [r["grad_norm"] for r in rows], "kl": [r["kl"] for r in rows],
           "rows": _digest([{k: v for k, v in r.items() if not k.startswith(MACHINE_KEYS)} for r in rows])}
    assert got == {"ids": ["279e84b7f9b65d8f", "ed45dd6158d71728"],
                   "loss": [2.9802322387695312e-08, 0.0005896138027310371],
                   "reward": [0.10050252079963684, 0.07588035613298416],
                   "grad_norm": [0.25853201746940613, 0.3173140585422516],
                   "kl": [0.0, 0.015095632523298264], "rows": "5522a6ccab07e9c2"}
