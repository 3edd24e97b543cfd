"""Peak memory per step (host RSS, CUDA allocator peak) beside the memory estimate.

The estimate is rftlib.models.memory's (the formulas the preflight shows), for the model actually
loaded (its HF config) and this config's batch shapes, so a run's log shows how far the preflight was
off on real hardware.
"""

from __future__ import annotations

import resource
import sys

import torch

from rftlib.models.memory import estimate_for_config, estimator_attention, shape_from_hf_config
from rftlib.rollout.factory import engine_kind
from rftlib.train.backends import sharding_of


def peak_rss_gib() -> float:
    """This process's peak resident memory so far (ru_maxrss: KiB on Linux, bytes on macOS)."""
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r / 2**30 if sys.platform == "darwin" else r / 2**20


def preflight_gib(cfg, hf_config, world_size: int, prompt_len: int, chunk_rows: int = 1024) -> float | None:
    """The estimate of one training GPU's peak for this run, GiB (None where it cannot say)."""
    try:
        total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory / 1e9
        est = estimate_for_config(cfg, shape_from_hf_config(hf_config), gpu=total, world_size=world_size,
                                  seq_len=prompt_len + cfg.max_new_tokens, chunk_rows=chunk_rows,
                                  sharding=sharding_of(cfg), hf_generate=engine_kind(cfg.rollout_engine).on_trainer_module,
                                  attention=estimator_attention(getattr(hf_config, "_attn_implementation", None)
                                                                or "sdpa"))
        return est.total_gb * 1e9 / 2**30
    except (ValueError, KeyError, AttributeError, RuntimeError):
        return None


def free_bytes(device: torch.device) -> int:
    """Memory a new tensor on ``device`` can take now: on CUDA the driver's free memory plus what torch's caching
    allocator holds unused (reserved - allocated), else the host's MemAvailable (0 where it cannot be read)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0] + torch.cuda.memory_reserved(device)
                   - torch.cuda.memory_allocated(device))
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def step_memory(device: torch.device) -> dict[str, float]:
    """Memory metrics of the step just taken; resets the CUDA peak for the next one."""
    out = {"memory/peak_rss_gib": peak_rss_gib()}
    if device.type == "cuda":
        out["memory/cuda_peak_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        torch.cuda.reset_peak_memory_stats(device)
    return out
