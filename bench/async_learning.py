"""Held-out greedy accuracy of a max_staleness A/B (issue 32's learning item): each arm's step-0 and final accuracy
with a bootstrap 95% CI over the held-out problems, and the paired B - A difference (rft compare's paired bootstrap).

    flock /tmp/torch.lock .venv/bin/rft train -p async-1x1-cpu --set max_staleness=0 --set num_steps=24 --set eval_steps=24
    flock /tmp/torch.lock .venv/bin/rft train -p async-1x1-cpu --set max_staleness=1 --set num_steps=24 --set eval_steps=24
    flock /tmp/torch.lock .venv/bin/python bench/async_learning.py RUN_K0 RUN_K1   # A = the first (k=0)

Writes bench/results/async_learning_<UTC date>.json (or --out) and prints the lines.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rftlib.attempts import read_attempt
from rftlib.report.compare import _pick_eval, load_all, paired_bootstrap, paired_eval_diff, per_problem

REPO = Path(__file__).resolve().parents[1]


def accuracy_ci(doc: dict) -> dict:
    """Mean of the 0/1 per-problem results with its bootstrap 95% CI (the paired bootstrap against all zeros)."""
    r = list(per_problem(doc).values())
    ci = paired_bootstrap([0.0] * len(r), r)
    return {"accuracy": ci.mean, "ci95": [ci.lo, ci.hi], "n": ci.n}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dirs", nargs="+")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    attempts = load_all(args.run_dirs)
    out = {"arms": [], "diffs": []}
    for a, d in zip(attempts, args.run_dirs):
        cfg = read_attempt(d)
        cfg = cfg.get("config", cfg)  # config.yaml: the config and its provenance
        rows = [json.loads(x) for x in (Path(d) / "logs" / "metrics.jsonl").read_text().splitlines() if x]
        steps = [r for r in rows if "timing/step" in r]
        arm = {"run_dir": str(d), "attempt": a.attempt_id, "max_staleness": cfg.get("max_staleness"),
               "steps": len(steps), "samples": int(sum(r.get("throughput/samples_per_s", 0) * r["timing/step"]
                                                      for r in steps) + 0.5),
               "train_seconds": sum(r["timing/step"] for r in steps),
               "staleness_mean": sum(r.get("staleness/mean", 0) for r in steps) / max(len(steps), 1)}
        for which in ("baseline", "final"):
            e = _pick_eval(a, which)
            if e is not None:
                arm[which] = {"step": e[0], **accuracy_ci(e[1])}
        out["arms"].append(arm)
        acc = " ".join(f"{w} step {arm[w]['step']}: {100 * arm[w]['accuracy']:.1f}% [95% CI {100 * arm[w]['ci95'][0]:.1f}, "
                       f"{100 * arm[w]['ci95'][1]:.1f}]" for w in ("baseline", "final") if w in arm)
        print(f"max_staleness {arm['max_staleness']}: {arm['steps']} steps, {arm['samples']} samples, "
              f"{arm['train_seconds']:.0f}s of steps, staleness mean {arm['staleness_mean']:.2f}; {acc}")
    for b in attempts[1:]:
        ci, note = paired_eval_diff(attempts[0], b, "final")
        out["diffs"].append({"b": b.attempt_id, "a": attempts[0].attempt_id, "note": note,
                             **({"mean": ci.mean, "ci95": [ci.lo, ci.hi], "p_le_0": ci.p_le_0, "n": ci.n} if ci else {})})
        print(f"{b.attempt_id} - {attempts[0].attempt_id}: {ci if ci else ''} {note}")
    path = Path(args.out or REPO / "bench" / "results" / f"async_learning_{time.strftime('%Y-%m-%d', time.gmtime())}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
