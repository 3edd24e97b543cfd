"""The reward seam: rewards registered by name, composed with weights, each component logged.

A reward scores one completion: ``row(text, example, truncated) -> (reward, diagnostics)``, the
diagnostics a flat dict of floats that becomes metrics next to ``reward_mean`` (``correctness``,
``has_boxed``, ...). A reward may also declare a ``batch`` form that scores a whole rollout in one
call (the code sandbox runs rows side by side); the trainer calls :meth:`Reward.score`, which uses
the declared batch form when there is one and goes row by row otherwise. Nothing is discovered with
``getattr``: a reward says what it has when it is made.

How to add a reward (one place)::

    from rftlib.rewards.registry import register_reward

    def brevity(text, example, truncated):        # (float, {diagnostic: float})
        return -len(text) / 1000, {}

    register_reward("brevity", brevity)           # or batch=fn for a batch form

then pick it for an attempt: ``rewards: {math_em: 1.0, brevity: 0.1}`` (RunConfig.rewards; the
name ``task`` stands for the task's own reward). The attempt's reward is the weighted sum
``sum_i w_i r_i`` (TRL's ``reward_funcs`` / ``reward_weights``); each component's own value is
logged as ``reward/<name>`` and the components' diagnostics are merged (the first component's
win on a clash, so the correctness reward listed first keeps ``correctness``). An attempt that
names no ``rewards`` uses its task's reward exactly as it was (no ``reward/*`` rows are added).
Held-out evaluation always reads the task's own reward (its ``correctness``): a format bonus moves
the training reward, never the accuracy an attempt is judged by.

Registered: ``math_em`` (rftlib.rewards.math), ``format_boxed`` and ``truncated_penalty`` (the
format and length terms of a composite: rftlib.rewards.terms), ``code_tests`` (beside the code
task's reward, rftlib.data.code_problems). A task's builder picks its default reward (a Task's
``reward``); the config overrides it per attempt.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from rftlib.algo.registry import Registry

RowReward = Callable[[str, Any, bool], "tuple[float, dict[str, float]]"]
BatchReward = Callable[[Sequence[str], Sequence[Any], Sequence[bool]], "list[tuple[float, dict[str, float]]]"]

TASK_REWARD = "task"
"""the name, in RunConfig.rewards, of the task's own reward"""


@dataclass(frozen=True)
class Reward:
    """A named reward with its row form and, when it has one, its batch form (declared, not found)."""

    name: str
    row: RowReward
    """row(completion_text, example, truncated) -> (reward, numeric diagnostics)"""
    batch: BatchReward | None = None
    """batch(texts, examples, truncated) -> one (reward, diagnostics) per row, in order; None: row by row"""

    def __call__(self, text: str, example: Any, truncated: bool) -> tuple[float, dict[str, float]]:
        return self.row(text, example, truncated)

    def score(self, texts: Sequence[str], examples: Sequence[Any], truncated: Sequence[bool]
              ) -> list[tuple[float, dict[str, float]]]:
        """(reward, diagnostics) of every row: the batch form in one call when declared, else row by row."""
        if self.batch is None:
            return [self.row(t, e, c) for t, e, c in zip(texts, examples, truncated)]
        scored = list(self.batch(list(texts), list(examples), list(truncated)))
        if len(scored) != len(texts):
            raise ValueError(f"reward '{self.name}': its batch form returned {len(scored)} results for "
                             f"{len(texts)} rows")
        return scored


@dataclass(frozen=True)
class WeightedReward(Reward):
    """``sum_i w_i r_i`` of several rewards; each component's own value is a diagnostic ``reward/<name>``."""

    parts: tuple[tuple[Reward, float], ...] = ()

    def __call__(self, text: str, example: Any, truncated: bool) -> tuple[float, dict[str, float]]:
        return self.score([text], [example], [truncated])[0]

    def score(self, texts, examples, truncated):
        columns = [(part, weight, part.score(texts, examples, truncated)) for part, weight in self.parts]
        out = []
        for i in range(len(texts)):
            total, diags = 0.0, {}
            for part, weight, scored in columns:
                r, d = scored[i]
                total += weight * float(r)
                for k, v in d.items():
                    diags.setdefault(k, v)  # the first component's diagnostic wins a clash
                diags[f"reward/{part.name}"] = float(r)
            out.append((total, diags))
        return out


REWARDS = Registry("reward")
"""name -> Reward; rftlib.data.base.registered_rewards() imports every module that registers one"""


def register_reward(name: str, row: RowReward, *, batch: BatchReward | None = None) -> Reward:
    """Register ``row`` (and its ``batch`` form) as the reward ``name``; returns the Reward."""
    reward = Reward(name, row, batch)
    REWARDS.add(name, reward)
    return reward


def as_reward(value: Reward | RowReward, name: str | None = None) -> Reward:
    """The Reward for a task's ``reward``: a Reward as it is; a registered row function as registered
    (with its declared batch form); any other callable row by row, named after itself."""
    if isinstance(value, Reward):
        return value
    if not callable(value):
        raise TypeError(f"a reward must be a Reward or a function (text, example, truncated) -> (float, dict); "
                        f"got {type(value).__name__}")
    registered = next((r for r in map(REWARDS.get, REWARDS.names()) if r.row is value), None)
    return registered or Reward(name or getattr(value, "__name__", "reward"), value)


def combine_rewards(weights: dict[str, float], task_reward: Reward | RowReward | None = None) -> Reward:
    """The attempt's reward from RunConfig.rewards ``{name: weight}``, in the order given; ``task`` names
    ``task_reward``. One component of weight 1 is still a WeightedReward, so it is logged as reward/<name>."""
    if not weights:
        raise ValueError("rewards: name at least one reward, e.g. {math_em: 1.0}")
    parts = []
    for name, w in weights.items():
        if name == TASK_REWARD:
            if task_reward is None:
                raise ValueError("rewards: 'task' names the task's own reward, but no task reward was given")
            part = as_reward(task_reward)
            part = Reward(TASK_REWARD, part.row, part.batch)
        else:
            part = REWARDS.get(name)
        parts.append((part, float(w)))
    label = "+".join(f"{w:g}*{p.name}" for p, w in parts)
    return WeightedReward(label, None, None, tuple(parts))
