"""Guardrails wired into the loop: early stopping on the OOD probe, health verdicts, spike log."""

import json

import pytest

import rftlib.train.evaluation as evaluation
import rftlib.train.loop as loop
from rftlib.train import checkpoint as ckpt


def test_planted_ood_drop_stops_after_second_drop(tiny_cfg, monkeypatch):
    planted = iter([0.50, 0.60, 0.55, 0.50, 0.70, 0.80])  # evals at steps 0,1,2,3,...: drops at 2 and 3
    real = evaluation.greedy_eval

    def fake(engine, tok, task, examples, **kw):
        res = real(engine, tok, task, examples[:2], **kw)
        if kw.get("dataset") == "ood":
            res["greedy_pass@1"] = next(planted)
        return res

    monkeypatch.setattr(evaluation, "greedy_eval", fake)
    cfg = tiny_cfg(num_steps=8, eval_steps=1, save_steps=0, eval_probes=["heldout", "ood"], early_stop_probe="ood")
    tr = loop.Trainer(cfg, progress=False)
    summary = tr.train()
    tr.close()
    assert summary["steps"] == 3  # stopped right after the second consecutive drop
    assert "dropped at 2 consecutive evals (0.600 -> 0.550 -> 0.500)" in summary["stop_reason"]
    assert summary["probes"]["ood"]["best_step"] == 1 and summary["probes"]["ood"]["best"] == 0.6
    # save_steps 0: steps 1 and 2 are kept only because every eval checkpoints when early stopping
    # is on (so the best step can be restored); 3 is the stop's own checkpoint
    assert ckpt.list_steps(tr.run_dir) == [1, 2, 3]
    assert (tr.run_dir / "eval" / "step_2_ood.json").exists()


def test_health_verdicts_written_and_abort(tiny_cfg, capsys, task_with):
    # every reward 0 (a random model is almost never right, but a chance hit must not decide the test),
    # every advantage 0, so grad_norm is exactly 0: seed 003 section 12's "frozen weights" smoke test,
    # which fails after 2 steps
    cfg = tiny_cfg(num_steps=8, health_abort=True, save_steps=0)
    tr = loop.Trainer(cfg, progress=False, task=task_with(cfg, lambda t, e, tr_: (0.0, {"correctness": 0.0})))
    summary = tr.train()
    tr.close()
    verdicts = {v["name"]: v for v in json.loads((tr.run_dir / "logs" / "health.json").read_text())}
    assert verdicts["grad_norm"]["status"] == "fail" and verdicts["grad_norm"]["value"] == 0.0
    assert "has_boxed" not in verdicts  # the arithmetic task opts out: its answers are never boxed
    # the root cause is named first (issue 15 item 4): all rewards equal, so no signal; grad 0 follows from it
    assert summary["stop_reason"].startswith("health verdict learning_signal failed")
    assert summary["steps"] == 2
    assert "FAIL learning_signal" in capsys.readouterr().out
    assert ckpt.list_steps(tr.run_dir) == [2]  # checkpointed before stopping


def test_spike_log_records_prompt_hashes(tiny_cfg, task_with):
    cfg = tiny_cfg(num_steps=1, spike_grad_norm=0.0)  # every step is a "spike"
    tr = loop.Trainer(cfg, progress=False, task=task_with(cfg, lambda t, e, tr_: (float(len(t) % 2), {})))
    tr.train()
    tr.close()
    (line,) = (tr.run_dir / "logs" / "spike_log.jsonl").read_text().splitlines()
    spike = json.loads(line)
    assert spike["step"] == 1 and len(spike["prompt_hashes"]) == cfg.rollout_batch_size
    assert {"grad_norm", "log_ratio_max", "ratio_max"} <= set(spike)


def test_gns_probe_and_ess_logged(tiny_cfg, task_with):
    from rftlib.monitor.metrics import read_metrics

    cfg = tiny_cfg(num_steps=1, gns_probe=True, micro_batch_size=4)  # 16 rows: 4 micro-batches
    tr = loop.Trainer(cfg, progress=False, task=task_with(cfg, lambda t, e, tr_: (float(len(t) % 2), {})))
    tr.train()
    tr.close()
    row = read_metrics(tr.run_dir)[1]
    assert row["importance_ess"] == 1.0  # exactly on-policy: every importance weight is 1
    assert {"gns_grad_sq", "gns_trace", "gns_b_simple"} <= set(row)
    assert row["gns_trace"] > 0  # the 4 micro-batch gradients differ (varied rewards)
    # E|G_B|^2 = |G|^2 + tr(S)/B at the full batch B = 16 rows: the estimates must give back the
    # full-batch gradient's squared norm, which clip_grad_norm_ measured on its own as grad_norm
    assert row["gns_grad_sq"] + row["gns_trace"] / 16 == pytest.approx(row["grad_norm"] ** 2, rel=1e-4)
