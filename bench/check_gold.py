"""Gold check: every dataset's own reference answers must score 1.0 with rftlib's rewards, and a
wrong answer must score 0.

    python bench/check_gold.py                 # everything (MBPP + HumanEval in the sandbox: ~1 min)
    python bench/check_gold.py --sample 20     # the first 20 of each dataset
    python bench/check_gold.py --only math500 gsm8k

Per dataset it prints: gold scored 1.0 (count and %), wrong scored 0, and lists the failures.
  math (gsm8k, math, math500, aime2024, aime2025): gold = the dataset's own solution text (its
    last \\boxed{} or ``#### n``; AIME has no solutions, so "\\boxed{answer}"); for GSM8K also the
    bare "\\boxed{n}". Wrong = "\\boxed{gold+1}" (integers) or "\\boxed{gold+1}" spelt as text.
  code (humaneval, mbpp, code_problems): gold = the reference solution in a ```python fence, run in
    the sandbox; wrong = a function of the right name that returns None (correctness must be 0).
Exit status 1 if a threshold is missed: 100% everywhere except MATH and MATH-500 (>= 99%; a few
MATH solutions box an intermediate step or use \\text answers that exact match cannot equate).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from dataclasses import dataclass, field

from rftlib.data.benchmarks import LOADERS
from rftlib.data.code_problems import load_code_problems
from rftlib.data.tasks import Example
from rftlib.rewards.code import batch_code_reward
from rftlib.rewards.math import math_reward

MATH_SETS = ("gsm8k", "math", "math500", "aime2024", "aime2025")
CODE_SETS = ("humaneval", "mbpp", "code_problems")
THRESHOLD = {"math": 0.99, "math500": 0.99}  # gold pass rate required; 1.0 for the others


@dataclass
class Result:
    name: str
    n: int = 0
    gold_ok: int = 0
    wrong_zero: int = 0
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def gold_rate(self) -> float:
        return self.gold_ok / self.n if self.n else 0.0

    def passed(self) -> bool:
        return self.n > 0 and self.gold_rate >= THRESHOLD.get(self.name, 1.0) and self.wrong_zero == self.n


def wrong_answer(gold: str) -> str:
    """gold + 1 for an integer; otherwise the gold with "+1" appended (still a different answer)."""
    return str(int(gold) + 1) if re.fullmatch(r"-?\d+", gold.strip()) else f"{gold}+1"


def gold_completions(name: str, e: Example) -> list[str]:
    sol = e.meta.get("solution")
    if not sol:
        return [f"The answer is $\\boxed{{{e.answer}}}$."]
    return [sol, f"\\boxed{{{e.answer}}}"] if name == "gsm8k" else [sol]


def check_math(name: str, examples: list[Example]) -> Result:
    res = Result(name, n=len(examples))
    t = time.time()
    for e in examples:
        bad = [c for c in gold_completions(name, e) if math_reward(c, e.answer).reward != 1.0]
        if bad:
            res.failures.append(f"{e.id}: gold {e.answer!r} not matched by its own solution")
        else:
            res.gold_ok += 1
        if math_reward(f"The answer is \\boxed{{{wrong_answer(e.answer)}}}.", e.answer).reward == 0.0:
            res.wrong_zero += 1
        else:
            res.failures.append(f"{e.id}: wrong answer {wrong_answer(e.answer)!r} scored 1")
    res.seconds = time.time() - t
    return res


def check_code(name: str, examples: list[Example], sandbox=None) -> Result:
    res = Result(name, n=len(examples))
    t = time.time()
    problems = [e.meta["problem"] for e in examples]
    gold = batch_code_reward([f"```python\n{e.answer}\n```" for e in examples], problems, sandbox=sandbox)
    stubs = [f"```python\ndef {p.entry_point}(*args, **kwargs):\n    return None\n```" for p in problems]
    stub = batch_code_reward(stubs, problems, sandbox=sandbox)
    for e, g, s in zip(examples, gold, stub):
        if g.reward == 1.0:
            res.gold_ok += 1
        else:
            why = next((r for r in g.per_test if r is not True), g.run.status if g.run else "?")
            res.failures.append(f"{e.id}: reference scored {g.reward:.2f} ({g.passed}/{g.total}): {str(why)[:160]}")
        if s.diagnostics()["correctness"] == 0.0:
            res.wrong_zero += 1
        else:
            res.failures.append(f"{e.id}: a stub returning None passed every test")
    res.seconds = time.time() - t
    return res


def load(name: str) -> list[Example]:
    return load_code_problems() if name == "code_problems" else LOADERS[name]()


def run(names: list[str], sample: int | None = None, sandbox=None) -> list[Result]:
    out = []
    for name in names:
        examples = load(name)[:sample] if sample else load(name)
        out.append(check_code(name, examples, sandbox) if name in CODE_SETS else check_math(name, examples))
    return out


def report(results: list[Result]) -> str:
    lines = [f"{'dataset':14s} {'n':>5s} {'gold=1.0':>9s} {'rate':>8s} {'wrong=0':>8s} {'secs':>6s}  verdict"]
    for r in results:
        lines.append(f"{r.name:14s} {r.n:5d} {r.gold_ok:9d} {100 * r.gold_rate:7.2f}% {r.wrong_zero:8d} "
                     f"{r.seconds:6.1f}  {'ok' if r.passed() else 'FAIL'}")
    for r in results:
        if r.failures:
            lines.append(f"\n{r.name}: {len(r.failures)} failure(s)")
            lines += [f"  {f}" for f in r.failures]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", nargs="+", choices=MATH_SETS + CODE_SETS, default=list(MATH_SETS + CODE_SETS))
    ap.add_argument("--sample", type=int, default=None, help="check only the first N of each dataset")
    args = ap.parse_args(argv)
    results = run(args.only, args.sample)
    print(report(results))
    return 0 if all(r.passed() for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
