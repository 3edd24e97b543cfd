"""Advantage estimators and the name registry, against hand-computed values."""

import pytest
import torch

from rftlib.algo.advantages import ADVANTAGES, advantage_stats, compute_advantages
from rftlib.algo.registry import Registry

# Two prompts (B=2), G=4 completions each: prompt 0 half right, prompt 1 all right.
REWARDS = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])  # (N,) = (8,)


def test_grpo_hand_computed():
    # prompt 0: mean 0.5, deviations +-0.5, sample var = 4 * 0.25 / (4 - 1) = 1/3, std = 0.577350
    #   -> +-0.5 / 0.577350 = +-0.866025
    # prompt 1: identical rewards -> deviations 0 -> advantages 0
    adv = compute_advantages("grpo", REWARDS, group_size=4)
    expected = torch.tensor([0.866025, -0.866025, -0.866025, 0.866025, 0.0, 0.0, 0.0, 0.0])
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=0)


def test_grpo_asymmetric_group():
    # rewards [0, 0, 0, 1]: mean 0.25, deviations [-0.25]*3 + [0.75]
    # sample var = (3 * 0.0625 + 0.5625) / 3 = 0.25, std = 0.5 -> [-0.5, -0.5, -0.5, 1.5]
    adv = compute_advantages("grpo", torch.tensor([0.0, 0.0, 0.0, 1.0]), group_size=4)
    torch.testing.assert_close(adv, torch.tensor([-0.5, -0.5, -0.5, 1.5]), atol=1e-5, rtol=0)


def test_dr_grpo_no_std_division():
    # r - group mean: prompt 0 mean 0.5 -> [0.5, -0.5, -0.5, 0.5]; prompt 1 mean 1 -> zeros
    adv = compute_advantages("dr_grpo", REWARDS, group_size=4)
    torch.testing.assert_close(adv, torch.tensor([0.5, -0.5, -0.5, 0.5, 0.0, 0.0, 0.0, 0.0]))


@pytest.mark.parametrize("name", ["grpo", "dr_grpo"])
def test_identical_rewards_give_zero(name):
    adv = compute_advantages(name, torch.full((6,), 0.7), group_size=3)
    assert torch.equal(adv, torch.zeros(6))


@pytest.mark.parametrize("name", ["grpo", "dr_grpo"])
def test_integer_rewards_accepted(name):
    adv = compute_advantages(name, torch.tensor([1, 0, 0, 1]), group_size=2)
    assert adv.dtype == torch.float32
    # groups [1, 0] and [0, 1]: centred +-0.5; grpo std = sqrt(0.5) -> +-0.707107
    scale = 1.0 if name == "dr_grpo" else 1 / 0.5**0.5
    torch.testing.assert_close(adv, torch.tensor([0.5, -0.5, -0.5, 0.5]) * scale, atol=1e-5, rtol=0)


def test_groups_are_prompt_major():
    # rows 0,1 are prompt 0 and rows 2,3 prompt 1: [0, 2 | 10, 10] -> [-1, 1 | 0, 0]
    adv = compute_advantages("dr_grpo", torch.tensor([0.0, 2.0, 10.0, 10.0]), group_size=2)
    torch.testing.assert_close(adv, torch.tensor([-1.0, 1.0, 0.0, 0.0]))


def test_bad_group_size_names_both_numbers():
    with pytest.raises(ValueError, match=r"N=7.*G=4"):
        compute_advantages("grpo", torch.zeros(7), group_size=4)


def test_grpo_rejects_single_generation():
    with pytest.raises(ValueError, match="at least 2 generations"):
        compute_advantages("grpo", torch.zeros(4), group_size=1)


def test_unknown_estimator_lists_valid_names():
    with pytest.raises(ValueError, match=r"unknown advantage estimator 'ppo'; valid: dr_grpo, grpo"):
        compute_advantages("ppo", REWARDS, group_size=4)


def test_advantage_stats():
    # [0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0]: mean 0, population var = 4 * 0.25 / 8 = 0.125
    adv = torch.tensor([0.5, -0.5, -0.5, 0.5, 0.0, 0.0, 0.0, 0.0], requires_grad=True)
    stats = advantage_stats(adv)
    assert set(stats) == {"advantage_mean", "advantage_std", "advantage_min", "advantage_max"}
    for v in stats.values():
        assert isinstance(v, torch.Tensor) and v.dim() == 0 and not v.requires_grad
    torch.testing.assert_close(stats["advantage_mean"], torch.tensor(0.0))
    torch.testing.assert_close(stats["advantage_std"], torch.tensor(0.125**0.5))
    torch.testing.assert_close(stats["advantage_min"], torch.tensor(-0.5))
    torch.testing.assert_close(stats["advantage_max"], torch.tensor(0.5))


def test_registry():
    reg = Registry("widget")

    @reg.register("b")
    def b():
        return "b"

    reg.register("a")(lambda: "a")
    assert reg.names() == ["a", "b"]
    assert "a" in reg and "c" not in reg
    assert reg.get("b") is b
    with pytest.raises(ValueError, match=r"^unknown widget 'c'; valid: a, b$"):
        reg.get("c")
    with pytest.raises(ValueError, match="already registered"):
        reg.register("a")(lambda: None)
    assert ADVANTAGES.names() == ["dr_grpo", "grpo", "reinforce_pp_baseline", "rloo"]
