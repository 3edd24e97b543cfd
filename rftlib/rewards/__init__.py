"""Rewards: pure functions from a completion's text (and the gold answer) to a scalar reward plus
numeric diagnostics. No judge, no network; see seed 003 sec. 10 for why pure exact match.
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

__all__ = [
    "MODES",
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
