"""Checks to run before a launch: will the LR schedule arrive in time, will the run fit in GPU memory.

Pure functions over numbers and configs (no GPU needed); each returns a result object with a
printable ``table()`` and a verdict in words.
"""

from rftlib.preflight.lr import LRPreflight, lr_preflight, lr_preflight_for_steps, openrlhf_total_steps
from rftlib.preflight.memory_check import (
    GPUS, MODELS, MemoryEstimate, ModelShape, estimate_rollout_memory, estimate_train_memory, lora_params,
)

__all__ = [
    "LRPreflight", "lr_preflight", "lr_preflight_for_steps", "openrlhf_total_steps",
    "GPUS", "MODELS", "MemoryEstimate", "ModelShape", "estimate_rollout_memory", "estimate_train_memory",
    "lora_params",
]
