"""What each public phase of the Trainer returns, and the hooks that observe the phases.

One GRPO step is ``rollout`` (generate + score; dynamic sampling may call it again) -> ``advantages``
(reference / old logprobs, shaped rewards, group-relative advantages, the loss mask) -> ``update``
(the micro-batched, gradient-accumulated optimizer steps) -> ``sync`` (the engine gets the new
weights); ``evaluate`` scores the held-out set. Each returns one of the dataclasses below, so the
code around the trainer (rftlib.validate, bench/, the tests) reads fields instead of keys,
and calls the phases instead of patching private methods.

Observing a phase: ``Trainer.hooks`` are callables ``hook(phase, seconds, result)`` called after each
phase with its wall time and what it returned; ``Trainer.around`` are callables ``around(phase)``
returning a context manager entered around each phase (a memory meter that must see the phase begin).
Phases: ``rollout`` (Scored), ``advantages`` (Advantaged), ``update`` (UpdateResult), ``sync``
(SyncResult), ``eval`` (EvalResult), ``step`` (the metrics row), and ``forward`` (Forward: one forward
of the policy or reference over some rows, with or without gradients: what a work counter needs).

Dimensions as in rftlib.algo: N rows (prompts x G, prompt-major), T completion tokens.
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager

import torch

from rftlib.train.steps import Groups

Hook = Callable[[str, float, Any], None]
"""hook(phase, seconds, result): called after a phase with its wall time and its result"""
Around = Callable[[str], ContextManager]
"""around(phase): a context manager entered around a phase"""


def settle(device) -> None:
    """Wait until ``device`` has run the kernels queued on it (CUDA: ``torch.cuda.synchronize``; nothing
    elsewhere). CUDA returns from a launch before the kernel runs, so a phase timed without this would end
    early and hand its kernels' time to the next phase's clock (the update's tail showing up as sync)."""
    if getattr(device, "type", None) == "cuda":
        torch.cuda.synchronize(device)


def phase(name: str, *, synchronize: bool = True):
    """Decorate a Trainer method as the public phase ``name``: it runs inside every ``self.around``
    context, is timed up to the end of its kernels (``synchronize``: :func:`settle` on the trainer's device,
    ``self.dist.device``), and every ``self.hooks`` entry then sees (name, seconds, result)."""
    def decorate(fn):
        @functools.wraps(fn)
        def run(self, *args, **kwargs):
            with contextlib.ExitStack() as stack:
                for around in self.around:
                    stack.enter_context(around(name))
                t = time.time()
                result = fn(self, *args, **kwargs)
                if synchronize:  # its kernels are its time
                    settle(getattr(getattr(self, "dist", None), "device", None))
                seconds = time.time() - t
            timeline = getattr(self, "timeline", None)  # the trainer's (rftlib.train.timeline_hook), once it has one
            if timeline is not None:
                timeline.on_phase(name, t, t + seconds)
            for hook in self.hooks:
                hook(name, seconds, result)
            return result
        return run
    return decorate


@dataclass
class Scored(Groups):
    """One generate call, scored: ``items`` one per prompt, (rollout, group index, example, pool index, the
    G rows' reward diagnostics), ``rewards`` (k*G,) host, prompt-major; how long generation and scoring took."""

    generate_seconds: float = 0.0
    reward_seconds: float = 0.0
    version: int = 0  # the policy version that sampled it: updates applied to the weights the engine used


@dataclass
class Advantaged:
    """The batch the update trains on: its rows, rewards and advantages, the reference and old
    logprobs (None when not needed), and the loss mask."""

    rollout: Any  # rftlib.rollout.base.Rollout of the kept groups (N rows)
    examples: list  # (B,) the prompts' examples
    indices: list[int]  # (B,) their pool indices
    rewards: list[float]  # (N,) task rewards
    diags: list[dict]  # (N,) the reward's per-row diagnostics
    advantages: torch.Tensor  # (N,) host, float32
    loss_mask: torch.Tensor  # (N, T) on the trainer's device
    ref_logprobs: torch.Tensor | None  # (N, T) the KL reference's, beta > 0
    old_logprobs: torch.Tensor | None  # (N, T) the policy's before the update, when not on-policy
    metrics: dict[str, float] = field(default_factory=dict)  # what reward shaping added (overlong, KL in reward)
    reference_seconds: float = 0.0  # the no-grad reference / old-logprob passes


@dataclass
class UpdateResult:
    """What the update did, for the metrics row (rftlib.train.step_metrics). Lists per optimizer step
    (``loss``, ``grad_norm``, ``lr``, ``gns``, ``seq_log_ratio``) or per micro-batch run (``tokens``,
    ``micro_metrics``; ``entropy`` and ``behaviour_diff`` from the first pass over the rollout only)."""

    loss: list[float] = field(default_factory=list)  # the global loss of each optimizer step
    grad_norm: list[float] = field(default_factory=list)
    lr: list[float] = field(default_factory=list)  # the LR each optimizer step used
    clip: tuple[float, float] = (0.0, 0.0)  # (clip_low, clip_high) the loss was called with
    tokens: list[float] = field(default_factory=list)  # completion tokens of each micro-batch run
    micro_metrics: list[dict[str, float]] = field(default_factory=list)  # the loss's metrics per micro-batch
    entropy: list[torch.Tensor] = field(default_factory=list)  # (tokens,) per micro-batch, host
    behaviour_diff: list[torch.Tensor] = field(default_factory=list)  # (tokens,) |trainer - engine| logprob
    seq_log_ratio: list[torch.Tensor] = field(default_factory=list)  # (rows run,) per optimizer step, host
    gns: list[dict[str, float]] = field(default_factory=list)  # the noise-scale probe's, per optimizer step
    rows_seen: int = 0  # rows the update was given, over every optimizer batch
    rows_run: int = 0  # of them, rows that went through the model (zero-advantage rows may be skipped)

    @property
    def grad_norm_max(self) -> float:
        """The largest gradient norm of the step; a non-finite one counts as the largest (a spike)."""
        return max(self.grad_norm, key=lambda g: math.inf if not math.isfinite(g) else g)


@dataclass
class SyncResult:
    """The engine's weight sync (rftlib.rollout.base.RolloutEngine.sync_weights): seconds, bytes moved,
    and the probe's gap (0 for an engine that shares the trainer's module). ``details``: the engine's dict."""

    seconds: float = 0.0
    bytes: int = 0
    probe_max_diff: float = 0.0
    probe_baseline: float = 0.0
    probe_threshold: float = 0.0
    probe_noise: float = 0.0
    details: dict = field(default_factory=dict)

    @classmethod
    def of(cls, d: dict) -> "SyncResult":
        known = {k: d[k] for k in ("seconds", "bytes", "probe_max_diff", "probe_baseline", "probe_threshold",
                                   "probe_noise") if k in d}
        return cls(**known, details=dict(d))


@dataclass
class EvalResult:
    """One evaluation: the step it scored and its row (``eval/<probe>/<metric>`` values, ``timing/eval``)."""

    step: int
    metrics: dict[str, Any]  # {"step": step, "eval/heldout/greedy_pass@1": ..., ..., "timing/eval": s}

    def values(self) -> dict[str, Any]:
        """The row's values without its step: what a training step's row takes in."""
        return {k: v for k, v in self.metrics.items() if k != "step"}


@dataclass
class Forward:
    """One forward of the policy (or a frozen reference) over some rows: the rows as run (trimmed to their
    own longest prompt and completion), (n, T') logprobs and entropies (None when not asked for), and
    whether it kept a graph for a backward."""

    rows: dict[str, torch.Tensor]
    logprobs: torch.Tensor  # (n, T')
    entropy: torch.Tensor | None  # (n, T')
    grad: bool

    @property
    def tokens(self) -> float:
        """Prompt + completion tokens the forward ran (the work, padding aside)."""
        return float(self.rows["prompt_mask"].sum() + self.rows["completion_mask"].sum())
