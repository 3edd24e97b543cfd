"""The sync probe: after every weight sync, check that the engine samples from the trainer's weights.

A few fixed prompts, a few tokens sampled by the engine with their logprobs, and the same tokens
scored by the trainer (rftlib.models.forward.completion_logprobs). Stale weights (a LoRA load that
silently kept the old adapter, a reload that missed a tied lm_head, a sleep that lost an update)
show up as a log-prob gap far above float noise (~1e-4 measured here), and the step fails loudly
instead of training on someone else's samples. Peers do not check this (TRL #5312).
Prompt logprobs are not used: with LoRA they crash vLLM's engine.
"""

from __future__ import annotations

import torch

from rftlib.models import forward

PROBE_PROMPTS = [
    "<|im_start|>user\nCalculate 3 + 4.<|im_end|>\n<|im_start|>assistant\n",
    "The capital of France is",
    "def add(a, b):\n    return",
]
PROBE_TOKENS = 6  # tokens sampled per probe prompt
PROBE_SEED = 1234  # fixed, so every probe samples comparable tokens


class SyncProbeError(RuntimeError):
    """The engine's logprobs disagree with the trainer's after a weight sync: stale weights."""


@torch.no_grad()
def probe_max_diff(engine, model) -> float:
    """max |engine - trainer| logprob over the probe's sampled tokens (temperature 1)."""
    trainer, behaviour, mask = probe_logprobs(engine, model)
    diff = (trainer.float() - behaviour).abs() * mask  # (N, T)
    return float(diff.max())


@torch.no_grad()
def probe_logprobs(engine, model) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(trainer logprobs, engine logprobs, completion mask), each (N, T) on the trainer's device: the
    engine's rollout comes back on the host (vLLM), so it moves to the model's device first."""
    ro = engine.generate(PROBE_PROMPTS, group_size=1, max_new_tokens=PROBE_TOKENS, temperature=1.0,
                         seed=PROBE_SEED)
    ro = ro.to(next(model.parameters()).device)
    was_training = model.training
    model.eval()
    try:
        trainer, _ = forward.completion_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.completion_ids,
                                         ro.completion_mask, temperature=1.0, with_entropy=False)  # (N, T)
    finally:
        model.train(was_training)
    return trainer, ro.behaviour_logprobs, ro.completion_mask


DEPARTURE = 10.0  # a later probe fails beyond max(tol, DEPARTURE x the gap measured after the first sync)
CANARY_STD = 0.05  # LoRA B entries of the start-up canary adapter (B is 0 in a fresh adapter)
CANARY_MIN_SHIFT = 1e-2  # the engine's first-token log-prob must move at least this much under the canary


def sync_threshold(tol: float, baseline: float | None) -> float:
    """The largest probe gap accepted: ``tol`` at the first sync; afterwards a clear departure from the
    gap that sync measured (numerics differ by engine and precision: ~1e-6 fp32 on CPU, ~1e-1 in bf16)."""
    return tol if baseline is None else max(tol, DEPARTURE * baseline)


def check_sync(engine, model, tol: float, baseline: float | None = None) -> float:
    """Run the probe; raise SyncProbeError with the gap, the baseline and the threshold when exceeded."""
    d = probe_max_diff(engine, model)
    limit = sync_threshold(tol, baseline)
    if not d <= limit:  # also catches NaN
        base = (f"; right after the first sync it was {baseline:.3g} (a {d / baseline:.3g}x departure; the limit "
                f"is max(vllm_sync_probe_tol, {DEPARTURE:g}x that))" if baseline else
                " at the first sync (vllm_sync_probe_tol; raise it if this engine's precision is lower)")
        raise SyncProbeError(
            f"sync probe: engine and trainer log-probs differ by {d:.4g} > {limit:.4g} on {len(PROBE_PROMPTS)} fixed "
            f"prompts after a weight sync{base}: the engine is sampling from stale or different weights (a LoRA "
            "load that kept the old adapter, a reload that missed a tied lm_head, or a dtype mismatch); refusing "
            "to train on its samples")
    return d


def first_token_shift(before, after) -> float:
    """How far an engine's probe samples moved between two adapters: per prompt, inf when the first sampled
    token differs (same seed, so only the weights changed it), else |log-prob difference| of that token."""
    shifts = []
    for i in range(before.completion_ids.shape[0]):
        if before.completion_ids[i, 0] != after.completion_ids[i, 0]:
            shifts.append(float("inf"))
        else:
            shifts.append(float((before.behaviour_logprobs[i, 0] - after.behaviour_logprobs[i, 0]).abs()))
    return max(shifts)


def canary_state(named_trainable, seed: int = 0) -> dict[str, torch.Tensor]:
    """The adapter with every LoRA B drawn from N(0, CANARY_STD^2) (a fresh adapter's B is 0, so the probe
    could not tell whether it reached the engine); other tensors as they are. named: (name, tensor) pairs."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for n, t in named_trainable:
        t = t.detach().to("cpu", copy=True)
        out[n] = torch.randn(t.shape, generator=g, dtype=torch.float32).to(t.dtype) * CANARY_STD if "lora_B" in n else t
    return out
