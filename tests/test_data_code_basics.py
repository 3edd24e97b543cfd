"""code_basics: the templated code task the embedded model learns on.

The splits are disjoint by function (family + parameters), every reference solution passes all of
its tests in the real sandbox, and seed 002's partial credit comes out as computed by hand on the
mistakes the model really makes (``else n`` for ``else str(n)``; FizzBuzz with the both-divisors
case last)."""

import pytest

from rftlib.data.code_basics import FAMILIES, all_keys, code_basics_task, make_problem, split_keys
from rftlib.data.code_problems import code_task_batch_reward, code_task_reward
from rftlib.rewards.sandbox import check_available

pytestmark = pytest.mark.skipif(not check_available()[0], reason=f"no sandbox here: {check_available()[1]}")


def fenced(code: str) -> str:
    return f"Here you go.\n```python\n{code}```\nThis function ..."


def test_splits_are_disjoint_by_function_and_deterministic():
    train, held = split_keys(10)
    assert not set(train) & set(held)
    assert sorted(train + held) == sorted(all_keys())  # nothing lost
    assert split_keys(10) == (train, held)  # seeded
    assert split_keys(10, seed=7)[1] != held  # and the seed matters
    task = code_basics_task(held_out_per_family=10)
    assert len(task.eval) == 10 * len(FAMILIES) and len(task.train) == len(all_keys()) - len(task.eval)
    # no function (entry point: the name carries the parameters) and no prompt on both sides
    assert not {e.meta["entry_point"] for e in task.train} & {e.meta["entry_point"] for e in task.eval}
    assert not {e.prompt for e in task.train} & {e.prompt for e in task.eval}
    # 10 held out from every family
    assert {f: sum(e.meta["type"] == f for e in task.eval) for f in FAMILIES} == {f: 10 for f in FAMILIES}


def test_a_family_subset_and_bad_arguments():
    task = code_basics_task(held_out_per_family=20, families=["fizz", "fizzbuzz"])
    assert {e.meta["type"] for e in task.eval + task.train} == {"fizz", "fizzbuzz"}
    assert len(task.eval) == 40
    with pytest.raises(ValueError, match="unknown"):
        code_basics_task(families=["fizz", "nope"])
    assert len(code_basics_task(held_out_per_family=40, families=["fizzbuzz"]).train) == 8  # 12 pairs x 4 words
    with pytest.raises(ValueError, match="held_out_per_family=48: family fizzbuzz has 48"):
        code_basics_task(held_out_per_family=48, families=["fizzbuzz"])


def test_an_instance_is_pinned():
    """The same key gives the same prompt and tests on any machine (CRC-seeded, not hash-seeded)."""
    e = make_problem("fizz", (4, "Foo"))
    assert e.meta["entry_point"] == "foo_4"
    assert e.meta["problem"].tests == (((4,), "Foo"), ((1,), "1"), ((12,), "Foo"), ((25,), "25"), ((33,), "33"))
    assert e.prompt.splitlines()[:4] == ["Write a Python function `def foo_4(n: int) -> str`.",
                                         'Return "Foo" if n is divisible by 4, otherwise n as a string.',
                                         "Examples:", "    foo_4(4) == 'Foo'"]


def test_every_reference_passes_all_its_tests_in_the_sandbox():
    ex = [make_problem(f, p) for f, p in all_keys()]
    res = code_task_batch_reward([fenced(e.answer) for e in ex], ex, [False] * len(ex))
    bad = [(e.id, d) for e, (r, d) in zip(ex, res) if r != 1.0]
    assert not bad, bad[:3]
    assert all(d["tests_passed"] == d["tests_total"] == len(e.meta["problem"].tests) for e, (_, d) in zip(ex, res))


def test_partial_credit_on_the_models_own_mistakes():
    # fizz (4, Foo): `else n` returns an int where a string is expected. Tests 4, 1, 12, 25, 33:
    # right on 4 and 12 only -> 2 of 5 -> 0.5 x 2/5 = 0.2
    e = make_problem("fizz", (4, "Foo"))
    r, d = code_task_reward(fenced("def foo_4(n: int) -> str:\n    return 'Foo' if n % 4 == 0 else n\n"), e, False)
    assert (d["tests_passed"], d["tests_total"]) == (2, 5) and r == pytest.approx(0.2, abs=1e-12)
    # fizzbuzz (3, 5): the both-divisors case checked last. Tests 3, 5, 15, 1, 69, 11: only 15
    # ("Fizz" instead of "FizzBuzz") is wrong -> 5 of 6 -> 0.5 x 5/6 = 5/12
    e = make_problem("fizzbuzz", (3, 5, "Fizz", "Buzz"))
    wrong = ("def fizzbuzz_3_5(n: int) -> str:\n    if n % 3 == 0:\n        return 'Fizz'\n"
             "    if n % 5 == 0:\n        return 'Buzz'\n    if n % 15 == 0:\n        return 'FizzBuzz'\n"
             "    return str(n)\n")
    r, d = code_task_reward(fenced(wrong), e, False)
    assert (d["tests_passed"], d["tests_total"]) == (5, 6) and r == pytest.approx(5 / 12, abs=1e-12)
    # all pass -> 1.0, not 0.5: the cap applies to partial credit only
    r, d = code_task_reward(fenced(e.answer), e, False)
    assert r == 1.0 and d["correctness"] == 1.0
    # greet ("Hello", "?"): the model's habit `+ "!"` passes none of 5 -> 0.0
    e = make_problem("greet", ("Hello", "?"))
    r, d = code_task_reward(fenced('def hello_asking(name: str) -> str:\n    return f"Hello, {name}!"\n'), e, False)
    assert (d["tests_passed"], r) == (0, 0.0)
