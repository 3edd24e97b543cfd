"""The learning-rate schedule of seed 003: linear warmup from 0, then cosine down to a floor.

This is the schedule OpenRLHF 0.9.x builds for the actor (``openrlhf/trainer/ray/ppo_actor.py``,
``PolicyModelActor.init_model_from_pretrained``)::

    get_scheduler("cosine_with_min_lr", optim,
                  num_warmup_steps=math.ceil(max_steps * args.lr_warmup_ratio),
                  num_training_steps=max_steps,
                  scheduler_specific_kwargs={"min_lr": args.actor_learning_rate * 0.1})

and transformers implements it as ``_get_cosine_schedule_with_warmup_lr_lambda`` with
``num_cycles=0.5``. :func:`lr_at` is that lambda times ``lr``, in pure python, so a notebook or the
LR preflight can tabulate the schedule without building an optimizer. Pure python (no torch):
rftlib.backends.scheduler builds the optimizer's LambdaLR from :func:`lr_factor`.

Units: ``step`` counts optimizer steps already taken (the LambdaLR's ``last_epoch``), so
``lr_at(0)`` is the LR used by the first ``optimizer.step()``. Two consequences of following
transformers exactly, kept on purpose so a run here matches a run there:

- the first optimizer step runs at LR 0 whenever ``warmup_steps > 0`` (warmup starts from 0);
- past ``total_steps`` the cosine is not clamped: it rises again from the floor (transformers
  does the same). A trainer should stop at ``total_steps``.
"""

from __future__ import annotations

import math

MIN_LR_RATIO = 0.1  # OpenRLHF hard-codes min_lr = 0.1 * actor_learning_rate (seed 003 §7)


def warmup_steps_for(total_steps: int, warmup_ratio: float) -> int:
    """Warmup length as OpenRLHF computes it: ``ceil(total_steps * warmup_ratio)``.

    Seed 003 defaults: ``--lr_warmup_ratio`` 0.05 (20B) and 0.03 (120B).
    """
    if total_steps < 0 or not 0.0 <= warmup_ratio <= 1.0:
        raise ValueError(f"need total_steps >= 0 and 0 <= warmup_ratio <= 1, got {total_steps}, {warmup_ratio}")
    return math.ceil(total_steps * warmup_ratio)


def lr_factor(step: int, *, total_steps: int, warmup_steps: int, min_lr_ratio: float = MIN_LR_RATIO) -> float:
    """Multiplier on the target LR after ``step`` optimizer steps (transformers' lambda, num_cycles=0.5)."""
    if step < warmup_steps:
        return float(step) / float(max(1, warmup_steps))  # linear 0 -> 1 over the warmup
    progress = float(step - warmup_steps) / float(max(1, total_steps - warmup_steps))  # 0 -> 1 over the decay
    factor = 0.5 * (1.0 + math.cos(math.pi * progress))  # cosine 1 -> 0
    return max(0.0, factor * (1.0 - min_lr_ratio) + min_lr_ratio)  # rescaled to 1 -> min_lr_ratio


def lr_at(step: int, *, total_steps: int, warmup_steps: int, lr: float, min_lr_ratio: float = MIN_LR_RATIO) -> float:
    """The LR of optimizer step ``step + 1`` (``step`` steps taken so far): ``lr * lr_factor(step)``."""
    return lr * lr_factor(step, total_steps=total_steps, warmup_steps=warmup_steps, min_lr_ratio=min_lr_ratio)
