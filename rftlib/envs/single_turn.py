"""``single_turn``: today's tasks as an environment: one prompt, one completion, the task's reward.

``reset`` gives the messages rftlib.eval.format_prompts renders today (the task's system prompt when it has
one, then the problem as the user message); ``step`` scores the completion with the reward the trainer uses
(the task's own, or the attempt's composite) and ends the episode. The numbers are the reward's own: the
diagnostics come back in ``info`` unchanged, beside ``stop``.
"""

from __future__ import annotations

from typing import Any

from rftlib.envs.base import STOP_ANSWER, STOP_LENGTH, Message, Step
from rftlib.rewards.registry import Reward, as_reward


class SingleTurnEnv:
    """One turn: the task's prompt, the model's completion, the reward (``reward``: the Reward or row function
    to score with; default the task's own, ``task.reward``)."""

    def __init__(self, task: Any, reward: Reward | Any | None = None):
        self.task = task
        self.reward = as_reward(reward if reward is not None else task.reward)
        self.example = None

    def reset(self, example: Any, seed: int) -> list[Message]:
        """[system (the task's, if any), user (the example's prompt)]; ``seed`` changes nothing (no randomness)."""
        self.example = example
        system = getattr(self.task, "system_prompt", None)
        return ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": example.prompt}]

    def step(self, assistant_text: str, *, truncated: bool = False) -> Step:
        """The completion scored as the trainer scores it (``reward(text, example, truncated)``); always done."""
        if self.example is None:
            raise RuntimeError("single_turn: step() before reset()")
        reward, diags = self.reward(assistant_text, self.example, truncated)
        return Step([], float(reward), True, {**diags, "stop": STOP_LENGTH if truncated else STOP_ANSWER})
