"""The GRPO-family variants against verl's own implementations (verl.trainer.ppo.core_algos) on the
same random tensors: losses (value and gradient), advantage estimators, and the k3+ KL.

verl is not a dependency of rftlib (it pulls ray, vLLM-era pins, ...): these tests skip when it is
absent, as in CI. To run them, a separate venv with verl's core_algos importable:
    python3.11 -m venv /work/venv-peers && /work/venv-peers/bin/pip install torch==2.13.0 pytest
    /work/venv-peers/bin/pip install --no-deps verl
    /work/venv-peers/bin/pip install packaging numpy ray tensordict omegaconf transformers codetiming orjson
    PYTHONPATH=$PWD OMP_NUM_THREADS=1 /work/venv-peers/bin/python -m pytest -q tests/test_algo_peer_verl.py
(verl 0.9.1 was checked this way.)
"""

import numpy as np
import pytest
import torch

core = pytest.importorskip("verl.trainer.ppo.core_algos", reason="verl is not installed (peer comparison only)")
from verl.workers.config import ActorConfig  # noqa: E402

from rftlib.algo.advantages import compute_advantages  # noqa: E402
from rftlib.algo.kl import kl_penalty  # noqa: E402
from rftlib.algo.losses import grpo_loss  # noqa: E402

N, T = 6, 7


def _batch(seed=0, scale=0.3):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(N, T, generator=g) * 3  # (N, T) old logprobs
    logp = (old + scale * torch.randn(N, T, generator=g)).clamp(max=0.0)  # (N, T)
    adv = torch.randn(N, generator=g)  # (N,)
    lengths = torch.tensor([7, 5, 3, 6, 1, 4])
    mask = (torch.arange(T) < lengths.unsqueeze(-1)).float()  # (N, T), no empty row
    return logp, old, adv, mask


def _actor(low, high):
    return ActorConfig(strategy="fsdp", clip_ratio=0.2, clip_ratio_low=low, clip_ratio_high=high,
                       ppo_micro_batch_size_per_gpu=1, rollout_n=1)


def _both(name, verl_name, low, high, agg, scale):
    logp, old, adv, mask = _batch(scale=scale)
    a = logp.clone().requires_grad_()
    ours, _ = grpo_loss(a, old, adv, mask, policy_loss=name, aggregation=agg, clip_low=low, clip_high=high)
    (g_ours,) = torch.autograd.grad(ours, a)
    b = logp.clone().requires_grad_()
    theirs, _ = core.get_policy_loss_fn(verl_name)(old_log_prob=old, log_prob=b, advantages=adv.unsqueeze(-1).expand(N, T),
                                                   response_mask=mask, loss_agg_mode=agg, config=_actor(low, high))
    (g_theirs,) = torch.autograd.grad(theirs, b)
    return ours, theirs, g_ours, g_theirs


@pytest.mark.parametrize("name, verl_name, low, high, agg, scale", [
    ("gspo", "gspo", 3e-4, 4e-4, "seq-mean-token-mean", 1e-3),  # ratios around the narrow range: some clipped
    ("gspo", "gspo", 0.2, 0.2, "token-mean", 0.3),
    ("cispo", "cispo", 1.0, 0.28, "token-mean", 0.3),
    ("cispo", "cispo", 0.2, 0.28, "seq-mean-token-mean", 0.3),
    ("gmpo", "geo_mean", 0.4, 0.4, "seq-mean-token-mean", 0.3),
])
def test_policy_loss_matches_verl(name, verl_name, low, high, agg, scale):
    ours, theirs, g_ours, g_theirs = _both(name, verl_name, low, high, agg, scale)
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(g_ours, g_theirs, atol=1e-6, rtol=1e-5)
    assert g_ours.abs().sum() > 0


def test_gspo_example_clips_some_sequences():
    # the narrow-range case above is not vacuous: some completions are clipped, some are not
    logp, old, adv, mask = _batch(scale=1e-3)
    _, m = grpo_loss(logp, old, adv, mask, policy_loss="gspo", clip_low=3e-4, clip_high=4e-4)
    assert 0 < float(m["seq_clip_frac"]) < 1


def _index(B, G):
    return np.array([f"p{i}" for i in range(B) for _ in range(G)], dtype=object)


@pytest.mark.parametrize("ours_name, verl_fn", [
    ("rloo", "compute_rloo_outcome_advantage"),
    ("reinforce_pp_baseline", "compute_reinforce_plus_plus_baseline_outcome_advantage"),
])
def test_advantages_match_verl(ours_name, verl_fn):
    # one token per completion: verl's token-level whitening (REINFORCE++) is then per completion, as ours
    B, G = 5, 4
    r = torch.randint(0, 3, (B * G,), generator=torch.Generator().manual_seed(1)).float()  # (N,)
    ours = compute_advantages(ours_name, r, G)
    theirs, _ = getattr(core, verl_fn)(token_level_rewards=r.unsqueeze(-1).clone(), response_mask=torch.ones(B * G, 1),
                                       index=_index(B, G))
    torch.testing.assert_close(ours, theirs[:, 0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name, verl_name", [("k3+", "k3+"), ("k3", "low_var_kl"), ("k1", "k1"), ("k2", "k2")])
def test_kl_estimators_match_verl(name, verl_name):
    logp, old, _, _ = _batch(scale=0.5)
    a, b = logp.clone().requires_grad_(), logp.clone().requires_grad_()
    ours = kl_penalty(name, a, old)
    theirs = core.kl_penalty(b, old, verl_name)
    torch.testing.assert_close(ours, theirs)
    (ga,) = torch.autograd.grad(ours.sum(), a)
    (gb,) = torch.autograd.grad(theirs.sum(), b)
    torch.testing.assert_close(ga, gb)


def test_kl_in_reward_matches_verl_token_rewards():
    from rftlib.algo.shaping import kl_in_reward

    logp, ref, _, mask = _batch(scale=0.5)
    r = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.5])
    # verl: token-level scores (the outcome at the last valid token) minus kl_ratio x (old - ref) per token;
    # an outcome estimator then sums the token rewards over the completion
    scores = torch.zeros(N, T)
    scores[torch.arange(N), mask.sum(-1).long() - 1] = r
    theirs = (core.compute_rewards(scores, logp, ref, 0.1) * mask).sum(-1)
    torch.testing.assert_close(kl_in_reward(r, logp - ref, mask, 0.1), theirs)
