"""The sync probe: after every weight sync, check that the engine samples from the trainer's weights.

A few fixed prompts, a few tokens sampled by the engine with their logprobs, and the same tokens
scored by the trainer (rftlib.train.forward.completion_logprobs). Stale weights (a LoRA load that
silently kept the old adapter, a reload that missed a tied lm_head, a sleep that lost an update)
show up as a log-prob gap far above float noise (~1e-4 measured here), and the step fails loudly
instead of training on someone else's samples. Peers do not check this (TRL #5312).
Prompt logprobs are not used: with LoRA they crash vLLM's engine.
"""

from __future__ import annotations

import torch

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
    from rftlib.train.forward import completion_logprobs

    ro = engine.generate(PROBE_PROMPTS, group_size=1, max_new_tokens=PROBE_TOKENS, temperature=1.0,
                         seed=PROBE_SEED)
    ro = ro.to(next(model.parameters()).device)
    was_training = model.training
    model.eval()
    try:
        trainer, _ = completion_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.completion_ids,
                                         ro.completion_mask, temperature=1.0, with_entropy=False)  # (N, T)
    finally:
        model.train(was_training)
    return trainer, ro.behaviour_logprobs, ro.completion_mask


def check_sync(engine, model, tol: float) -> float:
    """Run the probe; raise SyncProbeError naming the gap and the tolerance when it is exceeded."""
    d = probe_max_diff(engine, model)
    if not d <= tol:  # also catches NaN
        raise SyncProbeError(
            f"sync probe: engine and trainer log-probs differ by {d:.4g} (> vllm_sync_probe_tol={tol}) on "
            f"{len(PROBE_PROMPTS)} fixed prompts after a weight sync: the engine is sampling from stale or "
            "different weights (a LoRA load that kept the old adapter, a reload that missed a tied lm_head, "
            "or a dtype mismatch); refusing to train on its samples")
    return d
