"""gpt-oss's no-grad passes under eager and flex attention on a CUDA GPU: peak memory against the preflight's
per-row count, and the log-prob gap between the two (issue 29 item 3). GPU only; a few minutes.

The reference / old-logprob passes of seed 003 run logprob_batch_size rows (auto 8) of T ~ 4,450 tokens
(prompt p99.5 354 + 4,096 generated). transformers has no SDPA path for gpt-oss; eager attention holds
(heads, T, T) score tensors per row, flex attention computes them in tiles. This builds a gpt-oss-shaped
model with random weights (the real hidden size, heads, head_dim, vocabulary; 2 layers, one sliding and one
full; 4 experts), in bf16, and for each attention and 1 and 8 left-padded rows measures:

- the peak CUDA allocation of one no-grad ``completion_logprobs`` pass above the weights, against
  ``rows x nograd_row_bytes`` + one logits chunk (rftlib.models.memory: what rft preflight counts);
- flex's log-probs against eager's on the same weights and rows (bf16 both: the gap is kernel rounding), and
  eager's row 0 alone against the same row in the widest batch (the rounding of another batch shape);
- one training step (backward) at 1 row with each attention, gradient checkpointing on: it runs, and its peak.

    python bench/gptoss_attention_gpu.py --out gptoss_attention.json
"""

from __future__ import annotations

import argparse
import inspect
import json
import time

import torch


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--prompt", type=int, default=354)
    p.add_argument("--completion", type=int, default=4096)
    p.add_argument("--rows", default="1,8")
    a = p.parse_args()
    res: dict = {}

    def save():
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)

    import transformers
    from transformers import GptOssConfig, GptOssForCausalLM
    from transformers.integrations import flex_attention as fa
    from transformers.models.gpt_oss import modeling_gpt_oss as mg
    from transformers.utils import is_torch_flex_attn_available

    from rftlib.algo.logprobs import auto_chunk_size
    from rftlib.models.forward import completion_logprobs
    from rftlib.models.memory import nograd_row_bytes, shape_from_hf_config

    cls = mg.GptOssPreTrainedModel
    res["versions"] = {"torch": torch.__version__, "transformers": transformers.__version__,
                       "gpu": torch.cuda.get_device_name(), "cuda": torch.version.cuda}
    res["gpt_oss_class"] = {"_supports_sdpa": getattr(cls, "_supports_sdpa", None),
                            "_supports_flex_attn": getattr(cls, "_supports_flex_attn", None),
                            "flex_available": is_torch_flex_attn_available(),
                            "flex_applies_sinks": "s_aux" in inspect.getsource(fa.flex_attention_forward)}
    save()
    cfg = GptOssConfig(vocab_size=201088, hidden_size=2880, intermediate_size=2880, num_hidden_layers=2,
                       num_attention_heads=64, num_key_value_heads=8, head_dim=64, num_local_experts=4,
                       num_experts_per_tok=2, sliding_window=128, layer_types=["sliding_attention", "full_attention"],
                       max_position_embeddings=131072, attn_implementation="eager")
    torch.manual_seed(0)
    model = GptOssForCausalLM(cfg).to("cuda", torch.bfloat16).eval()
    shape = shape_from_hf_config(model.config)
    P, C = a.prompt, a.completion
    T = P + C
    chunk = auto_chunk_size(cfg.vocab_size)
    gen = torch.Generator(device="cpu").manual_seed(1)

    def rows(n: int):
        ids = torch.randint(0, cfg.vocab_size, (n, T), generator=gen)
        pm = torch.ones(n, P, dtype=torch.long)
        for i in range(n):
            pm[i, :16 * i] = 0  # left padding: row i's prompt is 16 i tokens shorter
        cm = torch.ones(n, C)
        return dict(prompt_ids=ids[:, :P].cuda(), prompt_mask=pm.cuda(), completion_ids=ids[:, P:].cuda(),
                    completion_mask=cm.cuda())

    def use(impl: str):
        if hasattr(model, "set_attn_implementation"):
            model.set_attn_implementation(impl)
        else:
            model.config._attn_implementation = impl

    counts = sorted(map(int, a.rows.split(",")))
    widest = rows(counts[-1])  # the smaller batches are its first rows, so row 0 is the same sequence in each
    batches = {n: {k: v[:n] for k, v in widest.items()} for n in counts}
    lps: dict = {}
    res["nograd"] = []
    for impl, est in (("eager", "eager"), ("flex_attention", "flex")):
        use(impl)
        for n, b in batches.items():
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            t = time.time()
            try:
                with torch.no_grad():
                    lp, _ = completion_logprobs(model, **b, chunk_size=chunk, with_entropy=False,
                                                checkpoint_chunks=False)
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001 -- an OOM or a missing kernel is the finding
                res["nograd"].append({"attention": impl, "rows": n, "error": f"{type(e).__name__}: {e}"[:500]})
                save()
                torch.cuda.empty_cache()
                continue
            peak = torch.cuda.max_memory_allocated() - base
            predicted = n * nograd_row_bytes(shape, T, 2, est, 2) + min(n * T, chunk) * cfg.vocab_size * 8
            lps[(impl, n)] = lp.float().cpu()
            res["nograd"].append({"attention": impl, "rows": n, "T": T, "seconds": round(time.time() - t, 2),
                                  "peak_gib": round(peak / 2**30, 3), "predicted_gib": round(predicted / 2**30, 3),
                                  "peak_over_predicted": round(peak / predicted, 3)})
            save()
    res["flex_vs_eager"] = {}
    for n in batches:
        if ("eager", n) in lps and ("flex_attention", n) in lps:
            d = (lps[("eager", n)] - lps[("flex_attention", n)]).abs()
            res["flex_vs_eager"][str(n)] = {"max": float(d.max()), "mean": float(d.mean())}
    lo, hi = counts[0], counts[-1]
    if ("eager", lo) in lps and ("eager", hi) in lps and lo != hi:  # bf16 noise of the batch shape alone: row 0
        d = (lps[("eager", lo)][0] - lps[("eager", hi)][0]).abs()
        res[f"eager_{lo}_vs_{hi}_row0"] = {"max": float(d.max()), "mean": float(d.mean())}
    save()

    res["train_step"] = []
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    for impl in ("eager", "flex_attention"):
        use(impl)
        model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        try:
            lp, _ = completion_logprobs(model, **batches[min(batches)], chunk_size=chunk, with_entropy=False)
            lp.sum().backward()
            torch.cuda.synchronize()
            g = float(sum(p.grad.float().norm() ** 2 for p in model.parameters() if p.grad is not None) ** 0.5)
            res["train_step"].append({"attention": impl, "rows": min(batches), "grad_norm": g,
                                      "peak_gib": round((torch.cuda.max_memory_allocated() - base) / 2**30, 3)})
        except Exception as e:  # noqa: BLE001
            res["train_step"].append({"attention": impl, "error": f"{type(e).__name__}: {e}"[:500]})
        save()
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
