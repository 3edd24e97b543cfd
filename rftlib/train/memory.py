"""Peak memory per step (host RSS, CUDA allocator peak) beside the memory preflight's estimate.

The estimate is rftlib.preflight.memory's, for the model actually loaded (its HF config) and this
config's batch shapes, so a run's log shows how far the preflight was off on real hardware.
"""

from __future__ import annotations

import resource
import sys

import torch


def peak_rss_gib() -> float:
    """This process's peak resident memory so far (ru_maxrss: KiB on Linux, bytes on macOS)."""
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r / 2**30 if sys.platform == "darwin" else r / 2**20


def shape_from_hf_config(c, name: str = "loaded"):
    from rftlib.preflight.memory import ModelShape

    heads = c.num_attention_heads
    return ModelShape(name, c.num_hidden_layers, c.hidden_size, heads, getattr(c, "num_key_value_heads", heads) or heads,
                      getattr(c, "head_dim", None) or c.hidden_size // heads, c.vocab_size, c.intermediate_size,
                      tied_embeddings=bool(getattr(c, "tie_word_embeddings", False)),
                      n_experts=getattr(c, "num_local_experts", 1) or 1,
                      experts_per_tok=getattr(c, "num_experts_per_tok", 1) or 1)


def preflight_gib(cfg, hf_config, world_size: int, prompt_len: int, chunk_rows: int = 1024) -> float | None:
    """The preflight's estimate of one training GPU's peak for this run (None where it cannot say)."""
    from rftlib.preflight.memory import estimate_train_memory

    try:
        total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory / 1e9
        est = estimate_train_memory(
            shape_from_hf_config(hf_config), gpu=total, train_dtype="bf16" if cfg.dtype == "bfloat16" else
            ("fp16" if cfg.dtype == "float16" else "fp32"), finetune="lora" if cfg.lora_rank else "full",
            lora_rank=max(cfg.lora_rank, 1), sequences=cfg.micro_batch_size, seq_len=prompt_len + cfg.max_new_tokens,
            gradient_checkpointing=cfg.gradient_checkpointing, logits="chunked", logits_chunk=chunk_rows,
            generation=(cfg.rollout_batch_size * cfg.n_samples_per_prompt // world_size,
                        prompt_len + cfg.max_new_tokens) if cfg.rollout_engine == "hf" else None,
            zero_stage=cfg.zero_stage if cfg.backend == "deepspeed" else 0, world_size=world_size,
            offload=cfg.offload_params, adam_offload=cfg.offload_optimizer)
        return est.total_gb * 1e9 / 2**30
    except (ValueError, KeyError, AttributeError, RuntimeError):
        return None


def step_memory(device: torch.device) -> dict[str, float]:
    """Memory metrics of the step just taken; resets the CUDA peak for the next one."""
    out = {"memory/peak_rss_gib": peak_rss_gib()}
    if device.type == "cuda":
        out["memory/cuda_peak_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        torch.cuda.reset_peak_memory_stats(device)
    return out
