"""``rft eval RUN_DIR [--limit N]``: every checkpoint of an attempt, "final" included (resumable)."""

from __future__ import annotations

import sys

from rftlib.attempts import existing_attempt
from rftlib.eval_checkpoints import eval_checkpoints


def add_arguments(e) -> None:
    e.add_argument("run_dir", help="the attempt directory (or its name under the runs root)")
    e.add_argument("--limit", type=int, default=None, help="only the first N held-out problems")
    e.add_argument("--max-new-tokens", type=int, default=None)
    e.add_argument("--batch-size", type=int, default=None)
    e.add_argument("--recompute", action="store_true", help="ignore results already in eval/")


def run(args) -> int:
    try:
        run_dir = existing_attempt(args.run_dir)  # before eval_checkpoints makes its logs/ there
    except FileNotFoundError as e:
        print(f"rft eval: {e}", file=sys.stderr)
        return 2
    res = eval_checkpoints(run_dir, limit=args.limit, max_new_tokens=args.max_new_tokens,
                           batch_size=args.batch_size, recompute=args.recompute)
    for s, d in res.items():
        print(f"[rft] step {s}{' (final)' if d.get('final') else ''}: {d['mode']} {d[d['mode']]:.3f} "
              f"({d.get('precision', 'precision unrecorded')}) on {d['n_problems']} problems -> eval/ckpt_step_{s}.json")
    return 0 if res else 1
