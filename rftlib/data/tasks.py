"""The task interface, re-exported from where it lives, for code that imports it from here.

``Example``, ``Task``, ``TASKS``, ``build_task`` and ``registered_tasks`` live in
:mod:`rftlib.data.base` (which imports no builder, so builders import it without a loop); the math
reward lives with the rewards, in :mod:`rftlib.rewards.math`.
"""

from rftlib.data.base import TASKS, Example, Task, build_task, registered_tasks
from rftlib.rewards.math import math_em_reward, math_task_reward

__all__ = ["TASKS", "Example", "Task", "build_task", "math_em_reward", "math_task_reward",
           "registered_tasks"]
