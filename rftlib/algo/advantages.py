"""Group-relative advantage estimators: one scalar advantage per completion, no value network.

Dimensions: B prompts, G = ``group_size`` generations per prompt, N = B*G rows, prompt-major
(rows i*G .. i*G+G-1 are the G completions of prompt i). Each completion's reward is compared
with the other completions of the same prompt; that group baseline replaces PPO's critic.
"""

from __future__ import annotations

import torch

from rftlib.algo.registry import Registry

ADVANTAGES = Registry("advantage estimator")


def _grouped(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """View (N,) rewards as (B, G), checking that N splits into whole groups."""
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D (N,), got shape {tuple(rewards.shape)}")
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    n = rewards.shape[0]
    if n % group_size != 0:
        raise ValueError(
            f"number of rewards N={n} is not a multiple of group_size G={group_size}; "
            "rows must be prompt-major groups of G completions"
        )
    if not rewards.is_floating_point():
        rewards = rewards.float()  # integer 0/1 rewards are common; the mean needs a float
    return rewards.view(-1, group_size)  # (B, G)


@ADVANTAGES.register("grpo")
def grpo_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """GRPO outcome advantage (DeepSeekMath, Shao et al. 2024, sec. 4.1.2): (r - mean_g) / (std_g + eps).

    ``std_g`` is the *sample* standard deviation of the group (Bessel's correction, divide by G-1),
    as DeepSeekMath's reference code and trl do; with G=4 and rewards [1,0,0,1] it is sqrt(1/3),
    not 0.5. A group of identical rewards has mean-centred rewards of exactly 0, so its advantages
    are 0 whatever the std (the ``eps`` keeps 0/0 away). G=1 is rejected: the sample std of one
    value is undefined, and a lone completion has no group to be compared with.

    rewards: (N,). Returns (N,).
    """
    if group_size < 2:
        raise ValueError(f"grpo advantages need at least 2 generations per prompt, got group_size={group_size}")
    grouped = _grouped(rewards, group_size)  # (B, G)
    mean = grouped.mean(dim=1, keepdim=True)  # (B, 1)
    std = grouped.std(dim=1, correction=1, keepdim=True)  # (B, 1) sample std
    return ((grouped - mean) / (std + eps)).reshape(-1)  # (N,)


@ADVANTAGES.register("dr_grpo")
def dr_grpo_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """Dr-GRPO advantage ("Understanding R1-Zero-Like Training", Liu et al. 2025): r - mean_g.

    Dividing by the group std weights prompts that are nearly all-right or all-wrong (small std)
    more heavily -- a question-difficulty bias; Dr-GRPO drops the division. ``eps`` is accepted
    only so every estimator shares one signature; it is unused here.

    rewards: (N,). Returns (N,).
    """
    grouped = _grouped(rewards, group_size)  # (B, G)
    return (grouped - grouped.mean(dim=1, keepdim=True)).reshape(-1)  # (N,)


def compute_advantages(name: str, rewards: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """Look up the estimator ``name`` in ADVANTAGES and apply it. rewards: (N,). Returns (N,)."""
    estimator = ADVANTAGES.get(name)
    _grouped(rewards, group_size)  # same N % G check for every estimator, before any math
    return estimator(rewards, group_size, eps=eps)


def advantage_stats(adv: torch.Tensor) -> dict[str, torch.Tensor]:
    """Detached 0-dim summaries of an (N,) advantage tensor, for logging.

    The std here is the population std (correction=0): it is a description of the batch, and it
    stays finite for N=1.
    """
    adv = adv.detach()
    return {
        "advantage_mean": adv.mean(),
        "advantage_std": adv.std(correction=0),
        "advantage_min": adv.min(),
        "advantage_max": adv.max(),
    }
