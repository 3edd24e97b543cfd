"""``rft note RUN_DIR "text" [--no-report]``: append a dated conclusion to an attempt; its report and the index
show it. Light: only rebuilding an existing HTML report imports papermill/nbconvert."""

from __future__ import annotations

from pathlib import Path

from rftlib.attempts import run_dir_path
from rftlib.report.attempt import add_note
from rftlib.report.index import reports_dir_for, write_index


def add_arguments(no) -> None:
    no.add_argument("run_dir", help="the attempt's run directory (e.g. runs/attempt-03-default)")
    no.add_argument("text", help="what the attempt taught you and what to try next")
    no.add_argument("--out", default=None, help="reports directory (default: reports/ beside the runs root)")
    no.add_argument("--no-report", action="store_true", help="only rebuild the index, not the attempt's report")


def run(args) -> int:
    """Append the conclusion, then rebuild the index (and the attempt's report when it has one)."""
    run_dir = run_dir_path(args.run_dir)
    note = add_note(run_dir, args.text)
    print(f"[rft] note {note['date']} -> {run_dir / 'notes.jsonl'}")
    out = Path(args.out) if args.out else reports_dir_for(run_dir.parent)
    if not args.no_report and (out / f"{run_dir.name}.html").exists():
        from rftlib.report.publish import write_report  # the report notebook: papermill + nbconvert

        print(f"[rft] report: {write_report(run_dir, out)}")
    else:
        print(f"[rft] index: {write_index(run_dir.parent, out)}")
    return 0
