"""Group-relative advantage estimators: one scalar advantage per completion, no value network.

Dimensions: B prompts, G = ``group_size`` generations per prompt, N = B*G rows, prompt-major
(rows i*G .. i*G+G-1 are the G completions of prompt i). Each completion's reward is compared
with the other completions of the same prompt; that group baseline replaces PPO's critic.
"""

from __future__ import annotations

import torch

from rftlib.algo.catalog import ADVANTAGES, REWARD_SCALES, takes_scale_rewards  # noqa: F401 (declared there)


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


def scale_group(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Each group's sample std (Bessel, divide by G-1), repeated over its rows. (N,) -> (N,)."""
    grouped = _grouped(rewards, group_size)  # (B, G)
    return grouped.std(dim=1, correction=1, keepdim=True).expand_as(grouped).reshape(-1)  # (N,)


def scale_batch(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """The sample std of all N rewards of the batch, at every row (TRL's scale_rewards="batch",
    after "Tricks or Traps? A Deep Dive into RL for LLM Reasoning", Liu et al. 2025). (N,) -> (N,)."""
    flat = _grouped(rewards, group_size).reshape(-1)  # (N,)
    return flat.std(correction=1).expand_as(flat)  # (N,)


def scale_none(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """No scaling (Dr-GRPO): ones. (N,) -> (N,)."""
    return torch.ones_like(_grouped(rewards, group_size).reshape(-1))  # (N,)


def _group_centred(rewards: torch.Tensor, group_size: int, eps: float, scale_rewards: str) -> torch.Tensor:
    """(r - mean_g) / (scale + eps), the scale from REWARD_SCALES; "none" divides by nothing. (N,) -> (N,)."""
    scale_fn = REWARD_SCALES.get(scale_rewards)
    grouped = _grouped(rewards, group_size)  # (B, G)
    centred = (grouped - grouped.mean(dim=1, keepdim=True)).reshape(-1)  # (N,)
    if scale_fn is scale_none:
        return centred  # exactly r - mean, no eps
    return centred / (scale_fn(rewards, group_size) + eps)  # (N,)


def grpo_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-6,
                    scale_rewards: str = "group") -> torch.Tensor:
    """GRPO outcome advantage (DeepSeekMath, Shao et al. 2024, sec. 4.1.2): (r - mean_g) / (std_g + eps).

    ``std_g`` is the *sample* standard deviation of the group (Bessel's correction, divide by G-1),
    as DeepSeekMath's reference code and trl do; with G=4 and rewards [1,0,0,1] it is sqrt(1/3),
    not 0.5. A group of identical rewards has mean-centred rewards of exactly 0, so its advantages
    are 0 whatever the std (the ``eps`` keeps 0/0 away). G=1 is rejected: the sample std of one
    value is undefined, and a lone completion has no group to be compared with.

    ``scale_rewards`` (TRL's setting, a REWARD_SCALES name) picks the divisor: group (GRPO), batch
    (the std of the whole batch's rewards, TRL's "batch") or none (r - mean_g: Dr-GRPO).

    rewards: (N,). Returns (N,).
    """
    if group_size < 2:
        raise ValueError(f"grpo advantages need at least 2 generations per prompt, got group_size={group_size}")
    return _group_centred(rewards, group_size, eps, scale_rewards)  # (N,)


def dr_grpo_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-6,
                       scale_rewards: str = "none") -> torch.Tensor:
    """Dr-GRPO advantage ("Understanding R1-Zero-Like Training", Liu et al. 2025): r - mean_g.

    Dividing by the group std weights prompts that are nearly all-right or all-wrong (small std)
    more heavily -- a question-difficulty bias; Dr-GRPO drops the division. It is GRPO with
    scale_rewards "none"; another ``scale_rewards`` makes it GRPO with that scaling. ``eps`` is
    used only when a scale divides.

    rewards: (N,). Returns (N,).
    """
    return _group_centred(rewards, group_size, eps, scale_rewards)  # (N,)


def rloo_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """RLOO, REINFORCE Leave-One-Out (Kool et al. 2019; Ahmadian et al. 2024, arXiv:2402.14740, eq. 6).

    Each completion's baseline is the mean reward of the *other* G-1 completions of its prompt:
        A_i = r_i - (sum_j r_j - r_i) / (G - 1) = G / (G - 1) * (r_i - mean_g)
    an unbiased baseline (it does not depend on the completion it scores), where GRPO's group mean
    includes r_i itself. No std scaling. G=1 is rejected (no other completion to compare with);
    ``eps`` is unused (one signature for every estimator).

    rewards: (N,). Returns (N,).
    """
    if group_size < 2:
        raise ValueError(f"rloo advantages need at least 2 generations per prompt, got group_size={group_size}")
    grouped = _grouped(rewards, group_size)  # (B, G)
    others = (grouped.sum(dim=1, keepdim=True) - grouped) / (group_size - 1)  # (B, G) leave-one-out mean
    return (grouped - others).reshape(-1)  # (N,)


def reinforce_pp_baseline_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """REINFORCE++-baseline (Hu et al. 2025, "REINFORCE++", arXiv:2501.03262, sec. 3): the group mean
    as baseline, then normalisation over the whole batch:
        x_i = r_i - mean_g(r);   A_i = (x_i - mean_batch(x)) / (std_batch(x) + eps)
    The batch std (sample std, Bessel) replaces GRPO's per-group std, so an all-equal group neither
    gets a 0/0 nor inflates near-unanimous groups; its x_i = 0 becomes -mean_batch(x)/std (about 0,
    as mean_batch(x) = 0 exactly when every group is whole). Each completion weighs one in the batch
    statistics; verl and OpenRLHF whiten over *tokens* (a completion weighs its length), which is
    the same when all completions have one length.

    rewards: (N,). Returns (N,).
    """
    if group_size < 2:
        raise ValueError(f"reinforce_pp_baseline needs at least 2 generations per prompt, got group_size={group_size}")
    grouped = _grouped(rewards, group_size)  # (B, G)
    x = (grouped - grouped.mean(dim=1, keepdim=True)).reshape(-1)  # (N,)
    if x.numel() < 2:
        raise ValueError("reinforce_pp_baseline needs at least 2 completions in the batch for a batch std")
    return (x - x.mean()) / (x.std(correction=1) + eps)  # (N,)


def compute_advantages(name: str, rewards: torch.Tensor, group_size: int, eps: float = 1e-6,
                       scale_rewards: str | None = None) -> torch.Tensor:
    """Look up the estimator ``name`` in ADVANTAGES and apply it. rewards: (N,). Returns (N,).

    ``scale_rewards`` (a REWARD_SCALES name) is passed to estimators that take it (grpo, dr_grpo);
    None keeps the estimator's own. An estimator without the argument refuses any value.
    """
    estimator = ADVANTAGES.get(name)
    _grouped(rewards, group_size)  # same N % G check for every estimator, before any math
    if scale_rewards is None:
        return estimator(rewards, group_size, eps=eps)
    if not takes_scale_rewards(name):
        raise ValueError(f"advantage estimator '{name}' has its own scaling; scale_rewards applies to "
                         f"{', '.join(n for n in ADVANTAGES.names() if takes_scale_rewards(n))}")
    return estimator(rewards, group_size, eps=eps, scale_rewards=scale_rewards)


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
