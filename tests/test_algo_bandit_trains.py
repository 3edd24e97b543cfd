"""Every policy loss x advantage estimator trains: a sign error or a dropped gradient in any of them would stop a
policy from learning the one rewarded action of a 4-armed bandit.

A completion is T=3 tokens drawn from softmax(theta) (V=4); reward = fraction of its tokens equal to
2, so groups differ and advantages are non-zero. 8 prompts x G=8 per step, 2 PPO epochs per rollout
(the second is off-policy, so ratios move and clipping is exercised), Adam lr 0.1, 25 steps. pi(2)
starts at 0.25; the test asks for > 0.6 and for weights that changed. Seeded: deterministic.
"""

import pytest
import torch

from rftlib.algo.advantages import compute_advantages
from rftlib.algo.losses import grpo_loss

CLIPS = {"ppo_clip": (0.2, 0.2), "gspo": (3e-4, 4e-4), "cispo": (1.0, 0.28), "gmpo": (0.4, 0.4)}


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "rloo", "reinforce_pp_baseline"])
@pytest.mark.parametrize("loss_name", ["ppo_clip", "gspo", "cispo", "gmpo"])
def test_bandit_learns_the_rewarded_arm(loss_name, estimator):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    theta = torch.zeros(4, requires_grad=True)  # (V,) pi = uniform
    opt = torch.optim.Adam([theta], lr=0.1)
    B, G, T = 8, 8, 3
    low, high = CLIPS[loss_name]
    for _ in range(25):
        with torch.no_grad():
            tokens = torch.multinomial(torch.softmax(theta, 0), B * G * T, replacement=True, generator=g).view(B * G, T)
        rewards = (tokens == 2).float().mean(-1)  # (N,)
        adv = compute_advantages(estimator, rewards, G)  # (N,)
        old = None
        for _epoch in range(2):
            logp = torch.log_softmax(theta, 0)[tokens]  # (N, T)
            old = logp.detach() if old is None else old
            loss, _ = grpo_loss(logp, old, adv, torch.ones(B * G, T), policy_loss=loss_name, clip_low=low,
                                clip_high=high)
            opt.zero_grad()
            loss.backward()
            opt.step()
    p2 = float(torch.softmax(theta.detach(), 0)[2])
    print(f"{loss_name} x {estimator}: pi(2) = {p2:.3f}")
    assert p2 > 0.6, f"{loss_name} x {estimator}: pi(rewarded arm) = {p2:.3f} after 25 steps (start 0.25)"
