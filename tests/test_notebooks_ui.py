"""notebooks/train.ipynb as a researcher meets it: papermill started from another
directory with the kernel's working directory elsewhere (as a JupyterLab kernel in notebooks/ is),
no rftlib runner setting RFTLIB_HEADLESS. The attempt must land in the one runs root, the executed
notebook must hold one text line per step (not a widget) and the plot cell's PNG."""

import json
import os
from pathlib import Path

import nbformat
import papermill as pm
import pytest

from rftlib.attempts import create_attempt, next_attempt_id, project_root, reports_root, runs_root
from rftlib.config import make_config
from rftlib.report.index import reports_dir_for

REPO = Path(__file__).resolve().parent.parent
NB = REPO / "notebooks" / "train.ipynb"
WIDGET = "application/vnd.jupyter.widget-view+json"


# ---- item 1: one runs root, one numbering --------------------------------------------------------
def test_default_runs_root_is_the_project_roots_whatever_the_cwd(tmp_path, monkeypatch):
    monkeypatch.delenv("RFTLIB_RUNS", raising=False)
    monkeypatch.delenv("RFTLIB_REPORTS", raising=False)
    monkeypatch.chdir(tmp_path)  # a kernel started in some other directory (notebooks/ in JupyterLab)
    assert runs_root("runs") == REPO / "runs" == runs_root(None)
    assert runs_root("elsewhere/r") == REPO / "elsewhere" / "r"  # relative: from the project root, not the cwd
    assert runs_root(tmp_path / "abs") == tmp_path / "abs"
    assert reports_root() == REPO / "reports" == reports_dir_for("runs")
    assert project_root() == REPO


def test_rftlib_runs_env_moves_every_attempt_and_its_reports(tmp_path, monkeypatch):
    nbdir = tmp_path / "notebooks"
    nbdir.mkdir()
    monkeypatch.chdir(nbdir)
    monkeypatch.setenv("RFTLIB_RUNS", str(tmp_path / "shared-runs"))
    monkeypatch.delenv("RFTLIB_REPORTS", raising=False)
    cfg = make_config("tiny", {})  # runs_root left at its default "runs"
    first = create_attempt(cfg)
    assert first == tmp_path / "shared-runs" / "attempt-01-tiny"
    # the next attempt from anywhere (the shell's rft, another kernel) continues the same numbering
    monkeypatch.chdir(tmp_path)
    assert next_attempt_id("runs", "tiny") == "attempt-02-tiny"
    assert reports_dir_for(first.parent) == tmp_path / "reports"
    assert not (nbdir / "runs").exists() and not (nbdir / "reports").exists()


# ---- items 1-3 through papermill, from another directory ----------------------------------------
@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    """train.ipynb (tiny preset, 2 steps) executed by papermill with the kernel's cwd in a scratch
    notebooks/ dir and RFTLIB_RUNS pointing at a scratch runs root. No RFTLIB_HEADLESS: the kernel
    must find out that it is headless by itself."""
    tmp = tmp_path_factory.mktemp("pm")
    kernel_cwd = tmp / "notebooks"
    kernel_cwd.mkdir()
    env = {"RFTLIB_RUNS": str(tmp / "runs"), "RFTLIB_REPORTS": str(tmp / "reports")}
    old = {k: os.environ.get(k) for k in [*env, "RFTLIB_HEADLESS"]}
    os.environ.update(env)
    os.environ.pop("RFTLIB_HEADLESS", None)
    try:
        out = tmp / "out.ipynb"
        pm.execute_notebook(str(NB), str(out), parameters={"preset": "tiny", "num_steps": 2},
                            cwd=str(kernel_cwd), progress_bar=False, kernel_name="python3")
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return tmp, kernel_cwd, nbformat.read(str(out), as_version=4)


def _cell(nb, needle):
    (cell,) = [c for c in nb.cells if c.cell_type == "code" and needle in c.source]
    return cell


def test_papermill_attempt_lands_in_the_runs_root_not_the_kernels_cwd(executed):
    tmp, kernel_cwd, nb = executed
    (run_dir,) = list((tmp / "runs").iterdir())
    assert run_dir.name == "attempt-01-tiny"
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 2
    assert (tmp / "reports" / "attempt-01-tiny.html").exists() and (tmp / "reports" / "index.html").exists()
    assert list(kernel_cwd.iterdir()) == []  # no notebooks/runs, no notebooks/reports
    assert not (REPO / "notebooks" / "runs").exists() and not (REPO / "notebooks" / "reports").exists()


def test_papermill_output_shows_the_plot_cells_figure(executed):
    _, _, nb = executed
    cell = _cell(nb, "wb.plot_run(")
    pngs = [o for o in cell.outputs if "image/png" in o.get("data", {})]
    assert len(pngs) == 1 and len(pngs[0]["data"]["image/png"]) > 1000


def test_papermill_kernel_takes_the_text_path(executed):
    _, _, nb = executed
    cell = _cell(nb, "wb.train(run)")
    text = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream" and o.name == "stdout")
    assert "[rft] step 0 baseline" in text
    assert "[rft] step 1/2" in text and "[rft] step 2/2" in text  # one line per step
    assert not any(WIDGET in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))


# ---- issue 19 item 13: a time budget; the verdicts shown once under the live panel ---------------
def test_time_budget_stops_with_a_checkpoint_and_says_why(tiny_cfg):
    from rftlib.config import ConfigError
    from rftlib.train import checkpoint as ckpt
    from rftlib.train.loop import Trainer

    # 1e-9 min = 60 ns: over once the first step has ended, on any machine; step 2 never runs
    tr = Trainer(tiny_cfg(num_steps=3, save_steps=0, max_train_minutes=1e-9), progress=False)
    try:
        summary = tr.train()
    finally:
        tr.close()
    assert summary["steps"] == 1
    assert summary["stop_reason"] == "time budget spent: max_train_minutes=1e-09 reached at step 1"
    assert ckpt.list_steps(tr.run_dir) == [1]  # save_steps 0: the stop's own checkpoint
    assert json.loads((tr.run_dir / "summary.json").read_text())["stop_reason"] == summary["stop_reason"]
    with pytest.raises(ConfigError, match="max_train_minutes=0.0: a positive number of minutes, or None"):
        make_config("tiny", {"max_train_minutes": 0})


def test_health_lines_only_where_no_view_shows_the_verdicts(tiny_cfg, capsys, task_with):
    from rftlib.report.live import LiveView, TextView
    from rftlib.train.loop import Trainer

    # every completion scores 0 (set here, not left to the random tiny model, whose samples change with its
    # version and the CPU's kernels): every advantage is 0, so learning_signal FAILs at step 2
    def run(make_view):
        cfg = tiny_cfg(num_steps=2, save_steps=0)
        run_dir = create_attempt(cfg)
        view = make_view(cfg, run_dir)
        tr = Trainer(cfg, run_dir, progress=False, callbacks=[view.update],
                     task=task_with(cfg, lambda text, ex, truncated: (0.0, {"correctness": 0.0})))
        try:
            tr.train()
        finally:
            tr.close()
        return view, capsys.readouterr().out

    live, out = run(lambda cfg, d: LiveView(cfg, run_dir=d, display_now=False))
    assert "learning_signal" in live.health.value  # the panel shows it ...
    assert "[health step" not in out  # ... and no text copy is printed under it
    _, out = run(lambda cfg, d: TextView(cfg, every=1, write=print, health=False))  # papermill's text path
    assert "[health step 2] FAIL learning_signal" in out
