"""Tasks: a training pool, a disjoint held-out set, a prompt and a reward.

A task is what one attempt trains on. The trainer sees only this interface, so a new task
(a dataset from disk, a code problem set) plugs in by registering a builder.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from rftlib.algo.registry import Registry


@dataclass(frozen=True)
class Example:
    """One problem: the user message shown to the model and the gold answer the reward checks."""

    id: str
    prompt: str
    answer: str
    meta: dict = field(default_factory=dict, compare=False, hash=False)


@dataclass
class Task:
    """A training pool, a held-out set disjoint from it, and the reward for one completion."""

    name: str
    train: list[Example]
    eval: list[Example]
    reward: Callable[[str, Example, bool], tuple[float, dict[str, float]]]
    """reward(completion_text, example, truncated) -> (reward, numeric diagnostics)"""
    system_prompt: str | None = None
    """None keeps the model's chat-template default"""

    def __post_init__(self) -> None:
        overlap = {e.prompt for e in self.train} & {e.prompt for e in self.eval}
        if overlap:
            raise ValueError(f"task {self.name}: {len(overlap)} held-out prompts also in the training pool, "
                             f"e.g. {sorted(overlap)[0]!r}")


TASKS = Registry("task")


def build_task(name: str, **kwargs: Any) -> Task:
    return TASKS.get(name)(**kwargs)


def math_em_reward(completion: str, example: Example, truncated: bool) -> tuple[float, dict[str, float]]:
    """Seed 003's exact-match reward (boxed, else the last number) with its diagnostics."""
    from rftlib.rewards.math import math_reward

    r = math_reward(completion, example.answer, truncated=truncated)
    return r.reward, r.diagnostics()


# Builders register themselves on import.
from rftlib.data import arithmetic as _arithmetic  # noqa: E402,F401
