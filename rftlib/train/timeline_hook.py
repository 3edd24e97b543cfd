"""The trainer's timeline as one hook: what the Trainer writes to ``logs/timeline.jsonl`` and reads back as a step's
busy shares, in one object instead of seven methods and attributes of the Trainer (issue 40: the loop split).

rftlib.monitor.timeline defines the intervals, the file and the shares; this module is where a running trainer
meets it. The Trainer holds one :class:`TrainerTimeline` (``Trainer.timeline``) and calls it at fixed points:

- every public phase that ends (rftlib.train.phases calls :meth:`TrainerTimeline.on_phase`): the trainer lane's
  ``rollout`` / ``advantages`` / ``update`` / ``sync`` / ``eval``;
- the wait for a producer's batch (``max_staleness`` > 0): :meth:`TrainerTimeline.wait`;
- a batch's generate and reward calls, wherever they run (the producer thread, or the trainer's):
  :meth:`TrainerTimeline.produce_spans`;
- an eval's generate calls: :meth:`TrainerTimeline.eval_engine` wraps the engine;
- a checkpoint: :meth:`TrainerTimeline.save_span`;
- the step's row: :meth:`TrainerTimeline.busy_shares`; the step's end and the run's end: :meth:`flush`.

Every rank records its own intervals (its rows' ``timing/*_busy``); rank 0 alone writes them. A resumed attempt
truncates the file after the checkpoint's step and continues its clock after the last recorded end.
Torch-free.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, ContextManager

from rftlib.monitor.timeline import Timeline, TimelineLog, shares

PHASES = ("rollout", "advantages", "update", "sync", "eval")
"""The public phases drawn on the trainer lane (``save`` and ``wait`` are drawn by their own calls)."""


class TrainerTimeline:
    """One attempt's timeline as the trainer records it (the module docstring lists the calls).

    ``engine``: the rollout engine (its ``servers``, if any, say how a generate call is split over engines);
    ``step``: a callable giving the trainer's step now (the steps an interval is filed under follow it);
    ``resume_step``: the checkpoint's step when resuming (the file's later lines go, the clock continues)."""

    def __init__(self, run_dir: str | Path, *, rank: int, is_main: bool, engine: Any, step: Callable[[], int],
                 resume_step: int | None = None):
        self.rank, self.engine, self._step = rank, engine, step
        self.log = TimelineLog(run_dir) if is_main else None  # logs/timeline.jsonl (rank 0)
        if resume_step is not None and self.log is not None:
            self.log.truncate_after(resume_step)
        offset = self.log.offset() if (self.log is not None and resume_step is not None) else 0.0
        self.timeline = Timeline(time.time() - offset)

    def on_phase(self, name: str, t0: float, t1: float) -> None:
        """A public phase ended: the trainer lane. An eval is filed under the step it evaluates; the other phases
        under the step they make. A threaded producer's batch is not a trainer phase: it shows on the engine lane
        (:meth:`produce_spans`), the trainer's blocking on it as ``wait``."""
        if name in PHASES:
            step = self._step()
            self.timeline.add("trainer", name, t0, t1, rank=self.rank, step=step if name == "eval" else step + 1)

    def wait(self, t0: float, seconds: float) -> None:
        """The trainer blocked ``seconds`` from ``t0`` on the producer's batch for the next step."""
        self.timeline.add("trainer", "wait", t0, t0 + seconds, rank=self.rank, step=self._step() + 1)

    def engine_lanes(self, n_prompts: int) -> list[dict[str, int]]:
        """The engine fields of a generate call of ``n_prompts`` prompts: server engines take prompt i on engine
        i % N (rftlib.rollout.vllm_server.VLLMServerEngine._sample), so the call runs on the first min(N, n_prompts)
        engines side by side; any other engine is engine 0."""
        n = len(getattr(self.engine, "servers", None) or [None])
        return [{"engine": k} for k in range(max(1, min(n, n_prompts)))]

    def produce_spans(self, n_prompts: int, *, batch: int, version: int) -> Callable[[str], ContextManager]:
        """The spans a rollout source opens for batch ``batch`` sampled by policy ``version``: ``generate`` on the
        engine lane (one line per engine with a share) and ``reward`` on the producer lane."""
        def span(name: str) -> ContextManager:
            if name == "generate":
                return self.timeline.span("engine", "generate", each=self.engine_lanes(n_prompts), rank=self.rank,
                                          batch=batch, version=version, step=batch)
            if name == "reward":
                return self.timeline.span("producer", "reward", rank=self.rank, batch=batch, step=batch)
            raise KeyError(f"no timeline span for a rollout source's {name!r} (generate, reward)")
        return span

    def eval_engine(self, engine: Any) -> "TimedEngine":
        """``engine`` as an eval sees it: each generate call an ``eval`` interval on the engine lane."""
        return TimedEngine(engine, self)

    def save_span(self) -> ContextManager:
        """A checkpoint of the step now, on the trainer lane."""
        return self.timeline.span("trainer", "save", rank=self.rank, step=self._step())

    def busy_shares(self, lo: float, hi: float) -> dict[str, float]:
        """timing/trainer_busy, engine_busy, reward_busy and rollout_busy (fractions of the step's wall time,
        rftlib.monitor.timeline.shares) and timing/overlap (seconds trainer and engines were both busy), from this
        rank's intervals of the step, a batch still generating or scoring at its end included."""
        return shares(self.timeline.peek(now=hi), lo - self.timeline.origin, hi - self.timeline.origin)

    def flush(self) -> None:
        """Rank 0 appends what was recorded to logs/timeline.jsonl (the other ranks forget theirs)."""
        items = self.timeline.drain()
        if self.log is not None:
            self.log.append(items)


class TimedEngine:
    """An engine as an eval sees it: each generate call is an ``eval`` interval on the timeline's engine lane (one
    per engine that got a share: TrainerTimeline.engine_lanes), everything else the engine's own."""

    def __init__(self, engine: Any, timeline: TrainerTimeline):
        self._engine, self._timeline = engine, timeline

    def __getattr__(self, name: str):
        return getattr(self._engine, name)

    def generate(self, prompts, **kw):
        tl = self._timeline
        with tl.timeline.span("engine", "eval", each=tl.engine_lanes(len(prompts)), rank=tl.rank, step=tl._step()):
            return self._engine.generate(prompts, **kw)

