"""Training backends behind one seam: how the policy module is wrapped, how gradients are reduced
and how the optimizer steps. The loop calls the same six methods whichever backend runs it:

    backend.forward(**rows)          (logprobs, entropy) through the wrapped PolicyForward
    with backend.accumulate(last):   gradient sync only on the optimizer batch's last micro-step
    backend.backward(loss)
    backend.step(finite) -> grad_norm   clip, step optimizer + LR schedule (or skip a non-finite step)
    backend.save(tmp_dir) / load(step_dir)   this rank's share of a checkpoint
    backend.trainable_state()        the full trainable tensors (gathered under ZeRO-3)

``single`` and ``ddp`` are torch (rftlib.train.backends.torch_backend); ``deepspeed`` is DeepSpeed's
engine (ZeRO-2/3, CPU offload). A new backend is a new file registered here.
"""

from __future__ import annotations

from rftlib.algo.registry import Registry

BACKENDS = Registry("training backend")


def make_backend(cfg, dist, model, *, total_opt_steps: int, warmup_steps: int):
    """Build the backend ``cfg.backend`` names around ``model`` (already on dist.device)."""
    if cfg.backend == "deepspeed":
        from rftlib.train.backends import deepspeed  # noqa: F401  (registers itself)
    else:
        from rftlib.train.backends import torch_backend  # noqa: F401
    return BACKENDS.get(cfg.backend)(cfg, dist, model, total_opt_steps=total_opt_steps, warmup_steps=warmup_steps)
