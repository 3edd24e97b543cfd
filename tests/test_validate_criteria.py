"""`rft validate`'s success criteria (seed 002), each measured, and each able to fail.

Synthetic validations check that a criterion fails when its evidence says so (weights that did
not change, a NaN loss, a KL that ran away, a reward out of range); a real run on the untrained
tiny model (the fast plumbing check) and one on the embedded default with the sandboxed code
reward (seed002-fizzbuzz-rtx3080-cpu) check the per-phase time and memory and the sandbox numbers."""

import json
import math
import time
from pathlib import Path

import pytest

from rftlib.validate import (KL_SMALL, PHASES, PhaseMeter, StepRecord, Validation, criteria_rows, phase_rows,
                                    sandbox_summary)
from rftlib.rewards.sandbox import check_available

G, B = 2, 1


def _step(k, *, changed=True, control=False, loss=0.1, kl=0.001, rewards=(0.2, 1.0), adv_std=1.0):
    row = {"step": k, "loss": loss, "reward_mean": sum(rewards) / len(rewards), "kl": kl, "advantage_std": adv_std,
           "timing/step": 10.0, "timing/generate": 8.0, "timing/reward": 0.5, "timing/reference": 0.5,
           "timing/update": 0.75, "timing/reward_share": 0.05, "sandbox/executions": 2.0, "sandbox/timeouts": 0.0,
           "sandbox/crashes": 1.0, "sandbox/errors": 0.0}
    return StepRecord(step=k, control=control, row=row, rewards=list(rewards), completions=["a", "b"], diags=[{}, {}],
                      params_changed=4 if changed else 0, params_total=4, max_abs_delta=1e-3 if changed else 0.0)


def _validation(steps, num_steps=None):
    v = Validation(run_dir=Path("x"), device="cpu",
                   config={"num_steps": num_steps or sum(not s.control for s in steps), "rollout_batch_size": B,
                           "n_samples_per_prompt": G, "beta": 0.04})
    v.steps = steps
    v.memory = [("Peak RSS (this process)", 2 ** 30, "")]
    meter = PhaseMeter()
    meter.peak_rss = {p: 2 ** 29 for p in PHASES}
    v.phases = phase_rows(steps, meter)
    v.sandbox = sandbox_summary(steps)
    return v


def _status(v):
    return {c: s for c, _t, _a, s in criteria_rows(v)}


def test_all_pass_on_a_healthy_run():
    st = _status(_validation([_step(k) for k in range(1, 6)]))
    assert st["Weights changed"] == "pass" and st["KL small"] == "pass" and st["Valid loss values"] == "pass"
    assert st["Rewards computed"] == "pass" and st["Time per phase"] == "pass" and st["Memory per phase"] == "pass"
    assert st["Reward time"] == "pass"  # 0.5 s per step < seed 002's 1 s


def test_weights_that_did_not_change_fail():
    st = _status(_validation([_step(k, changed=False, adv_std=0.0, rewards=(0.0, 0.0)) for k in range(1, 6)]))
    assert st["Weights changed"] == "fail" and st["Learning signal (task reward)"] == "warn"
    # changed only by control-reward steps: the plumbing works, the task reward did not train: warn, not pass
    steps = [_step(k, changed=False, adv_std=0.0) for k in range(1, 6)] + [_step(6, control=True)]
    assert _status(_validation(steps, num_steps=5))["Weights changed"] == "warn"


def test_bad_loss_kl_rewards_and_missing_steps_fail():
    steps = [_step(1), _step(2, loss=float("nan"))]
    assert _status(_validation(steps))["Valid loss values"] == "fail"
    steps = [_step(1), _step(2, kl=2 * KL_SMALL)]
    assert _status(_validation(steps))["KL small"] == "fail"
    # small, but measured only before any weight change (the last step was the first to update): not evidence
    steps = [_step(1, changed=False, kl=0.0), _step(2, kl=0.0)]
    assert _status(_validation(steps))["KL small"] == "warn"
    steps = [_step(1), _step(2, rewards=(1.5, 0.0))]  # a reward outside [0, 1]
    assert _status(_validation(steps))["Rewards computed"] == "fail"
    assert _status(_validation([_step(1)], num_steps=5))["Complete training loop"] == "fail"
    slow = [_step(1)]
    slow[0].row["timing/reward"] = 3.0
    assert _status(_validation(slow))["Reward time"] == "warn"  # seed 002's < 1 s, not met


def test_phase_rows_by_hand():
    rows = {r["phase"]: r for r in phase_rows([_step(1), _step(2)], None)}
    assert rows["generation"]["seconds"] == 8.0 and rows["generation"]["share"] == pytest.approx(0.8)
    assert rows["other (sync, advantages, metrics)"]["seconds"] == pytest.approx(10 - 8 - 0.5 - 0.5 - 0.75)
    sb = sandbox_summary([_step(1), _step(2)])
    assert sb["executions"] == 4 and sb["executions_per_s"] == pytest.approx(4 / 1.0) and sb["crashes"] == 2


def test_phase_rows_at_max_staleness_1_never_go_negative():
    """max_staleness 1: the producer generated (12 s, begun during the step before) and scored (0.5 s) the batch
    while the trainer updated; the 10 s step waited 1 s for it. Subtracting the producer's seconds from the step
    made "other" 10 - 12 - 0.5 - 0.5 - 0.75 = -3.75 s; on the step's path are the wait (1 s), the reference pass
    (0.5) and the update (0.75): other = 10 - 1 - 0.5 - 0.75 = 7.75 s."""
    steps = [_step(1), _step(2)]
    for st in steps:
        st.row.update({"timing/generate": 12.0, "timing/wait_rollout": 1.0})  # the producer's seconds exceed the step
    rows = {r["phase"]: r for r in phase_rows(steps, None, max_staleness=1)}
    assert rows["generation"]["overlapped"] and rows["reward"]["overlapped"] and not rows["update"]["overlapped"]
    assert rows["waiting for the producer (generation + reward not overlapped)"]["seconds"] == 1.0
    assert rows["other (sync, advantages, metrics)"]["seconds"] == pytest.approx(10 - 1 - 0.5 - 0.75)
    sync = {r["phase"]: r for r in phase_rows(steps, None)}  # read as synchronous: 10 - 12 - 0.5 - 0.5 - 0.75 < 0
    assert sync["other (sync, advantages, metrics)"]["seconds"] == pytest.approx(-3.75)


def test_phase_meter_charges_the_running_phase():
    import mmap

    with PhaseMeter(interval_s=0.001) as m:
        with m.phase("generation"):
            pass
        with m.phase("update"):
            # 64 MiB of fresh anonymous pages, written while "update" runs. Not a numpy array: malloc may
            # serve that from heap pages a test before this one left resident (CI saw RSS rise 4 KiB),
            # while a new mapping is always new RSS, and closing it gives the pages back.
            big = mmap.mmap(-1, 64 * 2 ** 20)
            for off in range(0, len(big), 4096):
                big[off] = 1
            time.sleep(0.2)  # the sampler thread (every 1 ms) sees it: a busy process may hold it off for ms
            big.close()
    assert m.peak_rss["update"] >= m.start_rss["update"] + 60 * 2 ** 20
    assert m.peak_rss["generation"] < m.peak_rss["update"]


def _run(preset, tmp_path, **over):
    from rftlib.config import make_config
    from rftlib.validate import run_validation

    cfg = make_config(preset, {"runs_root": str(tmp_path), **over})
    return run_validation(cfg, tmp_path / "attempt", log=lambda s: None)


@pytest.mark.skipif(not check_available()[0], reason=f"no sandbox here: {check_available()[1]}")
def test_tiny_plumbing_check_says_the_task_reward_did_not_train(tmp_path):
    v = _run("seed002-fizzbuzz-rtx3080-tiny-cpu", tmp_path)  # its 5 steps: the coin flip splits some group
    st = _status(v)
    assert st["Weights changed"] == "warn"  # only the control-reward steps moved it: labelled as such
    assert st["Valid loss values"] == st["Rewards computed"] == st["Time per phase"] == "pass"
    assert {p["phase"] for p in v.phases if p.get("peak_rss")} >= set(PHASES)
    assert v.sandbox["executions"] == 5 * B * G and v.sandbox["errors"] == 0


@pytest.mark.skipif(not check_available()[0], reason=f"no sandbox here: {check_available()[1]}")
def test_seed002_cpu_validation_on_the_embedded_model(tmp_path):
    """The CI check on the embedded default (2 steps, about a minute): real code, real sandbox."""
    v = _run("seed002-fizzbuzz-rtx3080-cpu", tmp_path, num_steps=2)
    st = _status(v)
    assert st["Complete training loop"] == st["Valid loss values"] == st["Rewards computed"] == "pass"
    assert st["Time per phase"] == st["Memory per phase"] == "pass" and st["KL small"] in ("pass", "warn")
    rewards = [r for s in v.steps if not s.control for r in s.rewards]
    assert max(rewards) > 0  # the model writes code that passes some of the sandbox's tests
    assert v.sandbox["executions"] == 2 * B * G and v.sandbox["errors"] == 0
    gen = next(p for p in v.phases if p["phase"] == "generation")
    assert gen["seconds"] > 0 and math.isfinite(gen["share"]) and gen["peak_rss"] > 2 ** 27


def test_validate_start_keeps_values_equal_to_0_false_or_empty_and_none_is_the_presets(tmp_path):
    """The notebooks' one convention: a named field None keeps the preset's; 0, False and "" are values (beta=0 is
    seed 003's 120b setting, not the preset's 0.04; notes "" is an empty note, not the preset's)."""
    from rftlib import validate as V

    cfg, _ = V.start("seed002-fizzbuzz-rtx3080-tiny-cpu", runs_root=str(tmp_path), beta=0, model=None, task=None,
                     num_steps=None, notes="")
    assert cfg.beta == 0 and cfg.model == "tiny" and cfg.task == "code_problems" and cfg.num_steps == 5
    assert cfg.notes == ""  # the preset's note is "Seed 002 loop plumbing check ..."
    cfg, _ = V.start("seed002-fizzbuzz-rtx3080-tiny-cpu", runs_root=str(tmp_path),
                     overrides={"beta": 0.0, "save_steps": 0, "gradient_checkpointing": False}, num_steps=2)
    assert cfg.beta == 0.0 and cfg.save_steps == 0 and cfg.num_steps == 2


@pytest.mark.skipif(not check_available()[0], reason=f"no sandbox here: {check_available()[1]}")
def test_validation_with_a_composite_reward_records_it_and_controls_it(tmp_path):
    """With rewards {task: 1, truncated_penalty: 0.1} the trainer scores with the composite, which
    main's recording wrapper and control reward never reached (control steps got -0.1 with advantage std 0, then an
    IndexError and no validation.json). Now every recorded reward is the composite's, the control steps score the
    coin flip, the criteria judge the task's component, and validation.json is written."""
    from rftlib.validate import control_reward

    v = _run("seed002-fizzbuzz-rtx3080-tiny-cpu", tmp_path, num_steps=2,
             rewards={"task": 1.0, "truncated_penalty": 0.1})
    assert (tmp_path / "attempt" / "validation.json").exists()
    task_steps = [s for s in v.steps if not s.control]
    assert len(task_steps) == 2
    for s in task_steps:
        assert len(s.rewards) == B * G and s.row["reward_mean"] == pytest.approx(sum(s.rewards) / (B * G))
        for r, d in zip(s.rewards, s.diags):
            assert r == pytest.approx(d["reward/task"] + 0.1 * d["reward/truncated_penalty"])
            assert d["reward/truncated_penalty"] in (0.0, -1.0) and 0.0 <= d["reward/task"] <= 1.0
        assert s.task_scores == [d["reward/task"] for d in s.diags]
    control = [s for s in v.steps if s.control]
    if not any(s.params_changed for s in task_steps):  # no learning signal from the task: the control steps ran
        assert len(control) == 2
    for s in control:
        coin = [control_reward(t, None, False)[0] for t in s.completions]
        assert s.rewards == coin and s.row["reward_mean"] == pytest.approx(sum(coin) / len(coin))
    st = _status(v)
    assert st["Rewards computed"] == st["Complete training loop"] == st["Valid loss values"] == "pass"


@pytest.mark.skipif(not check_available()[0], reason=f"no sandbox here: {check_available()[1]}")
def test_rft_validate_passes_every_set_to_the_notebook(tmp_path):
    """End to end: `rft validate --set beta=0 --set rewards=...` (main passed only model, task,
    num_steps and notes to the notebook, and its start() dropped values equal to 0 or False)."""
    from rftlib import cli

    runs = tmp_path / "runs"
    assert cli.main(["validate", "-p", "seed002-fizzbuzz-rtx3080-tiny-cpu", "--set", f"runs_root={runs}",
                     "--set", "num_steps=2", "--set", "beta=0", "--set", "rewards={task: 1, truncated_penalty: 0.1}",
                     "--no-report"]) == 0
    (run_dir,) = [p for p in runs.iterdir() if p.is_dir()]
    v = json.loads((run_dir / "validation.json").read_text())
    assert v["config"]["beta"] == 0 and v["config"]["rewards"] == {"task": 1, "truncated_penalty": 0.1}
    assert v["config"]["num_steps"] == 2 and len([s for s in v["steps"] if not s["control"]]) == 2
    crit = {c[0]: c[3] for c in v["criteria"]}
    assert crit["KL small"] == "n/a" and crit["Rewards computed"] == "pass"
    assert all(r == pytest.approx(d["reward/task"] + 0.1 * d["reward/truncated_penalty"])
               for s in v["steps"] if not s["control"] for r, d in zip(s["rewards"], s["diags"]))
