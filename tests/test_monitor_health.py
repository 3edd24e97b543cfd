"""rftlib.monitor.health: each rule on synthetic metrics that trip it and on metrics that do not."""

import pytest

from rftlib.monitor.health import HEALTH_DEFAULTS, RULES, Verdict, check_health, summarize


def rows(**series):
    """rows(reward_mean=[...], grad_norm=[...]) -> [{"step": 1, "reward_mean": .., ...}, ...]; None = not logged."""
    n = max(len(v) for v in series.values())
    out = []
    for i in range(n):
        r = {"step": i + 1}
        for k, v in series.items():
            if i < len(v) and v[i] is not None:
                r[k] = v[i]
        out.append(r)
    return out


def run(rule, metrics, **cfg):
    (v,) = check_health(metrics, rules=[rule], **cfg)
    assert isinstance(v, Verdict) and v.name == rule
    return v


HEALTHY = rows(
    reward_mean=[0.3, 0.35, 0.4, 0.38, 0.45, 0.5], reward_std=[0.4] * 6, has_boxed=[0.95, 0.96, 0.97, 0.95, 0.96, 0.97],
    grad_norm=[0.5, 0.6, 0.4, 0.7, 0.5, 0.6], advantage_std=[0.0, 0.8, 0.9, 0.85, 0.9, 0.9],
    truncated=[0.1] * 6, ppo_clip_ratio=[0.05] * 6, entropy_mean=[1.8, 1.7, 1.75, 1.7, 1.6, 1.65],
    response_length_mean=[400, 410, 390, 420, 405, 400], ratio_max=[1.5] * 6, log_ratio_raw_max=[0.4] * 6,
)


def test_healthy_run_has_no_warn_or_fail():
    vs = check_health(HEALTHY)
    assert {v.name for v in vs} == set(RULES.names())
    assert [v for v in vs if v.status in ("warn", "fail")] == []
    na = {v.name for v in vs if v.status == "n/a"}  # no eval rows, 6 steps: those rules say so instead of passing
    assert na == {"train_eval_divergence", "ood_early_stop", "grad_spikes_escalating"}
    assert summarize(vs).count("[N/A ]") == 3


def test_too_little_data_is_na():
    v = run("length_collapse", rows(response_length_mean=[100, 90]))
    assert v.status == "n/a" and "needs 6" in v.message
    assert run("reward_stuck", rows(grad_norm=[1.0])).status == "n/a"  # metric never logged


def test_unknown_setting_is_refused():
    with pytest.raises(ValueError, match="max_grad_norm"):
        check_health(HEALTHY, max_grad_nrom=1.0)
    with pytest.raises(ValueError, match="unknown health rule"):
        check_health(HEALTHY, rules=["no_such_rule"])


@pytest.mark.parametrize("values, word", [([0.0] * 6, "bug"), ([1.0] * 6, "too easy")])
def test_reward_stuck(values, word):
    v = run("reward_stuck", rows(reward_mean=values))
    assert v.status == "fail" and word in v.action
    assert run("reward_stuck", rows(reward_mean=[0.0, 0.0, 0.125, 0.0])).status == "pass"


def test_has_boxed():
    assert run("has_boxed", rows(has_boxed=[0.4, 0.45, 0.42])).status == "fail"  # < 50%
    v = run("has_boxed", rows(has_boxed=[0.99, 0.98, 0.99, 0.9, 0.85, 0.84]))  # 0.987 -> 0.863
    assert v.status == "warn" and "dropping" in v.message and "SFT" in v.action
    assert run("has_boxed", rows(has_boxed=[0.95, 0.97, 0.96, 0.96])).status == "pass"


def test_grad_norm():
    assert run("grad_norm", rows(grad_norm=[0.0, 0.0, 0.0])).status == "fail"  # frozen weights
    v = run("grad_norm", rows(grad_norm=[150.0, 200.0, 120.0]), max_grad_norm=1.0)
    assert v.status == "fail" and "eps_clip" in v.action
    assert run("grad_norm", rows(grad_norm=[0.5, 180.0, 0.6])).status == "warn"  # one spike
    assert run("grad_norm", rows(grad_norm=[150.0, 200.0, 120.0]), max_grad_norm=10.0).status == "pass"


def test_advantage_std():
    v = run("advantage_std", rows(advantage_std=[0.0, 0.0, 0.0, 0.0], reward_std=[0.3, 0.4, 0.4, 0.5]))
    assert v.status == "fail" and "rewards did vary" in v.message
    assert run("advantage_std", rows(advantage_std=[0.0, 0.5, 0.7])).status == "pass"  # 0 only at step 1


def test_truncation():
    assert run("truncation", rows(truncated=[0.2, 0.3, 0.2])).status == "pass"
    assert run("truncation", rows(truncated=[0.4, 0.6, 0.7])).status == "warn"  # mean 57% > 50%
    v = run("truncation", rows(truncated=[0.75, 0.72, 0.78]))
    assert v.status == "fail" and "increase max_new_tokens" in v.action  # the RunConfig field, not OpenRLHF's flag
    v = run("truncation", rows(truncated=[0.85, 0.9, 0.82]))
    assert v.status == "fail" and "rambling" in v.message


def test_ppo_clip_ratio():
    assert run("ppo_clip_ratio", rows(ppo_clip_ratio=[0.5, 0.6, 0.55, 0.5])).status == "fail"  # from the start
    assert run("ppo_clip_ratio", rows(ppo_clip_ratio=[0.1, 0.2, 0.45, 0.5, 0.6, 0.5, 0.5])).status == "warn"
    assert run("ppo_clip_ratio", rows(ppo_clip_ratio=[0.1, 0.2, 0.15])).status == "pass"


def test_entropy_collapse():
    v = run("entropy_collapse", rows(entropy_mean=[1.6, 1.2, 0.9, 0.8, 0.7]))
    assert v.status == "warn" and "from 1.6" in v.message
    assert run("entropy_collapse", rows(entropy_mean=[1.6, 1.5, 1.4])).status == "pass"


def test_length_collapse():
    # rolling-3 means: peak 400 before the last window; last 3 steps mean 150 -> 62% drop
    v = run("length_collapse", rows(response_length_mean=[400, 400, 400, 380, 150, 150, 150]))
    assert v.status == "fail" and v.value == pytest.approx(1 - 150 / 400)
    v = run("length_collapse", rows(response_length_mean=[400, 400, 400, 260, 260, 260]))  # 35% drop
    assert v.status == "warn"
    assert run("length_collapse", rows(response_length_mean=[400, 380, 420, 390, 410, 400])).status == "pass"


def _with_evals(correctness, evals):
    m = rows(correctness=correctness)
    for step, value in evals.items():
        m[step - 1]["eval/ood/greedy_pass@1"] = value
    return m


def test_train_eval_divergence():
    # attempt-26 shape: training correctness 0.51 -> 0.56 while OOD falls from its peak
    corr = [0.50, 0.51, 0.51, 0.52, 0.52, 0.53, 0.54, 0.55, 0.56, 0.56]
    v = run("train_eval_divergence", _with_evals(corr, {2: 0.30, 5: 0.354, 10: 0.271}))
    assert v.status == "fail" and "step 5" in v.action
    v = run("train_eval_divergence", _with_evals(corr, {2: 0.30, 5: 0.35, 10: 0.35}))
    assert v.status == "warn" and "flat" in v.message
    assert run("train_eval_divergence", _with_evals(corr, {2: 0.30, 5: 0.33, 10: 0.36})).status == "pass"
    assert run("train_eval_divergence", _with_evals(corr, {5: 0.3})).status == "n/a"


def test_ood_early_stop():
    v = run("ood_early_stop", _with_evals([0.5] * 9, {3: 0.40, 6: 0.36, 9: 0.33}))
    assert v.status == "fail" and "step 3" in v.action
    assert run("ood_early_stop", _with_evals([0.5] * 9, {3: 0.40, 6: 0.36, 9: 0.38})).status == "pass"


def test_ratio_max():
    v = run("ratio_max", rows(ratio_max=[2.0, 14.0], log_ratio_raw_max=[0.5, 2.6]))
    assert v.status == "warn" and "ratio_max 14" in v.message
    assert run("ratio_max", rows(log_ratio_raw_max=[0.5, 6.0])).status == "warn"
    assert run("ratio_max", rows(ratio_max=[2.0, 3.0], log_ratio_raw_max=[0.5, 1.1])).status == "pass"


def test_grad_spikes_escalating():
    g = [0.5] * 30
    g[4], g[15], g[25] = 20.0, 60.0, 300.0  # decade maxima 20 -> 60 -> 300
    v = run("grad_spikes_escalating", rows(grad_norm=g))
    assert v.status == "warn" and "escalating" in v.message
    g[25] = 40.0  # 20 -> 60 -> 40
    assert run("grad_spikes_escalating", rows(grad_norm=g)).status == "pass"
    assert run("grad_spikes_escalating", rows(grad_norm=[1.0] * 5)).status == "n/a"


def test_defaults_are_documented_once():
    assert HEALTH_DEFAULTS["max_grad_norm"] == 1.0 and HEALTH_DEFAULTS["truncation_severe"] == 0.8


# ---- issue 15 item 4: the root cause first, its consequences folded under it -----------------------
NOTHING_TO_LEARN = rows(  # every group had equal rewards (all 0): every advantage 0, so the gradient is 0
    reward_mean=[0.0] * 6, reward_std=[0.0] * 6, advantage_std=[0.0] * 6, grad_norm=[0.0] * 6,
    has_boxed=[0.95] * 6, truncated=[0.1] * 6, ppo_clip_ratio=[0.0] * 6, entropy_mean=[2.0] * 6,
    response_length_mean=[20.0] * 6,
)


def test_no_learning_signal_is_named_first_and_explains_the_other_fails():
    vs = check_health(NOTHING_TO_LEARN)
    root = vs[0]
    assert root.name == "learning_signal" and root.status == "fail"
    assert root.message.startswith("every group has equal rewards: no learning signal; the task is too hard or "
                                   "too easy for this model")
    assert "too hard" in root.message  # reward_mean 0 at every step
    folded = {v.name: v for v in vs if v.caused_by}
    assert set(folded) == {"advantage_std", "grad_norm", "reward_stuck"}
    assert [v.name for v in vs[1:4]] == [v.name for v in vs if v.caused_by]  # right under the root
    for v in folded.values():
        assert v.caused_by == "learning_signal" and "follows from learning_signal" in v.message
        assert "frozen" not in v.action and "bug" not in v.action
    text = summarize(vs).splitlines()
    assert text[0].startswith("[FAIL] learning_signal") and all(t.startswith("    [FAIL]") for t in text[1:4])


def test_zero_grad_with_mixed_rewards_is_still_its_own_failure():
    # advantages non-zero (rewards varied) but the gradient is 0: that one is frozen weights, not the task
    v = {x.name: x for x in check_health(rows(advantage_std=[0.0, 0.7, 0.8, 0.9], grad_norm=[0.0] * 4))}
    assert v["learning_signal"].status == "pass"
    assert v["grad_norm"].status == "fail" and not v["grad_norm"].caused_by and "frozen" in v["grad_norm"].action


def test_divergence_verdict_names_the_eval_it_read():
    # issue 12 defect 9: with only the held-out set evaluated, the verdict must not speak of "OOD".
    # correctness 0.2 -> 0.6 (rolling gain >= 0.02) while held-out stays 0.5 (flat): warn
    from rftlib.monitor.health import HELDOUT_KEY, run_verdicts

    m = rows(correctness=[0.2, 0.3, 0.4, 0.5, 0.6, 0.6], advantage_std=[0.5] * 6)
    m[0][HELDOUT_KEY], m[5][HELDOUT_KEY] = 0.5, 0.5
    (v,) = [x for x in run_verdicts(m, {"max_grad_norm": 1.0}) if x.name == "train_eval_divergence"]
    assert v.status == "warn" and "held-out" in v.message and "OOD" not in v.message
    m[0]["eval/ood/greedy_pass@1"], m[5]["eval/ood/greedy_pass@1"] = 0.5, 0.5  # an OOD probe ran: then it is OOD
    (v,) = [x for x in run_verdicts(m, {"max_grad_norm": 1.0}) if x.name == "train_eval_divergence"]
    assert "OOD" in v.message
