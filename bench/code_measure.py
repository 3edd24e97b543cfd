"""Measure a model's per-family solve rates on ``code_basics`` (no training): what the task's
design rests on. Greedy pass@1 on the held-out set, and T=1 sampled pass@1 (the rate training
rollouts see), per family, with mean completion length and truncation.

    python bench/code_measure.py --model smollm2-135m --samples 4 --max-new-tokens 128

Prints one line per family and writes the rows to ``--out`` (JSON) when given.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from rftlib.data.code_basics import FAMILIES, code_basics_task
from rftlib.eval import format_prompts
from rftlib.models.loading import compute_dtype, load_model_and_tokenizer
from rftlib.rewards.registry import as_reward
from rftlib.rollout.hf import HFEngine


def measure(model_name: str = "smollm2-135m", *, samples: int = 4, max_new_tokens: int = 128,
            held_out_per_family: int = 10, batch_size: int = 64, temperature: float = 1.0) -> dict:
    """{family: {n, greedy, sampled, reward_greedy, reward_sampled, length, truncated}} on the
    held-out split, plus "all"."""
    task = code_basics_task(held_out_per_family=held_out_per_family)
    model, tok = load_model_and_tokenizer(model_name)
    model.eval()
    engine = HFEngine(model, tok, amp=compute_dtype("auto", "auto"))
    ex = task.eval
    rows = {e.id: {"family": e.meta["type"], "greedy": 0.0, "sampled": 0.0, "rg": 0.0, "rs": 0.0,
                   "len": 0.0, "trunc": 0.0} for e in ex}
    reward = as_reward(task.reward)  # the registered code_tests reward, with its declared batch form
    t0 = time.time()
    for mode, n in (("greedy", 1), ("sampled", samples)):
        if n == 0:
            continue
        per = max(1, batch_size // n)
        for i in range(0, len(ex), per):
            batch = ex[i:i + per]
            ro = engine.generate(format_prompts(tok, batch, task.system_prompt), group_size=n,
                                 max_new_tokens=max_new_tokens, temperature=temperature if n > 1 else 0.0,
                                 greedy=n == 1)
            rewards = reward.score(list(ro.texts), [e for e in batch for _ in range(n)],
                                   [bool(c) for c in ro.truncated.tolist()])
            lengths = ro.lengths().tolist()
            for j, e in enumerate(batch):
                r = rows[e.id]
                for q in range(n):
                    rew, d = rewards[j * n + q]
                    r[mode] += d["correctness"] / n
                    r["rg" if n == 1 else "rs"] += rew / n
                    if n == 1:
                        r["len"] += lengths[j]
                        r["trunc"] += float(ro.truncated[j])
        print(f"[measure] {mode}: {time.time() - t0:.0f} s", flush=True)
    out: dict = {}
    for fam in list(FAMILIES) + ["all"]:
        sel = [r for r in rows.values() if fam in ("all", r["family"])]
        if not sel:
            continue
        k = len(sel)
        out[fam] = {"n": k, "difficulty": FAMILIES[fam][0] if fam in FAMILIES else None,
                    "greedy": sum(r["greedy"] for r in sel) / k, "sampled": sum(r["sampled"] for r in sel) / k,
                    "reward_greedy": sum(r["rg"] for r in sel) / k, "reward_sampled": sum(r["rs"] for r in sel) / k,
                    "length": sum(r["len"] for r in sel) / k, "truncated": sum(r["trunc"] for r in sel) / k}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--samples", type=int, default=4, help="T=1 samples per problem (0: greedy only)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--held-out-per-family", type=int, default=10)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    res = measure(a.model, samples=a.samples, max_new_tokens=a.max_new_tokens,
                  held_out_per_family=a.held_out_per_family)
    print(f"{'family':14s} {'d':>2s} {'n':>4s} {'greedy':>7s} {'sampled':>8s} {'r_greedy':>8s} {'r_samp':>7s} "
          f"{'len':>5s} {'trunc':>5s}")
    for fam, d in res.items():
        print(f"{fam:14s} {d['difficulty'] or '':>2} {d['n']:4d} {d['greedy']:7.2f} {d['sampled']:8.2f} "
              f"{d['reward_greedy']:8.2f} {d['reward_sampled']:7.2f} {d['length']:5.0f} {d['truncated']:5.2f}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
