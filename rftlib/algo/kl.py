"""Per-token estimators of KL(pi || pi_ref) from tokens sampled by pi, and which of them may sit in a loss.

From John Schulman, "Approximating KL Divergence" (2020, joschu.net/blog/kl-approx.html). With
d = ref_logp - logp = log(pi_ref / pi) at a sampled token:
    k1 = -d                  unbiased value, high variance, can be negative per token
    k2 = d^2 / 2             biased value, low variance, >= 0
    k3 = (e^d - 1) - d       unbiased value, low variance, >= 0 (what DeepSeekMath's GRPO uses);
                             capped at 10 as verl caps it, which bounds its gradient (kl_k3)
    k3+ = k3's value with k2's gradient (straight-through; verl's "k3+" / "low_var_kl+")

Their *values* estimate KL(pi || pi_ref) (the reverse KL). Their *gradients*, when the estimator is
a loss term on tokens sampled from pi (the sample is not differentiated), are another matter. Per
sampled token y, d/d(logp) of each estimator times grad log pi(y), in expectation over y ~ pi:
    k1: E[grad log pi]                       = 0                          (no regularisation at all)
    k2: E[(log pi - log pi_ref) grad log pi] = grad KL(pi || pi_ref)      (the reverse KL: right)
    k3: E[(1 - pi_ref/pi) grad log pi]       = -sum_y pi_ref grad log pi = grad KL(pi_ref || pi)
                                                                          (the forward KL)
    k3+: k2's gradient                       = grad KL(pi || pi_ref)
(tests/test_algo_kl_agg.py checks each against the closed form on a categorical example.) So k1
is refused as a loss term (KL_NOT_IN_LOSS says what to use instead); k1 or k3 belong in the reward
(shaping.kl_in_reward, where nothing is differentiated and an unbiased value is what counts).

Shapes: logprobs and ref_logprobs are (N, T) log-probabilities of the sampled tokens; every
estimator returns (N, T). Masking padded tokens is the caller's job (aggregation).
"""

from __future__ import annotations

import torch

from rftlib.algo.catalog import KL_ESTIMATORS, KL_NOT_IN_LOSS  # noqa: F401 (declared there)

K3_LOG_RATIO_CLAMP = 20.0  # e^20 ~ 5e8: far beyond any useful ratio, far below float32 overflow (e^88)
K3_VALUE_CLAMP = 10.0  # k3 capped here, as verl's low_var_kl does: bounds its gradient (see kl_k3)


def kl_k1(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k1 = logp - ref_logp (the naive log-ratio). (N, T) -> (N, T). For the reward, not the loss."""
    return logprobs - ref_logprobs  # (N, T)


def kl_k2(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k2 = (logp - ref_logp)^2 / 2. (N, T) -> (N, T). Its gradient is the reverse KL's."""
    return 0.5 * (logprobs - ref_logprobs).square()  # (N, T)


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k3 = exp(ref_logp - logp) - (ref_logp - logp) - 1, capped at 10. (N, T) -> (N, T).

    An unbiased, non-negative estimate of KL(pi || pi_ref); but as a loss term its expected
    gradient is that of the *forward* KL(pi_ref || pi) (module docstring). DeepSeekMath's GRPO uses
    it in the loss all the same; k3+ keeps its value and fixes the gradient.

    Two clamps, as verl's ``low_var_kl`` (volcengine/verl, core_algos.kl_penalty):
    - d = ref_logp - logp to [-20, 20] before exp, so exp(d) stays finite in float32;
    - the value to at most K3_VALUE_CLAMP = 10. d k3 / d logp = 1 - e^d grows without bound in d
      (-3.3e6 at d = 15: one token the policy has nearly dropped would own the whole update); under
      the cap |1 - e^d| <= e^d* - 1 = 12.6 where e^d* - d* - 1 = 10 (d* = 2.61, pi_ref/pi = 13.6) on
      the d > 0 side and < 1 on the d < 0 side (d > -11). Past the cap a token's KL term is constant:
      no gradient, like a PPO-clipped ratio.
    ``expm1`` keeps precision near d = 0.
    """
    d = (ref_logprobs - logprobs).clamp(-K3_LOG_RATIO_CLAMP, K3_LOG_RATIO_CLAMP)  # (N, T)
    return (torch.expm1(d) - d).clamp(max=K3_VALUE_CLAMP)  # (N, T)


def kl_k3_plus(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k3's value with k2's gradient: k2 - sg(k2) + sg(k3). (N, T) -> (N, T).

    Straight-through estimator (verl's "k3+"/"low_var_kl+", after Schulman's note that k2's gradient
    is the reverse KL's): the logged value is k3's low-variance unbiased estimate of KL(pi || pi_ref),
    and backward sees (logp - ref_logp) * grad logp, whose expectation under pi is grad KL(pi || pi_ref).
    """
    k2 = kl_k2(logprobs, ref_logprobs)  # (N, T)
    return k2 - k2.detach() + kl_k3(logprobs, ref_logprobs).detach()  # (N, T)


def kl_penalty(name: str, logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Look up the estimator ``name`` in KL_ESTIMATORS and apply it. (N, T) -> (N, T)."""
    if logprobs.shape != ref_logprobs.shape:
        raise ValueError(f"logprobs {tuple(logprobs.shape)} and ref_logprobs {tuple(ref_logprobs.shape)} differ in shape")
    return KL_ESTIMATORS.get(name)(logprobs, ref_logprobs)
