"""LR preflight (seed 003 §7, ``preflight_lr.sh``): will the schedule reach a useful LR in time?

Seed 003's rule: before any launch, model OpenRLHF's scheduler (linear warmup, then
``cosine_with_min_lr`` with ``min_lr = 0.1 * lr``) and abort if the LR at step 20 is below 30% of
the target. The failure it guards against is a warmup sized as a fraction of a huge run (50k
prompts x 8 samples x 20 episodes): the first dozens of steps then train at a tiny LR and a
"flat learning" diagnosis is really an LR that never arrived.

Total steps (OpenRLHF 0.9.x, ``PolicyModelActor`` / ``ppo_trainer.py``)::

    num_update_steps_per_episode = pool_size * n_samples_per_prompt // train_batch_size * max_epochs
    total_steps = ceil(num_episodes * num_update_steps_per_episode)
    warmup_steps = ceil(total_steps * lr_warmup_ratio)

Seed 003 writes the same formula without ``max_epochs`` (its runs use 1 PPO epoch per rollout).

Units, and what they mean for attempt 28 (400 prompts, 8 samples, batch 16, 1 episode, warmup
0.05, LR 5e-7). ``pool_size * n_samples_per_prompt`` counts *samples*, so the formula counts
optimizer steps only if ``train_batch_size`` is in samples too. That is OpenRLHF's meaning: it is
DeepSpeed's ``train_batch_size`` (micro batch x accumulation x ranks, in sequences), and OpenRLHF's
trainer recovers rollouts per episode as ``num_update_steps * train_batch_size // rollout_batch_size
// n_samples_per_prompt``. Seed 003 §6 labels ``--train_batch_size`` "(in prompts)"; read that way
the formula would be off by a factor of ``n_samples_per_prompt``. So for a28:

- total_steps = 400 * 8 // 16 * 1 = 200 *optimizer* steps, warmup ceil(10.0) = 10 steps, and the
  LR at optimizer step 20 is 99.4% of target: the seed's check passes.
- But with ``rollout_batch_size`` 16 prompts (128 samples) each rollout makes 128 / 16 = 8
  optimizer steps, so the run is only 25 rollout steps, and the ``step`` OpenRLHF logs (one per
  rollout: metrics.jsonl, ``--eval_steps``) advances 8 optimizer steps at a time. "Step 20" of the
  metrics log is optimizer step 160, where the LR is already down to 19.5% of target. Pass
  ``rollout_batch_size`` to see both views; ``check_unit="rollout"`` makes the verdict use it.
- If ``train_batch_size`` really were 16 prompts (128 samples), a28 would take 25 optimizer steps
  while the scheduler was told 200: warmup would still end at step 10 but the cosine would never
  get past step 25 of 200, i.e. the run would train at ~full LR throughout with no decay.

For rftlib's own trainer, which counts its own steps, call :func:`lr_preflight_for_steps` with the
trainer's total optimizer steps.

Step numbering: what is shown (the message, :meth:`LRPreflight.table`, :meth:`LRPreflight.plot`,
``rft preflight``) uses the trainer's numbering: optimizer step ``k`` = 1, 2, ... is the k-th
``optimizer.step()``, trained at ``lr_at(k - 1)`` (so step 1 is at LR 0 when there is a warmup),
the same ``step`` and ``lr`` a metrics row logs. The seed's check "LR@step20" is the scheduler's
``lr_at(20)``, the LR after 20 optimizer steps, which optimizer step 21 trains at; ``check_step``
keeps the scheduler's count (steps taken) and the message says both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from matplotlib.figure import Figure

from rftlib.algo.schedule import MIN_LR_RATIO, lr_at, warmup_steps_for

CHECK_STEP = 20  # seed 003 §7: "Aborts if LR@step20 < 30% of target"


def _require_finite(**values: float) -> None:
    """NaN or inf in a schedule input makes every comparison false, so the verdict would blame the
    cosine; refuse it by name instead."""
    for name, v in values.items():
        if not math.isfinite(v):
            raise ValueError(f"{name}={v}: must be a finite number (NaN and inf are refused)")
MIN_FRACTION = 0.3  # seed 003 §7: 30% of the target LR


def openrlhf_total_steps(
    pool_size: int, n_samples_per_prompt: int, train_batch_size: int, num_episodes: float, max_epochs: int = 1
) -> int:
    """Optimizer steps OpenRLHF schedules for: ``ceil(episodes * (pool * n // train_batch * epochs))``.

    ``train_batch_size`` is in samples (sequences), as in OpenRLHF/DeepSpeed; see the module doc.
    """
    for name, v in [("pool_size", pool_size), ("n_samples_per_prompt", n_samples_per_prompt),
                    ("train_batch_size", train_batch_size), ("max_epochs", max_epochs)]:
        if v < 1:
            raise ValueError(f"{name} must be >= 1, got {v}")
    if num_episodes <= 0:
        raise ValueError(f"num_episodes must be > 0, got {num_episodes}")
    per_episode = pool_size * n_samples_per_prompt // train_batch_size * max_epochs
    return math.ceil(num_episodes * per_episode)


@dataclass
class LRPreflight:
    """Result of an LR preflight: the schedule's numbers, a table of it, and a verdict."""

    total_steps: int  # optimizer steps the scheduler is built for
    warmup_steps: int  # ceil(total_steps * warmup_ratio)
    lr: float  # target (peak) LR
    min_lr_ratio: float  # floor as a fraction of lr
    check_step: int  # optimizer steps taken when the LR is checked (that LR trains step check_step + 1)
    lr_at_check: float  # LR at check_step (or the best LR of a run shorter than check_step)
    min_fraction: float  # refuse below this fraction of lr
    verdict: str  # "ok" | "refuse"
    message: str  # the verdict in words
    rows: list[tuple[int, float, float]] = field(default_factory=list)  # (optimizer step k, its lr, lr / target)
    steps_per_rollout: int | None = None  # optimizer steps per logged (rollout) step, when known
    inputs: dict = field(default_factory=dict)  # what the preflight was given, for the report

    @property
    def fraction_at_check(self) -> float:
        return self.lr_at_check / self.lr if self.lr else 0.0

    @property
    def ok(self) -> bool:
        return self.verdict == "ok"

    def table(self) -> str:
        """Printable report: inputs, the schedule at useful steps, the verdict."""
        lines = ["LR preflight (OpenRLHF cosine_with_min_lr: linear warmup from 0, cosine to min_lr); "
                 "step k = the k-th optimizer step, as the trainer logs it"]
        if self.inputs:
            lines.append("  " + ", ".join(f"{k}={v}" for k, v in self.inputs.items()))
        lines.append(f"  total_steps={self.total_steps} optimizer steps, warmup_steps={self.warmup_steps}, "
                     f"lr={self.lr:.3g}, min_lr={self.lr * self.min_lr_ratio:.3g}")
        k = self.steps_per_rollout
        head = f"  {'opt step':>8}" + (f" {'rollout':>8}" if k else "") + f" {'lr':>11} {'of target':>10}"
        lines += [head, "  " + "-" * (len(head) - 2)]
        for step, lr, frac in self.rows:
            roll = (f" {math.ceil(step / k):>8d}" if k else "")  # rollout r holds optimizer steps (r-1)k+1 .. rk
            mark = "  <- check" if step == self.check_step + 1 else ""
            lines.append(f"  {step:>8d}{roll} {lr:>11.4g} {frac:>9.1%}{mark}")
        lines.append(f"  verdict: {self.verdict.upper()} - {self.message}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def plot(self, ax=None):
        """LR against optimizer step (the trainer's numbering: step k trains at lr_at(k - 1)), with the
        first full-LR step, the check step and the refusal threshold marked."""
        if ax is None:  # a bare Figure: no pyplot state, works headless and is shown inline by Jupyter
            fig = Figure(figsize=(6, 3.5), layout="constrained")
            ax = fig.add_subplot()
        else:
            fig = ax.figure
        n = max(self.total_steps, 1)
        steps = list(range(1, n + 1))  # optimizer step k trains at lr_at(k - 1)
        lrs = [lr_at(k - 1, total_steps=self.total_steps, warmup_steps=self.warmup_steps, lr=self.lr,
                     min_lr_ratio=self.min_lr_ratio) for k in steps]
        ax.plot(steps, lrs, marker="." if n <= 50 else None, label="lr")
        ax.axhline(self.lr * self.min_fraction, color="grey", ls=":", label=f"{self.min_fraction:.0%} of target")
        if self.warmup_steps:
            ax.axvline(self.warmup_steps + 1, color="grey", ls="--", lw=0.8, label="first step at full LR")
        color = "tab:green" if self.ok else "tab:red"
        ax.plot([self.check_step + 1], [self.lr_at_check], "o", color=color, label=f"check: {self.verdict}")
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("learning rate")
        ax.set_title(f"LR schedule: {self.total_steps} steps, warmup {self.warmup_steps}")
        ax.legend(fontsize="small")
        return fig


def _useful_steps(total: int, warmup: int, check: int, k: int | None) -> list[int]:
    """Optimizer steps (1-based, the trainer's) worth a table row: the first two, the warmup's middle,
    its last step and the first at full LR, the checked step, quarters, the last (and rollout ends if k)."""
    pts = {1, 2, warmup // 2 + 1, warmup, warmup + 1, check + 1, total // 4, total // 2, 3 * total // 4, total}
    if k:
        pts |= {k, check * k}
    return sorted(p for p in pts if 1 <= p <= total)


def lr_preflight_for_steps(
    total_steps: int,
    warmup_ratio: float,
    lr: float,
    *,
    min_lr_ratio: float = MIN_LR_RATIO,
    check_step: int = CHECK_STEP,
    min_fraction: float = MIN_FRACTION,
    steps_per_rollout: int | None = None,
    inputs: dict | None = None,
) -> LRPreflight:
    """The preflight for a run of ``total_steps`` optimizer steps (``check_step`` in optimizer steps).

    Refuses when the LR at ``check_step`` is below ``min_fraction * lr``, or when there are no steps.
    A run shorter than ``check_step`` is judged by the best LR it reaches, since it never gets there.
    """
    _require_finite(warmup_ratio=warmup_ratio, lr=lr, min_lr_ratio=min_lr_ratio, min_fraction=min_fraction)
    if lr <= 0:
        raise ValueError(f"lr must be > 0, got {lr}")
    warmup = warmup_steps_for(total_steps, warmup_ratio)
    sched = dict(total_steps=total_steps, warmup_steps=warmup, lr=lr, min_lr_ratio=min_lr_ratio)
    if total_steps < 1:
        return LRPreflight(total_steps, warmup, lr, min_lr_ratio, check_step, 0.0, min_fraction, "refuse",
                           "the run has 0 optimizer steps (pool * n_samples < train_batch_size?)",
                           [], steps_per_rollout, inputs or {})
    if check_step < total_steps:
        at_check = lr_at(check_step, **sched)
        where = f"LR after {check_step} optimizer steps (the LR of step {check_step + 1})"
    else:  # the run ends first: judge the best LR it ever trains at
        best = max(range(total_steps), key=lambda s: lr_at(s, **sched))  # steps taken before the best step
        at_check, check_step = lr_at(best, **sched), best
        where = f"run is only {total_steps} steps (< check step); its best LR, at step {best + 1},"
    frac = at_check / lr
    rows = [(k, lr_at(k - 1, **sched), lr_at(k - 1, **sched) / lr)
            for k in _useful_steps(total_steps, warmup, check_step, steps_per_rollout)]
    verdict = "ok" if frac >= min_fraction else "refuse"
    cmp = ">=" if verdict == "ok" else "<"
    message = f"{where} is {at_check:.3g} = {frac:.1%} of target ({cmp} {min_fraction:.0%})"
    if verdict == "refuse" and warmup > check_step:
        message += f"; warmup lasts {warmup} steps: lower the warmup ratio or shorten the run"
    elif verdict == "refuse":
        message += "; the cosine has already decayed by then: lengthen the run or check earlier"
    return LRPreflight(total_steps, warmup, lr, min_lr_ratio, check_step, at_check, min_fraction, verdict,
                       message, rows, steps_per_rollout, inputs or {})


def lr_preflight(
    pool_size: int,
    n_samples_per_prompt: int,
    train_batch_size: int,
    num_episodes: float,
    warmup_ratio: float,
    lr: float,
    min_lr_ratio: float = MIN_LR_RATIO,
    check_step: int = CHECK_STEP,
    min_fraction: float = MIN_FRACTION,
    *,
    max_epochs: int = 1,
    rollout_batch_size: int | None = None,
    check_unit: str = "optimizer",
) -> LRPreflight:
    """Seed 003's ``preflight_lr.sh`` for an OpenRLHF-style run.

    ``train_batch_size`` in samples (see module doc). ``rollout_batch_size`` (prompts), if given,
    adds the rollout-step view; ``check_unit="rollout"`` then checks logged step ``check_step``
    (= optimizer step ``check_step * steps_per_rollout``) instead of optimizer step ``check_step``.
    """
    _require_finite(num_episodes=num_episodes, warmup_ratio=warmup_ratio, lr=lr, min_lr_ratio=min_lr_ratio,
                    min_fraction=min_fraction)
    if check_unit not in ("optimizer", "rollout"):
        raise ValueError(f"check_unit must be 'optimizer' or 'rollout', got {check_unit!r}")
    total = openrlhf_total_steps(pool_size, n_samples_per_prompt, train_batch_size, num_episodes, max_epochs)
    k = None
    if rollout_batch_size is not None:
        k = max(1, rollout_batch_size * n_samples_per_prompt // train_batch_size * max_epochs)
    elif check_unit == "rollout":
        raise ValueError("check_unit='rollout' needs rollout_batch_size")
    inputs = dict(pool_size=pool_size, n_samples_per_prompt=n_samples_per_prompt,
                  train_batch_size=train_batch_size, num_episodes=num_episodes, warmup_ratio=warmup_ratio)
    if rollout_batch_size is not None:
        inputs["rollout_batch_size"] = rollout_batch_size
    opt_check = check_step * k if check_unit == "rollout" else check_step
    result = lr_preflight_for_steps(total, warmup_ratio, lr, min_lr_ratio=min_lr_ratio, check_step=opt_check,
                                    min_fraction=min_fraction, steps_per_rollout=k, inputs=inputs)
    if k and check_unit == "optimizer" and check_step * k < total:  # the other reading of "step 20"
        s = check_step * k
        f = lr_at(s, total_steps=total, warmup_steps=result.warmup_steps, lr=lr, min_lr_ratio=min_lr_ratio) / lr
        result.message += (f". Note: {k} optimizer steps per logged (rollout) step, so the run is "
                           f"{total / k:.3g} rollout steps and logged step {check_step} ends at optimizer step {s}, "
                           f"after which the LR is {f:.1%} of target")
    return result
