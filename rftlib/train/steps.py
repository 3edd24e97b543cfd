"""Loop steps that are not pure tensor math: what the trainer calls between rollout and update.

- ``loss_kwargs(cfg)``: the grpo_loss settings of a RunConfig, with each loss's own clip range (its
  settings class's ``clip_range()``) and aggregation read from its LossSpec (the trainer never branches on
  a loss name).
- ``loss_totals``: an optimizer batch's normalisers (rows and tokens in the loss, over every rank).
- ``shape_rewards``: task rewards -> the rewards the advantage estimator sees (DAPO's soft overlong
  penalty, then KL in the reward).
- ``loss_mask``: the completion mask less truncated completions and dropped/masked groups.
- ``dynamic_sampling``: DAPO's dynamic sampling, given a callback that makes more rollouts.

Dimensions as in rftlib.algo: B prompts, G completions each, N = B*G rows prompt-major, T tokens.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from rftlib.algo.aggregation import batch_totals
from rftlib.algo.filtering import constant_groups, group_row_mask, untruncated_mask
from rftlib.algo.losses import POLICY_LOSSES
from rftlib.algo.shaping import kl_in_reward, kl_tokens, overlong_penalty


def clip_range(cfg) -> tuple[float, float]:
    """(clip_low, clip_high) for cfg.policy_loss: its settings class's ``clip_range()`` on this config's
    values of it (``cfg.section(spec.settings)``; a loss's own settings outside RunConfig's fields come from
    ``cfg.loss_args``). A clip_high of None means clip_low's: eps_clip_high None is eps_clip."""
    low, high = cfg.section(POLICY_LOSSES.get(cfg.policy_loss).settings).clip_range()
    return low, (low if high is None else high)


def aggregation(cfg) -> str:
    """The aggregation the loss runs: cfg.loss_agg_mode, or with ``auto`` the policy loss's own default
    (its LossSpec: seq-mean-token-mean for ppo_clip, gspo and gmpo; token-mean for cispo)."""
    return POLICY_LOSSES.get(cfg.policy_loss).aggregation(cfg.loss_agg_mode)


def loss_kwargs(cfg) -> dict[str, Any]:
    """Keyword arguments of rftlib.algo.losses.grpo_loss from a RunConfig (per-batch totals excluded).

    With kl_in_reward the KL is already in the rewards, so the loss gets beta = 0 (it still logs
    the KL when given ref_logprobs).
    """
    low, high = clip_range(cfg)
    return dict(policy_loss=cfg.policy_loss, aggregation=aggregation(cfg), kl_estimator=cfg.kl_estimator,
                beta=0.0 if cfg.kl_in_reward else cfg.beta, clip_low=low, clip_high=high, dual_clip=cfg.dual_clip,
                log_ratio_clamp=cfg.log_ratio_clamp, entropy_coef=cfg.entropy_coef)


def loss_totals(cfg, mask: torch.Tensor,
                all_sum: Callable[[torch.Tensor], torch.Tensor] = lambda t: t) -> tuple[torch.Tensor, torch.Tensor]:
    """(num_seqs, num_tokens) of an optimizer batch for grpo_loss: ``mask`` is this rank's (b, T) loss
    mask of the batch, ``all_sum`` sums over ranks. num_seqs counts the rows cfg.loss_seq_norm says
    (rftlib.algo.aggregation: nonempty, verl's, or all, TRL's); both are clamped to >= 1, so a batch
    with nothing in the loss aggregates to 0, not NaN."""
    seqs, tokens = batch_totals(mask, seq_norm=cfg.loss_seq_norm)
    return all_sum(seqs).clamp(min=1.0), all_sum(tokens).clamp(min=1.0)


def shape_rewards(cfg, rewards: torch.Tensor, lengths: torch.Tensor, *,
                  behaviour_logprobs: torch.Tensor | None = None, ref_logprobs: torch.Tensor | None = None,
                  completion_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """Task rewards (N,) -> rewards for the advantages (N,), and what was added, for the metrics.

    1. DAPO's soft overlong penalty when cfg.overlong_buffer_len > 0 (lengths: (N,) token counts).
    2. KL in the reward when cfg.kl_in_reward: r - beta * sum_t KL_t with cfg.kl_estimator on the
       sampling policy's logprobs (behaviour_logprobs; the old ones) against ref_logprobs, (N, T).
    """
    out = rewards.float()  # (N,)
    metrics: dict[str, float] = {}
    if cfg.overlong_buffer_len > 0:
        pen = overlong_penalty(lengths, cfg.max_new_tokens, cfg.overlong_buffer_len, cfg.overlong_penalty_factor)
        out = out + pen  # (N,)
        metrics.update(overlong_penalty_mean=float(pen.mean()), overlong_penalized_frac=float((pen < 0).float().mean()))
    if cfg.kl_in_reward:
        if behaviour_logprobs is None or ref_logprobs is None or completion_mask is None:
            raise ValueError("kl_in_reward needs behaviour_logprobs, ref_logprobs and completion_mask")
        kl = kl_tokens(cfg.kl_estimator, behaviour_logprobs, ref_logprobs)  # (N, T)
        before = out
        out = kl_in_reward(out, kl, completion_mask, cfg.beta)  # (N,)
        metrics["kl_reward_penalty_mean"] = float((before - out).mean())
    return out, metrics


def loss_mask(cfg, completion_mask: torch.Tensor, truncated: torch.Tensor,
              row_mask: torch.Tensor | None = None) -> torch.Tensor:
    """The (N, T) mask the loss and its token/sequence totals use: the completion mask, less truncated
    completions when cfg.mask_truncated_completions, less rows with row_mask 0 (dynamic sampling)."""
    mask = completion_mask  # (N, T)
    if cfg.mask_truncated_completions:
        mask = untruncated_mask(mask, truncated)  # (N, T)
    if row_mask is not None:
        mask = mask * row_mask.unsqueeze(-1)  # (N, T)
    return mask


@dataclass
class Groups:
    """Rollout groups as the dynamic-sampling step sees them: one opaque item per prompt (what the
    trainer needs to rebuild its batch: the prompt's rows of a Rollout, its example, ...) and the
    prompt-major rewards, (len(items) * G,)."""

    items: list
    rewards: torch.Tensor  # (k*G,)


@dataclass
class DynamicBatch:
    items: list  # B items
    rewards: torch.Tensor  # (B*G,)
    row_mask: torch.Tensor  # (B*G,) float {0, 1}: 0 on groups left out of the loss
    metrics: dict[str, float] = field(default_factory=dict)


def dynamic_sampling(first: Groups, sample_more: Callable[[int], Groups], *, group_size: int, mode: str,
                     max_rounds: int = 3, batch_groups: int | None = None) -> DynamicBatch:
    """DAPO's dynamic sampling (Yu et al. 2025, sec. 3.2, eq. 11) over groups of G completions.

    A group whose G rewards are all equal has zero group-relative advantage everywhere.
        off     keep the batch as it is.
        mask    keep it, with those groups' rows masked out of the loss (row_mask 0), as TRL does.
        refill  drop them and call ``sample_more(k)`` for k more prompts (a Groups of k items), up
                to ``max_rounds`` times, until ``batch_groups`` (default: len(first.items)) informative
                groups are in; the first batch_groups are kept in order of arrival. Each call asks for
                the shortfall divided by the informative fraction seen so far (at most batch_groups).
                If the cap is reached short of a full batch, dropped groups top it up with row_mask 0,
                so the batch keeps its shape, and ``dyn/filled`` is 0.
    Metrics: dyn/constant_group_frac (of the groups seen), dyn/extra_rollouts (completions generated
    beyond the first batch), dyn/rounds (extra generate calls), dyn/filled, dyn/masked_group_frac
    (of the returned batch).
    """
    G = group_size
    B = batch_groups if batch_groups is not None else len(first.items)
    if mode not in ("off", "mask", "refill"):
        raise ValueError(f"dynamic_sampling mode '{mode}': choose off, mask or refill")
    if first.rewards.shape != (len(first.items) * G,):
        raise ValueError(f"rewards {tuple(first.rewards.shape)} must be (len(items) x G,) = ({len(first.items) * G},)")
    const = constant_groups(first.rewards, G)  # (k,)
    if mode in ("off", "mask"):
        keep = torch.ones_like(const) if mode == "off" else ~const  # (k,)
        return DynamicBatch(first.items, first.rewards, group_row_mask(keep, G), {
            "dyn/constant_group_frac": float(const.float().mean()), "dyn/extra_rollouts": 0.0, "dyn/rounds": 0.0,
            "dyn/filled": 1.0, "dyn/masked_group_frac": float((~keep).float().mean())})

    kept: list[tuple[Any, torch.Tensor]] = []  # (item, (G,) rewards) of informative groups
    dropped: list[tuple[Any, torch.Tensor]] = []
    seen = n_const = rounds = extra = 0
    batch = first
    while True:
        const = constant_groups(batch.rewards, G)  # (k,)
        grouped = batch.rewards.view(-1, G)  # (k, G)
        for item, r, c in zip(batch.items, grouped, const.tolist()):
            (dropped if c else kept).append((item, r))
        seen += len(batch.items)
        n_const += int(const.sum())
        if len(kept) >= B or rounds >= max_rounds:
            break
        informative = (seen - n_const) / seen
        ask = B if informative == 0 else min(B, math.ceil((B - len(kept)) / informative))
        batch = sample_more(ask)
        if batch.rewards.shape != (len(batch.items) * G,):
            raise ValueError(f"sample_more({ask}) returned rewards {tuple(batch.rewards.shape)} for "
                             f"{len(batch.items)} items of {G} completions")
        rounds += 1
        extra += len(batch.items) * G
    chosen = kept[:B]
    filler = dropped[:B - len(chosen)]
    keep = torch.tensor([True] * len(chosen) + [False] * len(filler))  # (B,)
    rows = chosen + filler
    return DynamicBatch([it for it, _ in rows], torch.cat([r for _, r in rows]), group_row_mask(keep, G), {
        "dyn/constant_group_frac": n_const / seen, "dyn/extra_rollouts": float(extra), "dyn/rounds": float(rounds),
        "dyn/filled": float(len(chosen) == B), "dyn/masked_group_frac": float((~keep).float().mean())})



LEFT_PADDED = ("prompt_ids", "prompt_mask")  # Rollout fields padded on the left (prompts end where generation starts)


def gather_groups(picks: list[tuple[Any, int]], pad_id: int):
    """One Rollout from groups of several: ``picks`` = [(rollout, group index), ...] in batch order.

    Rollouts from different generate calls differ in width (P, T): prompts are left-padded and
    completions right-padded to the widest, with ``pad_id`` in ``*_ids`` and 0 elsewhere (masks 0,
    behaviour logprobs 0), so every padded position is masked. Per-row tensors and lists are taken
    row by row; other fields (group_size) must agree. This is how a dynamic-sampling batch is
    rebuilt from the groups it kept (Groups.items can be these (rollout, group index) pairs).
    """
    if not picks:
        raise ValueError("gather_groups needs at least one group")
    first = picks[0][0]
    G = first.group_size
    out: dict[str, Any] = {}
    for f in dataclasses.fields(first):
        vals = [getattr(ro, f.name) for ro, _ in picks]
        rows = [slice(i * G, (i + 1) * G) for _, i in picks]
        if isinstance(vals[0], torch.Tensor) and vals[0].dim() == 2:
            width = max(v.shape[1] for v in vals)
            fill = pad_id if f.name.endswith("_ids") else 0
            left = f.name in LEFT_PADDED
            parts = []
            for v, r in zip(vals, rows):
                part = v[r]  # (G, w)
                pad = part.new_full((G, width - part.shape[1]), fill)
                parts.append(torch.cat([pad, part] if left else [part, pad], dim=1))
            out[f.name] = torch.cat(parts)  # (k*G, width)
        elif isinstance(vals[0], torch.Tensor) and vals[0].dim() == 1:
            out[f.name] = torch.cat([v[r] for v, r in zip(vals, rows)])  # (k*G,)
        elif isinstance(vals[0], list):
            out[f.name] = [x for v, r in zip(vals, rows) for x in v[r]]
        else:
            if any(v != vals[0] for v in vals):
                raise ValueError(f"gather_groups: rollouts disagree on {f.name}: {sorted(set(map(str, vals)))}")
            out[f.name] = vals[0]
    return type(first)(**out)
