"""report_to: the same metrics rows, config and eval results reach every tracker, offline; a tracker
that fails (at start or mid-run) is dropped with a recorded warning and training goes on."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from rftlib.config import ConfigError, make_config
from rftlib.monitor import trackers as T
from rftlib.monitor.metrics import MetricsLogger, read_metrics
from rftlib.report.attempt import load_attempt
from rftlib.report.index import trackers_html
from rftlib.train.loop import Trainer

ROWS = [{"step": 0, "eval/heldout/greedy_pass@1": 0.25},
        {"step": 1, "reward_mean": 0.5, "grad_norm": 1.5, "truncated": False, "note": "text"},
        {"step": 2, "reward_mean": 0.75, "eval/heldout/greedy_pass@1": 0.5, "kl": float("nan")}]


def _logged_attempt(tmp_path, report_to, project):
    """An attempt directory with config.yaml, 3 metrics rows, summary.json and one eval file, logged
    through MetricsLogger as the trainer does (the trackers come from the saved config)."""
    cfg = make_config("tiny", {"runs_root": str(tmp_path / "runs"), "report_to": report_to,
                               "tracker_project": project, "name": "trk"})
    from rftlib.attempts import create_attempt

    run_dir = create_attempt(cfg)
    lg = MetricsLogger(run_dir)
    for r in ROWS:
        lg.log(r)
    (run_dir / "eval").mkdir()
    (run_dir / "eval" / "step_2.json").write_text(json.dumps({"mode": "greedy_pass@1", "greedy_pass@1": 0.5}))
    (run_dir / "summary.json").write_text(json.dumps({"steps": 2, "baseline": 0.25, "final": 0.5, "backend": "single"}))
    lg.close()
    return run_dir


def test_every_tracker_records_the_rows_config_and_eval_offline(tmp_path):
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    pytest.importorskip("trackio")
    project = f"rft-test-{tmp_path.name}"
    run_dir = _logged_attempt(tmp_path, ["tensorboard", "wandb", "mlflow", "trackio"], project)
    state = json.loads((run_dir / "trackers.json").read_text())
    assert {k: v["status"] for k, v in state.items()} == dict.fromkeys(["tensorboard", "wandb", "mlflow", "trackio"],
                                                                     "finished")
    assert all(v["run_name"] == run_dir.name and not v["warnings"] for v in state.values())
    # the numeric values of ROWS by step (bools, strings and NaN are not metrics)
    want = {0: {"eval/heldout/greedy_pass@1": 0.25}, 1: {"reward_mean": 0.5, "grad_norm": 1.5},
            2: {"reward_mean": 0.75, "eval/heldout/greedy_pass@1": 0.5}}

    # wandb: the offline run directory, read back without syncing
    w = T.read_wandb_offline(state["wandb"]["path"])
    got = {h["_step"]: {k: v for k, v in h.items() if not k.startswith("_")} for h in w["history"]}
    assert got == want
    assert w["summary"]["final"] == 0.5 and w["summary"]["baseline"] == 0.25  # summary.json's numbers
    assert w["config"]["tracker_project"] == project and w["config"]["model"] == "tiny"  # the resolved config
    assert state["wandb"]["path"].startswith(str(run_dir.parent / "trackers" / "wandb"))

    # MLflow: search_runs on the file store; '@' is not in MLflow's metric charset
    import mlflow
    from mlflow.tracking import MlflowClient

    mlflow.set_tracking_uri(state["mlflow"]["tracking_uri"])
    df = mlflow.search_runs(experiment_names=[project])
    assert list(df["tags.mlflow.runName"]) == [run_dir.name] and list(df["status"]) == ["FINISHED"]
    client = MlflowClient(state["mlflow"]["tracking_uri"])
    assert df["params.model"].iloc[0] == '"tiny"'
    hist = client.get_metric_history(state["mlflow"]["run_id"], "eval/heldout/greedy_pass_at_1")
    assert [(m.step, m.value) for m in hist] == [(0, 0.25), (2, 0.5)]
    assert df["metrics.final/final"].iloc[0] == 0.5
    arts = [a.path for a in client.list_artifacts(state["mlflow"]["run_id"], "eval")]
    assert arts == ["eval/step_2.json"]

    # trackio: its local SQLite store
    from trackio.sqlite_storage import SQLiteStorage

    logs = SQLiteStorage.get_logs(project, run_dir.name)
    got = {r["step"]: {k: r[k] for k in ("reward_mean", "eval/heldout/greedy_pass@1", "grad_norm") if k in r}
           for r in logs if "final/final" not in r}
    assert got == want

    # TensorBoard: the event file
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(state["tensorboard"]["path"])
    ea.Reload()
    assert [(e.step, e.value) for e in ea.Scalars("reward_mean")] == [(1, 0.5), (2, 0.75)]

    # the report's header names each run and where it is
    html = trackers_html(load_attempt(run_dir))
    assert state["wandb"]["path"] in html and state["mlflow"]["run_id"] in html and "trackio" in html


def test_report_to_refuses_unknown_and_repeated_names():
    with pytest.raises(ConfigError, match=r"report_to=\['tensorbord'\].*mlflow, tensorboard, trackio, wandb"):
        make_config("tiny", {"report_to": ["tensorbord"]})
    with pytest.raises(ConfigError, match="name each tracker once"):
        make_config("tiny", {"report_to": ["wandb", "wandb"]})
    assert make_config("tiny", {"report_to": []}).report_to == []


def test_a_tracker_that_is_not_installed_is_a_warning_naming_the_extra(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    run_dir = _logged_attempt(tmp_path, ["tensorboard", "wandb"], "p")
    state = json.loads((run_dir / "trackers.json").read_text())
    assert state["wandb"]["status"] == "failed" and state["tensorboard"]["status"] == "finished"
    msg = state["wandb"]["warnings"][0]["message"]
    assert "failed at start" in msg and "pip install 'rftlib[trackers]'" in msg
    assert "[trackers] WARNING wandb failed at start" in capsys.readouterr().out
    assert "WARNING wandb failed at start" in (run_dir / "logs" / "trackers.log").read_text()


def test_a_tracker_failing_mid_run_leaves_training_running(tiny_cfg, monkeypatch):
    """MLflow loses its connection at step 2 of 3: training runs to the end, the metrics file and
    TensorBoard have every step, MLflow the steps before, and the report shows the warning."""
    pytest.importorskip("mlflow")
    real = T.MLflow.log

    def flaky(self, metrics, step):
        if step >= 2:
            raise ConnectionError("tracking server unreachable")
        real(self, metrics, step)

    monkeypatch.setattr(T.MLflow, "log", flaky)
    tr = Trainer(tiny_cfg(report_to=["tensorboard", "mlflow"], save_steps=0), progress=False)
    weights = {k: v.detach().clone() for k, v in tr.model.named_parameters() if v.requires_grad}
    try:
        summary = tr.train()
    finally:
        tr.close()
    assert summary["steps"] == 3
    assert any((v != weights[k]).any() for k, v in tr.model.named_parameters() if v.requires_grad)
    rows = read_metrics(tr.run_dir)
    assert [r["step"] for r in rows] == [0, 1, 2, 3] and any(r["advantage_max"] > 0 for r in rows[1:])
    state = json.loads((tr.run_dir / "trackers.json").read_text())
    assert state["tensorboard"]["status"] == "finished" and state["mlflow"]["status"] == "failed"
    assert "failed at step 2 (ConnectionError: tracking server unreachable)" in state["mlflow"]["warnings"][0]["message"]
    from mlflow.tracking import MlflowClient

    hist = MlflowClient(state["mlflow"]["tracking_uri"]).get_metric_history(state["mlflow"]["run_id"], "reward_mean")
    assert [m.step for m in hist] == [1]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(state["tensorboard"]["path"])
    ea.Reload()
    assert [e.step for e in ea.Scalars("reward_mean")] == [1, 2, 3]
    assert "tracking server unreachable" in trackers_html(load_attempt(tr.run_dir))


class _Crash(RuntimeError):
    pass


def _crash_before_step(monkeypatch, n):
    """Trainer.step raises when it would take step ``n`` (a crash mid-run, after step n-1 was logged)."""
    real = Trainer.step

    def step(self):
        if self.step_num == n - 1:
            raise _Crash(f"simulated crash before step {n}")
        return real(self)

    monkeypatch.setattr(Trainer, "step", step)


def test_a_crashed_run_is_marked_failed_in_every_tracker(tiny_cfg, monkeypatch):
    """A run that ends by an exception was ended as FINISHED (MLflow), exit code 0 (wandb) and
    "finished" in trackers.json. Now each run is marked failed, and trackers.json says crashed and why."""
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    _crash_before_step(monkeypatch, 2)
    tr = Trainer(tiny_cfg(report_to=["tensorboard", "wandb", "mlflow"], tracker_project="crash", save_steps=0),
                 progress=False)
    with pytest.raises(_Crash):
        try:
            tr.train()
        finally:
            tr.close()
    state = json.loads((tr.run_dir / "trackers.json").read_text())
    assert {k: v["status"] for k, v in state.items()} == dict.fromkeys(["tensorboard", "wandb", "mlflow"], "crashed")
    assert all("simulated crash before step 2" in v["error"] for v in state.values())
    from mlflow.tracking import MlflowClient

    assert MlflowClient(state["mlflow"]["tracking_uri"]).get_run(state["mlflow"]["run_id"]).info.status == "FAILED"
    w = T.read_wandb_offline(state["wandb"]["path"])
    assert w["exit_code"] == 1 and [h["_step"] for h in w["history"]] == [0, 1]
    assert "the run crashed" in trackers_html(load_attempt(tr.run_dir))


def test_a_resume_mirrors_the_metrics_truncation_in_the_trackers(tiny_cfg, monkeypatch):
    """A crash after step 3 with the checkpoint at step 2; the resume drops step 3's row from
    metrics.jsonl and logs steps 3 and 4 again. main's trackers kept the old step 3 too (MLflow history 1, 2, 3,
    3, 4), wandb wrote a second offline segment of the same id and trackers.json kept only its path, TensorBoard had
    no purge_step. Now each tracker holds every step once, with the values of the metrics file."""
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = tiny_cfg(report_to=["tensorboard", "wandb", "mlflow"], tracker_project="resume", num_steps=4, save_steps=2)
    with monkeypatch.context() as m:
        _crash_before_step(m, 4)
        tr = Trainer(cfg, progress=False)
        with pytest.raises(_Crash):
            try:
                tr.train()
            finally:
                tr.close()
    run_dir = tr.run_dir
    first = json.loads((run_dir / "trackers.json").read_text())
    assert [r["step"] for r in read_metrics(run_dir)] == [0, 1, 2, 3]  # step 3 logged after the step-2 checkpoint
    tr = Trainer(cfg, run_dir, resume=True, progress=False)
    try:
        tr.train()
    finally:
        tr.close()
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
    want = {r["step"]: r["reward_mean"] for r in rows if "reward_mean" in r}
    state = json.loads((run_dir / "trackers.json").read_text())
    assert {k: v["status"] for k, v in state.items()} == dict.fromkeys(["tensorboard", "wandb", "mlflow"], "finished")

    # MLflow: a new run of the attempt's name holds steps 1..4 once; the one whose history ran past step 2 is deleted
    c = MlflowClient(state["mlflow"]["tracking_uri"])
    hist = c.get_metric_history(state["mlflow"]["run_id"], "reward_mean")
    assert [(m.step, m.value) for m in hist] == sorted(want.items())
    old = first["mlflow"]["run_id"]
    assert state["mlflow"]["superseded"] == [old] and state["mlflow"]["run_id"] != old
    gone = c.get_run(old)
    assert gone.info.lifecycle_stage == "deleted" and gone.data.tags["rftlib.superseded_by"] == state["mlflow"]["run_id"]

    # wandb: both offline segments of the one run id are kept; the last alone holds the whole history, once
    segs = state["wandb"]["segments"]
    assert len(segs) == 2 and segs[0] == first["wandb"]["path"] and segs[1] == state["wandb"]["path"]
    assert all(Path(s).is_dir() for s in segs) and state["wandb"]["run_id"] == first["wandb"]["run_id"]
    w = T.read_wandb_offline(segs[1])
    assert [h["_step"] for h in w["history"]] == [0, 1, 2, 3, 4]
    assert {h["_step"]: h["reward_mean"] for h in w["history"] if "reward_mean" in h} == want

    # TensorBoard: the resume's purge_step hides the crashed segment's step 3
    ea = EventAccumulator(state["tensorboard"]["path"])
    ea.Reload()
    assert [(e.step, e.value) for e in ea.Scalars("reward_mean")] == [(s, pytest.approx(v)) for s, v in sorted(want.items())]
