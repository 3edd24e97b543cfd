"""Reward shaping before advantages: DAPO's soft overlong penalty, and the KL penalty in the reward.

Both turn per-completion task rewards (N,) into the rewards the advantage estimator sees (N,).
Dimensions: N completions, T completion tokens; ``completion_mask`` (N, T) float {0, 1}.
"""

from __future__ import annotations

import torch

from rftlib.algo.kl import kl_penalty


def overlong_penalty(lengths: torch.Tensor, max_new_tokens: int, buffer_len: int,
                     factor: float = 1.0) -> torch.Tensor:
    """DAPO's soft overlong punishment (Yu et al. 2025, arXiv:2503.14476, eq. 13), times ``factor``.

    With L_max = max_new_tokens and L_cache = buffer_len, a completion of |y| tokens gets
        0                                   if |y| <= L_max - L_cache
        ((L_max - L_cache) - |y|) / L_cache  if L_max - L_cache < |y| <= L_max
    a linear ramp from 0 to -1 over the last buffer_len tokens before the cap (the paper's third case,
    -1 beyond L_max, is the ramp's end here: generation stops at L_max). verl's overlong_buffer
    multiplies it by overlong_penalty_factor, as ``factor`` does (DAPO: L_cache 4096, factor 1).

    lengths: (N,) completion token counts. Returns the (N,) penalty (<= 0) to add to the rewards.
    """
    if buffer_len < 1 or buffer_len > max_new_tokens:
        raise ValueError(f"buffer_len must be in [1, max_new_tokens={max_new_tokens}], got {buffer_len}")
    expected = max_new_tokens - buffer_len  # L_max - L_cache
    excess = (lengths.float() - expected).clamp(min=0.0)  # (N,)
    return -factor * excess / buffer_len  # (N,)


def kl_in_reward(rewards: torch.Tensor, kl: torch.Tensor, completion_mask: torch.Tensor,
                 beta: float) -> torch.Tensor:
    """Fold a per-token KL penalty into per-sequence rewards: r_i - beta * sum_t kl_it (valid tokens).

    OpenRLHF and verl (use_kl_in_reward) subtract beta * KL from the token-level reward; for an
    outcome reward the return of a completion is that sum, which is what a group-relative estimator
    then sees. Nothing here is differentiated, so the estimator only needs an unbiased value: k1
    (log pi_old - log pi_ref, OpenRLHF's and verl's default) or k3. kl comes from ``kl_tokens``.

    rewards: (N,); kl, completion_mask: (N, T). Returns (N,).
    """
    if kl.shape != completion_mask.shape or rewards.shape != kl.shape[:1]:
        raise ValueError(f"rewards {tuple(rewards.shape)} must be (N,) and kl {tuple(kl.shape)}, "
                         f"completion_mask {tuple(completion_mask.shape)} (N, T)")
    per_seq = torch.where(completion_mask > 0, kl, 0.0).sum(dim=-1)  # (N,)
    return rewards - beta * per_seq.detach()  # (N,)


def kl_tokens(estimator: str, logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token KL(pi || pi_ref) values for the reward (detached). (N, T) -> (N, T).

    ``logprobs`` are the sampling policy's (the rollout's behaviour/old logprobs), ``ref_logprobs``
    the reference model's, on the same tokens.
    """
    return kl_penalty(estimator, logprobs, ref_logprobs).detach()  # (N, T)
