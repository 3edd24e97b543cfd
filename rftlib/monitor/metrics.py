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
    ``tensorboard=False`` leaves TensorBoard out whatever report_to says.

    The trackers start with the first row logged, or with ``truncate_after`` (a resume), whichever comes first:
    a resume's trackers start knowing the checkpoint step and the rows kept, so they continue their runs with the
    truncation mirrored (rftlib.monitor.trackers). ``close(error)`` marks their runs failed."""

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
        self._tracker_args = (names, config, config.get("tracker_offline", True))
        self._trackers: Trackers | None = None

    def _start_trackers(self, rewind: dict | None = None) -> Trackers:
        names, config, offline = self._tracker_args
        self._trackers = Trackers(self.run_dir, names, config, offline=offline, rewind=rewind)
        return self._trackers

    @property
    def trackers(self) -> Trackers:
        """The attempt's trackers (started on first use)."""
        return self._trackers if self._trackers is not None else self._start_trackers()

    def log(self, row: dict[str, Any]) -> None:
        row = {k: _clean(v) for k, v in row.items()}
        self._f.write(json.dumps(row) + "\n")
        self._f.flush()
        self.trackers.log(row)

    def truncate_after(self, step: int) -> None:
        """Drop the metrics lines of steps after ``step`` (written after the checkpoint a resume starts from,
        e.g. by a crash after the save), so the resumed run does not log those steps twice; the trackers start
        here, continuing their runs from ``step`` with the same rows dropped. Call it before the first ``log``."""
        if self._trackers is not None:
            raise RuntimeError("truncate_after must come before the first row is logged: the trackers have started "
                               "and would keep the rows it drops")
        lines = self.path.read_text().splitlines()
        rows = read_metrics(self.run_dir)
        kept = [r for r in rows if r.get("step", 0) <= step]
        if len(kept) != len(lines):
            self._f.close()
            self.path.write_text("".join(json.dumps(r) + "\n" for r in kept))
            self._f = open(self.path, "a", buffering=1)
        self._start_trackers({"step": step, "rows": kept, "cut": len(kept) != len(rows)})

    def samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        with open(self.run_dir / "logs" / "samples" / f"samples_step{step}.jsonl", "w") as f:
            for r in rows:
                f.write(json.dumps({k: _clean(v) for k, v in r.items()}) + "\n")

    def spike(self, row: dict[str, Any]) -> None:
        with open(self.spike_path, "a") as f:
            f.write(json.dumps({k: _clean(v) for k, v in row.items()}) + "\n")

    def close(self, error: BaseException | None = None) -> None:
        """Close the metrics file; the trackers get the eval results (summary.json, eval/) and finish, or, with the
        ``error`` the run ended by, mark their runs failed (none is started just to be failed)."""
        self._f.close()
        if error is None or self._trackers is not None:
            self.trackers.finish(error)


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
