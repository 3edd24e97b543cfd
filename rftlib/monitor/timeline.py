"""Where an attempt's time goes: intervals per lane (trainer, engine, producer), ``logs/timeline.jsonl``.

Issue 32: with ``max_staleness`` k > 0 the engines generate the next batch while the trainer updates, and the
question a researcher asks is which side waits for the other. Each line of ``logs/timeline.jsonl`` is one
interval, seconds since the attempt started (a resumed attempt continues after the last recorded end)::

    {"lane": "trainer", "rank": 0, "phase": "update", "step": 7, "t0": 103.2, "t1": 141.9}
    {"lane": "engine", "engine": 0, "phase": "generate", "batch": 8, "version": 6, "step": 8, "t0": ..., "t1": ...}
    {"lane": "producer", "phase": "reward", "batch": 8, "step": 8, "t0": ..., "t1": ...}

Trainer phases: ``rollout`` (k = 0: the rollout on the trainer's thread), ``wait`` (k > 0: blocked on a batch),
``advantages``, ``update``, ``sync``, ``eval``, ``save``. On engine and producer lines ``step`` is the batch's
number, i.e. the step that trains it. The trainer writes it on rank 0 (rftlib.train.loop); rftlib.report.plots
``timeline`` draws it. Torch-free.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Iterable

TIMELINE = "timeline.jsonl"  # under <run_dir>/logs
# the trainer lane's own work: not ``wait`` (blocked on a producer's batch) and not ``rollout`` (a synchronous step
# waiting on the engine's generate, which the engine lane shows), so at k = 0 the overlap is ~0 and the shares add up
BUSY_TRAINER = ("advantages", "update", "sync", "eval", "save")


class Timeline:
    """A thread-safe recorder of intervals, in seconds since ``origin`` (a ``time.time()`` value)."""

    def __init__(self, origin: float | None = None):
        self.origin = time.time() if origin is None else origin
        self._lock = threading.Lock()
        self._items: list[dict[str, Any]] = []

    def add(self, lane: str, phase: str, t0: float, t1: float, **fields: Any) -> None:
        """Record ``phase`` on ``lane`` from ``t0`` to ``t1`` (``time.time()`` values) with its fields."""
        item = {"lane": lane, "phase": phase, **fields, "t0": round(t0 - self.origin, 4),
                "t1": round(t1 - self.origin, 4)}
        with self._lock:
            self._items.append(item)

    @contextlib.contextmanager
    def span(self, lane: str, phase: str, **fields: Any):
        """Record the block as one interval."""
        t0 = time.time()
        try:
            yield
        finally:
            self.add(lane, phase, t0, time.time(), **fields)

    def peek(self) -> list[dict[str, Any]]:
        """What was recorded since the last drain (a copy), in order of start."""
        with self._lock:
            return sorted(self._items, key=lambda d: d["t0"])

    def drain(self) -> list[dict[str, Any]]:
        """What was recorded since the last drain, in order of start, and forget it."""
        with self._lock:
            items, self._items = self._items, []
        return sorted(items, key=lambda d: d["t0"])


def timeline_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / "logs" / TIMELINE


def read_timeline(run_dir: str | Path) -> list[dict[str, Any]]:
    """Every interval of ``logs/timeline.jsonl`` ([] when absent). A line that is not a JSON object with lane,
    phase, t0 and t1 raises ValueError naming the file and the line."""
    return _read(timeline_path(run_dir))[0]


def _read(path: Path) -> tuple[list[dict[str, Any]], bool]:
    """The intervals of ``path`` and whether its last line was torn: no newline and not JSON, what a process
    killed mid-append leaves (ignored here, as rftlib.monitor.metrics ignores one; cut by truncate_after)."""
    if not path.exists():
        return [], False
    text = path.read_text()
    lines = text.splitlines()
    out, torn = [], False
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as e:
            if n == len(lines) and not text.endswith("\n"):
                torn = True
                continue
            raise ValueError(f"{path}:{n}: not JSON ({e.msg}): {line[:80]!r}") from None
        if not isinstance(item, dict) or not {"lane", "phase", "t0", "t1"} <= set(item):
            raise ValueError(f"{path}:{n}: an interval needs lane, phase, t0 and t1: {line[:80]!r}")
        out.append(item)
    return out, torn


class TimelineLog:
    """Appends intervals to ``logs/timeline.jsonl``; on a resume, drops what came after the checkpoint and
    continues the clock after the last recorded end."""

    def __init__(self, run_dir: str | Path):
        self.path = timeline_path(run_dir)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def offset(self) -> float:
        """Seconds already on the attempt's clock: the last recorded end (0 for a new attempt)."""
        items = read_timeline(self.path.parent.parent)
        return max((it["t1"] for it in items), default=0.0)

    def truncate_after(self, step: int) -> None:
        """Drop the intervals of steps after ``step`` (the checkpoint a resume starts from), atomically."""
        items, torn = _read(self.path)
        kept = [it for it in items if it.get("step", 0) <= step]
        if torn or len(kept) != len(items):  # a torn line would glue onto the next append
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text("".join(json.dumps(it) + "\n" for it in kept))
            os.replace(tmp, self.path)

    def append(self, items: Iterable[dict[str, Any]]) -> None:
        lines = "".join(json.dumps(it) + "\n" for it in items)
        if lines:
            with open(self.path, "a") as f:
                f.write(lines)


def union(spans: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of intervals, as sorted disjoint (t0, t1)."""
    out: list[list[float]] = []
    for a, b in sorted((a, b) for a, b in spans if b > a):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def covered(spans: Iterable[tuple[float, float]], lo: float, hi: float) -> float:
    """Seconds of [lo, hi] that the union of ``spans`` covers."""
    return sum(max(0.0, min(b, hi) - max(a, lo)) for a, b in union(spans))


def intersect(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The intersection of two unions of intervals (each sorted and disjoint)."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def busy_spans(items: Iterable[dict[str, Any]], lane: str) -> list[tuple[float, float]]:
    """The union of a lane's busy intervals: the trainer's work phases (not ``wait``), an engine's generates."""
    phases = BUSY_TRAINER if lane == "trainer" else ("generate",)
    return union((it["t0"], it["t1"]) for it in items if it["lane"] == lane and it["phase"] in phases)


def shares(items: list[dict[str, Any]], lo: float, hi: float) -> dict[str, float]:
    """Over the window [lo, hi]: the fraction of it the trainer was busy, the fraction some engine was generating,
    and the seconds both were (the overlap max_staleness > 0 buys)."""
    span = max(hi - lo, 1e-9)
    tr, en = busy_spans(items, "trainer"), busy_spans(items, "engine")
    return {"trainer_busy": covered(tr, lo, hi) / span, "engine_busy": covered(en, lo, hi) / span,
            "overlap": covered(intersect(tr, en), lo, hi)}
