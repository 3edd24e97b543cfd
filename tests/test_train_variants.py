"""The GRPO-family settings reach the trainer's step: the loss each policy_loss names with its own
clip range, dynamic sampling (refill and mask), overlong masking and KL in the reward.

Rewards here are chosen so that the variant has something to act on: half the prompts get one
reward for all their completions (a constant group), the others a reward the tiny model's
completions vary in (the share of digit characters).
"""

import pytest
import torch

import rftlib.train.loop as loop
from toy_rewards import half_constant_reward


def _spy(monkeypatch, name):
    seen = []
    real = getattr(loop, name)

    def spy(*a, **kw):
        seen.append((a, kw))
        return real(*a, **kw)

    monkeypatch.setattr(loop, name, spy)
    return seen


def _groups_constant(rewards, G):
    return (rewards.view(-1, G) == rewards.view(-1, G)[:, :1]).all(1)  # (B,)


def test_refill_fills_the_batch_with_informative_groups(tiny_cfg, monkeypatch, task_with):
    adv_calls = _spy(monkeypatch, "compute_advantages")
    cfg = tiny_cfg(dynamic_sampling="refill", dynamic_sampling_max_rounds=6, rollout_batch_size=4)
    tr = loop.Trainer(cfg, progress=False, task=task_with(cfg, half_constant_reward))
    row = tr.step()
    tr.close()
    rewards = adv_calls[-1][0][1]  # (N,) what the advantages saw
    assert rewards.shape == (16,)
    assert not _groups_constant(rewards, 4).any()  # every group of the batch carries signal
    assert row["dyn/filled"] == 1.0 and row["dyn/constant_group_frac"] > 0 and row["dyn/extra_rollouts"] > 0


# every row in order through the loss (the skip would leave these rows out of it altogether)
NO_SKIP = dict(skip_zero_advantage_rows=False, sort_micro_batches_by_length=False)


def test_mask_keeps_constant_groups_out_of_the_loss(tiny_cfg, monkeypatch, task_with):
    loss_calls = _spy(monkeypatch, "grpo_loss")
    adv_calls = _spy(monkeypatch, "compute_advantages")
    cfg = tiny_cfg(dynamic_sampling="mask", **NO_SKIP)
    tr = loop.Trainer(cfg, progress=False, task=task_with(cfg, half_constant_reward))
    row = tr.step()
    tr.close()
    const = _groups_constant(adv_calls[-1][0][1], 4)  # (B,)
    assert const.any() and not const.all(), "the fixture must give both kinds of group"
    mask = torch.cat([a[3] for a, _ in loss_calls])  # (N, T) the loss's masks, micro-batches in order
    row_in_loss = mask.sum(-1) > 0  # (N,)
    assert torch.equal(row_in_loss.view(-1, 4).any(1), ~const)
    assert row["dyn/masked_group_frac"] == pytest.approx(float(const.float().mean()))


def test_truncated_completions_leave_the_loss(tiny_cfg, monkeypatch, task_with):
    loss_calls = _spy(monkeypatch, "grpo_loss")
    cfg = tiny_cfg(mask_truncated_completions=True, max_new_tokens=4, **NO_SKIP)
    tr = loop.Trainer(cfg, progress=False, task=task_with(cfg, half_constant_reward))
    orig = tr.engine.generate
    truncs = []

    def gen(*a, **kw):
        ro = orig(*a, **kw)
        truncs.append(ro.truncated.clone())
        return ro

    tr.engine.generate = gen
    tr.step()
    tr.close()
    trunc = truncs[0]
    assert trunc.any()  # 4 tokens: most completions are cut
    mask = torch.cat([a[3] for a, _ in loss_calls])  # (N, T)
    assert torch.equal(mask.sum(-1) == 0, trunc)


@pytest.mark.parametrize("loss,field,value", [("gspo", "gspo_eps_clip", 3e-4), ("cispo", "cispo_eps_clip_high", 0.28),
                                              ("gmpo", "gmpo_eps_clip", 0.4)])
def test_each_policy_loss_trains_through_the_trainer_with_its_own_clip(tiny_cfg, monkeypatch, task_with, loss, field,
                                                                      value):
    loss_calls = _spy(monkeypatch, "grpo_loss")
    cfg = tiny_cfg(policy_loss=loss, lr=1e-2, warmup_ratio=0.0)
    tr = loop.Trainer(cfg, progress=False, task=task_with(cfg, half_constant_reward))
    before = {k: v.detach().clone() for k, v in tr.model.named_parameters() if v.requires_grad}
    row = tr.step()
    tr.close()
    assert {kw["policy_loss"] for _, kw in loss_calls} == {loss}
    assert value in (row["eps_clip_low"], row["eps_clip_high"])  # its own clip range, not eps_clip's
    assert row["grad_norm"] > 0
    assert any(not torch.equal(before[k], v) for k, v in tr.model.named_parameters() if v.requires_grad)


def test_kl_in_reward_moves_the_rewards_and_leaves_beta_out_of_the_loss(tiny_cfg, monkeypatch, task_with):
    loss_calls = _spy(monkeypatch, "grpo_loss")
    cfg = tiny_cfg(kl_in_reward=True, beta=0.5, kl_estimator="k1", num_steps=2, lr=5e-2)
    tr = loop.Trainer(cfg, progress=False, task=task_with(cfg, half_constant_reward))
    tr.step()
    row = tr.step()  # the adapter has moved: the policy differs from the reference
    tr.close()
    assert {kw["beta"] for _, kw in loss_calls} == {0.0}
    assert row["kl_reward_penalty_mean"] != 0.0
