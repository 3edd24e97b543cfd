"""The reward seam (rftlib.rewards.registry): rewards registered by name, composed with weights from the
config, each component logged as reward/<name>, the batch form declared; and a toy reward that trains."""

from __future__ import annotations

import pytest
import torch

from rftlib.config import ConfigError, make_config
from rftlib.data.base import Example, registered_rewards
from rftlib.data.code_problems import code_task_batch_reward, code_task_reward
from rftlib.rewards.math import math_em_reward
from rftlib.rewards.registry import REWARDS, Reward, as_reward, combine_rewards, register_reward
from rftlib.train.loop import Trainer

EX = Example("e", "Calculate 2 + 3.", "5")


def parity(text, example, truncated):
    """A toy reward that varies with the completion: 1.0 for an odd length, else 0.0."""
    return float(len(text) % 2), {"toy/len": float(len(text))}


@pytest.fixture
def toy_parity(monkeypatch):
    """Registers 'toy_parity' for one test (the registry is module state: restored after)."""
    monkeypatch.setattr(REWARDS, "_table", dict(REWARDS._table))
    return register_reward("toy_parity", parity)


def test_the_builtin_rewards_are_registered_from_where_they_live():
    names = registered_rewards().names()
    assert {"math_em", "code_tests", "format_boxed", "truncated_penalty"} <= set(names)
    assert REWARDS.get("math_em").row is math_em_reward
    code = REWARDS.get("code_tests")
    assert code.row is code_task_reward and code.batch is code_task_batch_reward  # declared, not found
    # a task's reward function maps back to its registration, batch form included
    assert as_reward(code_task_reward) is code
    assert as_reward(math_em_reward).batch is None


def test_a_weighted_reward_sums_its_components_and_reports_each(toy_parity):
    texts = ["The answer is \\boxed{5}", "5.", "cut off at the lim"]  # lengths 23, 2, 18
    trunc = [False, False, True]
    reward = combine_rewards({"math_em": 1.0, "toy_parity": 0.5, "format_boxed": 0.25, "truncated_penalty": 2.0})
    scored = reward.score(texts, [EX] * 3, trunc)
    # by hand: math_em 1, 1, 0 (boxed 5; last number 5; no number); parity 1, 0, 0; boxed 1, 0, 0; truncated 0, 0, -1
    assert [r for r, _ in scored] == [1.0 + 0.5 + 0.25, 1.0, -2.0]
    d0 = scored[0][1]
    assert (d0["reward/math_em"], d0["reward/toy_parity"], d0["reward/format_boxed"], d0["reward/truncated_penalty"]) \
        == (1.0, 1.0, 1.0, 0.0)
    assert d0["correctness"] == 1.0 and d0["toy/len"] == 23.0  # the components' diagnostics are kept
    assert scored[2][1]["reward/truncated_penalty"] == -1.0  # each component's own value, before its weight
    assert reward(texts[0], EX, False) == scored[0]  # the row form agrees with the batch


def test_the_first_component_keeps_a_diagnostic_both_report(toy_parity, monkeypatch):
    monkeypatch.setitem(REWARDS._table, "always_right",
                        Reward("always_right", lambda t, e, c: (1.0, {"correctness": 1.0})))
    wrong = "The answer is 7."
    assert combine_rewards({"math_em": 1.0, "always_right": 1.0})(wrong, EX, False)[1]["correctness"] == 0.0
    assert combine_rewards({"always_right": 1.0, "math_em": 1.0})(wrong, EX, False)[1]["correctness"] == 1.0


def test_a_declared_batch_form_scores_the_rows_in_one_call():
    calls = []

    def row(text, ex, cut):
        raise AssertionError("row by row although a batch form is declared")

    def batch(texts, exs, cuts):
        calls.append(len(texts))
        return [(1.0, {})] * len(texts)

    r = Reward("b", row, batch=batch)
    assert r.score(["a", "b", "c"], [EX] * 3, [False] * 3) == [(1.0, {})] * 3 and calls == [3]
    short = Reward("short", row, batch=lambda t, e, c: [(1.0, {})])
    with pytest.raises(ValueError, match="reward 'short': its batch form returned 1 results for 2 rows"):
        short.score(["a", "b"], [EX] * 2, [False] * 2)


def test_task_names_the_tasks_own_reward():
    own = Reward("own", lambda t, e, c: (3.0, {"own": 1.0}))
    r = combine_rewards({"task": 2.0, "truncated_penalty": 1.0}, own)
    assert r("x", EX, True) == (2.0 * 3.0 - 1.0, {"own": 1.0, "reward/task": 3.0, "reward/truncated_penalty": -1.0})
    with pytest.raises(ValueError, match="no task reward was given"):
        combine_rewards({"task": 1.0})


def test_the_config_refuses_an_unknown_reward_or_a_bad_weight():
    with pytest.raises(ConfigError, match="unknown reward 'math_exact'; valid: task, code_tests, format_boxed"):
        make_config("tiny", {"rewards": {"math_exact": 1.0}})
    with pytest.raises(ConfigError, match=r"rewards\['math_em'\]='1': a weight must be a finite number"):
        make_config("tiny", {"rewards": {"math_em": "1"}})
    assert make_config("tiny", {"rewards": {"task": 1.0, "format_boxed": 0.1}}).rewards == {"task": 1.0,
                                                                                            "format_boxed": 0.1}


def test_a_registered_toy_reward_trains_and_is_logged_per_component(monkeypatch, tiny_cfg):
    """Selected from the config beside the task's own: the step's reward is 1 x parity + 0.5 x the task's,
    each logged on its own; the advantages are non-zero and the weights move."""
    monkeypatch.setattr(REWARDS, "_table", dict(REWARDS._table))
    seen = []
    register_reward("toy_parity", lambda text, ex, cut: seen.append(parity(text, ex, cut)[0]) or parity(text, ex, cut))
    cfg = tiny_cfg(num_steps=2, eval_steps=0, save_steps=0, warmup_ratio=0.0, rewards={"toy_parity": 1.0, "task": 0.5})
    tr = Trainer(cfg, progress=False)
    try:
        before = {k: v.detach().clone() for k, v in tr.model.named_parameters() if v.requires_grad}
        row = tr.step()
        after = {k: v.detach() for k, v in tr.model.named_parameters() if v.requires_grad}
    finally:
        tr.close()
    n = len(seen)
    assert n == cfg.rollout_batch_size * cfg.n_samples_per_prompt
    assert 0 < sum(seen) < n  # the toy reward varies within the rollout: there is signal
    assert row["reward/toy_parity"] == pytest.approx(sum(seen) / n, abs=1e-6)
    assert "reward/task" in row and row["toy/len"] > 0  # the task's own component, a toy diagnostic
    # the mean of a weighted sum is the weighted sum of the means (each value a multiple of 0.5: exact in float32)
    assert row["reward_mean"] == pytest.approx(row["reward/toy_parity"] + 0.5 * row["reward/task"], abs=1e-6)
    assert row["advantage_max"] > 0 > row["advantage_min"]
    moved = sum(int(not torch.equal(before[k], after[k])) for k in before)
    assert moved > 0, "no trainable tensor changed"
