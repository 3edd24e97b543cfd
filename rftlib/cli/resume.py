"""``rft resume RUN_DIR --additional-steps K``: continue an attempt from its step_latest, through the notebook."""

from __future__ import annotations

import sys

from papermill.exceptions import PapermillExecutionError

from rftlib.attempts import AttemptLockedError, ensure_unlocked, run_dir_path
from rftlib.cli.common import report_line, run_notebook
from rftlib.workbench import result_text


def add_arguments(r) -> None:
    r.add_argument("run_dir")
    r.add_argument("--additional-steps", type=int, required=True)


def run(args) -> int:

    try:
        ensure_unlocked(run_dir_path(args.run_dir))  # say so before a kernel starts
        run_dir, summary = run_notebook({"resume": str(args.run_dir), "additional_steps": args.additional_steps})
    except (AttemptLockedError, PapermillExecutionError) as e:
        # refused before a kernel started, or by the kernel's Trainer (another one took the attempt in between)
        if isinstance(e, PapermillExecutionError) and e.ename != AttemptLockedError.__name__:
            raise
        print(f"rft: error: {e if isinstance(e, AttemptLockedError) else e.evalue}", file=sys.stderr)
        return 2
    print(f"[rft] {run_dir}: " + result_text(summary))
    if line := report_line(run_dir):
        print(line)
    return 0
