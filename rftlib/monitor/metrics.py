"""Per-step metrics as JSONL (one flushed line per step: nothing lost on a crash) + TensorBoard,
sample completions, and the spike log (seed 003 section 7's three outputs, in the run directory).
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Any


def _clean(v: Any) -> Any:
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)  # JSON has no NaN/inf; keep it visible as a string
    return v


class MetricsLogger:
    def __init__(self, run_dir: str | Path, *, tensorboard: bool = True):
        self.run_dir = Path(run_dir)
        (self.run_dir / "logs" / "samples").mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / "logs" / "metrics.jsonl"
        self.spike_path = self.run_dir / "logs" / "spike_log.jsonl"
        self._f = open(self.path, "a", buffering=1)
        self.tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(self.run_dir / "tensorboard"))
            except ImportError as e:  # tensorboard is a pinned dep; say so rather than crash a run
                warnings.warn(f"TensorBoard events disabled: {e}")

    def log(self, row: dict[str, Any]) -> None:
        row = {k: _clean(v) for k, v in row.items()}
        self._f.write(json.dumps(row) + "\n")
        self._f.flush()
        if self.tb is not None:
            step = int(row.get("step", 0))
            for k, v in row.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step":
                    self.tb.add_scalar(k, v, step)
            self.tb.flush()

    def samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        with open(self.run_dir / "logs" / "samples" / f"samples_step{step}.jsonl", "w") as f:
            for r in rows:
                f.write(json.dumps({k: _clean(v) for k, v in r.items()}) + "\n")

    def spike(self, row: dict[str, Any]) -> None:
        with open(self.spike_path, "a") as f:
            f.write(json.dumps({k: _clean(v) for k, v in row.items()}) + "\n")

    def close(self) -> None:
        self._f.close()
        if self.tb is not None:
            self.tb.close()


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
