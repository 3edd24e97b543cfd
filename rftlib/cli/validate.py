"""``rft validate [-p seed002-...-cpu]``: seed 002's loop validation through notebooks/validate.ipynb."""

from __future__ import annotations

import sys
from pathlib import Path

from rftlib.attempts import claim_attempt_dir, runs_root as resolve_runs
from rftlib.cli.common import headless_env, parse_sets
from rftlib.config import make_config
from rftlib.report import publish, register_tasks
from rftlib.report.index import reports_dir_for, write_index


def add_arguments(v) -> None:
    v.add_argument("-p", "--preset", default="seed002-fizzbuzz-rtx3080-cpu")
    v.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="a RunConfig field over the preset (model, task, num_steps, beta, notes, runs_root, ...)")
    v.add_argument("--control-steps", type=int, default=None)
    v.add_argument("--out", default=None, help="reports directory (default: reports/ beside the runs root)")
    v.add_argument("--no-report", action="store_true", help="skip reports/<attempt-id>.html and the index")


def run(args) -> int:
    """notebooks/validate.ipynb under papermill; the executed notebook lands in the attempt's run dir."""
    register_tasks()
    sets = parse_sets(args.set)
    cfg = make_config(args.preset, sets)  # fails fast, before a kernel starts
    root = resolve_runs(sets.get("runs_root") or cfg.runs_root)
    attempt_id = claim_attempt_dir(root, cfg.name).name
    named = ("model", "task", "num_steps", "beta", "notes")  # the notebook's named fields; every other --set is an override
    params = {"preset": args.preset, "runs_root": str(root), "attempt_id": attempt_id,
              **{k: v for k, v in sets.items() if k in named},
              "overrides": {k: v for k, v in sets.items() if k not in named and k != "runs_root"}}
    if args.control_steps is not None:
        params["control_steps"] = args.control_steps
    out_nb = root / attempt_id / "notebook.ipynb"
    try:
        with headless_env():
            publish.run_papermill(publish.NOTEBOOKS / "validate.ipynb", out_nb, params, log_output=True,
                                  stdout_file=sys.stdout, stderr_file=sys.stderr)
    finally:
        print(f"[rft] executed notebook: {out_nb}")
    if not args.no_report:  # the executed validation notebook is this attempt's report
        out = Path(args.out) if args.out else reports_dir_for(root)
        html = publish.to_html(out_nb, out / f"{attempt_id}.html", title=f"{attempt_id} loop validation")
        write_index(root, out)
        print(f"[rft] report: {html}")
    return 0
