"""Rollout/trainer mismatch correction: truncated importance sampling (TIS) weights.

When the rollout engine is not the trainer's own module (vLLM), the tokens were sampled from a
behaviour policy pi_b whose numerics (kernels, dtype, sampler) differ from the trainer's pi_old,
even with identical weights. The PPO ratio pi / pi_old then no longer corrects for where the data
came from, so the loss is reweighted per token by the importance ratio pi_old / pi_b, truncated at
a cap C so that a few tokens the engine found unlikely cannot dominate the gradient:

    w = min(exp(old_logprobs - behaviour_logprobs), C)                      (token level)
    w_i = min(exp(sum_t (old - behaviour)_it), C), the same for all of row i  (sequence level)

Asynchronous rollouts (``max_staleness`` k > 0, rftlib.train.pipeline) use the same two functions for the
decoupled PPO objective. Three policies are involved for the rows of step n: pi_theta, the weights being
optimised; pi_prox = the trainer's forward at the weights the update starts from (version n-1: the
``old_logprobs`` the trainer computes for every engine off its module); pi_b, the engine's sampling
distribution at the version v <= n-1 that generated the row (``behaviour_logprobs``, processed logprobs:
temperature and top-p applied). Per token t of row i, with advantage A_i and cap C = ``tis_cap``:

    r_it = exp(log pi_theta - log pi_prox)                       the PPO ratio, against the proximal policy
    w_it = min(exp(log pi_prox - log pi_b), C)                   stop-gradient (sequence level: the row's sum)
    l_it = w_it * max(-A_i r_it, -A_i clip(r_it, 1 - eps_low, 1 + eps_high))
    L    = agg(l) + beta KL(pi_theta || pi_ref) - c_H H          KL and entropy unweighted

Why it is right at any k: without the cap, E_{y~pi_b}[(pi_prox / pi_b) f(y)] = E_{y~pi_prox}[f(y)], so L is
PPO's surrogate on samples of pi_prox, and the trust region (the clip) is around the recent policy, not around
a behaviour policy k versions old (clipping against pi_b, as TRL's asynchronous trainer does, tightens with k
and mixes staleness into the clip fraction). The cap trades a bias for bounded variance. At k = 0, v = n-1 and
w corrects engine numerics only: today's TIS, the same tensors. ``mismatch_kl`` (k3 estimate of
KL(pi_b || pi_prox) on the sampled tokens, exp(d) - 1 - d with d = prox - b, >= 0) is the figure to watch when
choosing k: at lag 0 it is pure engine numerics, at lag >= 1 policy drift adds to it.
Sources: Hilton, Cobbe, Schulman 2022, "Batch size-invariance for policy optimization" (arXiv:2110.00641), the
decoupled PPO objective; Fu et al. 2025, "AReaL" (arXiv:2505.24298) sec. 5.2, and its
``areal/utils/functional/functional.py`` ppo_actor_loss_fn (behave_imp_weight = exp(proximal - behaviour),
clamp mode = our C).

Sources: Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training"
(the token-level TIS fix, C = 2); verl's rollout correction (``rollout_is`` token/sequence levels
and its mismatch metrics); TRL's GRPOConfig ``vllm_importance_sampling_correction``,
``vllm_importance_sampling_mode`` and ``vllm_importance_sampling_cap`` (default 2).

Dimensions: N completions, T completion tokens; ``mask`` is the (N, T) float {0,1} completion
mask. Pure: tensors in, tensors out, metrics are detached 0-dim tensors (no .item()).
"""

from __future__ import annotations

import math

import torch

from rftlib.algo.aggregation import masked_max, masked_mean

TIS_LEVELS = ("token", "sequence")


def tis_weights(
    old_logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    mask: torch.Tensor,
    *,
    cap: float = 2.0,  # C: the truncation (TRL vllm_importance_sampling_cap and Yao et al.: 2)
    level: str = "token",  # token | sequence (TRL vllm_importance_sampling_mode)
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Truncated IS weights (N, T), detached and 0 where masked, and the mismatch metrics.

    old_logprobs: (N, T) the trainer's log pi_old of the sampled tokens.
    behaviour_logprobs: (N, T) the engine's log pi_b of the same tokens (temperature applied).
    Metrics: mismatch_mean / mismatch_max = |old - behaviour| over valid tokens; mismatch_kl, the k3 estimate
    of KL(pi_b || pi_old) = mean of exp(d) - 1 - d, d = old - behaviour, over valid tokens; is_weight_mean /
    is_weight_max of the truncated weights and tis_truncated_frac, the fraction of weights the cap
    cut, each over valid tokens (token level) or over non-empty sequences (sequence level).
    """
    if level not in TIS_LEVELS:
        raise ValueError(f"tis level '{level}': choose one of {', '.join(TIS_LEVELS)}")
    if cap < 1:
        raise ValueError(f"tis cap={cap}: must be >= 1 (a cap below 1 shrinks every on-policy token)")
    if old_logprobs.dim() != 2:
        raise ValueError(f"old_logprobs must be (N, T), got {tuple(old_logprobs.shape)}")
    for name, t in (("behaviour_logprobs", behaviour_logprobs), ("mask", mask)):
        if t.shape != old_logprobs.shape:
            raise ValueError(f"{name} {tuple(t.shape)} must match old_logprobs {tuple(old_logprobs.shape)}")
    old, beh, mask = old_logprobs.detach().float(), behaviour_logprobs.detach().float(), mask.float()
    log_ratio = torch.where(mask > 0, old - beh, 0.0)  # (N, T)
    log_cap = math.log(cap)
    if level == "token":
        unit_log_ratio, unit_mask = log_ratio, mask  # (N, T), (N, T)
    else:
        unit_log_ratio = log_ratio.sum(-1, keepdim=True)  # (N, 1): log prod_t of the token ratios
        unit_mask = (mask.sum(-1, keepdim=True) > 0).float()  # (N, 1): rows with a valid token
    # min(exp(x), C) = exp(min(x, log C)): no overflow however large the sequence log-ratio
    unit_w = torch.exp(unit_log_ratio.clamp(max=log_cap))  # (N, T) or (N, 1)
    weights = (unit_w * mask).detach()  # (N, T): broadcast over the row at sequence level
    metrics = {
        "mismatch_mean": masked_mean((old - beh).abs(), mask),
        "mismatch_max": masked_max((old - beh).abs(), mask),
        # k3 (Schulman): exp(d) - 1 - d >= 0, unbiased for KL(pi_b || pi_old) on tokens sampled from pi_b
        "mismatch_kl": masked_mean(torch.expm1(log_ratio) - log_ratio, mask),
        "is_weight_mean": masked_mean(unit_w, unit_mask),
        "is_weight_max": masked_max(unit_w, unit_mask),
        "tis_truncated_frac": masked_mean((unit_log_ratio > log_cap).float(), unit_mask),
    }
    return weights, {k: v.detach() for k, v in metrics.items()}
