"""Precision: which dtype forward passes run in, and a float32 reference of any forward.

The trainer's forwards run in its *compute precision* (rftlib.models.loading.compute_dtype: the half dtype
of half weights, else bf16 autocast where the hardware has native bf16, else float32). A vLLM engine runs
in its own dtype (rftlib.rollout.vllm.engine_dtype). How far two honest forwards of the same weights drift
apart depends on that precision (~1e-6 nats of log-prob in float32, ~1e-1 in bf16), so checks that compare
log-probs (the sync probe) measure the drift of the precision that runs instead of assuming a constant:
:func:`float32_compute` gives the same forward with every operation in float32 (same stored weights), and
the gap between the two is the precision's own noise on that model and those tokens.
"""

from __future__ import annotations

import contextlib

import torch
from torch.overrides import TorchFunctionMode

HALF = (torch.bfloat16, torch.float16)


def _up(x):
    return x.float() if isinstance(x, torch.Tensor) and x.dtype in HALF else x


def _tree(fn, x):
    if isinstance(x, (list, tuple)):
        return type(x)(_tree(fn, v) for v in x)
    if isinstance(x, dict):
        return {k: _tree(fn, v) for k, v in x.items()}
    return fn(x)


class _Float32Everywhere(TorchFunctionMode):
    """Every torch call sees float32 where it would see bf16/fp16: half tensor arguments are upcast (a weight
    one op at a time, so memory grows by one matrix, not a model copy), a half ``dtype=`` becomes float32,
    and casts to a half dtype (``x.to(torch.bfloat16)``, ``x.half()``) keep float32. Works under ZeRO-3 too:
    its hooks gather a weight before the op that sees it."""

    CASTS = {torch.Tensor.half, torch.Tensor.bfloat16}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in self.CASTS:
            return args[0].float() if args[0].is_floating_point() else args[0]
        if func in (torch.Tensor.to, torch.Tensor.type):  # x.to(bf16), x.to(other) with other half, x.type(dtype)
            args = tuple(torch.float32 if a in HALF else (a.float() if isinstance(a, torch.Tensor) and a.dtype in HALF
                                                         else a) for a in args)
        if kwargs.get("dtype") in HALF:
            kwargs["dtype"] = torch.float32
        return func(*_tree(_up, args), **_tree(_up, kwargs))


@contextlib.contextmanager
def float32_compute(device_type: str):
    """Run the enclosed forward with every operation in float32, whatever the weights' dtype and any
    enclosing autocast: the reference the compute precision's noise is measured against."""
    with torch.autocast(device_type, enabled=False), _Float32Everywhere():
        yield


def precision_name(dtype: torch.dtype | None) -> str:
    """'bfloat16' / 'float16' / 'float32' for a compute dtype (None: the weights' float32)."""
    return "float32" if dtype is None else str(dtype).removeprefix("torch.")


def describe(weights: str, compute: torch.dtype | None, engine: str | None, device_type: str) -> dict[str, str]:
    """What an attempt computes in, for the plan, summary.json and the report: {trainer, engine, note}.
    ``weights``: the trainer's weights' dtype; ``compute``: its forwards' (compute_dtype); ``engine``: the vLLM
    engines' dtype (None: generation runs on the trainer's module). The note says when a CPU run is not in
    the GPU's precision, and why."""
    trainer = f"{weights} weights" + ("" if compute is None or precision_name(compute) == weights
                                      else f", {precision_name(compute)} autocast")
    out = {"trainer": trainer, "engine": engine or "the trainer's module", "note": ""}
    if device_type == "cpu" and compute is None:
        out["note"] = ("float32, not the bf16 a GPU run computes in: this CPU has no native bf16 (no avx512_bf16 "
                       "or AMX; autocast would emulate it)" + (
                           ", so the trainer and its engines run float32, and the sync probe's gaps and the importance "
                           "weights are float32's (~1e-4), not bf16's (~1e-1)" if engine else ""))
    elif device_type == "cpu" and engine and engine != precision_name(compute):
        out["note"] = (f"the engines serve {engine} while the trainer computes in {precision_name(compute)}: "
                       "not the GPU layout's precision (vllm_dtype)")
    return out
