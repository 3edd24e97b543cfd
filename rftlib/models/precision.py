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

from rftlib.models.memory import GPU_CAPABILITY  # the GPUs' compute capabilities, beside their capacities

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
    and casts to a half dtype (``x.to(torch.bfloat16)``, ``x.half()``) keep float32. ``paused``: calls pass
    through unchanged (ZeRO-3's hooks, see :func:`float32_compute`)."""

    CASTS = {torch.Tensor.half, torch.Tensor.bfloat16}

    def __init__(self):
        super().__init__()
        self.paused = False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if self.paused:
            return func(*args, **(kwargs or {}))
        kwargs = dict(kwargs or {})
        if func in self.CASTS:
            return args[0].float() if args[0].is_floating_point() else args[0]
        if func in (torch.Tensor.to, torch.Tensor.type):  # x.to(bf16), x.to(other) with other half, x.type(dtype)
            args = tuple(torch.float32 if a in HALF else (a.float() if isinstance(a, torch.Tensor) and a.dtype in HALF
                                                         else a) for a in args)
        if kwargs.get("dtype") in HALF:
            kwargs["dtype"] = torch.float32
        return func(*_tree(_up, args), **_tree(_up, kwargs))


def _zero3_partitioned(model) -> bool:
    """Whether ``model``'s parameters are DeepSpeed ZeRO-3 partitions (they carry a ``ds_id``)."""
    return model is not None and any(hasattr(p, "ds_id") for p in model.parameters())


@contextlib.contextmanager
def _paused_in_hooks(model, mode: _Float32Everywhere):
    """Pause ``mode`` while each module's other forward hooks run: ZeRO-3 gathers and releases a module's
    weights in its forward pre- and post-hooks with torch calls that must keep their own dtypes (its flat
    buffers are allocated with ``dtype=`` the weights' half dtype and filled in place; upcast copies leave the
    parameter empty: "'weight' must be 2-D" on a CPU, "Padding_idx must be within num_embeddings" on the H200,
    2026-11-27). Our hooks go first (prepend) and last around DeepSpeed's, registered when its engine was built."""
    def pause(*_):
        mode.paused = True

    def resume(*_):
        mode.paused = False

    handles = []
    for m in model.modules():
        handles += [m.register_forward_pre_hook(pause, prepend=True), m.register_forward_pre_hook(resume),
                    m.register_forward_hook(pause, prepend=True), m.register_forward_hook(resume)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


@contextlib.contextmanager
def float32_compute(device_type: str, model=None):
    """Run the enclosed forward with every operation in float32, whatever the weights' dtype and any
    enclosing autocast: the reference the compute precision's noise is measured against. ``model``: the module
    the forward runs, needed when its parameters are ZeRO-3 partitions (their gathers run unchanged)."""
    mode = _Float32Everywhere()
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.autocast(device_type, enabled=False))
        if _zero3_partitioned(model):
            stack.enter_context(_paused_in_hooks(model, mode))
        stack.enter_context(mode)
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


FLOAT16_MAX = 65504.0  # the largest finite float16: past it an activation is inf, then NaN downstream
QWEN2_FP16_REPORTS = "QwenLM/Qwen3 issues #761, #868, #826"  # Qwen2 in float16: '!!!' outputs, NaN activations


def float16_note(dtype: str, model: str, gpu: str | None = None) -> str:
    """What a run whose weights are float16 (``dtype``: ModelSettings.dtype) risks, and the bfloat16 alternative;
    '' for any other dtype. bfloat16 has float32's exponent range at float16's 2 bytes, so a model trained in
    bf16 (the Qwen2 family) whose activations pass FLOAT16_MAX runs there; float16 is kept when the config asks
    for it (seed 002's "Dtype: float16 (memory optimization)"), and this says so before the run. ``gpu``: a
    launch_gpu_type (rftlib.models.memory.GPUS), whose compute capability says whether it has bf16."""
    if dtype != "float16":
        return ""
    why = (f"{model} is a Qwen2-family model, trained in bfloat16, whose activations are reported to pass "
           f"float16's largest value ({FLOAT16_MAX:g}) and turn into inf/NaN ({QWEN2_FP16_REPORTS})"
           if "qwen2" in model.lower() else
           f"an activation past float16's largest value ({FLOAT16_MAX:g}) becomes inf, then NaN")
    cap = GPU_CAPABILITY.get(gpu or "")
    fix = "--set dtype=bfloat16 avoids the overflow at the same memory"
    if cap is not None and cap < (8, 0):
        fix = f"the {gpu} (sm_{cap[0]}{cap[1]}) has none: --set dtype=float32 there"
    elif cap is not None:
        fix = f"the {gpu} (sm_{cap[0]}{cap[1]}) has it: " + fix
    return (f"dtype float16: {why}, and the loss goes NaN or steps are skipped. bfloat16 has float32's range at "
            "float16's 2 bytes on every GPU from Ampere (sm_80) on (seed 002's RTX 3080 is sm_86); " + fix)
