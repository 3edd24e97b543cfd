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


def test_tokens_outside_the_model_mask_get_no_gradient_and_are_not_counted(tiny_cfg):
    """A hand-built rollout of one group (G = 2) whose row 0 holds an environment span (completion tokens 1-2: real
    tokens the model attends to, model_mask 0). The trainer's loss mask is the model mask, so with token-mean
    aggregation the loss's denominator is the 6 model tokens (3 + 3), not the 8 completion tokens.

    By hand: rewards (1, 0) -> GRPO advantages +-a, a = 0.5 / (std(1, 0) + 1e-6), std unbiased = sqrt(0.5). On-policy
    ppo_clip (ratio exp(logp - logp.detach()) = 1, inside the clip) gives the loss -(1/6) sum A_i ratio_it over model
    tokens, so d loss / d logp_it = -A_i / 6 on each model token and exactly 0 on the span and the padding.
    Counting the span would give -a/8 (and -a/8 on the span itself)."""
    import math

    import torch

    from rftlib.rollout.base import Rollout
    from rftlib.train import steps
    from rftlib.train.loop import Trainer

    cfg = tiny_cfg(n_samples_per_prompt=2, rollout_batch_size=1, micro_batch_size=2,
                   loss_agg_mode="token-mean", beta=0.0)
    tr = Trainer(cfg, progress=False)
    try:
        ro = Rollout(prompt_ids=torch.tensor([[5, 6], [5, 6]]), prompt_mask=torch.ones(2, 2),
                     completion_ids=torch.tensor([[7, 8, 9, 10, 11], [12, 13, 14, 0, 0]]),
                     completion_mask=torch.tensor([[1., 1, 1, 1, 1], [1, 1, 1, 0, 0]]),
                     behaviour_logprobs=torch.zeros(2, 5), truncated=torch.tensor([False, False]),
                     texts=["a", "b"], group_size=2, model_mask=torch.tensor([[1., 0, 0, 1, 1], [1, 1, 1, 0, 0]]))
        adv = tr.advantages(steps.Groups([(ro, 0, tr.task.train[0], 0, [{}, {}])], torch.tensor([1.0, 0.0])))
        a = 0.5 / (math.sqrt(0.5) + 1e-6)
        assert adv.advantages.tolist() == [float(torch.tensor(a)), float(torch.tensor(-a))]
        num_seqs, num_tokens = steps.loss_totals(cfg, adv.loss_mask)
        assert float(num_tokens) == 6.0
        totals = dict(num_seqs=num_seqs, num_tokens=num_tokens, norm_const=float(cfg.max_new_tokens))
        fwd, loss, _, _ = tr.micro_loss(adv, adv.advantages, torch.arange(2), epoch=0, totals=totals,
                                        loss_kw=steps.loss_kwargs(cfg))
        (grad,) = torch.autograd.grad(loss, fwd.logprobs)  # (2, 5)
    finally:
        tr.close()
    want = torch.tensor([[-a, 0, 0, -a, -a], [a, a, a, 0, 0]]) / 6
    # float32 on the order of a/6 ~ 0.12: the loss's few float32 ops round at ~1e-8 each; 1e-6 bounds them
    assert torch.allclose(grad, want, rtol=0, atol=1e-6), grad
    assert grad[0, 1:3].eq(0).all()  # the environment span: exactly zero, by the mask, not by rounding
