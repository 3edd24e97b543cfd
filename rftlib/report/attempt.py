"""One attempt as the reports read it: everything comes from its run directory, nothing else.

``load_attempt(run_dir)`` reads config.yaml (config + provenance), summary.json (absent while a run
is going or after a crash), logs/metrics.jsonl, eval/step_N.json (in-training evals),
eval/ckpt_step_N.json (checkpoint evals, :mod:`rftlib.eval_checkpoints`), the latest samples and
the spike log. The health verdicts are :func:`rftlib.monitor.health.check_health` over the metrics,
with the attempt's own clip norm and spike threshold.
"""

from __future__ import annotations

import datetime as _dt
import json
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from rftlib.attempts import read_attempt, run_dir_path, runs_root as resolve_runs
from rftlib.monitor.timeline import read_timeline
from rftlib.config import RunConfig, diff, to_dict
from rftlib.monitor.health import RULES, eval_metric_for, run_verdicts
from rftlib.monitor.metrics import read_metrics
from rftlib.monitor.trackers import read_state

EVAL_KEY = "eval/heldout/greedy_pass@1"  # what the trainer logs (rftlib.train.loop.EVAL_KEY)
# config fields that are bookkeeping, not the experiment: left out of "key differences"
BOOKKEEPING = ("name", "notes", "runs_root", "stop_after_steps", "torch_threads", "eval_batch_size", "log_samples",
               "report_to", "tracker_project", "tracker_offline")
NOTES_FILE = "notes.jsonl"  # <run_dir>/notes.jsonl: the researcher's dated conclusions (rft note)
_STEP_FILE = re.compile(r"^(ckpt_)?step_(\d+)\.json$")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def attempt_number(attempt_id: str) -> tuple[int, str]:
    """Sort key: attempt-28a-x sorts by (28, id); ids without a number go last."""
    m = re.match(r"attempt-(\d+)", attempt_id)
    return (int(m.group(1)) if m else 1 << 30, attempt_id)


@dataclass
class Attempt:
    run_dir: Path
    attempt_id: str
    config: dict[str, Any]
    provenance: dict[str, Any]
    summary: dict[str, Any] | None
    metrics: list[dict[str, Any]] = field(repr=False)
    resumes: list[dict[str, Any]] = field(default_factory=list)
    """config.yaml's record of each resume that changed the config: {at_step, changed: {field: [before, now]}}"""

    # ---- the metrics, split -------------------------------------------------------------------
    @property
    def train_rows(self) -> list[dict[str, Any]]:
        """One row per training step (the step-0 baseline row has no reward)."""
        return [r for r in self.metrics if "reward_mean" in r]

    @property
    def timeline(self) -> list[dict[str, Any]]:
        """The intervals of logs/timeline.jsonl (rftlib.monitor.timeline), [] for an attempt that has none."""
        return read_timeline(self.run_dir)

    @property
    def eval_rows(self) -> list[dict[str, Any]]:
        return [r for r in self.metrics if EVAL_KEY in r]

    @property
    def steps_done(self) -> int:
        return max([int(r.get("step", 0)) for r in self.metrics] or [0])

    @property
    def complete(self) -> bool:
        return self.summary is not None and self.summary.get("steps", -1) >= self.config.get("num_steps", 0)

    @property
    def status(self) -> str:
        if self.complete:
            return "complete"
        if (self.run_dir / "validation.json").exists():
            return "validation"
        return f"incomplete ({self.steps_done}/{self.config.get('num_steps', '?')} steps)"

    # ---- evals --------------------------------------------------------------------------------
    def _evals(self, ckpt: bool) -> dict[int, dict[str, Any]]:
        out = {}
        d = self.run_dir / "eval"
        for p in sorted(d.glob("*.json")) if d.is_dir() else []:
            m = _STEP_FILE.match(p.name)
            if m and bool(m.group(1)) == ckpt:
                doc = _read_json(p)
                if isinstance(doc, dict):
                    out[int(m.group(2))] = doc
        return dict(sorted(out.items()))

    @cached_property
    def evals(self) -> dict[int, dict[str, Any]]:
        """In-training held-out evals by step (eval/step_N.json)."""
        return self._evals(ckpt=False)

    @cached_property
    def ckpt_evals(self) -> dict[int, dict[str, Any]]:
        """Checkpoint evals by step (eval/ckpt_step_N.json)."""
        return self._evals(ckpt=True)

    def eval_label(self) -> str:
        """Which eval mode and dataset the numbers are (seed 003: always say which)."""
        doc = next(iter(self.evals.values()), None) or next(iter(self.ckpt_evals.values()), None)
        if not doc:
            return "no eval recorded"
        return (f"{doc.get('mode', '?')} on {doc.get('dataset', '?')} ({doc.get('n_problems', '?')} problems, "
                f"temperature {doc.get('temperature', '?')}, max_new_tokens {doc.get('max_new_tokens', '?')}, "
                f"precision {self.eval_precision()})")

    def eval_precision(self) -> str:
        """The precision the held-out evals computed in (each eval file's ``precision``: rftlib.eval.eval_dtypes),
        "a, b (mixed)" when they differ, "unrecorded" for files written before it was recorded."""
        seen = sorted({str(d.get("precision", "unrecorded")) for d in (*self.evals.values(), *self.ckpt_evals.values())})
        return ", ".join(seen) + (" (mixed)" if len(seen) > 1 else "") if seen else "unrecorded"

    def eval_points(self) -> list[tuple[int, float]]:
        """(step, accuracy) from the metrics, else from the eval files."""
        pts = [(int(r["step"]), float(r[EVAL_KEY])) for r in self.eval_rows]
        if not pts:
            pts = [(s, float(d.get(d.get("mode", "greedy_pass@1"), 0.0))) for s, d in self.evals.items()]
        return pts

    def baseline_best_final(self) -> tuple[float | None, tuple[int, float] | None, float | None]:
        """(step-0 baseline, (best step, best), final) of the held-out eval. ``final`` is the eval at the last
        step trained, else None (a run cut between evals was not evaluated at its end: an earlier eval never
        stands in for it); a checkpoint eval of that step (``rft eval``) counts."""
        pts = self.eval_points()
        if not pts:
            return None, None, None
        base = pts[0][1] if pts[0][0] == 0 else None
        best = max(pts, key=lambda p: (p[1], -p[0]))
        last = self.steps_done
        final = pts[-1][1] if pts[-1][0] == last else None
        if final is None and last in self.ckpt_evals:
            d = self.ckpt_evals[last]
            final = float(d.get(d.get("mode", "greedy_pass@1"), 0.0))
        return base, best, final

    # ---- logs ---------------------------------------------------------------------------------
    def samples(self) -> tuple[int | None, list[dict[str, Any]]]:
        """(step, rows) of the latest logs/samples/samples_stepN.jsonl."""
        d = self.run_dir / "logs" / "samples"
        files = sorted(d.glob("samples_step*.jsonl"), key=lambda p: int(re.sub(r"\D", "", p.stem) or 0)) \
            if d.is_dir() else []
        if not files:
            return None, []
        rows = [json.loads(x) for x in files[-1].read_text().splitlines() if x.strip()]
        return int(re.sub(r"\D", "", files[-1].stem)), rows

    def spikes(self) -> list[dict[str, Any]]:
        p = self.run_dir / "logs" / "spike_log.jsonl"
        return [json.loads(x) for x in p.read_text().splitlines() if x.strip()] if p.exists() else []

    def validation(self) -> dict[str, Any] | None:
        return _read_json(self.run_dir / "validation.json")

    # ---- health -------------------------------------------------------------------------------
    @cached_property
    def verdicts(self):
        """check_health over the metrics with this attempt's clip norm and spike threshold. The
        early-stop / divergence rules read the held-out eval (the trainer's only eval signal)."""
        saved = _read_json(self.run_dir / "logs" / "health.json")  # the trainer's rule set (task-aware)
        skip = ()
        if isinstance(saved, list) and saved:
            ran = {v.get("name") for v in saved}
            skip = tuple(r for r in RULES.names() if r not in ran and r != "learning_signal")
        return run_verdicts(self.metrics, self.config, skip)

    @property
    def stop_metric(self) -> str:
        """The eval the early-stop / divergence verdicts read: the early-stop probe, else the OOD
        probe when logged (seed 003's primary signal), else the held-out set."""
        return eval_metric_for(self.config, self.metrics)

    def probe_keys(self) -> list[str]:
        """Every eval/<probe>/greedy_pass@1 key in the metrics (heldout first)."""
        keys = sorted({k for r in self.metrics for k in r if k.startswith("eval/") and k.endswith("/greedy_pass@1")})
        return sorted(keys, key=lambda k: (k != EVAL_KEY, k))

    def verdict_counts(self) -> dict[str, int]:
        out = {"pass": 0, "warn": 0, "fail": 0, "n/a": 0}
        for v in self.verdicts:
            if not v.caused_by:  # a consequence folded under its root cause is not counted twice
                out[v.status] += 1
        return out

    # ---- the research log: hypothesis at launch, conclusions after, lineage, trackers ------------
    @property
    def hypothesis(self) -> str:
        """What the researcher expected, set at launch (the ``notes`` field)."""
        return str(self.config.get("notes") or "")

    @property
    def conclusions(self) -> list[dict[str, str]]:
        """The dated conclusions written after the run ({"date", "text"}, oldest first; ``rft note``)."""
        return read_notes(self.run_dir)

    @property
    def trackers(self) -> dict[str, dict[str, Any]]:
        """Each experiment tracker's run: status, run id, URL or local path, warnings (trackers.json)."""
        return read_state(self.run_dir)

    def format_points(self) -> list[tuple[int, float]]:
        """(step, \\boxed{} rate) of the held-out greedy evals (eval/step_N.json), whose per-problem
        results carry has_boxed: the format compliance before and after a stage."""
        return [(s, sum(r.get("has_boxed", 0.0) for r in d["results"]) / len(d["results"]))
                for s, d in self.evals.items() if d.get("results") and "has_boxed" in d["results"][0]]

    @property
    def parent(self) -> Path | None:
        """The attempt whose adapter this one started from (``init_adapter`` inside a run directory:
        an SFT attempt's ``adapter/``), or None."""
        ad = self.config.get("init_adapter")
        if not ad:
            return None
        d = Path(ad).expanduser().resolve()
        for cand in (d, *d.parents[:3]):
            if (cand / "config.yaml").exists():
                return cand
        return None

    @property
    def created(self) -> str:
        return str(self.provenance.get("created", ""))

    @property
    def sha(self) -> str:
        s = self.provenance.get("git_sha") or ""
        return (s[:10] + ("+dirty" if self.provenance.get("git_dirty") else "")) if s else "(no git)"


def load_attempt(run_dir: str | Path) -> Attempt:
    """Read an attempt's run directory; raises FileNotFoundError naming what is missing."""
    run_dir = run_dir_path(run_dir)
    if not (run_dir / "config.yaml").exists():
        raise FileNotFoundError(f"{run_dir}: not an attempt directory (no config.yaml)")
    doc = read_attempt(run_dir)
    summary = _read_json(run_dir / "summary.json")
    return Attempt(run_dir=run_dir, attempt_id=doc.get("attempt_id", run_dir.name), config=doc.get("config", {}),
                   provenance=doc.get("provenance", {}), summary=summary if isinstance(summary, dict) else None,
                   metrics=read_metrics(run_dir), resumes=list(doc.get("resumes") or []))


def list_attempts(runs_root: str | Path) -> list[Attempt]:
    """Every attempt directory directly under runs_root, in attempt-number order."""
    root = resolve_runs(runs_root)
    dirs = [p for p in root.iterdir() if p.is_dir() and (p / "config.yaml").exists()] if root.is_dir() else []
    return [load_attempt(p) for p in sorted(dirs, key=lambda p: attempt_number(p.name))]


def key_differences(config: dict[str, Any], baseline: dict[str, Any] | None) -> dict[str, tuple[Any, Any]]:
    """Config fields that differ from the baseline's (defaults when None), bookkeeping left out."""
    base = baseline if baseline is not None else to_dict(RunConfig())
    return {k: v for k, v in diff(base, config).items() if k not in BOOKKEEPING}


def add_note(run_dir: str | Path, text: str, *, date: str | None = None) -> dict[str, str]:
    """Append a dated conclusion to an attempt (seed 003's research log: lessons learned, next steps).

    The hypothesis stays in config.yaml (``notes``, set at launch); conclusions go to notes.jsonl, one
    line each, so writing one never rewrites the attempt's record.
    """
    run_dir = run_dir_path(run_dir)
    if not (run_dir / "config.yaml").exists():
        raise FileNotFoundError(f"{run_dir}: not an attempt directory (no config.yaml); give a run directory "
                                "such as runs/attempt-01-default")
    if not text or not text.strip():
        raise ValueError("the note is empty: write what the attempt taught you (and the next step)")
    note = {"date": date or _dt.datetime.now().isoformat(timespec="seconds"), "text": text.strip()}
    with open(run_dir / NOTES_FILE, "a") as f:
        f.write(json.dumps(note) + "\n")
    return note


def conclude(run_dir: str | Path, text: str) -> dict[str, str] | None:
    """The notebooks' conclusion cell: :func:`add_note` when ``text`` is not empty, else nothing (None)."""
    return add_note(run_dir, text) if text.strip() else None


def read_notes(run_dir: str | Path) -> list[dict[str, str]]:
    """The conclusions of an attempt (notes.jsonl), oldest first; [] when none were written."""
    p = Path(run_dir) / NOTES_FILE
    if not p.exists():
        return []
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()]
