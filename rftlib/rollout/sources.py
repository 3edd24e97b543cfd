"""Rollout sources by name: what turns one step's examples into its scored ``Rollout`` (issue 40's seam).

A *rollout source* owns the whole of one batch's generation and scoring: the single-turn source formats the
prompts, samples G completions each and scores them with the training reward; a multi-turn source would drive
an environment (rftlib.envs) turn by turn through the engine. The trainer and its producer thread
(rftlib.train.pipeline) only hand it the examples and take back a :class:`Produced`, so another kind of rollout
is a new source registered here, not an edit of the trainer.

Torch-free on purpose (as rftlib.rollout.kinds): a config names its source and the name is checked without
importing an engine or torch; each built-in source is declared by ``"module:attr"`` and imported on first
``SOURCES.get``. A source is a callable::

    source(examples, *, engine, tok, system_prompt, reward, sampling, group_size, device, spans=None) -> Produced

It touches only the engine, the tokenizer, the reward (and an environment), never the trainer's module,
optimizer or a collective: a producer thread may run it while the trainer updates.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, ContextManager

from rftlib.algo.registry import Registry

SOURCES = Registry("rollout source")
"""name -> source(examples, *, engine, tok, system_prompt, reward, sampling, group_size, device, spans) -> Produced"""


@dataclass(frozen=True)
class Sampling:
    """How one batch samples: the length cap, temperature and nucleus, and (a threaded producer's) the engine's
    base seed and the adapter (policy version) to sample from; None: the engine's own, now."""

    max_new_tokens: int
    temperature: float
    top_p: float
    seed: int | None = None
    adapter: str | None = None
    greedy: bool = False
    """argmax instead of a draw (an eval through an environment: rftlib.eval.env_greedy_eval)"""

    def engine_kwargs(self) -> dict[str, Any]:
        """The engine's ``generate`` keywords: seed and adapter only when given (an engine that draws its own
        seed, or has no adapters, is called as before)."""
        extra = {k: v for k, v in (("seed", self.seed), ("adapter", self.adapter)) if v is not None}
        return dict(max_new_tokens=self.max_new_tokens, temperature=self.temperature, top_p=self.top_p, **extra)


@dataclass
class Produced:
    """One batch from a source: the rollout (prompt-major rows, G per example, on ``device``), each row's reward
    and reward diagnostics, and the seconds generation and scoring took."""

    rollout: Any  # rftlib.rollout.base.Rollout
    rewards: list[float]  # (N,) one per row
    diags: list[dict]  # N reward diagnostics
    generate_seconds: float
    reward_seconds: float


Spans = Callable[[str], ContextManager]
"""spans(phase) -> a context manager around the source's ``generate`` or ``reward`` work (the trainer's timeline)"""


def no_spans(phase: str) -> ContextManager:
    """The default ``spans``: nothing observed."""
    return contextlib.nullcontext()


SOURCES.declare("single_turn", "rftlib.rollout.single_turn:single_turn")
SOURCES.declare("multi_turn", "rftlib.rollout.multi_turn:multi_turn")


def source_name(env: str) -> str:
    """The rollout source a config's ``env`` selects: ``single_turn`` for the single_turn environment (the batched
    reward path, so the code reward keeps its sandbox batch), ``multi_turn`` for any other."""
    return "single_turn" if env == "single_turn" else "multi_turn"
