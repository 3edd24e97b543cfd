"""Training backends behind one seam: how the policy module is wrapped, how gradients are reduced
and how the optimizer steps. The loop calls the same methods whichever backend runs it:

    backend.forward(**rows)          (logprobs, entropy) through the wrapped PolicyForward
    with backend.accumulate(last):   gradient sync only on the optimizer batch's last micro-step
    backend.backward(loss)
    backend.step(finite) -> grad_norm   clip, step optimizer + LR schedule (or skip a non-finite step)
    backend.lr() / backend.train(mode) / backend.close()
    backend.save(tmp_dir) / load(step_dir)   this rank's share of a checkpoint
    backend.trainable_state()        the full trainable tensors (gathered under ZeRO-3)
    backend.adapter_state()          the LoRA tensors to hand an engine (gathered), None without LoRA
    backend.generation_gather()      (a context HF generate runs in with the whole model gathered, or None; why)

and reads what a backend declares instead of its name:

    fixed_micro_steps   the optimizer steps after a fixed count of micro-steps (no row skipping)
    micro_step_grads    p.grad holds the running gradient after each micro-step (the GNS probe)
    partitions_params   each rank holds a shard of every weight (generation on the module runs in lock-step)
    partitioned_load_config(cfg, world)   the config to load the policy partitioned under (ZeRO-3), else None
    checkpoint_format   which backends can resume each other's checkpoints (checkpoint_format_of(name))

``single`` and ``ddp`` are torch (rftlib.train.backends.torch_backend); ``deepspeed`` is DeepSpeed's
engine (ZeRO-2/3, CPU offload), imported only when asked for (DeepSpeed is an optional heavy
dependency, imported in one place: deepspeed.import_deepspeed).

How to add a backend (one place): a class with the methods above in its own module here, registered
with ``BACKENDS.register("name")(MyBackend)``, and its module named in ``BACKEND_MODULES`` so
``make_backend`` imports it when a config asks for it (tests/test_train_build.py registers a toy one).
"""

from __future__ import annotations

import importlib

from rftlib.algo.registry import Registry

BACKENDS = Registry("training backend")
"""name -> class(cfg, dist, model, *, total_opt_steps, warmup_steps)"""

BACKEND_MODULES = {"single": "torch_backend", "ddp": "torch_backend", "deepspeed": "deepspeed"}
"""backend name -> module of rftlib.train.backends that registers it (imported on first use)"""

CHECKPOINT_FORMATS = {"single": "torch", "ddp": "torch"}
"""backend name -> checkpoint format, where several backends share one (others: their own name)"""


def checkpoint_format_of(name: str) -> str:
    """The checkpoint format backend ``name`` writes: single and ddp resume each other, DeepSpeed's
    partitioned checkpoints only DeepSpeed."""
    return CHECKPOINT_FORMATS.get(name, name)


def backend_class(name: str):
    """The class registered as ``name``, its module imported on first use."""
    if name not in BACKENDS and name in BACKEND_MODULES:
        importlib.import_module(f"rftlib.train.backends.{BACKEND_MODULES[name]}")
    return BACKENDS.get(name)


def partitioned_load_config(cfg, world_size: int) -> dict | None:
    """The config under which the policy must be *loaded* partitioned (ZeRO-3: every parameter arrives as
    this rank's shard, rftlib.models.loading.load_policy), or None when the backend wraps a whole model.
    A backend declares it with a ``partitioned_load_config(cfg, world_size)`` static method."""
    declare = getattr(backend_class(cfg.backend), "partitioned_load_config", None)
    return declare(cfg, world_size) if declare is not None else None


def make_backend(cfg, dist, model, *, total_opt_steps: int, warmup_steps: int):
    """Build the backend ``cfg.backend`` names around ``model`` (already on dist.device)."""
    return backend_class(cfg.backend)(cfg, dist, model, total_opt_steps=total_opt_steps, warmup_steps=warmup_steps)
