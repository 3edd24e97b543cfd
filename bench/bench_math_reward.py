"""Throughput of the exact-match math reward (answers scored per second, one thread).

A fixed mix of short responses (boxed, last-number fallback, no answer, gpt-oss Harmony), about
half of them correct, is scored by ``math_reward``; in the same run a naive baseline (the last
number of a plain ``re.findall``, compared as a string with the gold) scores the same mix, and
the ratio is printed. The seed-003 goal is >= 20,000 answers/s on such responses. Long responses
(~10k characters) are timed too, for information. Best of ``--repeats`` runs, no threshold.

    .venv/bin/python bench/bench_math_reward.py
    .venv/bin/python bench/bench_math_reward.py --n 50000 --repeats 5
"""

from __future__ import annotations

import argparse
import random
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rftlib.rewards.math import batch_math_reward, math_reward  # noqa: E402

_NAIVE_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")  # the same number pattern, nothing else

_FILLER = [
    "First we compute the sum of the first terms, which gives 3 + 4 = 7.",
    "Then we multiply both sides by 2 to clear the fraction $\\frac{x}{2}$.",
    "Substituting $x = 5$ into the equation $x^2 - 3x + 2$ yields 12.",
    "Since the remainder is 1, the number of full groups is 14.",
    "We check the boundary case n = 0 separately; it contributes nothing.",
]


def _reasoning(rng: random.Random, sentences: int) -> str:
    return " ".join(rng.choice(_FILLER) for _ in range(sentences))


def make_mix(n: int, seed: int = 0, sentences: int = 6) -> tuple[list[str], list[str]]:
    """n (response, gold) pairs cycling through the four response kinds."""
    rng = random.Random(seed)
    responses, golds = [], []
    for i in range(n):
        gold = str(rng.randint(0, 99999))
        said = gold if rng.random() < 0.5 else str(int(gold) + 1)  # about half correct
        body = _reasoning(rng, sentences)
        kind = i % 4
        if kind == 0:  # boxed
            text = f"{body}\n\nTherefore the answer is $\\boxed{{{said}}}$."
        elif kind == 1:  # no boxed: last-number fallback
            text = f"{body}\n\nSo the final answer is {int(said):,}."
        elif kind == 2:  # no answer at all
            text = body.replace("0", "").replace("1", "").replace("2", "").replace("3", "")
            text = re.sub(r"\d", "", text) + " I am not sure how to finish"
        else:  # gpt-oss Harmony
            text = (
                f"<|channel|>analysis<|message|>{body}<|end|><|start|>assistant"
                f"<|channel|>final<|message|>The answer is \\boxed{{{said}}}.<|return|>"
            )
        responses.append(text)
        golds.append(gold)
    return responses, golds


def naive_reward(response: str, gold: str) -> float:
    numbers = _NAIVE_NUMBER.findall(response)
    return 1.0 if numbers and numbers[-1] == gold else 0.0


def rate(fn, responses: list[str], golds: list[str], repeats: int) -> float:
    """Best answers/s over ``repeats`` passes of ``fn(response, gold)`` over the mix."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for r, g in zip(responses, golds):
            fn(r, g)
        best = min(best, time.perf_counter() - t0)
    return len(responses) / best


def batch_rate(responses: list[str], golds: list[str], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        batch_math_reward(responses, golds)
        best = min(best, time.perf_counter() - t0)
    return len(responses) / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=20000, help="responses in the short mix")
    parser.add_argument("--repeats", type=int, default=3, help="passes; the best is reported")
    args = parser.parse_args()

    responses, golds = make_mix(args.n)
    mean_chars = sum(map(len, responses)) / len(responses)
    correct = sum(math_reward(r, g).correctness for r, g in zip(responses, golds))
    print(f"short mix: {args.n} responses (boxed / last-number / none / Harmony), mean {mean_chars:.0f} chars, "
          f"{correct / args.n:.1%} correct")
    ours = rate(math_reward, responses, golds, args.repeats)
    batched = batch_rate(responses, golds, args.repeats)
    naive = rate(naive_reward, responses, golds, args.repeats)
    print(f"  math_reward        {ours:>10,.0f} answers/s")
    print(f"  batch_math_reward  {batched:>10,.0f} answers/s")
    print(f"  naive re.findall   {naive:>10,.0f} answers/s  (last number only, no Harmony/boxed/normalisation)")
    print(f"  ratio math_reward / naive = {ours / naive:.2f}   (goal: math_reward >= 20,000 answers/s)")

    long_n = max(1, args.n // 20)
    long_responses, long_golds = make_mix(long_n, seed=1, sentences=150)
    mean_long = sum(map(len, long_responses)) / long_n
    long_ours = rate(math_reward, long_responses, long_golds, args.repeats)
    long_naive = rate(naive_reward, long_responses, long_golds, args.repeats)
    print(f"long mix: {long_n} responses, mean {mean_long:.0f} chars")
    print(f"  math_reward        {long_ours:>10,.0f} answers/s")
    print(f"  naive re.findall   {long_naive:>10,.0f} answers/s   ratio {long_ours / long_naive:.2f}")


if __name__ == "__main__":
    main()
