"""A replay and the views that show it: rftlib.train.replay runs and saves a replay; the step's inspector pages and
the attempt's report read it, and stayed stale until ``rft report`` ran again (issue 43, item 8). This module
sits above both the record views (rftlib.report.record_view, which imports the replay) and the report writer
(rftlib.report.publish, which imports the record views where it writes inspector pages), so that neither
imports the other and the trainer's layer imports no report: ``rft replay`` and replay.ipynb call
:func:`replay_and_refresh`.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from rftlib.attempts import run_dir_path
from rftlib.monitor import records
from rftlib.report import publish
from rftlib.report.index import reports_dir_for
from rftlib.report.inspect import write_page
from rftlib.report.record_view import build_view, newest_recorded_attempt
from rftlib.train.replay import ReplayResult, replay


def replay_and_refresh(run_dir: str | Path, step: int, counterfactuals: list[dict[str, Any]] | None = None, *,
                       weights: str = "auto", nproc: int | None = None, log=print) -> ReplayResult:
    """rftlib.train.replay.replay (saved), then :func:`refresh_after_replay` of its step."""
    res = replay(run_dir, step, counterfactuals, weights=weights, nproc=nproc)
    refresh_after_replay(run_dir, res.step, log=log)
    return res


def refresh_after_replay(run_dir: str | Path, step: int, *, log=print) -> list[Path]:
    """What shows a replay's verdict, brought up to date once a replay is written (it stayed stale until
    ``rft report`` ran again): the step's inspector pages that exist (beside the record, and in the attempt's
    report directory) are written again, and the attempt's report, when it has one, is written again (its
    records table shows each step's latest replay). Returns the pages and report written."""
    run_dir = Path(run_dir)
    out = []
    reports = reports_dir_for(run_dir.resolve().parent)
    pages = [records.record_dir(run_dir, step) / "inspector.html", reports / run_dir.name / f"step-{step}.html"]
    pages = [p for p in pages if p.exists()]
    try:  # the replay is written whatever happens here: a view that cannot be built is said, not raised
        if pages:
            view = build_view(run_dir, step)
            out += [write_page(view, p) for p in pages]
        if (reports / f"{run_dir.name}.html").exists():
            out.append(publish.write_report(run_dir, reports, index=True))
    except Exception as e:
        warnings.warn(f"{run_dir}: the replay of step {step} is written, but its views were not refreshed "
                      f"({type(e).__name__}: {e}); rft report {run_dir} writes them")
    for p in out:
        log(f"[rft] refreshed {p}")
    return out



def run(run_dir: str | Path, step: int | None = None, counterfactuals: list[dict] | None = None,
        weights: str = "auto"):
    """Replay (rftlib.train.replay.replay) the given step, or the latest recorded one, and refresh its views
    (replay.ipynb's call)."""
    run_dir = run_dir_path(str(run_dir)) if run_dir else newest_recorded_attempt()
    if step is None:
        have = records.list_records(run_dir)
        if not have:
            raise FileNotFoundError(f"{run_dir}: no recorded step (records/ is empty; record_batches sets which)")
        step = have[-1]
    return replay_and_refresh(run_dir, step, counterfactuals or [], weights=weights)
