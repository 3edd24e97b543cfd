"""Toy environments the tiny model can play, shared by the test modules and the subprocess workers in tests/
(``from toy_envs import TwoTurnEnv``, found as toy_rewards is). Register one in a test with
``ENVS.register(name, TwoTurnEnv)`` after ``monkeypatch.setattr(ENVS, "_table", dict(ENVS._table))``."""

from __future__ import annotations

from toy_rewards import isdigit_share

from rftlib.envs.base import Step


class TwoTurnEnv:
    """A scripted environment: the model's first turn gets a fixed tool-style answer (a user message), its second
    ends the episode, scored by the digit share of that turn (isdigit_share). A turn cut by the budget ends it too."""

    ANSWER = "Result: 42"

    def __init__(self, task):
        self.turn = 0

    def reset(self, example, seed):
        return [{"role": "user", "content": example.prompt}]

    def step(self, text, *, truncated=False):
        self.turn += 1
        if truncated or self.turn == 2:
            return Step([], isdigit_share(text, None, truncated)[0], True,
                        {"stop": "length" if truncated else "answer"})
        return Step([{"role": "user", "content": self.ANSWER}], 0.0, False, {"tool_calls": 1.0})
