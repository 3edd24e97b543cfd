"""``code_feedback``: the code task, where a failing program gets its failing test back and may try again.

Turn 1 is the code task's prompt. Each model turn is scored as the code reward scores a completion (seed 002's:
its code extracted, run on the problem's tests in the sandbox, rftlib.rewards.code), and:

- all tests pass, or the turn was the last attempt (``max_attempts``), or it was cut by the token budget: the
  episode ends; its reward is that turn's code reward times ``discount ** (attempt - 1)`` (a fix on the second
  try is worth less than a first-time pass: the return favours getting it right at once);
- otherwise the model reads, as a user turn, which test failed and why (the first failing one: its call, what came
  back, the error or the program's stderr tail), reward 0, and writes its next attempt.

Examples must carry their problem as ``example.meta["problem"]`` (a rftlib.rewards.code.CodeProblem: the
``code_basics`` and ``code_problems`` tasks do). Only the model's programs are scored; the feedback never reaches
the reward. Info counts: ``attempts`` (on the last step), ``feedback_turns``, the code reward's diagnostics of
the final attempt (``correctness``, ``pass_frac``, ...), and ``correctness_first_attempt``: a held-out eval's
greedy_pass@1 is the first answer's (rftlib.eval), the final one's is ``correct_final`` beside it (the feedback
shows a failing test's expected value: a later pass is not pass@1). ``max_turns`` must allow ``max_attempts``
(the config checks it).
"""

from __future__ import annotations

from typing import Any

from rftlib.envs.base import STOP_ANSWER, STOP_LENGTH, Message, Step
from rftlib.rewards.code import code_reward

MAX_ATTEMPTS = 3
DISCOUNT = 0.8
STDERR_TAIL = 600  # characters of the program's stderr shown with a failure (its last ones: the traceback's cause)


class CodeFeedbackEnv:
    """Retries with test feedback for a code ``task`` (the module docstring gives the rules). ``sandbox``: the
    pool to run in (default the code reward's process-wide one)."""

    def __init__(self, task: Any, *, max_attempts: int = MAX_ATTEMPTS, discount: float = DISCOUNT,
                 sandbox: Any = None):
        if max_attempts < 1:
            raise ValueError(f"code_feedback: max_attempts={max_attempts}; it must be at least 1")
        if not 0 < discount <= 1:
            raise ValueError(f"code_feedback: discount={discount}; it must be in (0, 1]")
        self.task, self.max_attempts, self.discount, self.sandbox = task, max_attempts, discount, sandbox
        self.example, self.attempt, self.first_right = None, 0, 0.0

    def reset(self, example: Any, seed: int) -> list[Message]:
        problem = getattr(example, "meta", {}).get("problem")
        if problem is None:
            raise ValueError(f"code_feedback: example {getattr(example, 'id', '?')!r} has no meta['problem'] (a "
                             "CodeProblem): use a code task (code_basics, code_problems)")
        self.example, self.attempt = example, 0
        own = getattr(self.task, "system_prompt", None)
        return ([{"role": "system", "content": own}] if own else []) + [{"role": "user", "content": example.prompt}]

    def step(self, assistant_text: str, *, truncated: bool = False) -> Step:
        if self.example is None:
            raise RuntimeError("code_feedback: step() before reset()")
        self.attempt += 1
        res = code_reward(assistant_text, self.example.meta["problem"], sandbox=self.sandbox)
        solved = res.total > 0 and res.passed == res.total
        if self.attempt == 1:
            self.first_right = float(solved)
        if solved or truncated or self.attempt >= self.max_attempts:  # the episode's last step
            diags = {k: v for k, v in res.diagnostics().items() if not k.startswith("test_")}
            info = {**diags, "attempts": float(self.attempt), "correctness_first_attempt": self.first_right,
                    "stop": STOP_LENGTH if truncated else STOP_ANSWER}
            return Step([], res.reward * self.discount ** (self.attempt - 1), True, info)
        return Step([{"role": "user", "content": feedback(res, self.example.meta["problem"], self.attempt,
                                                          self.max_attempts)}], 0.0, False, {"feedback_turns": 1.0})


def feedback(res: Any, problem: Any, attempt: int, max_attempts: int) -> str:
    """What the model reads after a failing attempt: the first failing test (its call, what came back or the error)
    and the program's stderr tail, then how many attempts are left."""
    run = res.run
    lines = [f"Your program passed {res.passed} of {res.total} tests."]
    first = next((i for i, r in enumerate(res.per_test) if r is not True), None)
    if first is not None and first < len(problem.tests):
        args, _ = problem.tests[first]
        call = f"{problem.entry_point}({', '.join(repr(a) for a in args)})"
        lines.append(f"Test {first + 1} failed: {call}: {res.per_test[first]}")
    elif run is not None and run.error:
        lines.append(f"It did not run: {run.error}")
    if run is not None and run.stderr.strip():
        lines.append("stderr (end):\n" + run.stderr.strip()[-STDERR_TAIL:])
    left = max_attempts - attempt
    lines.append(f"Fix the program and write it again ({left} attempt{'s' if left != 1 else ''} left).")
    return "\n".join(lines)
