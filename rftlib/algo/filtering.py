"""Which completions carry a learning signal: DAPO's dynamic-sampling test, overlong filtering, SimpleTIR's
void-turn filter.

Pure row selection; the refill loop that acts on it is rftlib/train/steps.py.
Dimensions: B prompts, G completions each, N = B*G rows prompt-major; T completion tokens.
"""

from __future__ import annotations

import torch


def constant_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """(B,) bool: True where all G rewards of a prompt are equal (DAPO, Yu et al. 2025, eq. 11).

    Such a group (all right or all wrong) has r - mean_g = 0 for every completion, so every
    group-relative advantage is 0: it adds nothing to the gradient but still dilutes the batch.
    Exact equality on purpose (rewards are the task's numbers, not noisy floats). rewards: (N,).
    """
    if rewards.dim() != 1 or group_size < 1 or rewards.shape[0] % group_size:
        raise ValueError(f"rewards must be (N,) with N a multiple of group_size={group_size}, "
                         f"got {tuple(rewards.shape)}")
    grouped = rewards.view(-1, group_size)  # (B, G)
    return (grouped == grouped[:, :1]).all(dim=1)  # (B,)


def group_row_mask(keep_groups: torch.Tensor, group_size: int) -> torch.Tensor:
    """(B,) bool groups to keep -> (N,) float {0, 1} row mask, each group's flag repeated G times."""
    return keep_groups.float().repeat_interleave(group_size)  # (N,)


def untruncated_mask(completion_mask: torch.Tensor, truncated: torch.Tensor) -> torch.Tensor:
    """DAPO's overlong filtering (Yu et al. 2025, sec. 3.4): completions cut off at max_new_tokens
    leave the loss (their reward judges an unfinished answer). TRL's mask_truncated_completions.

    completion_mask: (N, T) float; truncated: (N,) bool. Returns the (N, T) loss mask.
    """
    if truncated.shape != completion_mask.shape[:1]:
        raise ValueError(f"truncated {tuple(truncated.shape)} must be (N,) = ({completion_mask.shape[0]},)")
    return completion_mask * (~truncated.bool()).float().unsqueeze(-1)  # (N, T)


def void_turn_row_mask(void_turns: torch.Tensor) -> torch.Tensor:
    """SimpleTIR's trajectory filter (Xue et al. 2025, arXiv 2509.02479, sec. 3): a multi-turn trajectory with a void
    turn (neither a complete tool call nor a final answer) leaves the loss. void_turns: (N,) counts per row;
    returns the (N,) float {0, 1} row mask (1: kept)."""
    if void_turns.dim() != 1:
        raise ValueError(f"void_turns must be (N,), got {tuple(void_turns.shape)}")
    return (void_turns <= 0).float()  # (N,)
