"""The optimizer's LR scheduler: a torch LambdaLR over rftlib.algo.schedule's warmup + cosine.

The schedule itself (``lr_at``, ``lr_factor``, ``warmup_steps_for``) is pure maths in
:mod:`rftlib.algo.schedule`, where the config and the preflight read it; a backend wraps it around its
optimizer here, and a resume restarts it with :func:`restart_schedule`.
"""

from __future__ import annotations

from functools import partial

import torch

from rftlib.algo.schedule import MIN_LR_RATIO, lr_factor


def make_scheduler(
    optimizer: torch.optim.Optimizer,
    *,
    total_steps: int,
    warmup_steps: int,
    min_lr_ratio: float = MIN_LR_RATIO,
) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR whose LR after ``k`` calls to ``scheduler.step()`` equals ``lr_at(k, ...)``.

    The target LR is each param group's ``lr`` at construction time. Call ``scheduler.step()`` once
    after each ``optimizer.step()``; its state_dict resumes the schedule from a checkpoint.
    """
    fn = partial(lr_factor, total_steps=total_steps, warmup_steps=warmup_steps, min_lr_ratio=min_lr_ratio)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, fn)


def restart_schedule(optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LambdaLR, *, lr: float,
                     betas: tuple[float, float], weight_decay: float) -> None:
    """After loading a checkpoint: the resumed config's lr/betas/weight decay win over the saved ones, and
    the LR continues on this config's schedule from the saved step (the LambdaLR's base LRs are the target)."""
    scheduler.base_lrs = [lr] * len(optimizer.param_groups)
    for g in optimizer.param_groups:
        g.update(initial_lr=lr, betas=betas, weight_decay=weight_decay)
        g["lr"] = lr * scheduler.lr_lambdas[0](scheduler.last_epoch)
