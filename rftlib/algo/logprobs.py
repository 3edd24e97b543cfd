"""Per-token log-probabilities and entropies of sampled tokens, without the full logits tensor.

Dimensions: N rows, T completion tokens, H hidden size, V vocabulary. The straightforward route
(``full_logprobs_entropy``) materialises (N, T, V) float32 logits -- 4096 tokens x 152k vocab is
2.5 GB, plus as much again for log_softmax and for their gradients -- which dominates the memory of
RL fine-tuning. ``chunked_logprobs_entropy`` starts from the final hidden states instead and runs
the LM head on ``chunk_size`` token rows at a time; under autograd each chunk is recomputed in the
backward pass (activation checkpointing), so only the (chunk, H) inputs are kept, never the
(chunk, V) logits of every chunk at once.

Entropy is a diagnostic (entropy collapse is GRPO's classic failure), so by default it is computed
under no_grad: its softmax need not be kept for backward. Pass ``entropy_grad=True`` to
back-propagate through it (needed only for an entropy bonus).
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


LOGITS_CHUNK_BYTES = 64 * 2**20  # one chunk's float32 logits: the budget the auto chunk size keeps to
MAX_CHUNK_ROWS = 1024


def auto_chunk_size(vocab_size: int, budget_bytes: int = LOGITS_CHUNK_BYTES, max_rows: int = MAX_CHUNK_ROWS,
                    min_rows: int = 16) -> int:
    """Token rows per LM-head chunk such that one chunk's float32 logits stay within ``budget_bytes``.

    The update's peak above the model is a few (chunk, V) float32 tensors (logits, their softmax,
    their gradient, measured ~6x one chunk's logits), so a fixed row count costs 3x more memory on
    Qwen's 151,936-token vocabulary than on a 49,152 one. 64 MiB gives 1024 rows up to V = 16,384,
    341 for SmolLM2 (49,152), 110 for Qwen (151,936): each chunk is still a (rows, H) x (H, V) matmul
    of at least ~10^9 FLOPs for H >= 512, large enough to run near the machine's GEMM rate.
    """
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
    return max(min_rows, min(max_rows, budget_bytes // (4 * vocab_size)))


LOGITS_KEEP_BYTES = 256 * 2**20  # float32 logits a pass may keep for backward instead of recomputing them


def recompute_needed(tokens: int, vocab_size: int, chunk_size: int, keep_bytes: int = LOGITS_KEEP_BYTES) -> bool:
    """Whether a chunked LM-head pass over ``tokens`` rows should recompute each chunk's logits in
    backward (the ``auto`` policy): only when it spans several chunks *and* keeping every chunk's
    float32 logits (tokens x V x 4 bytes) would exceed ``keep_bytes``. Below that the recompute's
    extra LM-head matmul (on SmolLM2 ~20% of the model's matmul FLOPs) buys back little memory; above
    it (Qwen's 151,936 vocabulary: from 442 tokens on) the kept logits would dominate the peak."""
    return tokens > chunk_size and tokens * vocab_size * 4 > keep_bytes


def _entropy_from_logits(logits: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """H = -sum p log p = logsumexp(z) - sum softmax(z) * z. (..., V), (...) -> (...)."""
    return lse - (torch.softmax(logits, dim=-1) * logits).sum(dim=-1)


def _chunk_logprobs_entropy(
    h: torch.Tensor,  # (C, H)
    weight: torch.Tensor | None,  # (V, H); None when ``head`` is given
    bias: torch.Tensor | None,  # (V,)
    targets: torch.Tensor,  # (C,) long
    temperature: float,
    with_entropy: bool,
    entropy_grad: bool,
    head=None,  # a callable (C, H) -> (C, V), e.g. the model's lm_head module
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob of each target and (optionally) entropy, for one chunk of C token rows."""
    logits = (head(h) if head is not None else F.linear(h, weight, bias)).float()  # (C, V) float32
    if temperature != 1.0:  # skip a (C, V) copy in the common case
        logits = logits / temperature  # (C, V)
    lse = torch.logsumexp(logits, dim=-1)  # (C,)
    logprobs = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse  # (C,)
    entropy = None
    if with_entropy:
        with nullcontext() if entropy_grad else torch.no_grad():
            entropy = _entropy_from_logits(logits, lse)  # (C,)
    return logprobs, entropy


def chunked_logprobs_entropy(
    hidden: torch.Tensor,
    lm_head_weight: torch.Tensor | None,
    targets: torch.Tensor,
    *,
    head=None,  # instead of lm_head_weight: a callable (C, H) -> (C, V) logits, called once per chunk
    temperature: float = 1.0,  # the sampling temperature: logprobs of the distribution that sampled
    chunk_size: int = 1024,  # token rows per LM-head call; peak extra memory ~ chunk_size * V * 4 bytes * a few
    lm_head_bias: torch.Tensor | None = None,
    with_entropy: bool = True,
    checkpoint_chunks: bool | str = True,  # recompute each chunk in backward; "auto": only when there are several chunks
    entropy_grad: bool = False,  # back-propagate through the entropy (only for an entropy bonus)
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log pi(target) and entropy per token from hidden states, ``chunk_size`` tokens at a time.

    hidden: (N, T, H) final hidden states at the positions that predict ``targets``;
    lm_head_weight: (V, H); targets: (N, T) integer token ids.
    ``head``, when given, replaces the weight: the LM head *module* is called on each chunk, so a
    parallel wrapper sees the call (ZeRO-3 gathers a partitioned weight only inside its module's
    forward; reading ``.weight`` directly would see an empty shard).
    The matmul runs in the dtype of hidden/weight (as the model's own lm_head would); the logits
    are then upcast to float32 and divided by ``temperature`` before any softmax.
    ``targets`` must be valid ids everywhere, padding included (use e.g. the pad token id there and
    mask the result later): gather rejects negative ids such as -100.
    Returns (logprobs (N, T) float32, entropy (N, T) float32 or None when with_entropy=False).
    Values equal ``full_logprobs_entropy(hidden @ W.T + b, targets)`` up to float rounding.
    ``checkpoint_chunks``: True recomputes every chunk's logits in backward (one more LM-head matmul
    per chunk; only the (C, H) inputs are kept); False keeps each chunk's logits for backward;
    "auto" recomputes only when N*T spans more than one chunk -- a single chunk's logits are alive
    during the backbone's backward either way, so recomputing it would cost time and save no peak.
    """
    if checkpoint_chunks not in (True, False, "auto"):
        raise ValueError(f"checkpoint_chunks must be True, False or 'auto', got {checkpoint_chunks!r}")
    if hidden.dim() != 3 or targets.shape != hidden.shape[:2]:
        raise ValueError(f"need hidden (N, T, H) and targets (N, T); got {tuple(hidden.shape)} and {tuple(targets.shape)}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    n, t, h = hidden.shape
    flat_hidden = hidden.reshape(n * t, h)  # (N*T, H)
    flat_targets = targets.reshape(n * t).long()  # (N*T,)
    if head is None and lm_head_weight is None:
        raise ValueError("pass lm_head_weight or head")
    head_grad = (head is not None and any(p.requires_grad for p in getattr(head, "parameters", lambda: [])())) or (
        lm_head_weight is not None and lm_head_weight.requires_grad) or (
        lm_head_bias is not None and lm_head_bias.requires_grad)
    needs_grad = torch.is_grad_enabled() and (hidden.requires_grad or head_grad)
    recompute = needs_grad and (checkpoint_chunks is True or (checkpoint_chunks == "auto" and n * t > chunk_size))
    logprob_chunks, entropy_chunks = [], []
    for start in range(0, n * t, chunk_size):
        args = (
            flat_hidden[start : start + chunk_size],  # (C, H)
            lm_head_weight,
            lm_head_bias,
            flat_targets[start : start + chunk_size],  # (C,)
            temperature,
            with_entropy,
            entropy_grad,
            head,
        )
        if recompute:
            lp, ent = checkpoint(_chunk_logprobs_entropy, *args, use_reentrant=False)
        else:
            lp, ent = _chunk_logprobs_entropy(*args)
        logprob_chunks.append(lp)
        entropy_chunks.append(ent)
    logprobs = torch.cat(logprob_chunks).view(n, t)  # (N, T)
    entropy = torch.cat(entropy_chunks).view(n, t) if with_entropy else None  # (N, T)
    return logprobs, entropy


def full_logprobs_entropy(
    logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    *,
    with_entropy: bool = True,
    entropy_grad: bool = False,  # as in chunked_logprobs_entropy, so both paths behave alike
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Reference: log pi(target) and entropy from full logits (N, T, V). Simple; memory O(N*T*V).

    Returns (logprobs (N, T) float32, entropy (N, T) float32 or None).
    """
    if logits.dim() != 3 or targets.shape != logits.shape[:2]:
        raise ValueError(f"need logits (N, T, V) and targets (N, T); got {tuple(logits.shape)} and {tuple(targets.shape)}")
    scaled = logits.float() / temperature  # (N, T, V)
    log_probs_all = torch.log_softmax(scaled, dim=-1)  # (N, T, V)
    logprobs = log_probs_all.gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)  # (N, T)
    entropy = None
    if with_entropy:
        with nullcontext() if entropy_grad else torch.no_grad():
            entropy = -(log_probs_all.exp() * log_probs_all).sum(dim=-1)  # (N, T)
    return logprobs, entropy
