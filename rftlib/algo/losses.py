"""Policy losses of the GRPO family and the full per-token GRPO objective.

Dimensions: N completions (rows), T completion tokens. Inputs are log-probabilities of the sampled
tokens, (N, T); advantages are one per completion, (N,), broadcast over its tokens; ``mask`` is the
(N, T) float {0, 1} completion mask. Every loss here is a *loss* (minimised): the negated surrogate.

A policy loss is registered in POLICY_LOSSES with the signature
    fn(logprobs, old_logprobs, advantages, mask, *, clip_low, clip_high, dual_clip, log_ratio_clamp)
        -> (loss_mat (N, T), metrics dict of detached 0-dim tensors)
so that ``grpo_loss`` can call any of them without knowing its name.
"""

from __future__ import annotations

import torch

from rftlib.algo.aggregation import aggregate, masked_max, masked_mean, masked_min, masked_quantile
from rftlib.algo.kl import kl_penalty
from rftlib.algo.registry import Registry

POLICY_LOSSES = Registry("policy loss")


def _check_shapes(logprobs, old_logprobs, advantages, mask) -> None:
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs must be (N, T), got {tuple(logprobs.shape)}")
    for name, t in (("old_logprobs", old_logprobs), ("mask", mask)):
        if t.shape != logprobs.shape:
            raise ValueError(f"{name} {tuple(t.shape)} must match logprobs {tuple(logprobs.shape)}")
    if advantages.shape != logprobs.shape[:1]:
        raise ValueError(f"advantages must be (N,) = ({logprobs.shape[0]},), got {tuple(advantages.shape)}")


@POLICY_LOSSES.register("ppo_clip")
def ppo_clip(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,  # ratio floor 1 - clip_low (PPO/GRPO: 0.2)
    clip_high: float = 0.2,  # ratio ceiling 1 + clip_high (DAPO clip-higher: 0.28)
    dual_clip: float | None = None,  # cap on the loss of A<0 tokens, -A*c (Ye et al. 2020: c=3)
    log_ratio_clamp: float = 20.0,  # |log ratio| bound before exp, keeps exp finite in float32
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token clipped surrogate of PPO as used by GRPO (Shao et al. 2024) and DAPO (Yu et al. 2025).

    ratio = pi / pi_old = exp(logprobs - old_logprobs), per token, and with A the row's advantage
        loss = max(-A * ratio, -A * clip(ratio, 1 - clip_low, 1 + clip_high))
    the pessimistic (larger-loss) branch: the policy gets no credit for moving a token's ratio past
    the clip range in the advantage's direction. DAPO's clip-higher sets clip_high > clip_low so that
    low-probability tokens with A > 0 can grow more before being clipped (against entropy collapse).

    Dual clip (Ye et al. 2020, "Mastering Complex Control in MOBA Games with Deep RL"): for A < 0
    the loss above grows without bound in the ratio; ``loss = min(loss, -A * dual_clip)`` caps it.

    The log-ratio is clamped to +-log_ratio_clamp before exp (a ratio of e^20 is meaningless, and
    exp overflows float32 at ~88); tokens beyond the clamp get no gradient through the ratio.
    ``log_ratio_raw_max`` reports the log-ratio before the clamp, to see when it bites.

    Metrics (over valid tokens; detached; 0 when the mask is empty):
        ppo_clip_ratio     fraction where the clipped branch is the larger one, i.e. the token's
                           gradient is zeroed by PPO clipping (dual-clipped tokens not included)
        dual_clip_frac     fraction capped by the dual clip (only when dual_clip is set)
        log_ratio_raw_max, log_ratio_max, log_ratio_min, ratio_max, log_ratio_abs_p99
        approx_kl_old      k3 estimate of KL(pi_old || pi), (ratio - 1) - log ratio, as cleanrl logs
                           it (http://joschu.net/blog/kl-approx.html)

    Returns (loss_mat (N, T), metrics). Padded positions of loss_mat are not zeroed: aggregate.
    """
    _check_shapes(logprobs, old_logprobs, advantages, mask)
    if not (0.0 <= clip_low < 1.0) or clip_high < 0.0:
        raise ValueError(f"need 0 <= clip_low < 1 and clip_high >= 0, got clip_low={clip_low}, clip_high={clip_high}")
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (Ye et al. 2020 use 3), got {dual_clip}")

    log_ratio_raw = logprobs - old_logprobs  # (N, T)
    log_ratio = log_ratio_raw.clamp(-log_ratio_clamp, log_ratio_clamp)  # (N, T)
    ratio = torch.exp(log_ratio)  # (N, T)
    adv = advantages.unsqueeze(-1)  # (N, 1), broadcast over tokens

    loss_unclipped = -adv * ratio  # (N, T)
    loss_clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)  # (N, T)
    loss_mat = torch.maximum(loss_unclipped, loss_clipped)  # (N, T)
    if dual_clip is not None:
        loss_dual = -adv * dual_clip  # (N, 1)
        dual_active = (adv < 0) & (loss_dual < loss_mat)  # (N, T)
        loss_mat = torch.where(dual_active, loss_dual, loss_mat)  # (N, T)

    with torch.no_grad():
        clip_active = (loss_clipped > loss_unclipped).float()  # (N, T)
        metrics = {
            "ppo_clip_ratio": masked_mean(clip_active, mask),
            "log_ratio_raw_max": masked_max(log_ratio_raw, mask),
            "log_ratio_max": masked_max(log_ratio, mask),
            "log_ratio_min": masked_min(log_ratio, mask),
            "ratio_max": masked_max(ratio, mask),
            "log_ratio_abs_p99": masked_quantile(log_ratio.abs(), mask, 0.99),
            "approx_kl_old": masked_mean(torch.expm1(log_ratio) - log_ratio, mask),
        }
        if dual_clip is not None:
            metrics["dual_clip_frac"] = masked_mean(dual_active.float(), mask)
    return loss_mat, {k: v.detach() for k, v in metrics.items()}


def grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    ref_logprobs: torch.Tensor | None = None,  # (N, T) reference-model logprobs; None: no KL at all
    beta: float = 0.0,  # KL coefficient (DeepSeekMath: 0.04; Dr-GRPO and DAPO: 0)
    kl_estimator: str = "k3",  # a KL_ESTIMATORS name; DeepSeekMath uses k3
    policy_loss: str = "ppo_clip",  # a POLICY_LOSSES name
    aggregation: str = "seq-mean-token-mean",  # an AGGREGATIONS name; GRPO's
    num_seqs: float | torch.Tensor | None = None,  # optimizer-batch totals, see aggregation.aggregate
    num_tokens: float | torch.Tensor | None = None,
    norm_const: float | None = None,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    log_ratio_clamp: float = 20.0,
    entropy: torch.Tensor | None = None,  # (N, T) per-token entropy of pi; logged, and a bonus if entropy_coef != 0
    entropy_coef: float = 0.0,  # entropy bonus weight (0 in GRPO/DAPO)
    is_weights: torch.Tensor | None = None,  # (N, T) detached truncated IS weights pi_old/pi_behaviour (rftlib.algo.correction)
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The GRPO objective (Shao et al. 2024, eq. 3) as a loss, with its variants chosen by name.

    per token: policy_loss + beta * KL(pi || pi_ref) - entropy_coef * entropy, then aggregated
    over tokens and completions with ``aggregation``. The KL term is added to the loss (as in
    DeepSeekMath), not folded into the reward. Everything named is looked up in a registry.
    ``is_weights`` (TIS, Yao et al. 2025) multiply the policy term per token when the tokens were
    sampled by another engine (vLLM); the KL and entropy terms are the trainer's own and are not weighted.

    Metrics (detached 0-dim): the policy loss's own metrics; ``policy_loss`` (the policy term alone,
    aggregated like the loss, so it sums over micro-batches like the loss does); ``kl`` (masked mean
    of the chosen estimator) whenever ref_logprobs is given, even with beta = 0; ``entropy_mean``
    when entropy is given.

    Returns (loss 0-dim, metrics).
    """
    pg_mat, metrics = POLICY_LOSSES.get(policy_loss)(
        logprobs, old_logprobs, advantages, mask,
        clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip, log_ratio_clamp=log_ratio_clamp,
    )  # (N, T)
    if is_weights is not None:  # rollout/trainer mismatch: the policy term reweighted per token (TIS)
        if is_weights.shape != pg_mat.shape:
            raise ValueError(f"is_weights {tuple(is_weights.shape)} must match logprobs {tuple(pg_mat.shape)}")
        pg_mat = pg_mat * is_weights.detach()  # (N, T)
    totals = dict(num_seqs=num_seqs, num_tokens=num_tokens, norm_const=norm_const)
    loss_mat = pg_mat  # (N, T)
    if ref_logprobs is not None:
        kl_mat = kl_penalty(kl_estimator, logprobs, ref_logprobs)  # (N, T)
        metrics["kl"] = masked_mean(kl_mat.detach(), mask)
        if beta > 0:
            loss_mat = loss_mat + beta * kl_mat
    if entropy is not None:
        if entropy.shape != mask.shape:
            raise ValueError(f"entropy {tuple(entropy.shape)} must match mask {tuple(mask.shape)}")
        metrics["entropy_mean"] = masked_mean(entropy.detach(), mask)
        if entropy_coef != 0.0:
            if torch.is_grad_enabled() and logprobs.requires_grad and not entropy.requires_grad:
                raise ValueError(
                    "entropy_coef != 0 but entropy carries no gradient, so the bonus would do nothing; "
                    "compute it with entropy_grad=True (rftlib.algo.logprobs)"
                )
            loss_mat = loss_mat - entropy_coef * entropy
    metrics["policy_loss"] = aggregate(aggregation, pg_mat.detach(), mask, **totals)
    loss = aggregate(aggregation, loss_mat, mask, **totals)
    return loss, metrics
