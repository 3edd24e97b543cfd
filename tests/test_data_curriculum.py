"""CurriculumSampler against a simulated solver whose solve probability falls with difficulty,
and weighted task mixing."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from rftlib.data.curriculum import (CurriculumConfig, CurriculumSampler, MixedTask, WeightedSampler, mix_tasks,
                                    pick_start_level)
from rftlib.data.tasks import Example, Task

POOL = [Example(id=str(i), prompt=f"p{i}", answer="", meta={"difficulty": 1 + i % 5, "type": "abc"[i % 3]})
        for i in range(300)]


def simulate(sampler, p_solve, steps, seed=1, batch=16):
    """Levels after each step when problem i is solved with probability p_solve(difficulty)."""
    rng = random.Random(seed)
    levels = []
    for step in range(steps):
        idx = sampler.next(batch)
        sampler.update(idx, [float(rng.random() < p_solve(POOL[i].meta["difficulty"], step)) for i in idx])
        levels.append(sampler.level)
    return levels


def fixed(rates):
    return lambda d, step: rates[d]


def test_level_rises_to_where_the_solver_is_challenged_and_stays():
    # solve rate above advance_above (0.7) on levels 1-3, 0.5 on level 4: climbs 1 -> 4, never to 5
    levels = simulate(CurriculumSampler(POOL, seed=0), fixed({1: .95, 2: .9, 3: .8, 4: .5, 5: .1}), 80)
    assert levels[0] == 1 and levels[-1] == 4
    assert levels == sorted(levels)  # only upward
    assert 5 not in levels


def test_level_falls_when_too_hard():
    # starting at 5 (solve rate 5% < retreat_below 0.2) it steps down to 4 (45%) and stays
    levels = simulate(CurriculumSampler(POOL, seed=0, start_level=5), fixed({1: .9, 2: .8, 3: .7, 4: .45, 5: .05}), 60)
    assert levels[0] == 5 and levels[-1] == 4 and set(levels) == {4, 5}


def test_follows_a_solver_that_improves_then_regresses():
    # skill rises for 150 steps then collapses: the level goes up, then back down
    def p(d, step):
        skill = step / 30 if step < 150 else 0.0
        return min(0.98, max(0.02, 0.5 + 0.4 * (skill - d)))

    levels = simulate(CurriculumSampler(POOL, seed=0), p, 250)
    peak = max(levels[:150])
    assert peak >= 4
    assert levels[-1] < peak and levels[-1] <= 2


def test_hysteresis_needs_min_results_at_the_level():
    s = CurriculumSampler(POOL, seed=0, config=CurriculumConfig(min_results=1000))
    simulate(s, fixed({d: 1.0 for d in range(1, 6)}), 20)
    assert s.level == 1 and s.moves == 0


def test_batch_mix_and_type_rotation():
    s = CurriculumSampler(POOL, seed=3, start_level=3)
    assert s.mix() == pytest.approx({1: 0.1, 2: 0.1, 3: 0.7, 4: 0.1, 5: 0.0})
    drawn = [POOL[i].meta for i in s.next(2000)]
    share = Counter(m["difficulty"] for m in drawn)
    assert share[3] / 2000 == pytest.approx(0.7, abs=0.04) and share[5] == 0
    at3 = [m["type"] for m in drawn if m["difficulty"] == 3]
    assert at3[:6] == ["a", "b", "c", "a", "b", "c"]  # types taken in turn


def test_deterministic_and_resumable():
    a, b = CurriculumSampler(POOL, seed=5), CurriculumSampler(POOL, seed=5)
    sim = fixed({1: .95, 2: .9, 3: .8, 4: .5, 5: .1})
    assert simulate(a, sim, 30) == simulate(b, sim, 30)
    state = json.loads(json.dumps(a.state()))  # checkpoints hold JSON
    c = CurriculumSampler(POOL, seed=999)
    c.load_state(state)
    assert c.next(50) == a.next(50) and c.metrics() == a.metrics()


def test_metrics_show_the_schedule():
    s = CurriculumSampler(POOL, seed=0)
    simulate(s, fixed({1: .95, 2: .9, 3: .8, 4: .5, 5: .1}), 40)
    m = s.metrics()
    assert m["curriculum/level"] == 4.0 and m["curriculum/moves"] == 3.0
    assert m["curriculum/solve_rate/1"] > 0.8 and m["curriculum/solve_rate/5"] < 0.3
    assert sum(v for k, v in m.items() if k.startswith("curriculum/mix/")) == pytest.approx(1.0)
    assert all(isinstance(v, float) for v in m.values())


def test_pick_start_level_targets_30_to_50_percent():
    assert pick_start_level({1: .95, 2: .8, 3: .45, 4: .2, 5: .02}) == 3
    assert pick_start_level({1: .9, 2: .1}) == 2  # |0.1-0.4| < |0.9-0.4|


def test_bad_config_and_level():
    with pytest.raises(ValueError, match="retreat_below < advance_above"):
        CurriculumConfig(advance_above=0.2, retreat_below=0.5)
    with pytest.raises(ValueError, match="not a level"):
        CurriculumSampler(POOL, start_level=9)


# --- mixing ------------------------------------------------------------------------------------


def _task(name, n, reward_value, skip=()):
    ex = [Example(id=str(i), prompt=f"{name} {i}", answer=str(i)) for i in range(n)]
    return Task(name=name, train=ex[2:], eval=ex[:2], reward=lambda c, e, t: (reward_value, {"v": reward_value}),
                probes={"id": ex[2:3]}, health_skip=skip)


def test_mixed_task_dispatches_the_reward_and_tags_examples():
    mixed = mix_tasks({"a": _task("a", 10, 1.0), "b": _task("b", 6, 0.0)}, {"a": 3, "b": 1})
    assert isinstance(mixed, MixedTask) and len(mixed.train) == 8 + 4 and len(mixed.eval) == 4
    ea = next(e for e in mixed.train if e.meta["task"] == "a")
    eb = next(e for e in mixed.train if e.meta["task"] == "b")
    assert ea.id.startswith("a/") and mixed.reward("x", ea, False)[0] == 1.0 and mixed.reward("x", eb, False)[0] == 0.0
    assert [e.id for e in mixed.probes["id"]] == ["a/2", "b/2"]


def test_mixed_task_skips_a_health_rule_any_part_skips():
    mixed = mix_tasks({"a": _task("a", 4, 1.0, skip=("has_boxed",)), "b": _task("b", 4, 0.0)})
    assert mixed.health_skip == ("has_boxed",)


def test_weighted_sampler_keeps_exact_proportions_and_resumes():
    mixed = mix_tasks({"a": _task("a", 10, 1.0), "b": _task("b", 6, 0.0)}, {"a": 3, "b": 1})
    s = mixed.make_sampler(seed=0)
    draws = [mixed.train[i].meta["task"] for i in s.next(40)]
    assert Counter(draws) == {"a": 30, "b": 10}
    assert s.metrics()["mix/drawn_frac/a"] == 0.75
    s2 = WeightedSampler(mixed.train, {"a": 3, "b": 1}, seed=42)
    s2.load_state(json.loads(json.dumps(s.state())))
    assert s2.next(17) == s.next(17)


def test_mix_rejects_unknown_weights():
    with pytest.raises(ValueError, match="unknown tasks"):
        mix_tasks({"a": _task("a", 4, 1.0)}, {"z": 1.0})
