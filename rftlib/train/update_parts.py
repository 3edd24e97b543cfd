"""The parts of the update that are not the loss: each its own function, so the update loop
(rftlib.train.loop.Trainer.update) reads as micro-batches -> loss -> backward -> optimizer step.

- ``truncated_is``: the truncated importance-sampling correction for an engine that is not the
  trainer's module (its own numerics sample the rollout), and its metrics.
- ``NoiseScaleProbe``: McCandlish et al.'s simple noise scale from the per-micro-batch gradients of
  one optimizer batch (``gns_probe``).
- ``sequence_log_ratio`` and ``token_diagnostics``: what the metrics row reports of a micro-batch
  (the importance ESS's sequence log-ratios; entropy and the engine's logprob gap per token).
- ``rows_of`` and ``full_width``: a micro-batch's rows of a rollout, trimmed to their own padding, and
  their logprobs back at the rollout's width; ``no_grad_batch_rows``: how many rows a no-grad
  (reference / old-logprob) forward runs.

Dimensions: n rows of a micro-batch, T' its completion width.
"""

from __future__ import annotations

import torch

from rftlib.algo.correction import tis_weights
from rftlib.algo.diagnostics import simple_noise_scale
from rftlib.models.loading import causal_lm
from rftlib.models.memory import nograd_rows, shape_from_hf_config
from rftlib.train.step_memory import free_bytes


def truncated_is(old: torch.Tensor, behaviour: torch.Tensor, mask: torch.Tensor, *, cap: float,
                 level: str) -> tuple[torch.Tensor, dict[str, float]]:
    """(n, T') truncated IS weights pi_old / pi_behaviour (rftlib.algo.correction.tis_weights) and their
    metrics named ``tis/<name>`` for the row. ``old``, ``behaviour``, ``mask``: (n, T')."""
    weights, stats = tis_weights(old, behaviour, mask, cap=cap, level=level)
    return weights, {f"tis/{k}": v for k, v in stats.items()}


class NoiseScaleProbe:
    """The simple noise scale B_simple = tr(Sigma) / |G|^2 of one optimizer batch of ``batch_rows`` rows cut
    into micro-batches of ``micro_rows`` (rftlib.algo.diagnostics.simple_noise_scale): after each micro-batch's
    backward, ``after_backward`` takes that micro-batch's own gradient (the accumulated one less the one before),
    rescaled to a mean gradient; ``result`` estimates from them and the batch's gradient. Every backend that
    exposes per-micro-step gradients (``micro_step_grads``) supports it."""

    def __init__(self, params, batch_rows: int, micro_rows: int):
        self.params, self.batch_rows, self.micro_rows = params, batch_rows, micro_rows
        self.prev: torch.Tensor | None = None  # (P,) the accumulated gradient after the last micro-batch
        self.micro_sq: list[torch.Tensor] = []  # () squared norms of each micro-batch's mean gradient

    def after_backward(self, rows: int) -> None:
        """Record the micro-batch of ``rows`` rows whose backward just ran."""
        flat = torch.cat([p.grad.reshape(-1) for p in self.params if p.grad is not None])  # (P,)
        g = flat if self.prev is None else flat - self.prev
        self.micro_sq.append((g * (self.batch_rows / rows)).pow(2).sum())
        self.prev = flat.clone()

    def result(self) -> dict[str, float] | None:
        """The estimate's values for the row (None when no micro-batch ran)."""
        if self.prev is None:
            return None
        return {k: float(v) for k, v in simple_noise_scale(torch.stack(self.micro_sq), self.prev.pow(2).sum(),
                                                           self.micro_rows, self.batch_rows).items()}


def sequence_log_ratio(logp: torch.Tensor, old: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(n,) host: each row's summed log pi / pi_old over its completion (the importance ESS's input)."""
    return ((logp.detach() - old) * mask).sum(-1).float().cpu()


def token_diagnostics(logp: torch.Tensor, entropy: torch.Tensor, behaviour: torch.Tensor,
                      mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(entropy, |logp - behaviour|) of every completion token, host: the policy's entropy, and the engine's
    sampling logprobs against the trainer's (0 up to float noise for HF generate; a vLLM engine's numerics
    show here). All (n, T') in."""
    valid = mask > 0
    return (entropy.detach()[valid].float().cpu(),
            (logp.detach() - behaviour).abs()[valid].float().cpu())


def rows_of(ro, idx: torch.Tensor) -> dict[str, torch.Tensor]:
    """The rows ``idx`` of a rollout, trimmed to their own longest prompt and completion: a
    micro-batch pays for its own padding, not the rollout's (prompts are left-padded, so leading
    all-pad columns go; completions right-padded, so trailing ones go). Positions come from the
    attention mask, so the trim changes no logprob; results are (n, P') and (n, T') with T' <= T."""
    pm, cm = ro.prompt_mask[idx], ro.completion_mask[idx]  # (n, P), (n, T)
    p0 = int(pm.any(0).float().argmax())  # first prompt column any row uses
    used = cm.any(0).nonzero()
    t1 = int(used.max()) + 1 if used.numel() else 1  # last completion column any row uses, + 1
    return dict(prompt_ids=ro.prompt_ids[idx][:, p0:], prompt_mask=pm[:, p0:],
                completion_ids=ro.completion_ids[idx][:, :t1], completion_mask=cm[:, :t1])


def full_width(lp: torch.Tensor, T: int) -> torch.Tensor:
    """(n, T') logprobs of trimmed rows -> (n, T), zero where trimmed (all masked there)."""
    return torch.nn.functional.pad(lp, (0, T - lp.shape[1]))


def no_grad_batch_rows(cfg, model, ro, *, amp, chunk_rows: int, vocab_size: int, device) -> int:
    """Rows per no-grad forward: ``logprob_batch_size``, else max(micro_batch_size, 8), fewer where the model
    runs eager attention and that many rows' (heads, T, T) scores would not fit NOGRAD_BUDGET of the memory
    free now (rftlib.models.memory.nograd_rows, the rule the preflight counts): at seed 003's T ~ 5,000,
    gpt-oss's eager scores are ~10 GB a row, so 8 rows beside a ZeRO-3 partition would not fit an H100.
    ``amp``: the autocast dtype or None; ``chunk_rows``: the LM head's chunk rows."""
    if cfg.logprob_batch_size:
        return cfg.logprob_batch_size
    most = max(cfg.micro_batch_size, 8)
    lm = causal_lm(model)
    if getattr(lm.config, "_attn_implementation", None) != "eager":
        return most
    width = ro.prompt_ids.shape[1] + ro.completion_ids.shape[1]  # the widest a forward of these rows gets
    b = (amp or lm.dtype).itemsize  # the scores' dtype: autocast's, else the weights'
    rb = lm.get_input_embeddings().weight.dtype.itemsize  # the residual stream's (float32 masters: 4)
    fixed = min(most * width, chunk_rows) * vocab_size * 8  # one logits chunk + log-softmax
    return nograd_rows(shape_from_hf_config(lm.config), width, b, "eager", free_bytes=free_bytes(device),
                       most=most, rb=rb, fixed_bytes=fixed)
