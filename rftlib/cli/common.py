"""What several verbs share: ``--set`` parsing, running train.ipynb under papermill, the report line.

It imports papermill (through rftlib.report.publish): the verbs that answer at once (status, note, stop,
attach, index) do not import it.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from rftlib.attempts import claim_attempt_dir, run_dir_path, runs_root as resolve_runs
from rftlib.config import make_config, value_from_text
from rftlib.report import publish
from rftlib.report.index import reports_dir_for
from rftlib.notebooks import NOTEBOOK_PARAMS, preset_overrides

REPO = Path(__file__).resolve().parent.parent.parent
TRAIN_NB = REPO / "notebooks" / "train.ipynb"


def parse_sets(items: list[str]) -> dict[str, Any]:
    """NAME=VALUE pairs, each value typed as the field wants (rftlib.config.value_from_text)."""
    out = {}
    for it in items:
        if "=" not in it:
            raise SystemExit(f"--set expects NAME=VALUE, got {it!r}")
        k, v = it.split("=", 1)
        out[k.strip()] = value_from_text(k.strip(), v)
    return out


def add_preset_and_sets(parser, default_preset: str = "default") -> None:
    """``-p/--preset`` and repeatable ``--set NAME=VALUE``: what every verb that resolves a config takes."""
    parser.add_argument("-p", "--preset", default=default_preset)
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")


def config_overrides(params: dict[str, Any]) -> dict[str, Any]:
    """The RunConfig fields among ``--set`` values: train.ipynb's own parameters (NOTEBOOK_PARAMS: preset,
    skip_preflight, nproc, ...) go to the notebook, not the config, so ``--set skip_preflight=True`` (the LR
    preflight's advice) works from the shell as it does in the notebook and with papermill's ``-p``. A
    ``--set overrides={...}`` dict joins them as the notebook joins it (rftlib.notebooks.preset_overrides), but
    a ``--set NAME=None`` is kept: from the shell it sets the field to None, it is not "not given"."""
    sets = {k: v for k, v in params.items() if k not in NOTEBOOK_PARAMS}
    named = {k: v for k, v in sets.items() if v is not None}
    return {**preset_overrides(params.get("overrides"), **named), **sets}


def run_notebook(parameters: dict[str, Any], *, runs_root: str | None = None) -> tuple[Path, dict]:
    """Execute notebooks/train.ipynb with papermill into the attempt's run directory."""
    params = dict(parameters)
    params.setdefault("live_view", False)
    if params.get("resume"):
        run_dir = run_dir_path(params["resume"])
        params["resume"] = str(run_dir)
        out_nb = run_dir / f"notebook-resume-{time.strftime('%Y%m%d-%H%M%S')}.ipynb"
    else:
        # resolve now (fails fast on a bad parameter, before a kernel starts) to name the run dir
        cfg = make_config(params.get("preset", "default"), config_overrides(params))
        root = resolve_runs(runs_root or cfg.runs_root)
        params["runs_root"] = str(root)  # the kernel resolves the same root (explicit beats $RFTLIB_RUNS)
        if params.get("attempt_id"):
            run_dir = root / params["attempt_id"]
            run_dir.mkdir(parents=True, exist_ok=False)
        else:  # the next number, this process's alone (two rft train at once get two directories)
            run_dir = claim_attempt_dir(root, cfg.name)
            params["attempt_id"] = run_dir.name
        out_nb = run_dir / "notebook.ipynb"
    with headless_env():
        publish.run_papermill(TRAIN_NB, out_nb, params, log_output=True, stdout_file=sys.stdout,
                              stderr_file=sys.stderr)
    summary = json.loads((run_dir / "summary.json").read_text())
    return run_dir, summary


@contextlib.contextmanager
def headless_env():
    """RFTLIB_HEADLESS=1 for the kernels papermill starts from here: the notebook takes the text path
    (one line per step, static figures) without having to guess (rftlib.workbench.headless_kernel)."""
    old = os.environ.get("RFTLIB_HEADLESS")
    os.environ["RFTLIB_HEADLESS"] = "1"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("RFTLIB_HEADLESS", None)
        else:
            os.environ["RFTLIB_HEADLESS"] = old


def report_line(run_dir: Path) -> str:
    """``[rft] report: <html>`` when the attempt has a report, else ""."""
    html = reports_dir_for(run_dir.resolve().parent) / f"{run_dir.name}.html"
    return f"[rft] report: {html}" if html.exists() else ""
