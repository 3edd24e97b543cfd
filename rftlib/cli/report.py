"""``rft report RUN_DIR [--baseline DIR]``: notebooks/analysis.ipynb for the attempt -> reports/<id>.html."""

from __future__ import annotations

from rftlib.report.publish import write_report


def add_arguments(rp) -> None:
    rp.add_argument("run_dir", nargs="+")
    rp.add_argument("--baseline", default=None, help="a run directory to diff the config against")
    rp.add_argument("--out", default=None, help="reports directory (default: reports/ beside the runs root)")


def run(args) -> int:
    for run_dir in args.run_dir:
        print(f"[rft] report: {write_report(run_dir, args.out, baseline_attempt=args.baseline)}")
    return 0
