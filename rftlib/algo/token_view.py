"""What one loss call did to each token: its gradient weight, the ratio it clipped and the side it clipped on.

The per-token gradient weight of a loss L over a micro-batch is c_t = dL/dlogp_t, the coefficient each
sampled token's log-probability gets in the update: by the chain rule

    grad_theta L = sum_t c_t grad_theta logp_t  (+ sum_t dL/dH_t grad_theta H_t when entropy_coef != 0)

so c says which tokens the update pushed up (c < 0: the loss falls when logp rises) or down, and by how much.
``grad_weights`` gets c by autograd on a detached leaf copy of the log-probs through the *same* ``grpo_loss``
call the trainer makes (rftlib.train.loop ``Trainer.update``), so it holds for every registered policy loss,
aggregation, KL estimator and TIS weighting without knowing their formulas. Closed forms (the tests' oracles),
on-policy (ratio 1), A_i the row's advantage, |y_i| its valid tokens, n_seq / n_tok / C the totals:
    ppo_clip, seq-mean-token-mean (GRPO)      c_t = -A_i / (|y_i| n_seq)
    ppo_clip, token-mean (DAPO)               c_t = -A_i / n_tok
    ppo_clip, seq-mean-token-sum-norm (Dr-GRPO) c_t = -A_i / (C n_seq)
    a token PPO clipped                       c_t = 0
    cispo, token-mean, weight capped          c_t = -A_i (1 + clip_high) / n_tok
    gspo in range                             c_t = -A_i s_i / (|y_i| n_seq)   (= ppo_clip's at s_i = 1)

``token_view`` gives the ratio each token's loss term clipped (the token ratio, or GSPO's sequence ratio
broadcast) and the clip side, from the loss's own ``LossSpec.token_view`` (computed by the function the loss
itself calls), or, for a loss that declares none, *inferred* from the gradient: clipped where c_t = 0 with
A_i != 0 and the token in the loss, on the side of sign(log r_t).

Dimensions: n rows (completions) of one micro-batch, T its completion width. Pure: tensors in, tensors out
(0-dim tensors for scalars; no .item(), no I/O, no model).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

from rftlib.algo.aggregation import masked_max, masked_mean
from rftlib.algo.loss_spec import POLICY_LOSSES
from rftlib.algo.losses import grpo_loss

TOTALS = ("num_seqs", "num_tokens", "norm_const")  # grpo_loss's optimizer-batch totals
_NOT_LOSS_KWARGS = TOTALS + ("ref_logprobs", "entropy", "is_weights")  # passed by their own arguments here
_CLIP_ARGS = ("clip_low", "clip_high", "dual_clip", "log_ratio_clamp")  # what a policy loss (and its view) takes
_GRPO_DEFAULTS = dict(policy_loss="ppo_clip", clip_low=0.2, clip_high=0.2, dual_clip=None, log_ratio_clamp=20.0)


def _check_kwargs(loss_kwargs: Mapping[str, Any], totals: Mapping[str, Any] | None = None) -> None:
    bad = sorted(set(loss_kwargs) & set(_NOT_LOSS_KWARGS))
    if bad:
        raise ValueError(f"rftlib.algo.token_view: loss_kwargs must be grpo_loss's settings alone (as "
                         f"rftlib.train.steps.loss_kwargs gives them); {bad} go in their own arguments "
                         f"(totals=, ref=, entropy=, is_weights=)")
    if totals is not None:
        extra = sorted(set(totals) - set(TOTALS))
        if extra:
            raise ValueError(f"rftlib.algo.token_view: totals has {extra}; it holds {list(TOTALS)} as grpo_loss "
                             "takes them (a missing one means this micro-batch alone, as aggregate's default)")


def grad_weights(
    logp: torch.Tensor,
    old: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    *,
    loss_kwargs: Mapping[str, Any],
    totals: Mapping[str, Any],
    ref: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    is_weights: torch.Tensor | None = None,
) -> dict[str, Any]:
    """Per-token gradient weights of one ``grpo_loss`` call, by autograd (any registered loss).

    logp, old: (n, T) log-probs of the sampled tokens (trainer's, old/proximal); adv: (n,); mask: (n, T) loss mask;
    ref: (n, T) reference log-probs or None; entropy: (n, T) per-token entropy or None; is_weights: (n, T) TIS
    weights or None; loss_kwargs: grpo_loss's settings (``rftlib.train.steps.loss_kwargs(cfg)``); totals:
    {num_seqs, num_tokens, norm_const} of the optimizer batch, as the trainer passes them.

    Returns
        c          (n, T) dL/dlogp_t of the whole loss (policy + beta KL; 0 at masked tokens)
        c_policy   (n, T) the same with beta = 0 and entropy_coef = 0: the policy term's (TIS weights included)
        c_kl       (n, T) c - c_policy: the KL term's
        c_entropy  (n, T) dL/dH_t (= -entropy_coef x the aggregation weight), or None when entropy_coef is 0
                   or no entropy is given (the trainer then has no bonus either)
        loss, policy_loss  0-dim detached: the loss value, and its policy term alone (as grpo_loss's metric)
        metrics    grpo_loss's metrics (detached 0-dim)
    Nothing is accumulated into the caller's tensors: logp (and entropy) are copied to fresh leaves.
    """
    _check_kwargs(loss_kwargs, totals)
    tot = {k: totals.get(k) for k in TOTALS}
    lp = logp.detach().clone().requires_grad_(True)  # (n, T) leaf
    bonus = entropy is not None and float(loss_kwargs.get("entropy_coef", 0.0)) != 0.0
    h = None if entropy is None else entropy.detach().clone().requires_grad_(bonus)  # (n, T)
    ref_d = None if ref is None else ref.detach()
    isw = None if is_weights is None else is_weights.detach()
    with torch.enable_grad():
        loss, metrics = grpo_loss(lp, old.detach(), adv.detach(), mask, ref_logprobs=ref_d, entropy=h,
                                  is_weights=isw, **tot, **loss_kwargs)
        grads = torch.autograd.grad(loss, [lp] + ([h] if bonus else []), allow_unused=True)
        c = grads[0] if grads[0] is not None else torch.zeros_like(lp)  # (n, T)
        c_ent = (grads[1] if grads[1] is not None else torch.zeros_like(h)) if bonus else None  # (n, T)
        lp2 = logp.detach().clone().requires_grad_(True)  # (n, T) a fresh leaf: the policy term alone
        pol, _ = grpo_loss(lp2, old.detach(), adv.detach(), mask, is_weights=isw, **tot,
                           **{**loss_kwargs, "beta": 0.0, "entropy_coef": 0.0})
        (g_pol,) = torch.autograd.grad(pol, [lp2], allow_unused=True)
    c_pol = g_pol if g_pol is not None else torch.zeros_like(lp2)  # (n, T)
    return {"c": c, "c_policy": c_pol, "c_kl": c - c_pol, "c_entropy": c_ent,
            "loss": loss.detach(), "policy_loss": pol.detach(), "metrics": metrics}


def token_view(
    logp: torch.Tensor,
    old: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    *,
    loss_kwargs: Mapping[str, Any],
    is_weights: torch.Tensor | None = None,
) -> dict[str, Any]:
    """What the policy loss named in ``loss_kwargs`` did to each token (no gradient is taken through it).

    logp, old, mask: (n, T); adv: (n,); loss_kwargs: grpo_loss's settings (policy_loss, clip_low, clip_high,
    dual_clip, log_ratio_clamp are read; the rest is ignored); is_weights: (n, T) TIS weights or None.

    Returns
        ratio      (n, T) the ratio the loss clips: the token ratio pi/pi_old (GSPO: the sequence ratio s_i
                   broadcast over row i), after the loss's log-ratio clamp
        clip       (n, T) int8: -1 clipped on the low side, +1 on the high side, 0 not (0 where mask is 0);
                   what "clipped" means is the loss's own (ppo_clip, gspo, gmpo: the token gets no gradient;
                   cispo: its IS weight was capped or raised; LossSpec docs)
        is_weight  (n, T) the TIS weight each token's policy term carries (ones when none)
        inferred   bool: True when the loss declares no token view and the clip was inferred from the gradient
                   (clipped where dL/dlogp_t = 0, A_i != 0 and mask = 1; side sign(log r_t); ratio the token's)
        and any extra (n, T) tensors the loss's view gives (ppo_clip: dual, clamped; gspo, gmpo: clamped;
        cispo: weight).
    """
    _check_kwargs(loss_kwargs)
    kw = {**_GRPO_DEFAULTS, **loss_kwargs}
    spec = POLICY_LOSSES.get(kw["policy_loss"])
    clip_kw = {k: kw[k] for k in _CLIP_ARGS}
    view_fn = spec.view_fn()
    with torch.no_grad():
        isw = torch.ones_like(logp) if is_weights is None else is_weights.detach().to(logp.dtype)  # (n, T)
        if view_fn is not None:
            out = dict(view_fn(logp.detach(), old.detach(), adv.detach(), mask, **clip_kw))
            for key in ("ratio", "clip"):
                if key not in out or tuple(out[key].shape) != tuple(logp.shape):
                    raise ValueError(f"policy loss '{kw['policy_loss']}': its token_view must return '{key}' of "
                                     f"shape {tuple(logp.shape)} (LossSpec.token_view)")
            return {**out, "clip": out["clip"].to(torch.int8), "is_weight": isw, "inferred": False}
    return {**inferred_view(logp, old, adv, mask, loss_kwargs=kw), "is_weight": isw, "inferred": True}


def inferred_view(
    logp: torch.Tensor,
    old: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    *,
    loss_kwargs: Mapping[str, Any],
) -> dict[str, torch.Tensor]:
    """The view of a loss that declares none, read off its gradient: {"ratio": (n, T) token ratio
    exp(clamp(logp - old)), "clip": (n, T) int8}, clipped where the policy term's c_t is exactly 0 while
    A_i != 0 and mask = 1, on the side of sign(log r_t) (0 when log r_t = 0). Without TIS weights (a weight
    of 0 is not a clip). The totals are this micro-batch's own: they scale c, they do not zero it."""
    _check_kwargs(loss_kwargs)
    kw = {**_GRPO_DEFAULTS, **loss_kwargs}
    g = grad_weights(logp, old, adv, mask, loss_kwargs={**kw, "beta": 0.0, "entropy_coef": 0.0}, totals={})
    with torch.no_grad():
        log_r = (logp - old).clamp(-kw["log_ratio_clamp"], kw["log_ratio_clamp"])  # (n, T)
        cut = (g["c_policy"] == 0) & (adv != 0).unsqueeze(-1) & (mask > 0)  # (n, T)
        clip = torch.where(cut, torch.sign(log_r), torch.zeros_like(log_r)).to(torch.int8)  # (n, T)
        return {"ratio": torch.exp(log_r), "clip": clip}


def _flat(x: torch.Tensor | Sequence[torch.Tensor]) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.detach().reshape(-1).double()
    parts = [t.detach().reshape(-1).double() for t in x]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64)


def cosine(a: torch.Tensor | Sequence[torch.Tensor], b: torch.Tensor | Sequence[torch.Tensor]) -> torch.Tensor:
    """Cosine similarity of two gradients, each a tensor or a list of per-parameter tensors (flattened and
    concatenated in order), in float64. 0-dim; NaN when either is all zeros (no direction to compare)."""
    fa, fb = _flat(a), _flat(b)
    if fa.shape != fb.shape:
        raise ValueError(f"cosine: the gradients have {fa.numel()} and {fb.numel()} elements; they must be of the "
                         "same parameters in the same order")
    na, nb = fa.norm(), fb.norm()
    return torch.where((na > 0) & (nb > 0), (fa @ fb) / (na * nb), torch.full_like(na, float("nan")))


def token_stats(view: Mapping[str, Any], c: torch.Tensor | None, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """A replay table's per-config figures over the valid tokens (mask > 0), each a 0-dim tensor (0 when none):
    clip_low / clip_high: fractions clipped on each side; ratio_max / ratio_mean of the view's ratio;
    ``sum|c|``: sum of |c_t| (the gradient weight's total mass; omitted when c is None)."""
    clip, ratio = view["clip"], view["ratio"]  # (n, T) each
    out = {
        "clip_low": masked_mean((clip < 0).to(ratio.dtype), mask),
        "clip_high": masked_mean((clip > 0).to(ratio.dtype), mask),
        "ratio_max": masked_max(ratio, mask),
        "ratio_mean": masked_mean(ratio, mask),
    }
    if c is not None:
        out["sum|c|"] = torch.where(mask > 0, c.abs(), torch.zeros_like(c)).sum()
    return out
