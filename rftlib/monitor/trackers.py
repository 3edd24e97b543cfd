"""Experiment trackers an attempt reports to: ``RunConfig.report_to`` (TRL's name), any of
tensorboard (the default), wandb, mlflow, trackio.

Every tracker gets the same things: the resolved config when it starts, every metrics row the
trainer writes to logs/metrics.jsonl (numbers only, keyed by step), and at the end the eval results
(summary.json's numbers and the eval/*.json files), under one run named after the attempt id.

Offline by default (``tracker_offline``): wandb in offline mode, MLflow's file store and trackio's
local store, all under ``<runs_root>/trackers/`` so every attempt of a runs root is one project.
Reading them back: ``wandb sync <path>`` uploads an offline run later (:func:`read_wandb_offline`
reads it here); ``MLFLOW_ALLOW_FILE_STORE=true mlflow ui --backend-store-uri <runs_root>/trackers/mlruns``
(MLflow 3 keeps the file store behind that opt-in); ``TRACKIO_DIR=<runs_root>/trackers/trackio trackio show``.
``tracker_offline: false`` uses the services: wandb online, MLflow at ``$MLFLOW_TRACKING_URI``,
trackio's own default store.

Crash and resume. A run that ends by an exception is marked so in every tracker that has a status (MLflow
FAILED, or KILLED for a KeyboardInterrupt; wandb a non-zero exit code; a TensorBoard text "status"), and its
trackers.json entry says ``"status": "crashed"``. A resume continues each run from the checkpoint's step ``k``
and mirrors the metrics file's truncation (the rows after ``k``, logged before a crash, are dropped there):
TensorBoard writes with ``purge_step=k+1`` (TensorBoard hides the older events from step k+1 on); an MLflow
run that holds steps after ``k`` is replaced by a new run of the same name holding the kept rows (the old one
is tagged ``rftlib.superseded_by`` and deleted, which ``mlflow gc`` makes final); wandb offline writes each
resume as a new segment of the same run id that replays the kept rows first, so the latest segment alone holds
the whole history (``wandb sync`` it; every segment's path stays in trackers.json under ``segments``), and
online rewinds the run to ``k`` (``resume_from``). trackio keeps the rows of both (it has no way to delete).

A tracker is never allowed to stop training: one that fails to start, or fails later (a lost
connection, a full disk), is dropped with a ``[trackers] WARNING`` line in the output and in
logs/trackers.log, and the failure is recorded in ``<run_dir>/trackers.json`` (which the report
reads, with each run's URL or local path). wandb, mlflow and trackio are optional extras
(``pip install 'rftlib[trackers]'``); each is imported in :func:`_import`, only when asked for.
"""

from __future__ import annotations

import datetime as _dt
import importlib
import json
import math
import os
import re
import struct
import sys
from pathlib import Path
from typing import Any, Callable

from rftlib.algo.registry import Registry

TRACKERS = Registry("tracker")
STATE_FILE = "trackers.json"  # <run_dir>/trackers.json: each tracker's run id, URL/path, status, warnings
EXTRAS = {"wandb": "wandb==0.31.0", "mlflow": "mlflow-skinny==3.17.2", "trackio": "trackio==0.43.0"}
"""the pip requirement of each optional tracker (pyproject's ``trackers`` extra)"""


def _import(name: str):
    """The tracker's package, or ImportError saying how to install it (the one place they load)."""
    module = {"mlflow": "mlflow"}.get(name, name)
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"report_to includes '{name}' but {module} is not installed ({e}); install it with "
                          f"pip install 'rftlib[trackers]' (or pip install {EXTRAS[name]})") from None


def numeric(row: dict[str, Any]) -> dict[str, float]:
    """The finite int/float values of a metrics row, step left out (what a tracker can plot)."""
    return {k: float(v) for k, v in row.items() if k != "step" and isinstance(v, (int, float))
            and not isinstance(v, bool) and math.isfinite(v)}


class TensorBoard:
    """Event files in <run_dir>/tensorboard (torch's SummaryWriter); the config and summary as text."""

    def __init__(self, run_dir: Path, run_name: str, config: dict, store: Path, offline: bool, resume: dict,
                 rewind: dict | None = None):
        from torch.utils.tensorboard import SummaryWriter  # torch's: imported when a run starts, not with the registry

        self.path = run_dir / "tensorboard"
        # a resume from step k: TensorBoard hides the events a crashed segment wrote from step k+1 on
        self.w = SummaryWriter(str(self.path), purge_step=None if rewind is None else rewind["step"] + 1)
        self.w.add_text("config", "```\n" + json.dumps(config, indent=1, default=str) + "\n```")
        self.info = {"path": str(self.path)}

    def log(self, metrics: dict[str, float], step: int) -> None:
        for k, v in metrics.items():
            self.w.add_scalar(k, v, step)
        self.w.flush()

    def finish(self, summary: dict[str, float], files: list[Path], error: BaseException | None = None) -> None:
        if error is not None:
            self.w.add_text("status", f"failed: {type(error).__name__}: {error}")
        else:
            self.w.add_text("summary", "```\n" + json.dumps(summary, indent=1) + "\n```")
        self.w.close()


class WandB:
    """A wandb run (offline: a directory under <store>/wandb that ``wandb sync`` can upload later)."""

    def __init__(self, run_dir: Path, run_name: str, config: dict, store: Path, offline: bool, resume: dict,
                 rewind: dict | None = None):
        wandb = _import("wandb")
        (store / "wandb").mkdir(parents=True, exist_ok=True)
        run_id = resume.get("run_id")
        how: dict[str, Any] = {"id": run_id, "resume": "allow"} if run_id else {}
        if run_id and rewind is not None and rewind["cut"] and not offline:
            how = {"resume_from": f"{run_id}?_step={rewind['step']}"}  # the server drops the steps after k
        self.run = wandb.init(project=config.get("tracker_project") or "rftlib", name=run_name, dir=str(store),
                              config=config, mode="offline" if offline else "online", reinit="create_new",
                              settings=wandb.Settings(console="off", silent=True), **how)
        path = str(Path(self.run.dir).parent)  # .../wandb/offline-run-<time>-<id>: one per segment
        self.info = {"run_id": self.run.id, "url": None if offline else self.run.url,  # offline: no URL (wandb warns)
                     "path": path, "segments": [*resume.get("segments", [resume["path"]] if resume.get("path") else []),
                                                path]}
        if rewind is not None and (offline or not run_id):
            # an offline segment (or a new run) starts with no history: the kept rows first, so this segment
            # alone holds the whole run (syncing a later segment of the same id replaces the earlier ones)
            for row in rewind["rows"]:
                self.log(numeric(row), int(row.get("step", 0)))

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def finish(self, summary: dict[str, float], files: list[Path], error: BaseException | None = None) -> None:
        if error is None:
            self.run.summary.update(summary)
            for f in files:
                self.run.save(str(f), base_path=str(f.parent.parent), policy="now")
        self.run.finish(exit_code=0 if error is None else 1)  # non-zero: wandb marks the run failed


class MLflow:
    """An MLflow run through the client API (no process-global active run): the file store
    <store>/mlruns offline, $MLFLOW_TRACKING_URI otherwise. Metric names keep MLflow's charset:
    ``@`` becomes ``_at_`` (eval/heldout/greedy_pass_at_1), other odd characters ``_``."""

    def __init__(self, run_dir: Path, run_name: str, config: dict, store: Path, offline: bool, resume: dict,
                 rewind: dict | None = None):
        mlflow = _import("mlflow")
        from mlflow.tracking import MlflowClient

        if offline:  # MLflow 3 keeps the file store in maintenance mode behind this opt-in; it needs no database
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        uri = (store / "mlruns").resolve().as_uri() if offline else mlflow.get_tracking_uri()
        self.client = c = MlflowClient(tracking_uri=uri)
        name = config.get("tracker_project") or "rftlib"
        exp = c.get_experiment_by_name(name)
        exp_id = exp.experiment_id if exp else c.create_experiment(name)
        self.Metric = mlflow.entities.Metric
        old = resume.get("run_id")
        superseded = list(resume.get("superseded", []))
        if old and not (rewind is not None and rewind["cut"]):
            self.run_id = old
            c.update_run(self.run_id, status="RUNNING")
        else:
            tags = {"rftlib.resumed_from": old} if old else None
            self.run_id = c.create_run(exp_id, run_name=run_name, tags=tags).info.run_id
            params = {k: json.dumps(v, default=str)[:6000] for k, v in config.items()}
            c.log_batch(self.run_id, params=[mlflow.entities.Param(k, v) for k, v in params.items()])
            c.log_dict(self.run_id, config, "config.json")
            if rewind is not None:  # the new run holds the attempt's history up to the checkpoint
                for row in rewind["rows"]:
                    self._batch(numeric(row), int(row.get("step", 0)))
            if old:  # its history runs past the checkpoint (MLflow cannot delete metric points): replaced
                c.set_tag(old, "rftlib.superseded_by", self.run_id)
                c.set_terminated(old, status="KILLED")
                c.delete_run(old)
                superseded.append(old)
        self.info = {"run_id": self.run_id, "experiment_id": exp_id, "tracking_uri": uri,
                     "path": str(store / "mlruns") if offline else None, "superseded": superseded or None}

    @staticmethod
    def key(k: str) -> str:
        return re.sub(r"[^\w\-. :/]", "_", k.replace("@", "_at_"))

    def _batch(self, metrics: dict[str, float], step: int) -> None:
        ts = int(_dt.datetime.now().timestamp() * 1000)
        ms = [self.Metric(self.key(k), v, ts, step) for k, v in metrics.items()]
        for i in range(0, len(ms), 1000):  # log_batch takes at most 1000 metrics
            self.client.log_batch(self.run_id, metrics=ms[i:i + 1000])

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._batch(metrics, step)

    def finish(self, summary: dict[str, float], files: list[Path], error: BaseException | None = None) -> None:
        if error is None:
            self._batch({f"final/{k}": v for k, v in summary.items()}, int(summary.get("steps", 0)))
            for f in files:
                self.client.log_artifact(self.run_id, str(f), artifact_path=f.parent.name)
        status = "FINISHED" if error is None else "KILLED" if isinstance(error, KeyboardInterrupt) else "FAILED"
        self.client.set_terminated(self.run_id, status=status)


class Trackio:
    """A trackio run in its local store (<store>/trackio, a SQLite file per project, offline)."""

    def __init__(self, run_dir: Path, run_name: str, config: dict, store: Path, offline: bool, resume: dict,
                 rewind: dict | None = None):
        if offline:
            os.environ["TRACKIO_DIR"] = str(store / "trackio")  # read when trackio is first imported
        trackio = _import("trackio")
        self.run = trackio.init(project=config.get("tracker_project") or "rftlib", name=run_name, config=config,
                                resume="allow" if resume else "never", embed=False)
        from trackio import utils

        # trackio reads TRACKIO_DIR once per process, at its first import: record where it really writes
        self.info = {"run_id": run_name, "path": str(utils.TRACKIO_DIR)}

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def finish(self, summary: dict[str, float], files: list[Path], error: BaseException | None = None) -> None:
        if error is None:  # trackio has no run status: a crashed run just gets no final numbers
            self.run.log({f"final/{k}": v for k, v in summary.items()}, step=int(summary.get("steps", 0)))
        self.run.finish()


TRACKERS.register("tensorboard")(TensorBoard)
TRACKERS.register("wandb")(WandB)
TRACKERS.register("mlflow")(MLflow)
TRACKERS.register("trackio")(Trackio)


class Trackers:
    """The attempt's trackers, fanned out; each call to one is guarded so its failure only drops it.

    ``Trackers(run_dir, report_to, config)`` starts them; ``log(row)`` sends a metrics row to each;
    ``finish()`` sends the eval results and closes them, ``finish(error)`` marks the runs failed instead.
    <run_dir>/trackers.json is rewritten on every change of state, so a crash leaves the last known state on
    disk. ``rewind={"step": k, "rows": [kept metrics rows], "cut": bool}``: this is a resume from the checkpoint
    of step k, and ``cut`` says rows after k were logged before (and are dropped from the metrics file): each
    tracker continues its run with those rows gone (the module docstring says how).
    """

    def __init__(self, run_dir: str | Path, report_to: list[str], config: dict[str, Any], *,
                 offline: bool = True, write: Callable[[str], None] | None = None, rewind: dict | None = None):
        self.run_dir = Path(run_dir)
        self.write = write or (lambda s: print(s, file=sys.stdout, flush=True))
        self.store = self.run_dir.resolve().parent / "trackers"
        old = read_state(self.run_dir)  # a resumed attempt continues the same runs
        self.state: dict[str, dict[str, Any]] = {}
        self.live: dict[str, Any] = {}
        for name in report_to:
            prev = old.get(name, {})
            # a run that crashed ("crashed") or was killed mid-step ("running") continues; a dropped one starts anew
            resume = prev if prev.get("status") in ("running", "finished", "crashed") else {}
            self.state[name] = {"status": "starting", "run_name": self.run_dir.name, "warnings": prev.get("warnings", [])}
            try:
                t = TRACKERS.get(name)(self.run_dir, self.run_dir.name, config, self.store, offline, resume, rewind)
            except Exception as e:  # noqa: BLE001 -- any failure to start leaves training running
                self._fail(name, "start", e)
                continue
            self.live[name] = t
            self.state[name].update(status="running", **{k: v for k, v in t.info.items() if v is not None})
        self._save()

    def _fail(self, name: str, when: str, e: BaseException) -> None:
        msg = f"{name} failed at {when} ({type(e).__name__}: {e}); it is dropped, training goes on"
        self.live.pop(name, None)
        self.state[name]["status"] = "failed"
        self.state[name]["warnings"].append({"time": _dt.datetime.now().isoformat(timespec="seconds"), "message": msg})
        self.write(f"[trackers] WARNING {msg}")
        logs = self.run_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        with open(logs / "trackers.log", "a") as f:
            f.write(f"{_dt.datetime.now().isoformat(timespec='seconds')} WARNING {msg}\n")
        self._save()

    def _save(self) -> None:
        path = self.run_dir / STATE_FILE
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.state, indent=1, default=str))
        tmp.replace(path)

    def log(self, row: dict[str, Any]) -> None:
        metrics, step = numeric(row), int(row.get("step", 0))
        for name, t in list(self.live.items()):
            try:
                t.log(metrics, step)
            except Exception as e:  # noqa: BLE001 -- a lost connection must not stop training
                self._fail(name, f"step {step}", e)

    def finish(self, error: BaseException | None = None) -> None:
        """The eval results (summary.json's numbers, eval/*.json as files) to each, then close them; with the
        ``error`` the run ended by, mark each run failed instead (no summary: summary.json, if any, is an earlier
        segment's) and record ``"status": "crashed"``."""
        summary = {}
        p = self.run_dir / "summary.json"
        if p.exists():
            try:
                summary = numeric(json.loads(p.read_text()))
            except (OSError, json.JSONDecodeError):
                summary = {}
        files = sorted((self.run_dir / "eval").glob("*.json")) if (self.run_dir / "eval").is_dir() else []
        for name, t in list(self.live.items()):
            try:
                t.finish(summary, files, error)
            except Exception as e:  # noqa: BLE001
                self._fail(name, "finish", e)
                continue
            self.state[name]["status"] = "finished" if error is None else "crashed"
            if error is not None:
                self.state[name]["error"] = f"{type(error).__name__}: {error}"[:500]
            else:
                self.state[name].pop("error", None)
        self.live.clear()
        self._save()


def read_state(run_dir: str | Path) -> dict[str, dict[str, Any]]:
    """<run_dir>/trackers.json: {tracker: {status, run_name, run_id, url, path, warnings}}; {} if absent."""
    try:
        doc = json.loads((Path(run_dir) / STATE_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return doc if isinstance(doc, dict) else {}


def read_wandb_offline(run_path: str | Path) -> dict[str, Any]:
    """What an offline wandb run recorded, read from its ``run-<id>.wandb`` file without syncing:
    {"config", "history" (one dict per logged step), "summary", "exit_code" (None while the run has not ended:
    0 finished, non-zero failed)}.

    The file is a LevelDB-style log (a 7-byte ``:W&B`` header, 32 KiB blocks of records with a
    7-byte header each: crc32, length, type FULL/FIRST/MIDDLE/LAST) of wandb's protobuf Records.
    """
    from wandb.proto import wandb_internal_pb2 as pb

    run_path = Path(run_path)
    f = run_path if run_path.suffix == ".wandb" else next(run_path.glob("run-*.wandb"))
    data, pos, block, part = f.read_bytes(), 7, 32768, b""
    if data[:4] != b":W&B":
        raise ValueError(f"{f}: not a wandb run file (header {data[:7]!r})")
    out: dict[str, Any] = {"config": {}, "history": [], "summary": {}, "exit_code": None}

    def item(it) -> tuple[str, Any]:
        return it.key or "/".join(it.nested_key), json.loads(it.value_json)

    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + n], pos + 7 + n
        if kind == 0:
            break
        part = chunk if kind in (1, 2) else part + chunk
        if kind not in (1, 4):  # FIRST / MIDDLE: the record goes on in the next block
            continue
        r = pb.Record()
        r.ParseFromString(part)
        which = r.WhichOneof("record_type")
        if which == "run":
            out["config"].update(dict(item(it) for it in r.run.config.update))
        elif which == "config":
            out["config"].update(dict(item(it) for it in r.config.update))
        elif which == "history":
            out["history"].append(dict(item(it) for it in r.history.item))
        elif which == "summary":
            out["summary"].update(dict(item(it) for it in r.summary.update))
        elif which == "exit":
            out["exit_code"] = r.exit.exit_code
    return out
