"""Toy rewards the tiny model can earn, shared by the test modules (``from toy_rewards import ...``:
tests/ has no __init__.py, so pytest's default import mode puts tests/ on sys.path; the torchrun worker
scripts in tests/ find it as their own directory). Each has the reward signature
``(text, example, truncated) -> (score, {"correctness": ...})``."""

from __future__ import annotations

import hashlib


def ascii_digit_share(text, ex, truncated):
    """Fraction of the completion's characters that are ASCII digits ("ab12" -> 2/4 = 0.5; "\\u00b2" -> 0).

    Dense (every sampled token can move it) and learnable: full fine-tuning at lr 3e-2 takes the
    tiny model from ~0.07 to ~0.9 in 10 steps (test_train_loop.py::test_digit_reward_is_learned)."""
    return sum(c in "0123456789" for c in text) / max(len(text), 1), {"correctness": 0.0}


def isdigit_share(text, ex, truncated):
    """Fraction of the completion's characters for which str.isdigit() holds (Unicode digits too:
    "\\u00b2" counts, unlike ascii_digit_share). Varies within a group: advantages are non-zero."""
    return sum(c.isdigit() for c in text) / max(len(text), 1), {"correctness": 0.0}


def has_digit(text, ex, truncated):
    """1 if the completion holds a digit (str.isdigit), else 0; correctness the same. The untrained tiny
    model earns it (its greedy output is all newlines, its samples are noise), so A/B arms learn, and diverge."""
    r = float(any(c.isdigit() for c in text))
    return r, {"correctness": r}


def half_constant_reward(text, ex, truncated):
    """Prompts whose md5 is even: 1.0 for every completion (a constant, all-correct group); others: the
    share of digits (isdigit_share)."""
    if int(hashlib.md5(ex.prompt.encode()).hexdigest(), 16) % 2 == 0:
        return 1.0, {"correctness": 1.0}
    return isdigit_share(text, ex, truncated)


def letter_a_share(text, ex, truncated):
    """Learnable by the tiny model: five times the share of the letter 'a' in the completion, capped at 1
    (varies within a group). The torchrun workers' reward (dist_worker.py, zero3_gather_worker.py)."""
    return min(1.0, 5 * text.count("a") / max(len(text), 1)), {"correctness": 0.0}
