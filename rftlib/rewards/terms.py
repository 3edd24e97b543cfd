"""The format and length terms of a composite reward: pure functions of the completion's text.

Each is registered by name (rftlib.rewards.registry) to be weighted beside a correctness reward,
e.g. ``rewards: {math_em: 1.0, format_boxed: 0.1, truncated_penalty: 0.1}`` (RunConfig.rewards).
"""

from __future__ import annotations

from typing import Any

from rftlib.rewards.math import extract_answer
from rftlib.rewards.registry import register_reward

BOXED = 2  # extract_answer's parse_method for a balanced, non-blank \boxed{}


def format_boxed(text: str, example: Any, truncated: bool) -> tuple[float, dict[str, float]]:
    """1.0 when the completion states its answer in a balanced, non-blank ``\\boxed{}`` (what seed 003's
    EM reward reads first), else 0.0: a format bonus beside a correctness reward."""
    return (1.0 if extract_answer(text)[1] == BOXED else 0.0), {}


def truncated_penalty(text: str, example: Any, truncated: bool) -> tuple[float, dict[str, float]]:
    """-1.0 for a completion cut at max_new_tokens, else 0.0: a length term that punishes running on."""
    return (-1.0 if truncated else 0.0), {}


register_reward("format_boxed", format_boxed)
register_reward("truncated_penalty", truncated_penalty)
