"""A small gpt-oss-shaped checkpoint stored as HF's gpt-oss checkpoints are: experts in MXFP4.

openai/gpt-oss-20b and -120b ship their expert projections quantised (MXFP4: blocks of 32 values,
each a 4-bit E2M1 number, sharing one 8-bit power-of-two scale, E8M0 with bias 127), everything else
in bf16. On disk each expert projection is a pair of tensors beside its bias::

    model.layers.{i}.mlp.experts.gate_up_proj_blocks  (E, 2I, H/32, 16) uint8   two FP4 codes per byte
    model.layers.{i}.mlp.experts.gate_up_proj_scales  (E, 2I, H/32)     uint8   E8M0 exponent + 127
    model.layers.{i}.mlp.experts.down_proj_blocks     (E, H, I/32, 16)  uint8
    model.layers.{i}.mlp.experts.down_proj_scales     (E, H, I/32)      uint8

and config.json says ``quantization_config: {"quant_method": "mxfp4", ...}``. The low nibble of a
byte is the even-indexed value, the high nibble the odd one; a row of the dequantised matrix is
``FP4[code] * 2**(scale - 127)`` along the input dimension, and the loaded parameter is that matrix
transposed (``gate_up_proj``: (E, H, 2I), ``down_proj``: (E, I, H), as GptOssExperts holds them).

This module writes such a checkpoint with random codes and scales (seeded), so the loading path of
seed 003 (dequantise, ZeRO-3 partitioned load) is tested on CPU in seconds with no download.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import GptOssConfig, GptOssForCausalLM

from rftlib.models.cache import cache_dir
from rftlib.models.tiny import build_tiny_tokenizer

GPTOSS_VERSION = "v1"
FP4_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)  # code -> value
MXFP4_BLOCK = 32  # values sharing one scale
E8M0_BIAS = 127
# scales 2**-9 .. 2**-7 times codes up to 6: expert weights within +-0.047, the size of a 0.02-std init
SCALE_RANGE = (E8M0_BIAS - 9, E8M0_BIAS - 7)
# HF's gpt-oss config keeps these in bf16 (attention, router, embeddings, head)
MODULES_NOT_CONVERTED = ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]
PROJECTIONS = ("gate_up_proj", "down_proj")


def random_mxfp4(rows_shape: tuple[int, ...], cols: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random MXFP4 (blocks, scales) for a (*rows_shape, cols) matrix stored row-major along ``cols``.

    blocks: (*rows_shape, cols/32, 16) uint8, scales: (*rows_shape, cols/32) uint8 in SCALE_RANGE.
    """
    if cols % MXFP4_BLOCK:
        raise ValueError(f"MXFP4 needs the quantised dimension to be a multiple of {MXFP4_BLOCK}, got {cols}")
    g = cols // MXFP4_BLOCK
    blocks = torch.randint(0, 256, (*rows_shape, g, MXFP4_BLOCK // 2), generator=gen, dtype=torch.int32).to(torch.uint8)
    scales = torch.randint(SCALE_RANGE[0], SCALE_RANGE[1] + 1, (*rows_shape, g), generator=gen,
                           dtype=torch.int32).to(torch.uint8)
    return blocks, scales


def build_gptoss_mxfp4(out_dir: str | Path, *, seed: int = 0, layers: int = 2, hidden: int = 64,
                       intermediate: int = 64, experts: int = 4, experts_per_tok: int = 2, heads: int = 4,
                       kv_heads: int = 2, head_dim: int = 16, sliding_window: int = 16) -> Path:
    """Write a GptOssForCausalLM checkpoint with MXFP4 experts (random, seeded) + the tiny tokenizer.

    Non-expert weights are HF's random init in bf16 (as gpt-oss stores them); the experts' biases bf16.
    """
    if hidden % MXFP4_BLOCK or intermediate % MXFP4_BLOCK:
        raise ValueError(f"hidden ({hidden}) and intermediate ({intermediate}) must be multiples of {MXFP4_BLOCK}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok = build_tiny_tokenizer()
    arch = GptOssConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=intermediate,
                        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                        head_dim=head_dim, num_local_experts=experts, num_experts_per_tok=experts_per_tok,
                        sliding_window=sliding_window,
                        max_position_embeddings=131072,  # gpt-oss's: YaRN factor 32 x 4096 (no memory cost)
                        tie_word_embeddings=False,
                        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None)
    torch.manual_seed(seed)
    model = GptOssForCausalLM(arch).to(torch.bfloat16)
    gen = torch.Generator().manual_seed(seed + 1)
    state: dict[str, torch.Tensor] = {}
    for name, t in model.state_dict().items():
        stem, _, leaf = name.rpartition(".")
        if stem.endswith("mlp.experts") and leaf in PROJECTIONS:
            # the loaded parameter is (E, in, out); the checkpoint stores its transpose, rows = out features
            e, d_in, d_out = t.shape
            state[f"{name}_blocks"], state[f"{name}_scales"] = random_mxfp4((e, d_out), d_in, gen)
        else:
            state[name] = t.contiguous()
    del model
    save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    d = arch.to_dict()
    d["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": MODULES_NOT_CONVERTED}
    d["architectures"] = ["GptOssForCausalLM"]
    d["torch_dtype"] = d["dtype"] = "bfloat16"
    (out_dir / "config.json").write_text(json.dumps(d, indent=2))
    (out_dir / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id}))
    tok.save_pretrained(out_dir)
    return out_dir


def gptoss_mxfp4_dir(**shape) -> Path:
    """The cached checkpoint for these ``build_gptoss_mxfp4`` arguments (built on first use, atomically)."""
    tag = "-".join(f"{k}{v}" for k, v in sorted(shape.items()))
    d = cache_dir() / "models" / (f"gptoss-mxfp4-{GPTOSS_VERSION}" + (f"-{tag}" if tag else ""))
    if not (d / "config.json").exists():
        tmp = d.with_name(d.name + f".tmp{os.getpid()}")
        build_gptoss_mxfp4(tmp, **shape)
        try:
            os.replace(tmp, d)
        except OSError:  # another process won the race
            shutil.rmtree(tmp, ignore_errors=True)
    return d
