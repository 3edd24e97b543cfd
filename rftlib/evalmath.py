"""Evaluation estimators (pure python) and the three eval modes of seed 003 §7.

- ``pass_at_k(n, c, k)``: the unbiased estimator of Chen et al. 2021 ("Evaluating Large Language
  Models Trained on Code", the Codex paper): with n samples of which c are correct,
  ``pass@k = 1 - C(n-c, k) / C(n, k)``, the chance that k samples drawn without replacement from
  the n contain a correct one. Computed as the product ``prod_{i=n-c+1}^{n} (1 - k/i)`` (their
  numerically stable form) instead of with binomials that overflow floats for large n.
- ``maj_at_k(answers, truth)``: majority vote over the normalised answers; 1.0 if the winner
  matches the truth.
- ``mean_over_problems``: the dataset score is the unweighted mean of the per-problem values.

Modes (never conflate them; always label which was used -- seed 003 §7, §9): ``greedy_pass@1``
(temperature 0, n 1) for checkpoint selection; ``sampling_pass@k`` (temperature 0.6, n k: the
majority-vote accuracy, as the seed defines it) for final comparisons; ``nondet_proxy_pass@k``
(temperature 0, n k: any of the k right) only as a diagnostic of serving nondeterminism.
``check_eval_mode`` refuses temperature 0 with n > 1 under any other name. Beside the mode's own
number an eval logs ``maj@k``, ``any_correct@k`` (pass@k at k = n, never under a seed's name) and
``pass@1``, each named for what it is.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct: ``1 - C(n-c, k) / C(n, k)``.

    ``n - c < k``: every draw of k contains a correct sample, so 1.0. ``c == 0``: 0.0.
    """
    if not (0 <= c <= n) or not (1 <= k <= n):
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    prob_all_wrong = 1.0  # C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k / i)
    for i in range(n - c + 1, n + 1):
        prob_all_wrong *= 1.0 - k / i
    return 1.0 - prob_all_wrong


def normalize_answer(answer: str | None) -> str:
    """A light, generic normal form for voting: strip, drop ``$``/trailing period, collapse spaces,
    drop thousands commas. Task-specific normalisation (seed 003 §10) should be passed to maj_at_k.
    """
    if answer is None:
        return ""
    a = answer.strip().strip("$").strip()
    a = a.rstrip(".").strip()
    a = re.sub(r"\s+", " ", a)
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", a):
        a = a.replace(",", "")
    return a


def majority_answer(answers: Sequence[str | None], normalize: Callable[[str | None], str] = normalize_answer) -> str:
    """The most frequent normalised non-empty answer.

    Ties go to the answer that appeared first among the samples (sample order is the order the
    engine returned them in, i.e. deterministic for a fixed seed), so the result never depends on
    hash or dict ordering. Empty answers (nothing extracted) do not vote; all empty -> "".
    """
    normed = [normalize(a) for a in answers]
    votes = Counter(a for a in normed if a)
    if not votes:
        return ""
    first_seen = {a: i for i, a in reversed(list(enumerate(normed)))}
    return max(votes, key=lambda a: (votes[a], -first_seen[a]))


def maj_at_k(answers: Sequence[str | None], truth: str, k: int | None = None,
             normalize: Callable[[str | None], str] = normalize_answer) -> float:
    """1.0 if the majority vote over the first k answers (all if k is None) equals the truth."""
    pool = list(answers if k is None else answers[:k])
    if k is not None and not 1 <= k <= len(answers):
        raise ValueError(f"need 1 <= k <= {len(answers)}, got k={k}")
    if not pool:
        raise ValueError("maj@k needs at least one answer")
    return 1.0 if majority_answer(pool, normalize) == normalize(truth) else 0.0


def majority_correct(votes: Sequence[str | None], correct: Sequence[bool]) -> float:
    """1.0 when the majority answer is right, else 0.0: ``votes`` are the samples' answers already in the
    reward's normal form (None: nothing extracted, no vote), ``correct`` the reward's verdict on each sample.
    The winner is the most frequent answer (ties: the one seen first, as :func:`majority_answer`); it is right
    when the reward scored a sample carrying it right, so the vote agrees with the reward by construction,
    numeric tolerance and symbolic equivalence included. No vote at all: 0.0."""
    if len(votes) != len(correct):
        raise ValueError(f"{len(votes)} votes but {len(correct)} verdicts: one of each per sample")
    winner = majority_answer([v or "" for v in votes], normalize=lambda a: a or "")
    if not winner:
        return 0.0
    return 1.0 if any(ok for v, ok in zip(votes, correct) if v == winner) else 0.0


def mean_over_problems(values: Iterable[float]) -> float:
    """Unweighted mean of per-problem scores (every problem counts once, whatever its n)."""
    vals = list(values)
    if not vals:
        raise ValueError("no problems to average")
    return sum(vals) / len(vals)


def pass_at_k_dataset(counts: Iterable[tuple[int, int]], k: int) -> float:
    """Mean pass@k over problems given (n, c) per problem."""
    return mean_over_problems(pass_at_k(n, c, k) for n, c in counts)


@dataclass(frozen=True)
class EvalMode:
    """How an eval samples: temperature and samples per problem (n); ``k`` in the name is n."""

    name: str  # "greedy_pass@1" | "sampling_pass@k" | "nondet_proxy_pass@k"
    temperature: float | None  # None: the caller's, must be > 0
    n: int | None  # None: the k of the label
    use: str  # what the mode is for (seed 003 §7)
    score: str = "maj"  # what the mode's number is over its k samples: "maj" (majority vote) | "any_correct"


EVAL_MODES: dict[str, EvalMode] = {
    "greedy_pass@1": EvalMode("greedy_pass@1", 0.0, 1, "deterministic single-sample accuracy: checkpoint selection"),
    # seed 003 section 7: "sampling_pass@8 | 0.6 | 8 | Majority-vote accuracy with diversity"
    "sampling_pass@k": EvalMode("sampling_pass@k", 0.6, None,
                                "majority-vote accuracy of k samples at temperature 0.6: final comparisons", "maj"),
    # seed 003 section 7: its gap over greedy_pass@1 measures fragile solutions: any of k greedy samples right
    "nondet_proxy_pass@k": EvalMode("nondet_proxy_pass@k", 0.0, None,
                                    "any-of-k accuracy of k greedy samples: serving nondeterminism, diagnostics only",
                                    "any_correct"),
}


def mode_label(mode: str, n: int) -> str:
    """The metric name for a mode at n samples: ``sampling_pass@k`` with n=8 -> ``sampling_pass@8``."""
    base = _base_mode(mode)
    return base if base == "greedy_pass@1" else base.replace("@k", f"@{n}")


def _base_mode(mode: str) -> str:
    if mode in EVAL_MODES:
        return mode
    m = re.fullmatch(r"(sampling_pass|nondet_proxy_pass)@(\d+)", mode)
    if m:
        return f"{m.group(1)}@k"
    raise ValueError(f"unknown eval mode '{mode}'; valid: {', '.join(EVAL_MODES)} (or with k as a number)")


def check_eval_mode(mode: str, temperature: float, n: int) -> str:
    """Validate a (mode, temperature, n) triple and return its label (e.g. ``sampling_pass@8``).

    Refuses temperature 0 with n > 1 unless the mode is nondet_proxy (seed 003 §9: "Do not combine
    temp=0 with n>1 -- greedy produces near-identical samples"), sampling at temperature 0, greedy
    with n != 1 or temperature != 0, and an explicit k that disagrees with n.
    """
    base = _base_mode(mode)
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    explicit_k = re.search(r"@(\d+)$", mode)
    if base != "greedy_pass@1" and explicit_k and int(explicit_k.group(1)) != n:
        raise ValueError(f"mode '{mode}' says k={explicit_k.group(1)} but n={n}")
    if base == "greedy_pass@1":
        if temperature != 0 or n != 1:
            raise ValueError(f"greedy_pass@1 is temperature 0, n 1; got temperature {temperature}, n {n}")
    elif base == "sampling_pass@k":
        if temperature <= 0:
            raise ValueError(f"sampling_pass@k needs temperature > 0 (seed 003: 0.6), got {temperature}; "
                             "temperature 0 with n > 1 is nondet_proxy_pass@k, a diagnostic")
    elif base == "nondet_proxy_pass@k":
        if temperature != 0:
            raise ValueError(f"nondet_proxy_pass@k is temperature 0 by definition, got {temperature}")
    return mode_label(base, n)
