"""``code_basics``: templated short Python functions the embedded 135M model can partly write.

Seed 002 trains on FizzBuzz with sandboxed tests and partial credit; its 0.5B coder solved it
every time (no learning signal), and SmolLM2-135M-Instruct solves almost none of our 30-problem
set (``code_problems``). This task sits between them: ten families, graded from one-line
arithmetic (difficulty 1) to FizzBuzz with two divisors (5), each a template with a parameter
(a constant, a word, a letter), so every family has tens of distinct instances.

An instance is fully determined by its key ``(family, params)``: the parameters pick the function
name, the description and, through a random generator seeded by the key, the test inputs.
Held-out instances are drawn per family (stratified) from a seeded shuffle of the keys and the
training pool is every other key, so no function (same family and parameters) is in both, not
only no identical prompt. Expected outputs come from trusted reference functions in this file;
only the model's code runs in the sandbox. Reward: seed 002's (``code_task_reward``): 1.0 when
every test passes, else 0.5 x the fraction passed; ``correctness`` (all pass) is pass@1.

Measured base rates of the families (SmolLM2-135M-Instruct, greedy and T=1 sampled) are in
data/README.md and params/code-cpu.yaml; re-measure them when a template's wording changes
(``python bench/code_measure.py``).
"""

from __future__ import annotations

import random
import zlib
from typing import Callable

from rftlib.data.base import Example, Task
from rftlib.data.code_problems import N_EXAMPLES_SHOWN, code_prompt, code_task_reward
from rftlib.rewards.code import CodeProblem

Maker = Callable[[tuple, random.Random], tuple[str, str, Callable, list[tuple]]]
"""params, rng -> (signature, description, reference function, test inputs)"""

WORDS = ("Fizz", "Buzz", "Foo", "Bar", "Ping", "Pong", "Zip", "Zap", "Bing", "Bong")
GREETINGS = ("Hello", "Hi", "Hey", "Welcome", "Goodbye", "Bye", "Thanks", "Cheers", "Howdy", "Greetings",
             "Morning", "Evening", "Congrats", "Sorry", "Ahoy", "Salut", "Hola", "Ciao", "Aloha", "Yo")
LETTERS = "abcdefghijklmnoprstuw"  # common letters: test strings hold them


def _word(rng: random.Random) -> str:
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 8)))


def _ints(rng: random.Random, k: int, lo: int = -20, hi: int = 50) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(k)]


# ---- the families: params -> (signature, description, reference, inputs) -------------------------
def _add(p, rng):
    (k,) = p
    return (f"def add_{k}(n: int) -> int", f"Return n plus {k}.", lambda n: n + k,
            [(x,) for x in [0, 1] + _ints(rng, 3)])


def _times(p, rng):
    (k,) = p
    return (f"def times_{k}(n: int) -> int", f"Return n multiplied by {k}.", lambda n: n * k,
            [(x,) for x in [1, 0] + _ints(rng, 3)])


def _greet(p, rng):
    g, end = p
    names = [n.capitalize() for n in (_word(rng) for _ in range(5))]
    tag = {"!": "excited", ".": "plain", "?": "asking"}[end]
    return (f"def {g.lower()}_{tag}(name: str) -> str", f'Return "{g}, " followed by name and "{end}".',
            lambda name: f"{g}, {name}{end}", [(n,) for n in names])


def _is_multiple(p, rng):
    (k,) = p
    xs = [k, k * rng.randint(2, 9), k * rng.randint(2, 9) + rng.randint(1, k - 1), rng.randint(1, k - 1) + k, 0]
    return (f"def is_multiple_of_{k}(n: int) -> bool", f"Return True if n is divisible by {k}, otherwise False.",
            lambda n: n % k == 0, [(x,) for x in xs])


def _repeat(p, rng):
    (k,) = p
    return (f"def repeat_{k}(s: str) -> str", f"Return the string s repeated {k} times.", lambda s: s * k,
            [(w,) for w in [_word(rng), "ab", _word(rng), "x", ""]])


def _end_chars(p, rng):
    side, k = p
    return (f"def {side}_{k}(s: str) -> str", f"Return the {side} {k} characters of the string s.",
            (lambda s: s[:k]) if side == "first" else (lambda s: s[-k:]),
            [("".join(_word(rng) for _ in range(3)),) for _ in range(5)])


def _count_letter(p, rng):
    c, upper = p
    if upper:
        c = c.upper()
    texts = [" ".join(_word(rng) for _ in range(rng.randint(1, 4))) + c * rng.randint(0, 3) for _ in range(4)]
    if upper:
        texts = [t.capitalize() + c * rng.randint(0, 2) for t in texts]
    return (f"def count_{'upper_' if upper else ''}{c}(s: str) -> int",
            f"Return how many times the {'upper case ' if upper else ''}letter '{c}' occurs in the string s.",
            lambda s: s.count(c), [(t,) for t in texts + [c * 3 + "x"]])


def _sum_above(p, rng):
    (k,) = p
    lists = [_ints(rng, rng.randint(3, 7), 0, 3 * k) for _ in range(4)] + [[]]
    return (f"def sum_above_{k}(xs: list) -> int", f"Return the sum of the numbers in the list xs that are greater "
            f"than {k}.", lambda xs: sum(x for x in xs if x > k), [(xs,) for xs in lists])


def _fizz(p, rng):
    k, w = p
    xs = [k, 1, k * rng.randint(2, 9), rng.randint(1, k - 1) + k * rng.randint(0, 9), rng.randint(1, 100)]
    return (f"def {w.lower()}_{k}(n: int) -> str", f'Return "{w}" if n is divisible by {k}, otherwise n as a string.',
            lambda n: w if n % k == 0 else str(n), [(x,) for x in xs])


def _fizzbuzz(p, rng):
    a, b, w1, w2 = p

    def f(n):
        return (w1 if n % a == 0 else "") + (w2 if n % b == 0 else "") or str(n)

    xs = [a, b, a * b, 1, rng.randint(1, 100), rng.randint(1, 100)]
    return (f"def {w1.lower()}{w2.lower()}_{a}_{b}(n: int) -> str",
            f'Return "{w1}{w2}" if n is divisible by both {a} and {b}, "{w1}" if only by {a}, "{w2}" if only by '
            f"{b}, and otherwise n as a string.", f, [(x,) for x in xs])


FAMILIES: dict[str, tuple[int, list[tuple], Maker]] = {  # name -> (difficulty, every params tuple, maker)
    "add": (1, [(k,) for k in range(2, 40)], _add),
    "times": (1, [(k,) for k in range(2, 40)], _times),
    "greet": (1, [(g, end) for g in GREETINGS for end in "!.?"], _greet),
    "repeat": (2, [(k,) for k in range(2, 30)], _repeat),
    "is_multiple": (2, [(k,) for k in range(2, 40)], _is_multiple),
    "end_chars": (2, [(side, k) for side in ("first", "last") for k in range(1, 21)], _end_chars),
    "count_letter": (3, [(c, up) for c in LETTERS for up in (False, True)], _count_letter),
    "sum_above": (3, [(k,) for k in range(1, 40)], _sum_above),
    "fizz": (4, [(k, w) for k in range(2, 12) for w in WORDS], _fizz),
    "fizzbuzz": (5, [(a, b, w1, w2) for a, b in [(2, 3), (2, 5), (2, 7), (2, 9), (3, 4), (3, 5), (3, 7),
                                                            (3, 8), (4, 5), (4, 7), (5, 6), (5, 7)]
                     for w1, w2 in [("Fizz", "Buzz"), ("Foo", "Bar"), ("Ping", "Pong"), ("Zip", "Zap")]], _fizzbuzz),
}


def _entry(signature: str) -> str:
    return signature.split("def ", 1)[1].split("(", 1)[0].strip()


def make_problem(family: str, params: tuple) -> Example:
    """The Example of one instance: same (family, params), same prompt and tests, on any machine
    (its generator is seeded by a CRC of the key, not by Python's salted hash)."""
    if family not in FAMILIES:
        raise ValueError(f"unknown code_basics family {family!r}; valid: {', '.join(FAMILIES)}")
    difficulty, _, make = FAMILIES[family]
    rng = random.Random(zlib.crc32(repr((family, params)).encode()))
    signature, desc, fn, inputs = make(params, rng)
    entry = _entry(signature)
    distinct = {repr(a): a for a in inputs}  # distinct inputs, in order (lists are not hashable)
    pairs = [(tuple(a), fn(*a)) for a in distinct.values()]
    key = "-".join(str(x) for x in params)
    return Example(id=f"code_basics/{family}/{key}",
                   prompt=code_prompt(signature, desc, pairs[:N_EXAMPLES_SHOWN], entry),
                   answer=_reference_source(signature, family, params),
                   meta={"problem": CodeProblem(entry_point=entry, tests=tuple(pairs)), "difficulty": difficulty,
                         "type": family, "entry_point": entry, "params": params, "source": "code_basics"})


def _reference_source(signature: str, family: str, params: tuple) -> str:
    """A solution as source text (what the validation's control completion and the tests run in the
    sandbox), written independently of the reference lambdas above."""
    p = params
    body = {
        "add": lambda: f"return n + {p[0]}",
        "times": lambda: f"return n * {p[0]}",
        "greet": lambda: f'return "{p[0]}, " + name + {p[1]!r}',
        "repeat": lambda: f"return s * {p[0]}",
        "is_multiple": lambda: f"return n % {p[0]} == 0",
        "end_chars": lambda: (f"return s[:{p[1]}]" if p[0] == "first" else
                              f"return s[len(s) - {p[1]}:] if len(s) >= {p[1]} else s"),
        "count_letter": lambda: f"return sum(1 for ch in s if ch == {(p[0].upper() if p[1] else p[0])!r})",
        "sum_above": lambda: f"total = 0\n    for x in xs:\n        if x > {p[0]}:\n            total += x\n    return total",
        "fizz": lambda: f"if n % {p[0]} == 0:\n        return {p[1]!r}\n    return str(n)",
        "fizzbuzz": lambda: (f"if n % {p[0] * p[1]} == 0:\n        return {p[2] + p[3]!r}\n"
                             f"    if n % {p[0]} == 0:\n        return {p[2]!r}\n"
                             f"    if n % {p[1]} == 0:\n        return {p[3]!r}\n    return str(n)"),
    }[family]()
    return f"{signature}:\n    {body}\n"


def all_keys(families: list[str] | None = None) -> list[tuple[str, tuple]]:
    names = list(FAMILIES) if families is None else families
    unknown = [f for f in names if f not in FAMILIES]
    if unknown or not names:
        raise ValueError(f"unknown code_basics families {unknown}; valid: {', '.join(FAMILIES)}")
    return [(f, p) for f in names for p in FAMILIES[f][1]]


def split_keys(held_out_per_family: int, seed: int = 1234,
               families: list[str] | None = None) -> tuple[list[tuple[str, tuple]], list[tuple[str, tuple]]]:
    """(train keys, held-out keys): per family, a seeded shuffle of its parameters; the first
    ``held_out_per_family`` are held out. Disjoint by key, so by function, by construction."""
    train, held = [], []
    for f in (list(FAMILIES) if families is None else families):
        keys = [k for k in all_keys([f])]
        if not 0 < held_out_per_family < len(keys):
            raise ValueError(f"held_out_per_family={held_out_per_family}: family {f} has {len(keys)} instances; "
                             f"choose 1..{len(keys) - 1}")
        random.Random(f"{seed}/{f}").shuffle(keys)
        held += keys[:held_out_per_family]
        train += keys[held_out_per_family:]
    return train, held


def code_basics_task(held_out_per_family: int = 12, seed: int = 1234, families: list | None = None,
                     max_difficulty: int = 5) -> Task:
    """Train on every instance not held out; evaluate on ``held_out_per_family`` instances of
    each family (10 families x 12 = 120 by default) with difficulty <= ``max_difficulty``.
    Probe "id": 40 training instances (seed 42). Reward: code_task_reward, in the sandbox."""
    names = [f for f in (families or list(FAMILIES)) if f in FAMILIES and FAMILIES[f][0] <= max_difficulty]
    bad = [f for f in (families or []) if f not in FAMILIES]
    if bad:
        raise ValueError(f"task_args families: unknown {bad}; valid: {', '.join(FAMILIES)}")
    if not names:
        raise ValueError(f"max_difficulty={max_difficulty}: no family that easy (difficulties 1-5)")
    train_keys, held_keys = split_keys(held_out_per_family, seed, names)
    train = [make_problem(f, p) for f, p in train_keys]
    held = [make_problem(f, p) for f, p in held_keys]
    random.Random(seed).shuffle(train)  # families interleaved in the pool's order
    probes = {"id": random.Random(42).sample(train, min(40, len(train)))}
    return Task(name="code_basics", train=train, eval=held, reward=code_task_reward, probes=probes,
                health_skip=("has_boxed",))

