"""Held-out evaluation during and after training, labelled with its mode (seed 003 section 7).

The trainer's built-in eval is ``greedy_pass@1`` (temperature 0, n 1): deterministic and cheap,
the seed's primary checkpoint signal. Every result records its mode, dataset, n, temperature and
max tokens, so results from different modes are never compared by accident.
"""

from __future__ import annotations

from typing import Any

import torch

from rftlib.data.tasks import Example, Task


def format_prompts(tokenizer, examples: list[Example], system_prompt: str | None = None) -> list[str]:
    """Chat-formatted prompt text (generation prompt appended) for each example."""
    out = []
    for e in examples:
        msgs = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + [
            {"role": "user", "content": e.prompt}]
        out.append(tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True))
    return out


@torch.no_grad()
def greedy_eval(engine, tokenizer, task: Task, examples: list[Example], *, max_new_tokens: int,
                batch_size: int = 64, dataset: str = "heldout") -> dict[str, Any]:
    """greedy_pass@1 over examples, with per-example completions and rewards."""
    results = []
    for i in range(0, len(examples), batch_size):
        batch = examples[i:i + batch_size]
        ro = engine.generate(format_prompts(tokenizer, batch, task.system_prompt), group_size=1,
                             max_new_tokens=max_new_tokens, temperature=0.0, greedy=True)
        for ex, text, trunc, length in zip(batch, ro.texts, ro.truncated.tolist(), ro.lengths().tolist()):
            r, diag = task.reward(text, ex, bool(trunc))
            results.append({"id": ex.id, "prompt": ex.prompt, "answer": ex.answer, "completion": text,
                            "reward": r, "correct": float(diag.get("correctness", r)), "length": int(length)})
    n = len(results)
    acc = sum(r["correct"] for r in results) / max(n, 1)
    return {"mode": "greedy_pass@1", "dataset": dataset, "n_problems": n, "n_samples": 1, "temperature": 0.0,
            "max_new_tokens": max_new_tokens, "greedy_pass@1": acc,
            "mean_length": sum(r["length"] for r in results) / max(n, 1), "results": results}
