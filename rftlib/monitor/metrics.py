"""Per-step metrics as JSONL (one flushed line per step: nothing lost on a crash), sample
completions and the spike log (seed 003 section 7's three outputs, in the run directory), and the
same rows sent to the attempt's experiment trackers (``report_to``: TensorBoard by default, wandb,
MLflow, trackio; :mod:`rftlib.monitor.trackers`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import yaml

from rftlib.monitor.trackers import Trackers


def _clean(v: Any) -> Any:
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)  # JSON has no NaN/inf; keep it visible as a string
    return v


def _saved_config(run_dir: Path) -> dict[str, Any]:
    """The resolved config in <run_dir>/config.yaml ({} when the directory has none)."""
    try:
        return (yaml.safe_load((run_dir / "config.yaml").read_text()) or {}).get("config") or {}
    except OSError:
        return {}


class MetricsLogger:
    """The run directory's logs and the trackers. ``report_to`` / ``config`` default to the attempt's
    saved config (config.yaml), so whoever opens the logger needs only the run directory;
    ``tensorboard=False`` leaves TensorBoard out whatever report_to says."""

    def __init__(self, run_dir: str | Path, *, tensorboard: bool = True, report_to: list[str] | None = None,
                 config: dict[str, Any] | None = None):
        self.run_dir = Path(run_dir)
        (self.run_dir / "logs" / "samples").mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / "logs" / "metrics.jsonl"
        self.spike_path = self.run_dir / "logs" / "spike_log.jsonl"
        self._f = open(self.path, "a", buffering=1)
        config = config if config is not None else _saved_config(self.run_dir)
        names = list(report_to if report_to is not None else config.get("report_to", ["tensorboard"]))
        if not tensorboard and "tensorboard" in names:
            names.remove("tensorboard")
        self.trackers = Trackers(self.run_dir, names, config, offline=config.get("tracker_offline", True))

    def log(self, row: dict[str, Any]) -> None:
        row = {k: _clean(v) for k, v in row.items()}
        self._f.write(json.dumps(row) + "\n")
        self._f.flush()
        self.trackers.log(row)

    def truncate_after(self, step: int) -> None:
        """Drop the metrics lines of steps after ``step`` (written after the checkpoint a resume starts from,
        e.g. by a crash after the save), so the resumed run does not log those steps twice."""
        lines = self.path.read_text().splitlines()
        keep = [json.dumps(r) for r in read_metrics(self.run_dir) if r.get("step", 0) <= step]
        if len(keep) != len(lines):
            self._f.close()
            self.path.write_text("".join(ln + "\n" for ln in keep))
            self._f = open(self.path, "a", buffering=1)

    def samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        with open(self.run_dir / "logs" / "samples" / f"samples_step{step}.jsonl", "w") as f:
            for r in rows:
                f.write(json.dumps({k: _clean(v) for k, v in r.items()}) + "\n")

    def spike(self, row: dict[str, Any]) -> None:
        with open(self.spike_path, "a") as f:
            f.write(json.dumps({k: _clean(v) for k, v in row.items()}) + "\n")

    def close(self) -> None:
        """Close the metrics file; the trackers get the eval results (summary.json, eval/) and finish."""
        self._f.close()
        self.trackers.finish()


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """Every metrics line of an attempt; a torn last line (killed mid-write) is ignored."""
    path = Path(run_dir) / "logs" / "metrics.jsonl"
    rows = []
    if not path.exists():
        return rows
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                continue
            raise ValueError(f"{path}:{i + 1}: malformed metrics line") from None
    return rows
