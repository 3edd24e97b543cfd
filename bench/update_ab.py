"""A/B of the update phase's speed settings on one real rollout of a preset (default: the embedded demo).

One rollout is generated and scored as ``Trainer.step`` does; then the same update (same rows, same
advantages, same weights: the optimizer step is replaced by a gradient capture) is timed under each
variant, interleaved over ``--reps`` rounds, and each variant's gradient is compared to the first's.

    PYTHONPATH=$PWD RFTLIB_CACHE=/work/main/.cache python bench/update_ab.py --reps 2

Variants: old (no skip, no sort, recompute always, 1024-row LM-head chunks: the behaviour before
these settings), +skip, +sort, +recompute auto, the defaults with 1024-row chunks, all (the
defaults: chunk rows sized from the vocabulary). Prints median seconds per variant and the rows it ran.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import torch

import rftlib.train.loop as loop
from rftlib.config import make_config

OLD = dict(skip_zero_advantage_rows=False, sort_micro_batches_by_length=False, logprob_recompute="always",
           logprob_chunk_size=1024)
VARIANTS = {
    "old": OLD,
    "+skip": {**OLD, "skip_zero_advantage_rows": True},
    "+sort": {**OLD, "sort_micro_batches_by_length": True},
    "+recompute auto": {**OLD, "logprob_recompute": "auto"},
    "defaults, chunk 1024": {"logprob_chunk_size": 1024},
    "all (defaults)": {},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-p", "--preset", default="default")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--runs", default="/tmp/update_ab_runs")
    args = ap.parse_args()
    cfg = make_config(args.preset, {"runs_root": args.runs, "eval_steps": 0, "save_steps": 0})
    seen = []  # the batch each update trained on (the advantages phase's result)
    tr = loop.Trainer(cfg, progress=False, hooks=[lambda phase, s, res: phase == "advantages" and seen.append(res)])
    grads, rows = [], []

    def step(loss_finite):  # capture the gradient; leave the weights as they are
        grads.append(torch.cat([p.grad.reshape(-1) for p in tr.params]))
        tr.optimizer.zero_grad(set_to_none=True)
        return 1.0, True

    real_forward = tr.backend.forward

    def forward(**r):
        rows.append(r["completion_ids"].shape[0])
        return real_forward(**r)

    tr.backend.step, tr.backend.forward = step, forward
    t = time.time()
    row = tr.step()
    print(f"rollout step: generate {row['timing/generate']:.1f}s, update {row['timing/update']:.1f}s "
          f"(defaults), frac_reward_zero_std {row['frac_reward_zero_std']:.3f}, "
          f"response_length_mean {row['response_length_mean']:.1f}  ({time.time() - t:.0f}s)")
    base_cfg = tr.cfg
    auto_chunk = tr.logprob_chunk_size  # the Trainer's own sizing (logprob_chunk_size 0)
    print(f"LM-head chunk rows by default: {auto_chunk}")
    batch = seen[-1]
    times: dict[str, list[float]] = {k: [] for k in VARIANTS}
    ran: dict[str, int] = {}
    ref = None
    for _ in range(args.reps):
        for name, over in VARIANTS.items():
            tr.cfg = dataclasses.replace(base_cfg, **over)
            tr.logprob_chunk_size = tr.cfg.logprob_chunk_size or auto_chunk
            grads.clear()
            rows.clear()
            t = time.perf_counter()
            tr.update(batch)
            times[name].append(time.perf_counter() - t)
            ran[name] = sum(rows)
            g = torch.cat(grads)
            ref = g if ref is None else ref
            diff = float((g - ref).abs().max())
            print(f"  {name:22s} {times[name][-1]:6.1f}s  rows run {ran[name]:3d}  max|grad - old grad| {diff:.2e}",
                  flush=True)
    print("median seconds per update:")
    old = statistics.median(times["old"])
    for name, ts in times.items():
        m = statistics.median(ts)
        print(f"  {name:22s} {m:6.1f}s  x{old / m:.2f} vs old  rows {ran[name]}")
    tr.close()


if __name__ == "__main__":
    main()
