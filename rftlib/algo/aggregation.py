"""Reduce an (N, T) per-token loss to the scalar that is back-propagated, and masked reductions.

The three modes differ in how much weight each token gets (verl's ``agg_loss`` names):
    seq-mean-token-mean      GRPO (DeepSeekMath): mean over each completion's tokens, then over
                             completions. A token of a short answer weighs more than one of a long
                             answer -- the length bias Dr-GRPO points out.
    seq-mean-token-sum-norm  Dr-GRPO (Liu et al. 2025): divide each completion's token sum by one
                             constant (e.g. the max completion length), so every token weighs the same
                             whatever its completion's length.
    token-mean               DAPO (Yu et al. 2025): mean over all valid tokens of the batch.

Gradient accumulation is exact: ``num_seqs``/``num_tokens`` are the totals of the whole optimizer
batch, not of the micro-batch at hand, so every mode is a plain sum over rows divided by a
batch-wide constant, and summing the micro-batch aggregates gives the full-batch aggregate.

Which rows ``num_seqs`` counts (``batch_totals``, SEQ_NORMS) matters when the loss mask empties
whole rows (dynamic sampling's masked groups, truncated completions left out, refill's top-up):
    nonempty  rows with at least one token in the loss (verl's ``agg_loss``): the seq-mean modes
              average over the completions that are in the loss.
    all       every row, empty ones included (TRL): an emptied row still counts, so masking a group
              of zero advantage changes no gradient at all under the seq-mean modes.
token-mean divides by the loss's tokens, which an empty row has none of: the choice does not touch it.

Masks are float {0, 1}, shape (N, T). Padded positions are selected out with ``torch.where`` (not
multiplied), so whatever value sits there -- even inf or NaN -- cannot reach the forward value.
"""

from __future__ import annotations

import torch

from rftlib.algo.catalog import AGGREGATIONS, SEQ_NORMS  # noqa: F401 (declared there)


def _row_sums(loss_mat: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum of the valid tokens of each row. (N, T) -> (N,)."""
    return torch.where(mask > 0, loss_mat, 0.0).sum(dim=-1)  # (N,)


def seq_mean_token_mean(loss_mat, mask, *, num_seqs, num_tokens, norm_const):
    """sum_i [ sum_t (loss*mask)_it / max(len_i, 1) ] / num_seqs. A fully masked row adds 0."""
    seq_len = mask.sum(dim=-1).clamp(min=1.0)  # (N,)
    return (_row_sums(loss_mat, mask) / seq_len).sum() / num_seqs


def seq_mean_token_sum_norm(loss_mat, mask, *, num_seqs, num_tokens, norm_const):
    """sum_i [ sum_t (loss*mask)_it / norm_const ] / num_seqs, norm_const a constant, not len_i."""
    return (_row_sums(loss_mat, mask) / norm_const).sum() / num_seqs


def token_mean(loss_mat, mask, *, num_seqs, num_tokens, norm_const):
    """sum_it (loss*mask)_it / num_tokens: every valid token of the batch weighs the same."""
    return _row_sums(loss_mat, mask).sum() / num_tokens


def batch_totals(mask: torch.Tensor, *, seq_norm: str = "nonempty") -> tuple[torch.Tensor, torch.Tensor]:
    """(num_seqs, num_tokens) of an (N, T) loss mask, 0-dim float tensors: the rows the seq-mean modes
    divide by (``seq_norm`` in SEQ_NORMS) and the valid tokens. Not clamped and not reduced over
    ranks: the caller sums them over its micro-batches and ranks, then clamps to >= 1."""
    if seq_norm not in SEQ_NORMS:
        raise ValueError(f"seq_norm '{seq_norm}': choose {' or '.join(SEQ_NORMS)}")
    tokens_per_row = mask.float().sum(dim=-1)  # (N,) float32: counts exact to 2^24
    if seq_norm == "nonempty":
        rows = (tokens_per_row > 0).float().sum()
    else:
        rows = torch.full((), float(mask.shape[0]), device=mask.device)
    return rows, tokens_per_row.sum()


def aggregate(
    mode: str,
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    *,
    num_seqs: float | torch.Tensor | None = None,
    num_tokens: float | torch.Tensor | None = None,
    norm_const: float | None = None,
) -> torch.Tensor:
    """Aggregate an (N, T) loss with mode ``mode`` (looked up in AGGREGATIONS). Returns a 0-dim tensor.

    Defaults describe this tensor alone (right when it is the whole optimizer batch):
    num_seqs = N (fully masked rows included), num_tokens = mask.sum() clamped to >= 1,
    norm_const = T. With micro-batches, pass the optimizer batch's totals instead.
    """
    fn = AGGREGATIONS.get(mode)
    if loss_mat.shape != mask.shape or loss_mat.dim() != 2:
        raise ValueError(f"loss_mat {tuple(loss_mat.shape)} and mask {tuple(mask.shape)} must both be (N, T)")
    n, t = loss_mat.shape
    num_seqs = n if num_seqs is None else num_seqs
    num_tokens = mask.sum().clamp(min=1.0) if num_tokens is None else num_tokens
    norm_const = t if norm_const is None else norm_const
    return fn(loss_mat, mask, num_seqs=num_seqs, num_tokens=num_tokens, norm_const=norm_const)


# --- masked reductions for metrics: 0-dim results, 0 (not NaN) when nothing is valid ---------


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of x over positions where mask > 0; 0 if there are none."""
    return torch.where(mask > 0, x, 0.0).sum() / mask.sum().clamp(min=1.0)


def masked_max(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Max of x over positions where mask > 0; 0 if there are none."""
    m = torch.where(mask > 0, x, float("-inf")).amax()
    return torch.where(mask.sum() > 0, m, torch.zeros_like(m))


def masked_min(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Min of x over positions where mask > 0; 0 if there are none."""
    return -masked_max(-x, mask)


def masked_quantile(x: torch.Tensor, mask: torch.Tensor, q: float) -> torch.Tensor:
    """q-quantile of x over positions where mask > 0 (linear interpolation, as torch.quantile); 0 if none.

    Sort-based and free of host syncs: boolean indexing (``x[mask > 0]``) would need the count of
    valid tokens on the host. Invalid positions are sent to -inf so they sort first; the n valid
    values then occupy the last n slots of the sorted vector.
    """
    flat_valid = mask.reshape(-1) > 0  # (M,)
    vals = torch.where(flat_valid, x.reshape(-1), float("-inf")).sort().values  # (M,)
    m = vals.shape[0]
    n = flat_valid.sum()  # 0-dim long
    pos = (m - n) + q * (n - 1).clamp(min=0)  # 0-dim float: fractional index into vals
    lo = pos.floor().long().clamp(0, m - 1).reshape(1)  # (1,)
    hi = pos.ceil().long().clamp(0, m - 1).reshape(1)  # (1,)
    v_lo, v_hi = vals.gather(0, lo)[0], vals.gather(0, hi)[0]
    v = v_lo + (v_hi - v_lo) * (pos - pos.floor())
    v = torch.where(lo[0] == hi[0], v_lo, v)  # an exact index: skip interpolation (avoids inf - inf)
    return torch.where(n > 0, v, torch.zeros_like(v))
