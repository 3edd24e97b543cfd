"""Flex attention's compiles under the trainer's call mix: bounded, and a fallback said out loud (issue 42, item 6).

transformers runs flex_attention through ``torch.compile`` (integrations/flex_attention.py, WrappedFlexAttention).
Dynamo keeps at most ``torch._dynamo.config.recompile_limit`` compiled entries per code object (8 in torch 2.13)
and, past it, runs the frame uncompiled: flex_attention's unfused path, which materialises the (heads, T, T)
scores (~40 GB a layer at 8 rows of gpt-oss-20b at T 4450), an OOM hours into a run that the preflight (which
counts flex as tiled) says fits. One GRPO step calls attention in several modes, and each distinct mode is a
compiled entry of its own: grad and no grad, the half precision and the probe's float32, train and eval mode
(transformers re-wraps flex in a new torch.compile when the module's training flag flips), sliding-window and
full masks; row counts and sequence lengths are marked dynamic by dynamo after their first change.
bench/flex_recompiles.py counts the entries under that mix (the measured counts are in FLEX_RECOMPILE_LIMIT's
comment); :func:`install_flex_bound` raises the limit above them for this process and makes dynamo's fallback
warning an rftlib one that names the memory it will cost.
"""

from __future__ import annotations

import contextlib
import logging

import torch

FLEX_RECOMPILE_LIMIT = 64  # entries per code object; see the measurement in the module docstring's bench
FALLBACK_NOTE = ("[rft] WARNING: flex attention hit torch.compile's recompile limit ({limit}) and now runs "
                 "uncompiled: flex_attention's unfused path materialises the (heads, T, T) scores of every layer, "
                 "which the memory preflight does not count (it counts flex as tiled); a long run may die of OOM. "
                 "Dynamo said: {msg}")


class _FallbackWarner(logging.Handler):
    """Turns dynamo's recompile-limit warning into rftlib's (printed once per process), and counts them."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.hits: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if "recompile_limit" not in msg and "cache_size_limit" not in msg:
            return
        self.hits.append(msg.splitlines()[0][:300])
        if len(self.hits) == 1:
            print(FALLBACK_NOTE.format(limit=torch._dynamo.config.recompile_limit, msg=self.hits[0]), flush=True)


_WARNER: _FallbackWarner | None = None


def fallbacks() -> list[str]:
    """Dynamo's recompile-limit messages seen since :func:`install_flex_bound` (each: a frame now uncompiled)."""
    return list(_WARNER.hits) if _WARNER is not None else []


def install_flex_bound(limit: int = FLEX_RECOMPILE_LIMIT) -> None:
    """For a process that runs flex attention: dynamo's per-code-object recompile limit at least ``limit`` (and the
    accumulated limit at least 4x that), and dynamo's fallback warning printed as rftlib's. Idempotent."""
    global _WARNER
    cfg = torch._dynamo.config
    cfg.recompile_limit = max(cfg.recompile_limit, limit)
    cfg.accumulated_recompile_limit = max(cfg.accumulated_recompile_limit, 4 * limit)
    if _WARNER is None:
        _WARNER = _FallbackWarner()
        logging.getLogger("torch._dynamo").addHandler(_WARNER)


@contextlib.contextmanager
def bound_flex_recompiles(limit: int = FLEX_RECOMPILE_LIMIT):
    """:func:`install_flex_bound` for the duration of a block, the limits restored after (a bench's before/after)."""
    global _WARNER
    cfg = torch._dynamo.config
    saved, warner = (cfg.recompile_limit, cfg.accumulated_recompile_limit), _WARNER
    install_flex_bound(limit)
    try:
        yield
    finally:
        cfg.recompile_limit, cfg.accumulated_recompile_limit = saved
        if warner is None and _WARNER is not None:
            logging.getLogger("torch._dynamo").removeHandler(_WARNER)
            _WARNER = None


SCORING_KERNEL = "TRITON"
"""flex_attention's kernel for a whole-sequence forward (torch's ``kernel_options["BACKEND"]``). Its default, AUTO,
sends a query of fewer than 128 positions to the decoding kernel, meant for generation's few new tokens: on an H200
(torch 2.11, transformers 5.17, 2026-11-27) that kernel found no config for gpt-oss-20b's 64 query / 8 key-value heads
at T 57 (inductor's NoValidChoicesError, the first call of the trainer's mix; gpu_check.py's flex_mix stage), while
TRITON, the main kernel, compiled every call of the mix, backward included (RFT_FLEX_BACKEND=TRITON, same machine)."""


def flex_forward_kwargs(config, device: torch.device) -> dict:
    """What the trainer's logprob forward passes to the backbone (transformers hands it on to the attention
    function) when the model runs flex attention on CUDA: the main kernel, a fresh dict each call (torch fills in
    its defaults in place); ``{}`` otherwise (other attention ignores it; flex on a CPU has one kernel)."""
    if device.type != "cuda" or getattr(config, "_attn_implementation", None) != "flex_attention":
        return {}
    return {"kernel_options": {"BACKEND": SCORING_KERNEL}}
