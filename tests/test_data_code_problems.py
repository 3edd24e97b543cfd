"""Our FizzBuzz-style problem set: well-formed, seed 002's anchors present, every reference
solution passes its tests in the sandbox, and the procedural pool is deterministic."""

from __future__ import annotations

import functools
import json
from collections import Counter

import pytest

from rftlib.data.code_problems import (FAMILIES, PROBLEMS_FILE, code_problems_task, code_task_reward,
                                       load_code_problems, procedural_code_problems)
from rftlib.data.jsonl import DataError
from rftlib.rewards.code import batch_code_reward, code_reward
from rftlib.rewards.registry import as_reward


def test_set_spans_difficulties_1_to_10_with_seed_002_anchors():
    probs = {e.id.split("/", 1)[1]: e for e in load_code_problems()}
    assert len(probs) >= 20
    assert set(Counter(e.meta["difficulty"] for e in probs.values())) == set(range(1, 11))
    fb = probs["fizzbuzz"]
    assert fb.meta["difficulty"] == 3 and fb.meta["problem"].num_tests == 5
    assert "def fizzbuzz(n: int) -> str" in fb.prompt
    assert [t[1] for t in fb.meta["problem"].tests] == ["Fizz", "Buzz", "FizzBuzz", "7", "Fizz"]
    par = probs["parentheses"]
    assert par.meta["difficulty"] == 7 and par.meta["entry_point"] == "is_balanced"


def test_every_reference_solution_passes_and_a_stub_fails(sb):
    probs = load_code_problems()
    problems = [e.meta["problem"] for e in probs]
    gold = batch_code_reward([f"```python\n{e.answer}```" for e in probs], problems, sandbox=sb)
    assert [(e.id, r.reward) for e, r in zip(probs, gold) if r.reward != 1.0] == []
    stub = batch_code_reward([f"```python\ndef {e.meta['entry_point']}(*a):\n    return None\n```" for e in probs],
                             [e.meta["problem"] for e in probs], sandbox=sb)
    assert all(r.diagnostics()["correctness"] == 0.0 for r in stub)


def test_task_reward_signature_and_diagnostics(sb, monkeypatch):
    import rftlib.data.code_problems as cp

    monkeypatch.setattr(cp, "code_reward", functools.partial(code_reward, sandbox=sb))  # this module's sandbox
    ex = next(e for e in load_code_problems() if e.id.endswith("/fizzbuzz"))
    r, d = code_task_reward(f"```python\n{ex.answer}```", ex, True)
    assert r == 1.0 and d["correctness"] == 1.0 and d["truncated_response"] == 1.0
    assert not any(k.startswith("test_") for k in d)
    wrong = ex.answer.replace("n % 15 == 0", "n == 30")  # 15 -> "Fizz": 4 of 5 tests pass
    assert code_task_reward(f"```python\n{wrong}```", ex, False)[0] == pytest.approx(0.5 * 4 / 5)


def test_batch_form_scores_like_the_row_by_row_reward(sb, monkeypatch):
    import rftlib.data.code_problems as cp

    monkeypatch.setattr(cp, "code_reward", functools.partial(code_reward, sandbox=sb))
    monkeypatch.setattr(cp, "batch_code_reward", functools.partial(batch_code_reward, sandbox=sb))
    ex = next(e for e in load_code_problems() if e.id.endswith("/fizzbuzz"))
    wrong = ex.answer.replace("n % 15 == 0", "n == 30")
    texts = [f"```python\n{ex.answer}```", f"```python\n{wrong}```", "no code at all"]
    trunc = [False, True, False]
    code = as_reward(code_task_reward)  # what the trainer scores with: the registered reward, batch form declared
    assert code.batch is cp.code_task_batch_reward and not hasattr(code_task_reward, "batch")
    batch = code.score(texts, [ex] * 3, trunc)
    # 1.0 (all pass), 0.5 * 4/5 (4 of 5 tests; the partial-credit rule above), 0.0 (nothing to run)
    assert [r for r, _ in batch] == pytest.approx([1.0, 0.4, 0.0])
    def timeless(scored):  # exec_s is a wall-clock measurement: it differs run to run
        return [(r, {k: v for k, v in d.items() if k != "exec_s"}) for r, d in scored]

    assert timeless(batch) == timeless([code_task_reward(t, ex, c) for t, c in zip(texts, trunc)])


def test_procedural_pool_is_deterministic_distinct_and_covers_families():
    a, b = procedural_code_problems(2000, seed=3), procedural_code_problems(2000, seed=3)  # the task's default size
    assert [e.prompt for e in a] == [e.prompt for e in b]
    assert len({e.prompt for e in a}) == 2000
    assert Counter(e.meta["type"] for e in a) == {f: 250 for f in FAMILIES}  # families in turn
    assert procedural_code_problems(8, seed=4)[0].prompt != a[0].prompt


def test_task_is_disjoint_and_filters_difficulty():
    task = code_problems_task(train_size=40, max_difficulty=4)
    assert len(task.train) == 40 and all(e.meta["difficulty"] <= 4 for e in task.train + task.eval)
    assert not {e.prompt for e in task.train} & {e.prompt for e in task.eval}
    assert len(task.probes["id"]) == 30 and task.health_skip == ("has_boxed",)


def test_malformed_problem_row_names_file_and_line(tmp_path):
    rows = PROBLEMS_FILE.read_text().splitlines()
    bad = json.loads(rows[1])
    bad["difficulty"] = 11
    p = tmp_path / "p.jsonl"
    p.write_text(rows[0] + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(DataError, match=rf"^{p}:2: difficulty must be an integer 1-10"):
        load_code_problems(p)
    del bad["tests"]
    p.write_text(rows[0] + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(DataError, match=rf"^{p}:2: missing column 'tests'"):
        load_code_problems(p)
