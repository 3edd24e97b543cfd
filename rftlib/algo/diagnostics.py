"""Research diagnostics from seed 001: the gradient noise scale and the importance weights' ESS.

Pure functions over tensors; the trainer feeds them per-micro-batch and full-batch quantities.
"""

from __future__ import annotations

import torch


def simple_noise_scale(small_sq_norms: torch.Tensor, big_sq_norm: torch.Tensor, b_small: float,
                       b_big: float) -> dict[str, torch.Tensor]:
    """McCandlish et al. 2018 ("An Empirical Model of Large-Batch Training", appendix A.1).

    From E|G_B|^2 = |G|^2 + tr(S)/B measured at two batch sizes:
        |G|^2  ~ (b_big |G_big|^2 - b_small |G_small|^2) / (b_big - b_small)
        tr(S)  ~ (|G_small|^2 - |G_big|^2) / (1/b_small - 1/b_big)
        B_simple = tr(S) / |G|^2  (the batch size where gradient noise and signal balance)
    small_sq_norms: (M,) squared norms of M micro-batch mean gradients (their mean is |G_small|^2);
    big_sq_norm: () squared norm of the full-batch mean gradient. Single-step estimates are noisy
    (|G|^2 can come out negative): average them over steps before reading B_simple.
    """
    if not b_big > b_small > 0:
        raise ValueError(f"need b_big > b_small > 0, got b_small={b_small}, b_big={b_big}")
    g_small = small_sq_norms.float().mean()
    g_big = big_sq_norm.float()
    g2 = (b_big * g_big - b_small * g_small) / (b_big - b_small)
    trace = (g_small - g_big) / (1.0 / b_small - 1.0 / b_big)
    return {"gns_grad_sq": g2, "gns_trace": trace, "gns_b_simple": trace / g2}


def importance_ess(log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Effective sample size of per-sequence importance weights, as a fraction of the sequences.

    w_i = exp(sum_t log_ratio_it) over valid tokens; ESS = (sum w)^2 / sum w^2 (Kong 1992), / N.
    1.0 exactly on-policy; it falls as the policy moves away from the one that sampled.
    log_ratio, mask: (N, T).
    """
    seq = (log_ratio.float() * mask).sum(-1)  # (N,)
    w = torch.exp(seq - seq.max())  # (N,) scaled for stability; the ratio is scale-free
    return (w.sum() ** 2 / (w.pow(2).sum() * w.numel())).detach()
