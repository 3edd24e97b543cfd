"""How often dynamo recompiles flex attention under the trainer's call mix, and whether it falls back (issue 42,
item 6). transformers runs flex_attention through ``torch.compile`` (integrations/flex_attention.py:
WrappedFlexAttention); dynamo keeps at most ``torch._dynamo.config.recompile_limit`` compiled entries per code
object (8 in torch 2.13) and past it runs the frame uncompiled: flex_attention's unfused path, which materialises
the (heads, T, T) scores (~40 GB a layer at 8 rows of gpt-oss-20b at T 4450): an OOM the preflight, which
counts flex as tiled, cannot see.

The call mix is what one GRPO step makes with LoRA and a vLLM engine (rftlib.train.loop): the update's forward
with grad (train mode, autocast), the old-logprob and reference passes without grad (logprob_batch_size rows,
then the remainder), the sync probe's forwards (3 prompts, the engine's precision and float32), each step at a
new T (prompt + the longest completion). Counted: the cache entries dynamo holds for flex_attention's code
object (its compiles), and the recompile-limit warnings (each a fallback), first with torch's defaults, then with
rftlib's bound (rftlib.models.flex.bound_flex_recompiles) in place.

    python bench/flex_recompiles.py              # CPU: a small Llama with attn_implementation=flex_attention
    python bench/flex_recompiles.py --device cuda --gptoss
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import traceback
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# (grad, compute, rows, train mode): one GRPO step's forwards at one T, in the trainer's order
STEP_CALLS = [
    (False, "half", 8, False),  # old logprobs (no grad), logprob_batch_size rows
    (False, "half", 3, False),  # ... and the remainder
    (False, "half", 8, False),  # reference (LoRA: adapter disabled), same shapes
    (True, "half", 8, True),  # the update's micro-batches, with grad
    (True, "half", 3, True),
    (False, "half", 3, False),  # the sync probe in the engine's precision
    (False, "float32", 3, False),  # ... and in float32 (its noise measurement)
]
STEP_T = (57, 90, 131, 75)  # a new T each step: the prompt + the longest completion of that step's batch


def _model(device: str, gptoss: bool):
    from transformers import AutoModelForCausalLM, GptOssConfig, LlamaConfig

    torch.manual_seed(0)
    if gptoss:  # gpt-oss-20b's attention dims, 2 layers (one sliding-window, one full), tiny experts
        c = GptOssConfig(vocab_size=512, hidden_size=2880, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=64, num_key_value_heads=8, head_dim=64, num_local_experts=4,
                         num_experts_per_tok=2, sliding_window=128, max_position_embeddings=131072,
                         tie_word_embeddings=False)
    else:  # Llama-shaped, small: heads of 16, 2 layers
        c = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
    return AutoModelForCausalLM.from_config(c, dtype=torch.float32, attn_implementation="flex_attention").to(device)


class _FallbackLog(logging.Handler):
    """Counts dynamo's "hit config.recompile_limit" warnings (each: a frame that now runs uncompiled)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.hits: list[str] = []

    def emit(self, record):
        msg = record.getMessage()
        if "recompile_limit" in msg or "cache_size_limit" in msg:
            self.hits.append(msg.splitlines()[0][:200])


def flex_compiles() -> int:
    """Compiled entries dynamo holds for flex_attention's code object (each compile or recompile adds one)."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list
    from torch.nn.attention.flex_attention import flex_attention

    return len(_debug_get_cache_entry_list(flex_attention.__code__))


def count_mix(model, device: str, steps=STEP_T, calls=STEP_CALLS, half=torch.bfloat16) -> dict:
    """Run the call mix; {compiles, fallbacks, calls, seconds, first_fallback_call}."""
    from rftlib.models.precision import float32_compute

    if device == "cpu":  # torch 2.13: "FlexAttention does not support backward on CPU"
        calls = [c for c in calls if not c[0]]
    # flex's kernel, as the trainer's logprob forward asks for it (rftlib.models.flex.SCORING_KERNEL, on CUDA: AUTO's
    # decoding kernel found no config for gpt-oss's heads at T 57 on an H200); RFT_FLEX_BACKEND=AUTO shows that
    from rftlib.models.flex import SCORING_KERNEL

    backend = os.environ.get("RFT_FLEX_BACKEND") or (SCORING_KERNEL if device == "cuda" else "")
    torch._dynamo.reset()
    log = _FallbackLog()
    logging.getLogger("torch._dynamo").addHandler(log)
    t0, n, first, error = time.time(), 0, None, None
    try:
        for T in steps:
            for grad, compute, rows, train in calls:
                model.train(train)
                ids = torch.randint(0, 512, (rows, T), device=device)
                ctx = float32_compute(device) if compute == "float32" else torch.autocast(device, dtype=half)
                try:
                    with torch.set_grad_enabled(grad), ctx:
                        extra = {"kernel_options": {"BACKEND": backend}} if backend else {}
                        out = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False,
                                    **extra).logits
                        if grad:
                            out.float().mean().backward()
                except Exception as e:  # noqa: BLE001 -- a call that cannot compile is the finding: which one
                    traceback.print_exc()  # the row keeps one line; the log, inductor's whole account of the cause
                    error = {"call": n + 1, "T": T, "grad": grad, "compute": compute, "rows": rows,
                             "error": f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300]}"}
                    break
                n += 1
                if log.hits and first is None:
                    first = n
            if error:
                break
    finally:
        logging.getLogger("torch._dynamo").removeHandler(log)
    out = {"compiles": flex_compiles(), "fallbacks": len(log.hits), "calls": n, "first_fallback_call": first,
           "seconds": round(time.time() - t0, 1), "fallback_messages": log.hits[:2]}
    return {**out, "failed_call": error} if error else out


def run_mix(device: str = "cpu", gptoss: bool = False) -> dict:
    """Before (torch's defaults) and after (rftlib's bound); status fail when the bounded mix still falls back."""
    from rftlib.models import flex

    model = _model(device, gptoss)
    limit0 = torch._dynamo.config.recompile_limit
    before = count_mix(model, device)
    print(json.dumps({"before": before, "recompile_limit": limit0}), flush=True)
    with flex.bound_flex_recompiles():
        after = count_mix(model, device)
        limit1 = torch._dynamo.config.recompile_limit
    print(json.dumps({"after": after, "recompile_limit": limit1}), flush=True)
    bad = before.get("failed_call") or after.get("failed_call")
    return {"status": "pass" if after["fallbacks"] == 0 and not bad else "fail", "before": {**before, "limit": limit0},
            "after": {**after, "limit": limit1}}


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--gptoss", action="store_true", help="gpt-oss-20b's attention dims (flex applies sinks on CUDA only)")
    a = p.parse_args()
    print(json.dumps(run_mix(a.device, gptoss=a.gptoss), indent=1))
