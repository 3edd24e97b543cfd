"""Memory per step (host RSS now and the run's peak, CUDA allocator peak) beside the memory estimate.

Two host figures, because they answer different questions: ``memory/peak_rss_gib`` is the process's
high-water mark so far (getrusage's ru_maxrss: it can only rise, so a run whose later steps simply reach
a new maximum once looks like one that grows), and ``memory/rss_gib`` is the resident size when the step's
metrics are taken, its activations and logits freed: what a step leaves behind. Something that accumulates
over a long run (kept tensors, rows, caches) raises ``memory/rss_gib`` step after step; the peak does not
tell the two apart. The resident size includes memory the allocator keeps free for reuse (glibc held
~1.6 GiB of it between steps of the default preset, bench/long_run_flat.py), so read its trend, not its
level. The CUDA peak is already per step (reset after each read).

The estimate is rftlib.models.memory's (the formulas the preflight shows), for the model actually
loaded (its HF config) and this config's batch shapes, so a run's log shows how far the preflight was
off on real hardware.
"""

from __future__ import annotations

import resource
import sys

import torch

from rftlib.models.memory import estimate_for_config, estimator_attention, shape_from_hf_config
from rftlib.rollout.kinds import engine_kind
from rftlib.settings import ModelSettings, OptimizationSettings, RolloutSettings
from rftlib.backends import BackendInputs, sharding_of


def peak_rss_gib() -> float:
    """This process's peak resident memory so far (ru_maxrss: KiB on Linux, bytes on macOS)."""
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r / 2**30 if sys.platform == "darwin" else r / 2**20


def rss_gib() -> float | None:
    """This process's resident memory now, GiB (/proc/self/statm; None where there is no procfs).

    Read from the kernel, not sampled: no reset of the peak counters (``clear_refs`` would also reset
    ru_maxrss, which :func:`peak_rss_gib` and rftlib.validate read as the run's peak)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize() / 2**30
    except (OSError, ValueError, IndexError):
        return None


def preflight_gib(cfg, hf_config, world_size: int, prompt_len: int, chunk_rows: int = 1024) -> float | None:
    """The estimate of one training GPU's peak for this run, GiB (None where it cannot say)."""
    try:
        total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory / 1e9
        est = estimate_for_config(cfg.section(ModelSettings), cfg.section(RolloutSettings),
                                  cfg.section(OptimizationSettings), shape_from_hf_config(hf_config),
                                  needs_reference=cfg.needs_reference,
                                  on_policy=cfg.on_policy, gpu=total,
                                  world_size=world_size,
                                  seq_len=prompt_len + cfg.max_new_tokens, chunk_rows=chunk_rows,
                                  sharding=sharding_of(BackendInputs.of(cfg.section, train_prompts=cfg.train_prompts)),
                                  hf_generate=engine_kind(cfg.rollout_engine).on_trainer_module,
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
    if (now := rss_gib()) is not None:
        out["memory/rss_gib"] = now
    if device.type == "cuda":
        out["memory/cuda_peak_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        torch.cuda.reset_peak_memory_stats(device)
    return out
