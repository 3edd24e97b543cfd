"""``rft index [--runs runs] [--out reports]``: reports/index.html, rebuilt from the run directories."""

from __future__ import annotations

from rftlib.attempts import runs_root as resolve_runs
from rftlib.report.attempt import list_attempts
from rftlib.report.index import write_index


def add_arguments(i) -> None:
    i.add_argument("--runs", default=None, help="runs root (default: $RFTLIB_RUNS, else <project root>/runs)")
    i.add_argument("--out", default=None, help="default: reports/ beside --runs")
    i.add_argument("--baseline", default=None, help="attempt id the config differences are taken against")


def run(args) -> int:
    runs = resolve_runs(args.runs)
    path = write_index(runs, args.out, baseline=args.baseline)
    print(f"[rft] index of {len(list_attempts(runs))} attempt(s) in {runs}: {path}")
    return 0
