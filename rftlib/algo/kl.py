"""Per-token estimators of KL(pi || pi_ref) from tokens sampled by pi.

From John Schulman, "Approximating KL Divergence" (2020, joschu.net/blog/kl-approx.html). With
d = ref_logp - logp = log(pi_ref / pi) at a sampled token:
    k1 = -d                  unbiased, high variance, can be negative per token
    k2 = d^2 / 2             biased, low variance, >= 0
    k3 = (e^d - 1) - d       unbiased, low variance, >= 0 (what DeepSeekMath's GRPO uses)
Shapes: logprobs and ref_logprobs are (N, T) log-probabilities of the sampled tokens; every
estimator returns (N, T). Masking padded tokens is the caller's job (aggregation).
"""

from __future__ import annotations

import torch

from rftlib.algo.registry import Registry

KL_ESTIMATORS = Registry("kl estimator")

K3_LOG_RATIO_CLAMP = 20.0  # e^20 ~ 5e8: far beyond any useful ratio, far below float32 overflow (e^88)


@KL_ESTIMATORS.register("k1")
def kl_k1(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k1 = logp - ref_logp (the naive log-ratio). (N, T) -> (N, T)."""
    return logprobs - ref_logprobs  # (N, T)


@KL_ESTIMATORS.register("k2")
def kl_k2(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k2 = (logp - ref_logp)^2 / 2. (N, T) -> (N, T)."""
    return 0.5 * (logprobs - ref_logprobs).square()  # (N, T)


@KL_ESTIMATORS.register("k3")
def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k3 = exp(ref_logp - logp) - (ref_logp - logp) - 1. (N, T) -> (N, T).

    The log-ratio is clamped to [-20, 20] before exp: a token the reference finds far likelier
    than the policy would otherwise give exp(large) = inf in float32 and a NaN gradient; beyond
    the clamp the estimate (and its gradient) stops growing. ``expm1`` keeps precision near d=0.
    """
    d = (ref_logprobs - logprobs).clamp(-K3_LOG_RATIO_CLAMP, K3_LOG_RATIO_CLAMP)  # (N, T)
    return torch.expm1(d) - d  # (N, T)


def kl_penalty(name: str, logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Look up the estimator ``name`` in KL_ESTIMATORS and apply it. (N, T) -> (N, T)."""
    if logprobs.shape != ref_logprobs.shape:
        raise ValueError(f"logprobs {tuple(logprobs.shape)} and ref_logprobs {tuple(ref_logprobs.shape)} differ in shape")
    return KL_ESTIMATORS.get(name)(logprobs, ref_logprobs)
