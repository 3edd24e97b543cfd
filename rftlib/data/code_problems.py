"""Our own FizzBuzz-style code problems (seed 002) and a procedural pool of code problems.

``data/code_problems.jsonl`` (written for rftlib, MIT like the rest of the repository): 30 small
functions, three at each difficulty 1-10, each row

    {"id", "difficulty" (1-10), "type" (strings, math, lists, parsing, dp, search),
     "signature" ("def fizzbuzz(n: int) -> str"), "description", "tests" ([[args], expected] pairs
     of plain values), "reference" (a solution that passes them)}

Seed 002's anchors are there: ``fizzbuzz`` at difficulty 3 with its 5 tests, and balanced
parentheses (``parentheses``, ``def is_balanced(s: str) -> bool``) at difficulty 7.

``procedural_code_problems(n, seed)`` draws parametrised variants of eight problem families
(FizzBuzz with other divisors and words, bracket checking over other bracket sets, ...), each with
a difficulty, so a training pool never contains the held-out set's exact problems. Their expected
outputs are computed here by trusted reference functions; only the model's code runs sandboxed.

Examples carry their ``CodeProblem`` in ``meta["problem"]``, plus ``difficulty`` and ``type``
(what ``CurriculumSampler`` reads). Reward: ``code_task_reward`` (seed 002's 1.0 / 0.5 * fraction).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Callable

from rftlib.data.base import Example, Task
from rftlib.data.benchmarks import CODE_INSTRUCTION
from rftlib.data.jsonl import REPO_ROOT, DataError, iter_jsonl
from rftlib.rewards.code import CodeProblem, batch_code_reward, code_reward
from rftlib.rewards.registry import Reward

PROBLEMS_FILE = REPO_ROOT / "data" / "code_problems.jsonl"
REQUIRED = ("id", "difficulty", "type", "signature", "description", "tests", "reference")
N_EXAMPLES_SHOWN = 2  # tests shown in the prompt as examples (the rest stay hidden)
MAX_MISSES = 200  # consecutive duplicate draws after which a procedural family counts as exhausted


def code_prompt(signature: str, description: str, shown: list[tuple[tuple, Any]], entry: str) -> str:
    """The user message: the signature, what it must do, a few example calls, the format asked."""
    lines = [f"Write a Python function `{signature}`.", description.strip()]
    if shown:
        lines.append("Examples:")
        lines += [f"    {entry}({', '.join(map(repr, args))}) == {exp!r}" for args, exp in shown]
    lines.append(CODE_INSTRUCTION)
    return "\n".join(lines)


def _entry(signature: str) -> str:
    return signature.split("def ", 1)[1].split("(", 1)[0].strip()


def load_code_problems(path: str | Path = PROBLEMS_FILE) -> list[Example]:
    """The problem set as Examples: ``answer`` is the reference solution; meta: problem
    (CodeProblem), difficulty, type, entry_point."""
    out = []
    for lineno, row in iter_jsonl(path, required=REQUIRED):
        where = f"{path}:{lineno}"
        d = row["difficulty"]
        if not (isinstance(d, int) and 1 <= d <= 10):
            raise DataError(f"{where}: difficulty must be an integer 1-10, got {d!r}")
        if not isinstance(row["signature"], str) or not row["signature"].startswith("def "):
            raise DataError(f"{where}: signature must start with 'def ', got {row['signature']!r}")
        tests = row["tests"]
        if not (isinstance(tests, list) and tests and all(isinstance(t, list) and len(t) == 2
                                                         and isinstance(t[0], list) for t in tests)):
            raise DataError(f"{where}: tests must be a non-empty list of [[args...], expected] pairs")
        entry = _entry(row["signature"])
        pairs = [(tuple(a), e) for a, e in tests]
        try:
            problem = CodeProblem(entry_point=entry, tests=tuple(pairs))
        except ValueError as e:
            raise DataError(f"{where}: {e}") from None
        out.append(Example(id=f"code_problems/{row['id']}",
                           prompt=code_prompt(row["signature"], row["description"], pairs[:N_EXAMPLES_SHOWN], entry),
                           answer=row["reference"],
                           meta={"problem": problem, "difficulty": d, "type": row["type"], "entry_point": entry,
                                 "source": "code_problems"}))
    ids = [e.id for e in out]
    if len(set(ids)) != len(ids):
        raise DataError(f"{path}: duplicate ids")
    return out


# ---------------------------------------------------------------------------------------------
# procedural families: (difficulty, make(rng) -> (signature, description, reference fn, inputs))


def _rand_text(rng: random.Random, words: int = 3) -> str:
    """A few random lowercase/capitalised words: varied test inputs for the string families."""
    out = []
    for _ in range(rng.randint(1, words)):
        w = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 8)))
        out.append(w.capitalize() if rng.random() < 0.3 else w)
    return " ".join(out)


def _rand_runs(rng: random.Random, alphabet: str = "abcxyz") -> str:
    return "".join(rng.choice(alphabet) * rng.randint(1, 5) for _ in range(rng.randint(1, 5)))


def _fizzbuzz_variant(rng: random.Random):
    a, b = rng.choice([(2, 3), (2, 5), (2, 7), (3, 4), (3, 7), (4, 5), (5, 6), (5, 7), (3, 11), (4, 7)])  # not (3, 5)
    w1, w2 = rng.sample(["Fizz", "Buzz", "Foo", "Bar", "Ping", "Pong", "Zip", "Zap"], 2)

    def f(n):
        s = (w1 if n % a == 0 else "") + (w2 if n % b == 0 else "")
        return s or str(n)

    desc = (f'Return "{w1}{w2}" if n is divisible by both {a} and {b}, "{w1}" if only by {a}, "{w2}" if only by {b}, '
            "and otherwise n as a string.")
    inputs = [(a,), (b,), (a * b,), (1,)] + [(rng.randint(1, 200),) for _ in range(4)]
    return f"def fizzbuzz_{a}_{b}(n: int) -> str", desc, f, inputs


def _count_char(rng: random.Random):
    c = rng.choice("abcdefghijklmnopqrstuvwxyz")

    def f(s):
        return s.lower().count(c)

    texts = [_rand_text(rng) + (c * rng.randint(0, 2)) for _ in range(4)] + ["", c.upper() + c]
    return (f"def count_{c}(s: str) -> int", f"Return how many times the letter '{c}' occurs in s, ignoring case.", f,
            [(t,) for t in texts])


def _sum_multiples(rng: random.Random):
    a, b = rng.sample([2, 3, 4, 5, 7, 9, 11], 2)

    def f(n):
        return sum(k for k in range(n) if k % a == 0 or k % b == 0)

    return (f"def sum_multiples_{a}_{b}(n: int) -> int",
            f"Return the sum of all non-negative integers below n that are divisible by {a} or by {b}.", f,
            [(rng.randint(5, 60),), (a * b,), (0,), (1,)] + [(rng.randint(2, 500),) for _ in range(3)])


def _digit_sum_base(rng: random.Random):
    base = rng.randint(2, 16)

    def f(n):
        s = 0
        while n:
            n, r = divmod(n, base)
            s += r
        return s

    return (f"def digit_sum_base{base}(n: int) -> int",
            f"Return the sum of the digits of the non-negative integer n written in base {base}.", f,
            [(base + 1,), (rng.randint(10, 99),), (0,), (base - 1,)] + [(rng.randint(1, 10 ** 6),) for _ in range(3)])


def _caesar_variant(rng: random.Random):
    k = rng.choice([k for k in range(1, 26) if k != 13])

    def f(s):
        return "".join(chr((ord(c) - 97 + k) % 26 + 97) if c.islower() else
                       chr((ord(c) - 65 + k) % 26 + 65) if c.isupper() else c for c in s)

    texts = [_rand_text(rng), _rand_text(rng) + "!", "xyz", "", "Zebra 42"]
    return (f"def shift_{k}(s: str) -> str",
            f"Shift every letter of s forward by {k} places in the alphabet, wrapping from z to a and keeping its "
            "case; other characters stay as they are.", f, [(t,) for t in texts])


def _rle_variant(rng: random.Random):
    sep = rng.choice(["", ":", "-", "x"])
    count_first = rng.random() < 0.5

    def f(s):
        out, i = [], 0
        while i < len(s):
            j = i
            while j < len(s) and s[j] == s[i]:
                j += 1
            out.append(f"{j - i}{sep}{s[i]}" if count_first else f"{s[i]}{sep}{j - i}")
            i = j
        return "".join(out)

    ex = '"aaab" -> "' + f("aaab") + '"'
    order = "length then the character" if count_first else "character then its length"
    return (f"def encode_runs_{'cf' if count_first else 'ch'}_{ord(sep) if sep else 0}(s: str) -> str",
            f"Replace each maximal run of one repeated character in s by its {order}"
            f"{f', separated by {sep!r}' if sep else ''}, e.g. {ex}.", f,
            [(_rand_runs(rng),), (_rand_runs(rng),), ("",), ("abc",), ("zzzzzzzzzzzz",), (_rand_runs(rng),)])


def _recurrence(rng: random.Random):
    p, q, a0, a1 = rng.randint(1, 4), rng.randint(1, 4), rng.randint(0, 5), rng.randint(1, 6)

    def f(n):
        x, y = a0, a1
        for _ in range(n):
            x, y = y, p * y + q * x
        return x

    return (f"def seq_{p}{q}{a0}{a1}(n: int) -> int",
            f"The sequence a is defined by a(0) = {a0}, a(1) = {a1} and a(n) = {p}*a(n-1) + {q}*a(n-2) for n >= 2. "
            "Return a(n); it must be fast for n up to 300.", f, [(2,), (5,), (0,), (1,), (20,), (300,)])


def _brackets_variant(rng: random.Random):
    pairs = rng.sample([("(", ")"), ("[", "]"), ("{", "}"), ("<", ">")], rng.choice([2, 3]))
    if set(pairs) == {("(", ")"), ("[", "]"), ("{", "}")}:
        pairs = [("(", ")"), ("<", ">"), ("{", "}")]
    opens = {o: c for o, c in pairs}
    closes = {c for _, c in pairs}

    def f(s):
        stack = []
        for ch in s:
            if ch in opens:
                stack.append(opens[ch])
            elif ch in closes and (not stack or stack.pop() != ch):
                return False
        return not stack

    (o1, c1), (o2, c2) = pairs[0], pairs[1]
    symbols = [o for o, _ in pairs] + [c for _, c in pairs] + ["a", "b"]
    inputs = [("".join(rng.choice(symbols) for _ in range(rng.randint(2, 8))),) for _ in range(2)]
    inputs += [(o1 + c1,), (o1 + o2 + c2 + c1,), (o1 + o2 + c1 + c2,), (o1 * 2,), ("",), (c1 + o1,),
               (f"x{o2}y{o1}z{c1}{c2}",)]
    names = " ".join(o + c for o, c in pairs)
    return (f"def balanced_{''.join(str(ord(o) % 10) for o, _ in pairs)}(s: str) -> bool",
            f"Return True if the brackets {names} in s are balanced and properly nested; every other character "
            "is ignored.", f, inputs)


FAMILIES: dict[str, tuple[int, Callable]] = {  # name -> (difficulty, maker)
    "count_char": (1, _count_char),
    "sum_multiples": (2, _sum_multiples),
    "fizzbuzz_variant": (3, _fizzbuzz_variant),
    "digit_sum_base": (3, _digit_sum_base),
    "caesar_variant": (4, _caesar_variant),
    "rle_variant": (5, _rle_variant),
    "recurrence": (6, _recurrence),
    "brackets_variant": (7, _brackets_variant),
}


def procedural_code_problems(n: int, seed: int = 0, families: list[str] | None = None) -> list[Example]:
    """``n`` distinct generated problems (distinct prompts), cycling through ``families``
    (default: all, in order) so every difficulty is represented; deterministic given ``seed``.
    A family's parameters can repeat with other test inputs (e.g. the same shift with other
    strings); a family that stops yielding new prompts is dropped from the rotation."""
    names = list(FAMILIES) if families is None else families
    unknown = [f for f in names if f not in FAMILIES]
    if unknown or not names:
        raise ValueError(f"unknown families {unknown}; valid: {', '.join(FAMILIES)}")
    rng = random.Random(seed)
    out, seen = [], set()
    live = list(names)  # families that still make new problems
    misses = {f: 0 for f in names}  # consecutive duplicates per family
    turn = 0
    while len(out) < n:
        if not live:
            raise ValueError(f"cannot make {n} distinct problems from families {names} (made {len(out)})")
        family = live[turn % len(live)]
        difficulty, make = FAMILIES[family]
        signature, desc, fn, inputs = make(rng)
        entry = _entry(signature)
        pairs = [(tuple(a), fn(*a)) for a in dict.fromkeys(inputs)]  # distinct inputs, in order
        prompt = code_prompt(signature, desc, pairs[:N_EXAMPLES_SHOWN], entry)
        if prompt in seen:
            misses[family] += 1
            if misses[family] >= MAX_MISSES:
                live.remove(family)
            continue
        misses[family] = 0
        turn += 1
        seen.add(prompt)
        out.append(Example(id=f"code_gen/{seed}/{len(out)}", prompt=prompt, answer="",
                           meta={"problem": CodeProblem(entry_point=entry, tests=tuple(pairs)),
                                 "difficulty": difficulty, "type": family, "entry_point": entry,
                                 "source": "code_gen"}))
    return out


# ---------------------------------------------------------------------------------------------
# the reward and the task


def code_task_reward(completion: str, example: Example, truncated: bool) -> tuple[float, dict[str, float]]:
    """Task.reward for code: seed 002's reward on ``example.meta["problem"]`` in the shared sandbox.
    Diagnostics: CodeReward.diagnostics() without the per-test keys (their count varies by
    problem), plus ``truncated_response``."""
    return _task_result(code_reward(completion, example.meta["problem"]), truncated)


def _task_result(r, truncated: bool) -> tuple[float, dict[str, float]]:
    """(reward, diagnostics) of one CodeReward: its diagnostics without the per-test keys, plus truncated_response."""
    d = {k: v for k, v in r.diagnostics().items() if not k.startswith("test_")}
    d["truncated_response"] = 1.0 if truncated else 0.0
    return r.reward, d


def code_task_batch_reward(completions: list[str], examples: list[Example],
                           truncated: list[bool]) -> list[tuple[float, dict[str, float]]]:
    """``code_task_reward`` of every row in one sandbox ``map``: the pool's workers (2 by default)
    run rows side by side instead of one at a time (row order kept)."""
    rs = batch_code_reward(completions, [e.meta["problem"] for e in examples])
    return [_task_result(r, t) for r, t in zip(rs, truncated)]


# the batch form is declared with the reward: the trainer's as_reward(task.reward) finds the registered
# Reward (row function + batch form); a wrapper that replaces the reward (a test's) is scored row by row.
# Registered as "code_tests" by its declaration in rftlib.data.base (REWARDS.declare)
CODE_TESTS = Reward("code_tests", code_task_reward, batch=code_task_batch_reward)


def code_problems_task(train_size: int = 2000, seed: int = 1234, max_difficulty: int = 10,
                       probe_size: int = 30) -> Task:
    """Train on ``train_size`` procedural problems, evaluate on our 30-problem set (difficulty
    <= ``max_difficulty``); probe "id": ``probe_size`` problems of the pool (seed 42). Reward:
    code_task_reward (run in the sandbox); the has_boxed health rule does not apply."""
    held_out = [e for e in load_code_problems() if e.meta["difficulty"] <= max_difficulty]
    if not held_out:
        raise ValueError(f"max_difficulty={max_difficulty}: no problems at or below it (difficulties 1-10)")
    families = [f for f, (d, _) in FAMILIES.items() if d <= max_difficulty]
    if not families:
        raise ValueError(f"max_difficulty={max_difficulty}: no procedural family that easy (lowest: 1)")
    pool = procedural_code_problems(train_size, seed, families)
    probes = {"id": random.Random(42).sample(pool, min(probe_size, len(pool)))}  # seed 003's probe seed
    return Task(name="code_problems", train=pool, eval=held_out, reward=code_task_reward, probes=probes,
                health_skip=("has_boxed",))
