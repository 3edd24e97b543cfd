"""An attempt's summary says what happened.

When ``max_train_minutes`` cut a run there was no final eval, so ``final`` was the step-0 baseline, the gain
0 and the best step 0; a run that finished all its steps was still tagged ``stop_reason: time budget
spent`` with ``[early stop at step 1]``. Now a budget cut evaluates the weights it stops with, a run at
its end is never tagged as cut, and a run stopped between evals reports no final rather than an old one.
"""

from __future__ import annotations

import json

from rftlib.attempts import request_stop
from rftlib.report.attempt import load_attempt
from rftlib.train.loop import EVAL_KEY, Trainer
from rftlib.workbench import result_text


def _train(cfg, before=None):
    tr = Trainer(cfg, progress=False)
    try:
        if before:
            before(tr)
        return tr, tr.train()
    finally:
        tr.close()


def test_a_time_budget_cut_evaluates_the_weights_it_stops_with(tiny_cfg):
    # 1e-9 min: spent once the first step has ended; eval_steps 0 (tiny): no eval is due before the end
    tr, summary = _train(tiny_cfg(num_steps=3, save_steps=0, max_train_minutes=1e-9))
    assert summary["steps"] == 1 and summary["stop_reason"].startswith("time budget spent")
    step1 = json.loads((tr.run_dir / "eval" / "step_1.json").read_text())
    step0 = json.loads((tr.run_dir / "eval" / "step_0.json").read_text())
    assert summary["final"] == step1["greedy_pass@1"] and summary["final_step"] == 1
    assert summary["baseline"] == step0["greedy_pass@1"]
    assert summary["gain"] == step1["greedy_pass@1"] - step0["greedy_pass@1"]
    assert summary["best_step"] in (0, 1) and summary["final_note"] is None
    rows = [json.loads(x) for x in (tr.run_dir / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if EVAL_KEY in r] == [0, 1]  # the step-1 row carries the eval
    # the checkpoint the stop wrote holds that eval (a resume continues from a consistent history)
    state = json.loads((tr.run_dir / "training_state" / "step_1" / "trainer_state.json").read_text())
    assert [e["step"] for e in state["eval_history"]] == [0, 1]
    assert load_attempt(tr.run_dir).baseline_best_final()[2] == step1["greedy_pass@1"]


def test_a_run_that_ran_every_step_is_not_tagged_as_cut(tiny_cfg, capsys):
    tr, summary = _train(tiny_cfg(num_steps=1, max_train_minutes=1e-9))
    assert summary["steps"] == 1 and summary["stop_reason"] is None
    assert "[early stop" not in capsys.readouterr().out
    assert summary["final_step"] == 1
    assert summary["final"] == json.loads((tr.run_dir / "eval" / "step_1.json").read_text())["greedy_pass@1"]


def test_a_run_stopped_between_evals_reports_no_final_rather_than_the_baseline(tiny_cfg):
    tr, summary = _train(tiny_cfg(num_steps=3, save_steps=0), before=lambda t: request_stop(t.run_dir))
    assert summary["steps"] == 1 and summary["stop_reason"] == "stopped by user"
    assert summary["baseline"] is not None  # the step-0 eval is there ...
    assert summary["final"] is None and summary["gain"] is None and summary["best"] is None  # ... and no other
    assert "not evaluated" in summary["final_note"] and "step 1" in summary["final_note"]
    text = result_text(summary)
    assert "not evaluated" in text and "points" not in text
    assert load_attempt(tr.run_dir).baseline_best_final()[2] is None
    assert not (tr.run_dir / "control" / "stop").exists()  # honoured and removed
