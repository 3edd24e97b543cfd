"""What recording a step's batch costs (issue 33): bytes per record and seconds added to the recorded step.

Runs the given preset (the embedded default by default) twice in this process, ``record_batches: [all]`` and
``[]``, each a fresh Trainer on the same seed for ``--steps`` steps (evals only at step 0 and the end, on a small
held-out set: they are outside the step rows). Reports, per recorded step: the record's bytes on disk by part
(batch tensors, the pre-update snapshot, texts, manifest), ``timing/record`` (the snapshot copy, the gather and
the atomic write: the seconds the recorder adds to the step) and its share of ``timing/step``; and, as a check
that the trace inside the update costs nothing visible, the median ``timing/update`` of each arm (their ratio;
the same steps on the same seed: the batches are identical, so the update does the same work).

    flock /tmp/torch.lock env PYTHONPATH=$PWD .venv/bin/python bench/record_cost.py            # default preset
    flock /tmp/torch.lock env PYTHONPATH=$PWD .venv/bin/python bench/record_cost.py -p tiny --steps 3

Writes bench/results/record_cost_<UTC date>.json and prints the table. No test asserts these numbers.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

from rftlib.config import make_config
from rftlib.monitor import records
from rftlib.monitor.metrics import read_metrics
from rftlib.train.loop import Trainer


def part_bytes(d: Path) -> dict[str, int]:
    """A record's bytes by part."""
    size = {"batch": (d / "batch.safetensors").stat().st_size, "texts": (d / "texts.json").stat().st_size,
            "manifest": (d / "manifest.json").stat().st_size,
            "snapshot": sum(p.stat().st_size for p in (d / "start").rglob("*") if p.is_file())}
    size["total"] = sum(size.values())
    return size


def run(preset: str, steps: int, mode: list, root: Path) -> tuple[Path, list[dict]]:
    cfg = make_config(preset, {"runs_root": str(root), "num_steps": steps, "eval_steps": 0, "eval_size": 8,
                               "save_steps": 0, "record_batches": mode, "record_on_spike": False,
                               "name": f"record-{'all' if mode else 'none'}", "report_to": []})
    tr = Trainer(cfg, progress=False)
    tr.train()
    tr.close()
    return tr.run_dir, [r for r in read_metrics(tr.run_dir) if "loss" in r]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-p", "--preset", default="default")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="record-cost-"))
    rec_dir, rec_rows = run(a.preset, a.steps, ["all"], root)
    off_dir, off_rows = run(a.preset, a.steps, [], root)
    per_step = []
    for r in rec_rows:
        d = records.record_dir(rec_dir, r["step"])
        b = part_bytes(d)
        per_step.append({"step": r["step"], **{f"bytes/{k}": v for k, v in b.items()},
                         "timing/record": r.get("timing/record", 0.0), "timing/step": r["timing/step"],
                         "share": r.get("timing/record", 0.0) / r["timing/step"]})
    upd_rec = statistics.median(r["timing/update"] for r in rec_rows)
    upd_off = statistics.median(r["timing/update"] for r in off_rows)
    same = [x["loss"] for x in rec_rows] == [x["loss"] for x in off_rows]
    print(f"{a.preset}: {a.steps} steps, {platform.processor() or platform.machine()}")
    print(f"{'step':>4} {'total MB':>9} {'batch KB':>9} {'snapshot MB':>12} {'texts KB':>9} {'manifest KB':>12} "
          f"{'record s':>9} {'step s':>8} {'share':>7}")
    for x in per_step:
        print(f"{x['step']:>4} {x['bytes/total'] / 1e6:>9.2f} {x['bytes/batch'] / 1e3:>9.1f} "
              f"{x['bytes/snapshot'] / 1e6:>12.2f} {x['bytes/texts'] / 1e3:>9.1f} {x['bytes/manifest'] / 1e3:>12.1f} "
              f"{x['timing/record']:>9.3f} {x['timing/step']:>8.2f} {x['share']:>7.2%}")
    print(f"median timing/update: recorded {upd_rec:.2f} s, not recorded {upd_off:.2f} s (ratio {upd_rec / upd_off:.3f}); "
          f"losses identical in both arms: {same}")
    out = Path(a.out or Path(__file__).parent / "results" / f"record_cost_{time.strftime('%Y-%m-%d', time.gmtime())}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"preset": a.preset, "steps": a.steps, "per_step": per_step, "update_median": {
        "recorded": upd_rec, "not_recorded": upd_off}, "losses_identical": same,
        "cpu": platform.processor() or platform.machine()}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
