"""Policy losses of the GRPO family and the full per-token GRPO objective.

Dimensions: N completions (rows), T completion tokens. Inputs are log-probabilities of the sampled
tokens, (N, T); advantages are one per completion, (N,), broadcast over its tokens; ``mask`` is the
(N, T) float {0, 1} completion mask. Every loss here is a *loss* (minimised): the negated surrogate.

A policy loss is registered in POLICY_LOSSES (``register_loss``; the built-in ones here are declared by name
in rftlib.algo.loss_spec, which the config reads without importing this module) with the signature
    fn(logprobs, old_logprobs, advantages, mask, *, clip_low, clip_high, dual_clip, log_ratio_clamp)
        -> (loss_mat (N, T), metrics dict of detached 0-dim tensors)
so that ``grpo_loss`` can call any of them without knowing its name, and with its LossSpec: its settings
class (a rftlib.settings Section whose fields, ranges and rules are its own settings and whose
``clip_range()`` gives clip_low and clip_high: PPOClipSettings, GSPOSettings, CISPOSettings, GMPOSettings
for the losses here), the aggregations its paper's objective is defined under and its default one,
which the config and the trainer read.

Each built-in loss also has a token view, ``<name>_view`` (same arguments, no grad): the ratio it clips and
the side each token was clipped on, computed by the ``_<name>_parts`` function the loss itself calls, so the
view and the loss cannot drift apart (LossSpec.token_view; rftlib.algo.token_view reads it).
"""

from __future__ import annotations

import torch

from rftlib.algo.aggregation import aggregate, masked_max, masked_mean, masked_min, masked_quantile
from rftlib.algo.kl import kl_penalty
from rftlib.algo.loss_spec import POLICY_LOSSES, SEQUENCE_LEVEL  # noqa: F401 (the losses are declared there)


def _check_shapes(logprobs, old_logprobs, advantages, mask) -> None:
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs must be (N, T), got {tuple(logprobs.shape)}")
    for name, t in (("old_logprobs", old_logprobs), ("mask", mask)):
        if t.shape != logprobs.shape:
            raise ValueError(f"{name} {tuple(t.shape)} must match logprobs {tuple(logprobs.shape)}")
    if advantages.shape != logprobs.shape[:1]:
        raise ValueError(f"advantages must be (N,) = ({logprobs.shape[0]},), got {tuple(advantages.shape)}")


def _ratio_metrics(clip_active, log_ratio_raw, log_ratio, mask) -> dict[str, torch.Tensor]:
    """The per-token ratio diagnostics every policy loss logs under the same names (detached, 0-dim).

    clip_active: (N, T) float, 1 where the loss's clipping zeroes or caps that token's gradient.
    log_ratio_raw / log_ratio: (N, T) log(pi / pi_old) before / after the +-log_ratio_clamp.
    """
    with torch.no_grad():
        return {
            "ppo_clip_ratio": masked_mean(clip_active, mask),
            "log_ratio_raw_max": masked_max(log_ratio_raw, mask),
            "log_ratio_max": masked_max(log_ratio, mask),
            "log_ratio_min": masked_min(log_ratio, mask),
            "ratio_max": masked_max(torch.exp(log_ratio), mask),
            "log_ratio_abs_p99": masked_quantile(log_ratio.abs(), mask, 0.99),
            "approx_kl_old": masked_mean(torch.expm1(log_ratio) - log_ratio, mask),
        }


# a per-token surrogate: every aggregation is a weighting of its tokens (GRPO, Dr-GRPO and DAPO use one each)
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
    parts = _ppo_clip_parts(logprobs, old_logprobs, advantages, mask, clip_low=clip_low, clip_high=clip_high,
                            dual_clip=dual_clip, log_ratio_clamp=log_ratio_clamp)
    with torch.no_grad():
        clip_active = (parts["side"] != 0).float()  # (N, T): the clipped branch is the larger one
        metrics = _ratio_metrics(clip_active, parts["log_ratio_raw"], parts["log_ratio"], mask)
        if dual_clip is not None:
            metrics["dual_clip_frac"] = masked_mean(parts["dual"].float(), mask)
    return parts["loss_mat"], {k: v.detach() for k, v in metrics.items()}


def _ppo_clip_parts(logprobs, old_logprobs, advantages, mask, *, clip_low, clip_high, dual_clip, log_ratio_clamp):
    """ppo_clip's computation, shared by the loss and its token view (so the two cannot drift apart).

    Returns loss_mat (N, T); ratio (N, T) (clamped, as the loss clips it); side (N, T) float, detached:
    -1 where the clipped branch is the larger one on the low side (A < 0, ratio < 1 - clip_low), +1 on the
    high side (A > 0, ratio > 1 + clip_high), 0 otherwise; dual (N, T) bool, detached: capped by the dual clip
    (all False without one); log_ratio_raw / log_ratio (N, T) before / after the clamp.
    Checks the inputs (shapes, clip range, dual clip) first: ValueError naming the bad one.
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
    dual_active = torch.zeros_like(loss_mat, dtype=torch.bool)  # (N, T)
    if dual_clip is not None:
        loss_dual = -adv * dual_clip  # (N, 1)
        dual_active = (adv < 0) & (loss_dual < loss_mat)  # (N, T)
        loss_mat = torch.where(dual_active, loss_dual, loss_mat)  # (N, T)
    with torch.no_grad():
        # the clipped branch is strictly larger only for A > 0 above the ceiling or A < 0 below the floor:
        # the side is the advantage's sign
        side = torch.sign(adv) * (loss_clipped > loss_unclipped).to(adv.dtype)  # (N, T)
    return dict(loss_mat=loss_mat, ratio=ratio, side=side, dual=dual_active.detach(),
                log_ratio_raw=log_ratio_raw, log_ratio=log_ratio)


def ppo_clip_view(logprobs, old_logprobs, advantages, mask, *, clip_low=0.2, clip_high=0.2, dual_clip=None,
                  log_ratio_clamp=20.0) -> dict[str, torch.Tensor]:
    """ppo_clip's token view (LossSpec.token_view; rftlib.algo.token_view): what its clip did to each token.

    ratio (N, T): the token ratio the loss clips; clip (N, T) int8: -1 low side, +1 high side (a
    dual-clipped token counts as high: its ratio is above the dual bound), 0 none, 0 where mask is 0;
    dual (N, T) bool; clamped (N, T) bool: |log ratio| beyond log_ratio_clamp (no gradient through it).
    """
    with torch.no_grad():
        p = _ppo_clip_parts(logprobs, old_logprobs, advantages, mask, clip_low=clip_low, clip_high=clip_high,
                            dual_clip=dual_clip, log_ratio_clamp=log_ratio_clamp)
        side = torch.where(p["dual"], torch.ones_like(p["side"]), p["side"])  # (N, T)
        return _view(p["ratio"], side, mask, dual=p["dual"] & (mask > 0),
                     clamped=(p["log_ratio_raw"].abs() > log_ratio_clamp) & (mask > 0))


def _view(ratio, side, mask, **extra) -> dict[str, torch.Tensor]:
    """A token view: ratio (N, T) detached, clip (N, T) int8 = side where mask > 0 else 0, and ``extra``."""
    clip = torch.where(mask > 0, side, torch.zeros_like(side)).to(torch.int8)  # (N, T)
    return {"ratio": ratio.detach(), "clip": clip, **{k: v.detach() for k, v in extra.items()}}


def _seq_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Masked mean over each row's valid tokens: (N, T) -> (N,); 0 for a fully masked row."""
    return torch.where(mask > 0, x, 0.0).sum(dim=-1) / mask.sum(dim=-1).clamp(min=1.0)  # (N,)


def gspo(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 3e-4,  # sequence-ratio floor 1 - clip_low (Zheng et al. 2025: 3e-4)
    clip_high: float = 4e-4,  # sequence-ratio ceiling 1 + clip_high (Zheng et al. 2025: 4e-4)
    dual_clip: float | None = None,  # not part of GSPO: must be None
    log_ratio_clamp: float = 20.0,  # bound on |log s_i| before exp
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GSPO, Group Sequence Policy Optimization (Zheng et al. 2025, arXiv:2507.18071), GSPO-token form.

    One importance ratio per completion, length-normalised (eq. 7):
        s_i = (pi(y_i) / pi_old(y_i))^(1/|y_i|) = exp(mean_t log(pi / pi_old)_it)
    and the token-level form of sec. 4.3 (eq. 13), s_it = sg[s_i] * pi(y_it) / sg[pi(y_it)]: its value
    is s_i at every token, its gradient s_i * grad log pi(y_it), so that per-token advantages could
    differ (here they are one per completion, and GSPO-token's gradient equals GSPO's). Per token
        loss = max(-A * s_it, -A * clip(s_it, 1 - clip_low, 1 + clip_high))
    with the whole completion clipped or not together. The clip range is on a *sequence* ratio,
    two orders of magnitude narrower than PPO's token range (the paper: 3e-4 / 4e-4). The paper
    averages tokens within a completion, then completions: aggregate with seq-mean-token-mean.

    ``log_ratio_clamp`` bounds log s_i (as verl clamps it, at 10); past it the row gets no gradient.
    Metrics: those of ppo_clip (``ppo_clip_ratio`` counts tokens of clipped completions), plus
    ``seq_clip_frac`` (fraction of non-empty completions clipped), ``seq_ratio_max``/``seq_ratio_min``.

    Returns (loss_mat (N, T), metrics). Padded positions of loss_mat are not zeroed: aggregate.
    """
    p = _gspo_parts(logprobs, old_logprobs, advantages, mask, clip_low=clip_low, clip_high=clip_high,
                    dual_clip=dual_clip, log_ratio_clamp=log_ratio_clamp)
    log_ratio_raw, log_ratio, log_s_tok, loss_mat = p["log_ratio_raw"], p["log_ratio"], p["log_s_tok"], p["loss_mat"]
    with torch.no_grad():
        clip_active = (p["side"] != 0).float()  # (N, T): the whole completion clipped or not
        metrics = _ratio_metrics(clip_active, log_ratio_raw, log_ratio, mask)
        rows = (mask.sum(dim=-1) > 0).float()  # (N,) completions with at least one token
        seq_ratio = torch.exp(log_s_tok[:, 0])  # (N,)
        metrics["seq_clip_frac"] = (clip_active[:, 0] * rows).sum() / rows.sum().clamp(min=1.0)
        metrics["seq_ratio_max"] = masked_max(seq_ratio, rows)
        metrics["seq_ratio_min"] = masked_min(seq_ratio, rows)
    return loss_mat, {k: v.detach() for k, v in metrics.items()}


def _gspo_parts(logprobs, old_logprobs, advantages, mask, *, clip_low, clip_high, dual_clip, log_ratio_clamp):
    """gspo's computation, shared by the loss and its token view. Checks the inputs, then returns loss_mat
    (N, T); log_s_tok (N, T) (value log s_i at every token of row i, clamped); side (N, T) float, detached:
    -1 where the row is clipped on the low side (A < 0, s_i < 1 - clip_low), +1 on the high side (A > 0,
    s_i > 1 + clip_high), 0 otherwise; log_s (N, 1) before the clamp; log_ratio_raw / log_ratio (N, T)."""
    _check_shapes(logprobs, old_logprobs, advantages, mask)
    if not (0.0 <= clip_low < 1.0) or clip_high < 0.0:
        raise ValueError(f"gspo needs 0 <= clip_low < 1 and clip_high >= 0, got {clip_low}, {clip_high}")
    if dual_clip is not None:
        raise ValueError("dual_clip is a token-level PPO device; GSPO clips whole sequences: set dual_clip None")
    log_ratio_raw = logprobs - old_logprobs  # (N, T)
    log_ratio = log_ratio_raw.clamp(-log_ratio_clamp, log_ratio_clamp)  # (N, T), metrics only
    log_s = _seq_mean(log_ratio_raw, mask).detach().unsqueeze(-1)  # (N, 1) sg[log s_i]
    log_s_tok = (log_s + logprobs - logprobs.detach()).clamp(-log_ratio_clamp, log_ratio_clamp)  # (N, T)
    s_tok = torch.exp(log_s_tok)  # (N, T): value s_i, gradient s_i * grad logp_it
    adv = advantages.unsqueeze(-1)  # (N, 1)
    loss_unclipped = -adv * s_tok  # (N, T)
    loss_clipped = -adv * s_tok.clamp(1.0 - clip_low, 1.0 + clip_high)  # (N, T)
    loss_mat = torch.maximum(loss_unclipped, loss_clipped)  # (N, T)
    with torch.no_grad():  # strictly larger only for A > 0 above the ceiling or A < 0 below the floor
        side = torch.sign(adv) * (loss_clipped > loss_unclipped).to(adv.dtype)  # (N, T)
    return dict(loss_mat=loss_mat, log_s_tok=log_s_tok, side=side, log_s=log_s,
                log_ratio_raw=log_ratio_raw, log_ratio=log_ratio)


def gspo_view(logprobs, old_logprobs, advantages, mask, *, clip_low=3e-4, clip_high=4e-4, dual_clip=None,
              log_ratio_clamp=20.0) -> dict[str, torch.Tensor]:
    """gspo's token view (LossSpec.token_view): ratio (N, T) the sequence ratio s_i broadcast over row i (the
    ratio GSPO clips); clip (N, T) int8, the row's side at each of its valid tokens (-1 low, +1 high, 0 none);
    clamped (N, T) bool: |log s_i| beyond log_ratio_clamp (the row gets no gradient)."""
    with torch.no_grad():
        p = _gspo_parts(logprobs, old_logprobs, advantages, mask, clip_low=clip_low, clip_high=clip_high,
                        dual_clip=dual_clip, log_ratio_clamp=log_ratio_clamp)
        clamped = (p["log_s"].abs() > log_ratio_clamp).expand_as(mask) & (mask > 0)  # (N, T)
        return _view(torch.exp(p["log_s_tok"]), p["side"], mask, clamped=clamped)


def cispo(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 1.0,  # IS-weight floor 1 - clip_low; >= 1 means no floor (MiniMax-M1 sets none)
    clip_high: float = 0.28,  # IS-weight ceiling 1 + clip_high (the bound MiniMax-M1 tunes)
    dual_clip: float | None = None,  # not part of CISPO: must be None
    log_ratio_clamp: float = 20.0,  # |log ratio| bound before exp
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """CISPO, Clipped IS-weight Policy Optimization (MiniMax-M1, MiniMax 2025, arXiv:2506.13585, eq. 4-5).

        loss = -sg(clip(r, 1 - clip_low, 1 + clip_high)) * A * log pi(y_t),   r = pi / pi_old per token
    PPO drops the gradient of a token whose ratio left the clip range (often the rare "fork" tokens
    of a reasoning trace); CISPO clips the importance *weight* instead and keeps a REINFORCE gradient
    A * w * grad log pi on every token. The weight is detached: no gradient flows through the ratio.
    The loss *value* is therefore -w * A * log pi, not a ratio surrogate (its gradient is what counts).

    The paper normalises by the batch's total token count: token-mean (the default its LossSpec
    declares) or seq-mean-token-sum-norm, which also weighs every token the same.

    Metrics: those of ppo_clip; ``ppo_clip_ratio`` is the fraction of tokens whose weight was
    clipped (their gradient is scaled down, not zeroed).
    Returns (loss_mat (N, T), metrics). Padded positions of loss_mat are not zeroed: aggregate.
    """
    p = _cispo_parts(logprobs, old_logprobs, advantages, mask, clip_low=clip_low, clip_high=clip_high,
                     dual_clip=dual_clip, log_ratio_clamp=log_ratio_clamp)
    metrics = _ratio_metrics((p["side"] != 0).float(), p["log_ratio_raw"], p["log_ratio"], mask)
    return p["loss_mat"], metrics


def _cispo_parts(logprobs, old_logprobs, advantages, mask, *, clip_low, clip_high, dual_clip, log_ratio_clamp):
    """cispo's computation, shared by the loss and its token view. Checks the inputs, then returns loss_mat
    (N, T); ratio (N, T) and weight (N, T), both detached (weight = the ratio clipped to the IS-weight range);
    side (N, T) float: +1 where the weight was capped (ratio > 1 + clip_high), -1 where it was raised to the
    floor (ratio < 1 - clip_low), 0 otherwise, whatever the advantage (as its ppo_clip_ratio metric counts);
    log_ratio_raw / log_ratio (N, T)."""
    _check_shapes(logprobs, old_logprobs, advantages, mask)
    if clip_low < 0.0 or clip_high < 0.0:
        raise ValueError(f"cispo needs clip_low >= 0 and clip_high >= 0, got {clip_low}, {clip_high}")
    if dual_clip is not None:
        raise ValueError("dual_clip caps a PPO surrogate; CISPO's weight is already clipped: set dual_clip None")
    log_ratio_raw = logprobs - old_logprobs  # (N, T)
    log_ratio = log_ratio_raw.clamp(-log_ratio_clamp, log_ratio_clamp)  # (N, T)
    ratio = torch.exp(log_ratio).detach()  # (N, T)
    weight = ratio.clamp(max(0.0, 1.0 - clip_low), 1.0 + clip_high)  # (N, T), stop-gradient
    loss_mat = -weight * advantages.unsqueeze(-1) * logprobs  # (N, T)
    side = (weight < ratio).to(ratio.dtype) - (weight > ratio).to(ratio.dtype)  # (N, T)
    return dict(loss_mat=loss_mat, ratio=ratio, weight=weight, side=side,
                log_ratio_raw=log_ratio_raw, log_ratio=log_ratio)


def cispo_view(logprobs, old_logprobs, advantages, mask, *, clip_low=1.0, clip_high=0.28, dual_clip=None,
               log_ratio_clamp=20.0) -> dict[str, torch.Tensor]:
    """cispo's token view (LossSpec.token_view): ratio (N, T) the token ratio; clip (N, T) int8, +1 where the
    IS weight was capped at 1 + clip_high, -1 where it was raised to 1 - clip_low (the gradient is scaled,
    not zeroed), 0 otherwise; weight (N, T) the clipped IS weight each token's REINFORCE term carries."""
    with torch.no_grad():
        p = _cispo_parts(logprobs, old_logprobs, advantages, mask, clip_low=clip_low, clip_high=clip_high,
                         dual_clip=dual_clip, log_ratio_clamp=log_ratio_clamp)
        return _view(p["ratio"], p["side"], mask, weight=p["weight"])


def gmpo(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.4,  # log-ratio floor -clip_low (Zhao et al. 2025: ratio range (e^-0.4, e^0.4))
    clip_high: float = 0.4,  # log-ratio ceiling +clip_high
    dual_clip: float | None = None,  # not part of GMPO: must be None
    log_ratio_clamp: float = 20.0,  # |log ratio| bound before anything else
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GMPO, Geometric-Mean Policy Optimization (Zhao et al. 2025, arXiv:2507.20673, eq. 4).

    GRPO maximises the arithmetic mean of token ratios, which one outlier token can dominate;
    GMPO maximises their geometric mean, clipping each token's ratio in log space:
        l_it = sgn(A) * min(sgn(A) * log r_it, sgn(A) * clip(log r_it, -clip_low, clip_high))
        loss_i = -A_i * exp(mean_t l_it)
    (the pessimistic side: for A > 0 a log ratio above clip_high is capped, for A < 0 one below
    -clip_low). The bounds are on the *log* ratio: the paper's range (e^-0.4, e^0.4) is clip 0.4.
    loss_i is one number per completion, written at each of its tokens: aggregate with
    seq-mean-token-mean to get the paper's mean over completions (verl's geo_mean does the same).

    Metrics: those of ppo_clip; ``ppo_clip_ratio`` is the fraction of tokens whose log ratio was
    clipped on the advantage's side (those tokens get no gradient); a token of a zero-advantage
    completion is never counted (nothing is clipped where there is no gradient to cut).
    Returns (loss_mat (N, T), metrics). Padded positions of loss_mat are not zeroed: aggregate.
    """
    p = _gmpo_parts(logprobs, old_logprobs, advantages, mask, clip_low=clip_low, clip_high=clip_high,
                    dual_clip=dual_clip, log_ratio_clamp=log_ratio_clamp)
    with torch.no_grad():
        metrics = _ratio_metrics((p["side"] != 0).float(), p["log_ratio_raw"], p["log_ratio"], mask)
    return p["loss_mat"], metrics


def _gmpo_parts(logprobs, old_logprobs, advantages, mask, *, clip_low, clip_high, dual_clip, log_ratio_clamp):
    """gmpo's computation, shared by the loss and its token view. Checks the inputs, then returns loss_mat
    (N, T); side (N, T) float, detached: sgn(A_i) where the token's log ratio was clipped on the advantage's
    side (+1: A > 0 and log r > clip_high; -1: A < 0 and log r < -clip_low), 0 otherwise;
    log_ratio_raw / log_ratio (N, T) before / after the clamp."""
    _check_shapes(logprobs, old_logprobs, advantages, mask)
    if clip_low < 0.0 or clip_high < 0.0:
        raise ValueError(f"gmpo needs clip_low >= 0 and clip_high >= 0 (log-space bounds), got {clip_low}, {clip_high}")
    if dual_clip is not None:
        raise ValueError("dual_clip is not part of GMPO: set dual_clip None")
    log_ratio_raw = logprobs - old_logprobs  # (N, T)
    log_ratio = log_ratio_raw.clamp(-log_ratio_clamp, log_ratio_clamp)  # (N, T)
    sgn = torch.sign(advantages).unsqueeze(-1)  # (N, 1)
    clipped = log_ratio.clamp(-clip_low, clip_high)  # (N, T)
    log_r = sgn * torch.minimum(sgn * log_ratio, sgn * clipped)  # (N, T)
    seq_ratio = torch.exp(_seq_mean(log_r, mask))  # (N,) geometric mean of the clipped ratios
    loss_mat = (-advantages * seq_ratio).unsqueeze(-1).expand_as(logprobs)  # (N, T)
    with torch.no_grad():
        # clipped where the min took the clipped branch strictly; A = 0 (sgn 0) clips nothing: 0 > 0 is false
        side = sgn * (sgn * log_ratio > sgn * clipped).to(sgn.dtype)  # (N, T)
    return dict(loss_mat=loss_mat, side=side, log_ratio_raw=log_ratio_raw, log_ratio=log_ratio)


def gmpo_view(logprobs, old_logprobs, advantages, mask, *, clip_low=0.4, clip_high=0.4, dual_clip=None,
              log_ratio_clamp=20.0) -> dict[str, torch.Tensor]:
    """gmpo's token view (LossSpec.token_view): ratio (N, T) the token ratio GMPO clips (in log space, before
    the geometric mean); clip (N, T) int8, -1 / +1 where the token's log ratio was clipped on the advantage's
    side (it gets no gradient), 0 otherwise; clamped (N, T) bool: |log r| beyond log_ratio_clamp."""
    with torch.no_grad():
        p = _gmpo_parts(logprobs, old_logprobs, advantages, mask, clip_low=clip_low, clip_high=clip_high,
                        dual_clip=dual_clip, log_ratio_clamp=log_ratio_clamp)
        return _view(torch.exp(p["log_ratio"]), p["side"], mask,
                     clamped=(p["log_ratio_raw"].abs() > log_ratio_clamp) & (mask > 0))


def grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    ref_logprobs: torch.Tensor | None = None,  # (N, T) reference-model logprobs; None: no KL at all
    beta: float = 0.0,  # KL coefficient (DeepSeekMath: 0.04; Dr-GRPO and DAPO: 0); 0 when the KL is in the reward
    kl_estimator: str = "k3",  # a KL_ESTIMATORS name; DeepSeekMath uses k3, k3+ has the reverse KL's gradient
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
    over tokens and completions with ``aggregation``. Here the KL term is in the loss (as in
    DeepSeekMath); k1 there has zero expected gradient (RunConfig refuses it, see rftlib.algo.kl), and k3's
    gradient is the forward KL's: k3+ is the estimator whose gradient is the reverse KL's. For KL in
    the reward instead (rftlib.algo.shaping.kl_in_reward), call this with beta = 0.
    Everything named is looked up in a registry.
    ``is_weights`` (TIS, Yao et al. 2025) multiply the policy term per token when the tokens were
    sampled by another engine (vLLM); the KL and entropy terms are the trainer's own and are not weighted.
    With asynchronous rollouts (max_staleness k > 0) this is the decoupled PPO objective (Hilton et al. 2022,
    arXiv:2110.00641; AReaL, arXiv:2505.24298 sec. 5.2): ``old_logprobs`` are the proximal policy's (the
    trainer's forward at the weights the update starts from), the ratio and its clip are taken against them,
    and ``is_weights`` = min(pi_prox / pi_behaviour, C) correct for the k-versions-old engine that sampled the
    tokens; written out with why it holds at any k in rftlib.algo.correction.

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
