"""Every metrics row of short tiny-model runs, timing and memory keys aside: a refactor of the trainer
must leave them bit for bit as they were.

Runs the ``tiny`` preset (seeded, CPU) a few steps under several variants chosen to reach every
branch of the step: the default on-policy update, several optimizer steps per rollout (old
logprobs, shuffled batches), a KL reference (beta > 0, KL in the loss and in the reward), the
noise-scale probe, DAPO's dynamic sampling (refill and mask), an entropy bonus. Each variant's rows
(``logs/metrics.jsonl``, the eval rows included) are kept minus the keys that measure the machine,
not the run: ``timing/*``, ``memory/*``, ``sandbox/executions_per_s``.

    PYTHONPATH=. .venv/bin/python bench/metrics_fingerprint.py --write bench/results/tiny_metrics_golden.json
    PYTHONPATH=. .venv/bin/python bench/metrics_fingerprint.py --check bench/results/tiny_metrics_golden.json

``--check`` compares with exact equality (floats as JSON writes them: repr, every bit) and names the
first differing key of each variant. The golden file holds this machine's numbers: another CPU's
kernels may round differently, so write it and check it on the same machine (before and after a change).
The file is not committed (bench/results/ is ignored: it is this machine's data). Issue 31 item 5 was checked
so: written from main at cd6017e on the 2-core Xeon development machine, the Trainer with public phases checked
identical against it there (28 rows of 7 variants).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

VARIANTS: dict[str, dict] = {
    "default": {},
    "off_policy": {"num_updates_per_rollout": 2, "train_batch_size": 2},
    "kl_loss": {"beta": 0.04, "kl_estimator": "k3"},
    "kl_reward": {"beta": 0.04, "kl_in_reward": True, "overlong_buffer_len": 4},
    "gns_probe": {"gns_probe": True, "micro_batch_size": 4},
    "refill": {"dynamic_sampling": "refill"},
    "mask_entropy": {"dynamic_sampling": "mask", "entropy_coef": 0.01, "skip_zero_advantage_rows": False},
}
MACHINE_KEYS = ("timing/", "memory/", "throughput/")
MACHINE_EXACT = {"sandbox/executions_per_s"}


def _kept(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith(MACHINE_KEYS) and k not in MACHINE_EXACT}


def fingerprint(steps: int = 3) -> dict[str, list[dict]]:
    """{variant: [row, ...]} of the tiny preset run ``steps`` steps under each variant."""
    from rftlib.config import make_config
    from rftlib.monitor.metrics import read_metrics
    from rftlib.train.loop import Trainer

    out = {}
    with tempfile.TemporaryDirectory(prefix="fingerprint-") as root:
        for name, over in VARIANTS.items():
            cfg = make_config("tiny", {"runs_root": root, "name": f"fp-{name}", "num_steps": steps,
                                       "save_steps": 0, "report_to": [], **over})
            tr = Trainer(cfg, progress=False)
            try:
                tr.train()
            finally:
                tr.close()
            out[name] = [_kept(r) for r in read_metrics(tr.run_dir)]
    return out


def compare(got: dict, want: dict, *, new_keys: tuple[str, ...] = ()) -> list[str]:
    """What differs, one line per variant (empty: identical). ``new_keys``: key prefixes a change adds on purpose
    (absent from an older golden file): compared only where the golden has them."""
    bad = []
    got = {n: [{k: v for k, v in r.items() if not k.startswith(new_keys) or k in w}
               for r, w in zip(rows, want.get(n, [{}] * len(rows)))] for n, rows in got.items()}
    for name in sorted(set(got) | set(want)):
        a, b = got.get(name), want.get(name)
        if a == b:
            continue
        if a is None or b is None or len(a) != len(b):
            bad.append(f"{name}: {0 if a is None else len(a)} rows, golden {0 if b is None else len(b)}")
            continue
        for i, (ra, rb) in enumerate(zip(a, b)):
            keys = sorted(k for k in set(ra) | set(rb) if ra.get(k, "<absent>") != rb.get(k, "<absent>"))
            if keys:
                k = keys[0]
                bad.append(f"{name} row {i}: {len(keys)} keys differ, first {k}: {ra.get(k, '<absent>')!r} "
                           f"vs golden {rb.get(k, '<absent>')!r}")
                break
    return bad


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--write", type=Path, help="write the rows to this JSON file")
    g.add_argument("--check", type=Path, help="compare the rows with this JSON file, exactly")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--new-keys", default="", help="comma-separated key prefixes this change adds (e.g. staleness/): "
                    "not required in an older golden file; every other key must still be equal")
    args = ap.parse_args(argv)
    # the rows as JSON writes them (metrics.jsonl is JSON: a round trip keeps every float's bits)
    got = json.loads(json.dumps(fingerprint(args.steps)))
    if args.write:
        args.write.parent.mkdir(parents=True, exist_ok=True)
        args.write.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
        n = sum(len(v) for v in got.values())
        print(f"wrote {n} rows of {len(got)} variants to {args.write}")
        return 0
    bad = compare(got, json.loads(args.check.read_text()),
                  new_keys=tuple(p for p in args.new_keys.split(",") if p))
    for line in bad:
        print("DIFFERS", line)
    n = sum(len(v) for v in got.values())
    print(f"{'identical' if not bad else 'NOT identical'}: {n} rows of {len(got)} variants against {args.check}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
