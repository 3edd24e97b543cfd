"""The LR schedule, re-exported for older imports: the pure schedule lives in :mod:`rftlib.algo.schedule`,
the optimizer's LambdaLR in :mod:`rftlib.train.backends.scheduler`."""

from rftlib.algo.schedule import MIN_LR_RATIO, lr_at, lr_factor, warmup_steps_for
from rftlib.train.backends.scheduler import make_scheduler, restart_schedule

__all__ = ["MIN_LR_RATIO", "lr_at", "lr_factor", "make_scheduler", "restart_schedule", "warmup_steps_for"]
