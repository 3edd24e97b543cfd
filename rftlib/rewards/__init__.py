"""Rewards: pure functions from a completion's text (and the gold answer) to a scalar reward plus
numeric diagnostics. No judge, no network; see seed 003 sec. 10 for why pure exact match.

The seam is :mod:`rftlib.rewards.registry`: rewards registered by name (``math_em`` here,
``format_boxed`` and ``truncated_penalty`` in :mod:`rftlib.rewards.terms`, ``code_tests`` with the code
task), composed per attempt with weights (RunConfig.rewards), each component logged as
``reward/<name>``. Adding one is a function and a ``register_reward(name, fn)`` line (the registry's
docstring shows it).
"""

from rftlib.rewards.math import (
    MODES,
    MathReward,
    answers_match,
    batch_math_reward,
    extract_answer,
    looks_truncated,
    math_em_reward,
    math_reward,
    math_task_reward,
    normalize_answer,
    parse_gold,
)
from rftlib.rewards.registry import REWARDS, Reward, WeightedReward, as_reward, combine_rewards, register_reward
from rftlib.rewards.terms import format_boxed, truncated_penalty

__all__ = [
    "MODES",
    "REWARDS",
    "Reward",
    "WeightedReward",
    "as_reward",
    "combine_rewards",
    "format_boxed",
    "register_reward",
    "truncated_penalty",
    "MathReward",
    "answers_match",
    "batch_math_reward",
    "extract_answer",
    "looks_truncated",
    "math_em_reward",
    "math_reward",
    "math_task_reward",
    "normalize_answer",
    "parse_gold",
]
