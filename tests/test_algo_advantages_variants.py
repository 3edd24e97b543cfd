"""RLOO, REINFORCE++-baseline and TRL's scale_rewards against hand-computed values.

verl's implementations on the same tensors: test_algo_peer_verl.py.
"""

import math

import pytest
import torch

from rftlib.algo.advantages import REWARD_SCALES, compute_advantages

# Two prompts (B=2), G=4: prompt 0 half right, prompt 1 all right.
REWARDS = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])  # (8,)


def test_rloo_by_hand():
    # prompt 0: sum 2. Row 0: others' mean (2 - 1) / 3 = 1/3 -> 1 - 1/3 = 2/3; row 1: (2 - 0) / 3 -> -2/3
    # prompt 1: all equal -> 0
    adv = compute_advantages("rloo", REWARDS, group_size=4)
    torch.testing.assert_close(adv, torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3, 0.0, 0.0, 0.0, 0.0]))
    # [0, 0, 0, 1]: rows 0-2 others' mean 1/3 -> -1/3; row 3 others' mean 0 -> 1
    adv = compute_advantages("rloo", torch.tensor([0.0, 0.0, 0.0, 1.0]), group_size=4)
    torch.testing.assert_close(adv, torch.tensor([-1 / 3, -1 / 3, -1 / 3, 1.0]))


def test_rloo_is_g_over_g_minus_1_times_dr_grpo():
    # G=2: A = 2 (r - mean); [3, 1] -> mean 2 -> [2, -2]
    torch.testing.assert_close(compute_advantages("rloo", torch.tensor([3.0, 1.0]), 2), torch.tensor([2.0, -2.0]))


def test_reinforce_pp_baseline_by_hand():
    # group-centred x = [0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0]; batch mean 0;
    # sample var = 4 * 0.25 / 7 = 1/7, std = 0.377964 -> +-0.5 / 0.377964 = +-1.322876
    adv = compute_advantages("reinforce_pp_baseline", REWARDS, group_size=4)
    a = 0.5 / math.sqrt(1 / 7)
    torch.testing.assert_close(adv, torch.tensor([a, -a, -a, a, 0.0, 0.0, 0.0, 0.0]), atol=1e-5, rtol=0)


def test_reinforce_pp_baseline_uses_batch_not_group_std():
    # prompt 0 [0, 2] (x = [-1, 1]), prompt 1 [0, 0.2] (x = [-0.1, 0.1]). GRPO would give both groups
    # +-0.707 (each divided by its own std); the batch std keeps their scale apart:
    # x = [-1, 1, -0.1, 0.1], mean 0, sample var = (1 + 1 + 0.01 + 0.01) / 3 = 0.673333, std = 0.820569
    adv = compute_advantages("reinforce_pp_baseline", torch.tensor([0.0, 2.0, 0.0, 0.2]), group_size=2)
    s = math.sqrt(2.02 / 3)
    torch.testing.assert_close(adv, torch.tensor([-1 / s, 1 / s, -0.1 / s, 0.1 / s]), atol=1e-5, rtol=0)


def test_scale_rewards_batch_by_hand():
    # centred [0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0]; the std of all 8 raw rewards (TRL: rewards.std()):
    # mean 0.75, squares 6 * 0.0625 + 2 * 0.5625 = 1.5, / 7 = 0.214286, std = 0.462910 -> +-1.080123
    adv = compute_advantages("grpo", REWARDS, group_size=4, scale_rewards="batch")
    a = 0.5 / math.sqrt(1.5 / 7)
    torch.testing.assert_close(adv, torch.tensor([a, -a, -a, a, 0.0, 0.0, 0.0, 0.0]), atol=1e-5, rtol=0)


def test_scale_rewards_group_and_none():
    # grpo with none = r - mean: [0.5, -0.5, -0.5, 0.5, 0...]; dr_grpo with group = GRPO's +-0.866025
    half = torch.tensor([0.5, -0.5, -0.5, 0.5, 0.0, 0.0, 0.0, 0.0])
    torch.testing.assert_close(compute_advantages("grpo", REWARDS, 4, scale_rewards="none"), half)
    g = 0.5 / math.sqrt(1 / 3)
    torch.testing.assert_close(compute_advantages("dr_grpo", REWARDS, 4, scale_rewards="group"),
                               torch.tensor([g, -g, -g, g, 0.0, 0.0, 0.0, 0.0]), atol=1e-5, rtol=0)
    assert REWARD_SCALES.names() == ["batch", "group", "none"]


def test_scale_rewards_refused_by_estimators_with_their_own():
    with pytest.raises(ValueError, match="'rloo' has its own scaling; scale_rewards applies to dr_grpo, grpo"):
        compute_advantages("rloo", REWARDS, 4, scale_rewards="batch")
    with pytest.raises(ValueError, match="unknown reward scaling 'global'; valid: batch, group, none"):
        compute_advantages("grpo", REWARDS, 4, scale_rewards="global")


@pytest.mark.parametrize("name", ["rloo", "reinforce_pp_baseline"])
def test_new_estimators_need_groups(name):
    with pytest.raises(ValueError, match="at least 2 generations"):
        compute_advantages(name, torch.tensor([1.0, 0.0]), group_size=1)
    with pytest.raises(ValueError, match="not a multiple of group_size"):
        compute_advantages(name, torch.tensor([1.0, 0.0, 1.0]), group_size=2)
