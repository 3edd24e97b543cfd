"""Where an attempt's time goes: intervals per lane (trainer, engine, producer), ``logs/timeline.jsonl``.

Issue 32: with ``max_staleness`` k > 0 the engines generate the next batch while the trainer updates, and the
question a researcher asks is which side waits for the other. Each line of ``logs/timeline.jsonl`` is one
interval, seconds since the attempt started (a resumed attempt continues after the last recorded end)::

    {"lane": "trainer", "rank": 0, "phase": "update", "step": 7, "t0": 103.2, "t1": 141.9}
    {"lane": "engine", "engine": 0, "phase": "generate", "batch": 8, "version": 6, "step": 8, "t0": ..., "t1": ...}
    {"lane": "producer", "phase": "reward", "batch": 8, "step": 8, "t0": ..., "t1": ...}
    {"lane": "engine", "engine": 1, "phase": "eval", "step": 8, "t0": ..., "t1": ...}

Trainer phases: ``rollout`` (k = 0: the rollout on the trainer's thread), ``wait`` (k > 0: blocked on a batch),
``advantages``, ``update``, ``sync``, ``eval``, ``save``. Engine phases: ``generate`` (a training batch) and
``eval`` (an eval's generate call); a call served by several engines (server engines split its prompts) is one
line per engine that got a share, each spanning the call. The producer lane holds ``reward`` (scoring a batch: on
the producer thread at k > 0, on the trainer's at k = 0). On engine and producer lines of a batch ``step`` is the
batch's number, i.e. the step that trains it. The trainer writes it on rank 0 (rftlib.train.loop);
rftlib.report.plots ``timeline`` draws it. Torch-free.

Who is busy: the trainer with its own work (:data:`BUSY_TRAINER`); the rollout side with generating a batch
(``generate``) or scoring one (``reward``): a batch is ready only when both are done. An eval is neither side's
step work (the trainer waits while the engines generate it): :func:`shares` takes its windows out. On CUDA a
trainer phase ends when its kernels have run (rftlib.train.phases.settle synchronizes the device), not when Python
returned from launching them.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Iterable

TIMELINE = "timeline.jsonl"  # under <run_dir>/logs
# the trainer lane's own work: not ``wait`` (blocked on a producer's batch), not ``rollout`` (a synchronous step
# waiting on the engine's generate, which the engine lane shows) and not ``eval`` (the trainer waits on the engines'
# eval generation, on the engine lane), so at k = 0 the overlap is ~0 and the shares add up
BUSY_TRAINER = ("advantages", "update", "sync", "save")


class Timeline:
    """A thread-safe recorder of intervals, in seconds since ``origin`` (a ``time.time()`` value)."""

    def __init__(self, origin: float | None = None):
        self.origin = time.time() if origin is None else origin
        self._lock = threading.Lock()
        self._items: list[dict[str, Any]] = []
        self._open: dict[int, dict[str, Any]] = {}  # spans in progress (``span``), by a serial number, their start
        self._serial = itertools.count()

    def add(self, lane: str, phase: str, t0: float, t1: float, **fields: Any) -> None:
        """Record ``phase`` on ``lane`` from ``t0`` to ``t1`` (``time.time()`` values) with its fields."""
        item = {"lane": lane, "phase": phase, **fields, "t0": round(t0 - self.origin, 4),
                "t1": round(t1 - self.origin, 4)}
        with self._lock:
            self._items.append(item)

    @contextlib.contextmanager
    def span(self, lane: str, phase: str, each: Iterable[dict[str, Any]] | None = None, **fields: Any):
        """Record the block as one interval, or one per dict of ``each`` (its fields added: e.g. one line per engine
        a call used). While the block runs, :meth:`peek` sees it as open (what a step's busy shares count when a
        batch is still generating at the step's end)."""
        t0 = time.time()
        with self._lock:
            key = next(self._serial)
            self._open[key] = {"lane": lane, "phase": phase, **fields, "t0": t0 - self.origin}
        try:
            yield
        finally:
            t1 = time.time()
            with self._lock:
                del self._open[key]
            for extra in (each if each is not None else [{}]):
                self.add(lane, phase, t0, t1, **fields, **extra)

    def peek(self, now: float | None = None) -> list[dict[str, Any]]:
        """What was recorded since the last drain (a copy), in order of start; with ``now`` (a ``time.time()``
        value) the spans still open too, as if they ended then."""
        with self._lock:
            items = list(self._items)
            if now is not None:
                items += [{**it, "t1": now - self.origin} for it in self._open.values()]
        return sorted(items, key=lambda d: d["t0"])

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


def subtract(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """``a`` less ``b`` (each sorted and disjoint, as :func:`union` returns them)."""
    out = []
    for lo, hi in a:
        for c0, c1 in b:
            if c1 <= lo or c0 >= hi:
                continue
            if c0 > lo:
                out.append((lo, c0))
            lo = max(lo, c1)
            if lo >= hi:
                break
        if hi > lo:
            out.append((lo, hi))
    return out


BUSY = {"trainer": ("trainer", BUSY_TRAINER), "engine": ("engine", ("generate",)), "reward": ("producer", ("reward",))}
"""what each busy share counts: (lane, phases)"""


def busy_spans(items: Iterable[dict[str, Any]], side: str) -> list[tuple[float, float]]:
    """The union of one side's busy intervals (:data:`BUSY`): ``trainer`` its work phases (not ``wait``, ``rollout``
    or ``eval``), ``engine`` the generates of training batches, ``reward`` the scoring of them."""
    lane, phases = BUSY[side]
    return union((it["t0"], it["t1"]) for it in items if it["lane"] == lane and it["phase"] in phases)


def eval_windows(items: Iterable[dict[str, Any]]) -> list[tuple[float, float]]:
    """The union of the trainer's ``eval`` intervals: what the attempt-wide shares leave out."""
    return union((it["t0"], it["t1"]) for it in items if it["lane"] == "trainer" and it["phase"] == "eval")


def shares(items: list[dict[str, Any]], lo: float, hi: float,
           exclude: Iterable[tuple[float, float]] = ()) -> dict[str, float]:
    """Over the window [lo, hi] less ``exclude`` (e.g. :func:`eval_windows`): the fraction of it the trainer was
    busy, some engine was generating a batch (``engine_busy``), some batch was being scored (``reward_busy``), the
    rollout side was busy with either (``rollout_busy``: a batch is ready once generated and scored), and the
    seconds trainer and engines were both busy (``overlap``: what max_staleness > 0 buys). Each share is in [0, 1]."""
    window = subtract([(lo, hi)] if hi > lo else [], union(exclude))
    span = max(sum(b - a for a, b in window), 1e-9)

    def cov(spans):
        return sum(b - a for a, b in intersect(union(spans), window))

    tr, en, rw = busy_spans(items, "trainer"), busy_spans(items, "engine"), busy_spans(items, "reward")
    return {"trainer_busy": cov(tr) / span, "engine_busy": cov(en) / span, "reward_busy": cov(rw) / span,
            "rollout_busy": cov(en + rw) / span, "overlap": cov(intersect(tr, en))}
