"""The run's cadence: when a Trainer evaluates, checkpoints, reports health and stops, around its steps.

:class:`rftlib.train.loop.Trainer` is one GRPO step of public phases (rollout, advantages, update, sync) and the
operations a run calls (evaluate, save); this is the loop over those steps that a researcher's attempt is: an eval at
step 0, every ``eval_steps`` and at the end; a checkpoint every ``save_steps``, at an eval that early stopping reads,
at a stop and at the end; the health verdicts after every step; the stop reasons (early stop, a failed verdict under
``health_abort``, ``control/stop``, the ``max_train_minutes`` budget); the metrics rows to the logger and callbacks;
and the summary. ``RunLoop`` is a mixin of the Trainer: it reads the Trainer's parts (cfg, dist, run_dir, state,
logger, callbacks, task) and calls its ``step``, ``evaluate`` and ``save``.
"""

from __future__ import annotations

import time
from typing import Any

from tqdm.auto import tqdm

from rftlib.attempts import STOP_FILE, write_json
from rftlib.monitor.health import run_verdicts
from rftlib.monitor.metrics import read_metrics
from rftlib.train.evaluation import early_stop_reason, eval_outcome

BUDGET_STOP = "time budget spent"  # how a stop_reason of max_train_minutes begins


class RunLoop:
    """The cadence of a Trainer's run (the module docstring); mixed into rftlib.train.loop.Trainer."""

    def train(self) -> dict[str, Any]:
        """Run to num_steps (or stop_after_steps more); eval at 0, every eval_steps and at the end.

        Stops early when the early-stop probe drops at ``early_stop_patience`` consecutive evals,
        or, with ``health_abort``, when a health verdict fails, or when a stop is requested, or when
        ``max_train_minutes`` have passed since this call; each way it checkpoints first and records
        why in summary.json. Verdict changes are printed as ``[health step N]`` lines unless a
        callback's object shows the verdicts itself (``shows_verdicts``: the live panel).
        """
        started = time.time()
        cfg = self.cfg
        start = self.step_num
        end = cfg.num_steps if cfg.stop_after_steps is None else min(cfg.num_steps, start + cfg.stop_after_steps)
        self.session_end = end  # the source permits no batch past it (rftlib.train.pipeline: take's ``last``)
        try:
            return self._train(started, start, end)
        finally:
            self.session_end = None

    def _train(self, started: float, start: int, end: int) -> dict[str, Any]:
        """:meth:`train`'s loop from step ``start`` to ``end`` (``started``: when the session began, time.time())."""
        cfg, main = self.cfg, self.dist.is_main
        say_health = main and not any(getattr(getattr(cb, "__self__", cb), "shows_verdicts", False)
                                      for cb in self.callbacks)
        if self.step_num == 0 and not self.eval_history:
            self._emit(self.evaluate().metrics)
        bar = None
        if self.progress and main:
            bar = tqdm(total=cfg.num_steps, initial=start, desc=self.run_dir.name, unit="step")
        rows = read_metrics(self.run_dir) if main else []
        rows = self.dist.broadcast_object(rows)
        self.stop_reason = None
        seen_bad: set[tuple[str, str]] = set()
        while self.step_num < end:
            row = self.step()
            final = self.step_num == cfg.num_steps
            is_eval = final or (cfg.eval_steps and self.step_num % cfg.eval_steps == 0)
            if is_eval:
                row.update(self.evaluate().values())
                self.stop_reason = early_stop_reason(cfg, self.eval_history)
            if self.stop_reason is None and self.step_num < end:  # a run at its end was not cut, whatever the clock says
                self.stop_reason = self.stop_requested(started)
                if not is_eval and self.stop_reason is not None and self.stop_reason.startswith(BUDGET_STOP):
                    # the budget cut the run between evals: the weights it stops with are evaluated, so the
                    # summary's "final" is theirs (never the last eval's, which may be the step-0 baseline)
                    row.update(self.evaluate().values())
                    is_eval = True
            self._emit(row)
            rows.append(row)
            # the live panel's and the report's verdicts (one list everywhere); the same rows on every rank
            verdicts = run_verdicts(rows, cfg, self.task.health_skip)
            if main:
                write_json(self.run_dir / "logs" / "health.json", [v.__dict__ for v in verdicts])
            for v in verdicts:
                if v.status in ("warn", "fail") and (v.name, v.status) not in seen_bad:
                    seen_bad.add((v.name, v.status))
                    if say_health:
                        print(f"[health step {self.step_num}] {v.status.upper()} {v.name}: {v.message} -> {v.action}")
                    if v.status == "fail" and cfg.health_abort and self.stop_reason is None:
                        self.stop_reason = f"health verdict {v.name} failed: {v.message}"
            stop = self.stop_reason is not None
            if final or stop or self.step_num == end or (cfg.save_steps and self.step_num % cfg.save_steps == 0) \
                    or (is_eval and cfg.early_stop_probe):
                self.save()
            if bar is not None:
                bar.update(1)
                bar.set_postfix(reward=f"{row['reward_mean']:.2f}", len=f"{row['response_length_mean']:.0f}",
                                s=f"{row['timing/step']:.0f}")
            if stop:
                if main:
                    print(f"[early stop at step {self.step_num}] {self.stop_reason}")
                break
        if main:  # a stop asked during this session is honoured by its end (stopped or done): a resume goes on
            (self.run_dir / STOP_FILE).unlink(missing_ok=True)
        self.timeline.flush()
        if bar is not None:
            bar.close()
        return self.summary()

    def stop_requested(self, started: float | None = None) -> str | None:
        """Why to stop from outside the run, else None: a researcher asked (``<run_dir>/control/stop``;
        the live view's Stop button and ``rft stop`` write it), or the time budget (max_train_minutes,
        counted from ``started``) is spent. Rank 0 decides (one file, one clock); every rank gets its answer."""
        reason, budget = None, self.cfg.max_train_minutes
        if self.dist.is_main:
            if (self.run_dir / STOP_FILE).exists():
                reason = "stopped by user"
            elif budget is not None and started is not None and time.time() - started >= 60 * budget:
                reason = f"{BUDGET_STOP}: max_train_minutes={budget:g} reached at step {self.step_num}"
        return self.dist.broadcast_object(reason)

    def _emit(self, row: dict[str, Any]) -> None:
        if not self.dist.is_main:
            return
        self.logger.log(row)
        group = getattr(self, "_group", None)
        for cb in self.callbacks:
            cb({**row, "_group": group} if group is not None and "reward_mean" in row else row)

    def summary(self) -> dict[str, Any]:
        """The attempt's result (rftlib.train.evaluation.eval_outcome: ``final`` is the held-out eval of the
        weights training ended with, else None with ``final_note`` saying why; ``best`` over the evals after
        step 0), with how it ran; rank 0 writes summary.json."""
        out = {"attempt_id": self.run_dir.name, "run_dir": str(self.run_dir), "steps": self.step_num,
               "stop_reason": getattr(self, "stop_reason", None),
               **eval_outcome(self.eval_history, self.step_num, self.cfg.eval_probes),
               "skipped_steps": self.skipped_steps, "eval_mode": "greedy_pass@1", "eval_dataset": "heldout",
               "eval_n": len(self.task.eval), "eval_precision": self.eval_precision, "precision": self.precision,
               "world_size": self.dist.world_size, "backend": self.cfg.backend, "device": str(self.dist.device)}
        if self.dist.is_main:
            write_json(self.run_dir / "summary.json", out)
        return out
