"""``rft compare RUN_A RUN_B [...]``: notebooks/compare.ipynb -> reports/compare-<A>-vs-<B>.html."""

from __future__ import annotations

from rftlib.report.compare import load_all, summary_text
from rftlib.report.publish import write_compare


def add_arguments(c) -> None:
    c.add_argument("run_dirs", nargs="+")
    c.add_argument("--out", default=None)


def run(args) -> int:
    print(summary_text(load_all(args.run_dirs)))
    print(f"[rft] comparison: {write_compare(args.run_dirs, args.out)}")
    return 0
