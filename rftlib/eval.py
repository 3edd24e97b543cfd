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
                            "reward": r, "correct": float(diag.get("correctness", r)), "length": int(length),
                            "has_boxed": float(diag.get("has_boxed", 0.0))})
    n = len(results)
    acc = sum(r["correct"] for r in results) / max(n, 1)
    return {"mode": "greedy_pass@1", "dataset": dataset, "n_problems": n, "n_samples": 1, "temperature": 0.0,
            "max_new_tokens": max_new_tokens, "greedy_pass@1": acc,
            "mean_length": sum(r["length"] for r in results) / max(n, 1), "results": results}


@torch.no_grad()
def evaluate(engine, tokenizer, task: Task, examples: list[Example], *, mode: str = "greedy_pass@1", n: int = 1,
             temperature: float | None = None, max_new_tokens: int, batch_size: int = 64,
             dataset: str = "heldout") -> dict[str, Any]:
    """One labelled eval (seed 003 section 7): greedy_pass@1, sampling_pass@k (n samples at 0.6 by
    default: unbiased pass@k, pass@1 and maj@k) or nondet_proxy_pass@k (n greedy samples, diagnostics).

    Temperature 0 with n > 1 is refused unless the mode is the nondet proxy (rftlib.evalmath).
    """
    from rftlib.evalmath import EVAL_MODES, _base_mode, check_eval_mode, maj_at_k, pass_at_k
    from rftlib.rewards.math import extract_answer

    base = _base_mode(mode)
    if base == "greedy_pass@1":
        return greedy_eval(engine, tokenizer, task, examples, max_new_tokens=max_new_tokens, batch_size=batch_size,
                           dataset=dataset)
    temp = EVAL_MODES[base].temperature if temperature is None else temperature
    label = check_eval_mode(mode, temp, n)
    greedy = temp == 0.0
    per_problem = []
    rows = max(1, batch_size // n)
    for i in range(0, len(examples), rows):
        batch = examples[i:i + rows]
        ro = engine.generate(format_prompts(tokenizer, batch, task.system_prompt), group_size=n,
                             max_new_tokens=max_new_tokens, temperature=max(temp, 1e-6), greedy=greedy)
        for j, ex in enumerate(batch):
            texts = ro.texts[j * n:(j + 1) * n]
            correct = [float(task.reward(t, ex, bool(ro.truncated[j * n + q]))[1].get("correctness", 0.0))
                       for q, t in enumerate(texts)]
            answers = [extract_answer(t)[0] for t in texts]
            per_problem.append({"id": ex.id, "answer": ex.answer, "n": n, "c": int(sum(correct)),
                                "completions": texts, "maj": maj_at_k(answers, ex.answer)})
    npb = max(len(per_problem), 1)
    return {"mode": label, "dataset": dataset, "n_problems": len(per_problem), "n_samples": n, "temperature": temp,
            "max_new_tokens": max_new_tokens,
            label: sum(pass_at_k(p["n"], p["c"], n) for p in per_problem) / npb,
            "pass@1": sum(p["c"] / p["n"] for p in per_problem) / npb,
            f"maj@{n}": sum(p["maj"] for p in per_problem) / npb, "results": per_problem}


def compare(a: dict[str, Any], b: dict[str, Any]) -> float:
    """b's score minus a's, refused unless both are the same mode on the same dataset (seed 003:
    never compare metrics across modes)."""
    for key in ("mode", "dataset", "n_samples", "max_new_tokens"):
        if a.get(key) != b.get(key):
            raise ValueError(f"refusing to compare evals with different {key}: {a.get(key)!r} vs {b.get(key)!r}")
    return b[a["mode"]] - a[a["mode"]]


def sft_decision(engine, tokenizer, task: Task, examples: list[Example], *, max_new_tokens: int,
                 threshold: float = 0.95, batch_size: int = 64) -> dict[str, Any]:
    """Seed 003 section 12: SFT is needed only if the base model's format compliance (the \\boxed{}
    rate, greedy, on a probe) is below 95%. Returns the rate, the verdict and the eval it came from."""
    res = greedy_eval(engine, tokenizer, task, examples, max_new_tokens=max_new_tokens, batch_size=batch_size,
                      dataset="format_probe")
    rate = sum(r["has_boxed"] for r in res["results"]) / max(len(res["results"]), 1)
    verdict = "SFT needed" if rate < threshold else "SFT not needed"
    return {"has_boxed_rate": rate, "threshold": threshold, "verdict": verdict, "n": len(res["results"]),
            "message": f"{verdict}: boxed-answer rate {rate:.0%} on {len(res['results'])} problems "
                       f"({'<' if rate < threshold else '>='} {threshold:.0%}, seed 003 section 12)",
            "eval": res}
