"""notebooks/train.ipynb under papermill, as users run it: parameters injected, unknown ones refused."""

import json

import nbformat
import papermill as pm
import pytest
import yaml

from rftlib.notebooks import train_notebook
from rftlib.workbench import collect, parameters_cell

NB = "notebooks/train.ipynb"


def test_committed_template_is_in_sync_and_clean():
    nb = nbformat.read(NB, as_version=4)
    params = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(params) == 1 and params[0].source == parameters_cell()
    assert [c.source for c in nb.cells] == [c.source for c in train_notebook().cells]
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code")


def test_papermill_eps_clip_reaches_saved_config_and_metrics(tmp_path):
    out = tmp_path / "out.ipynb"
    pm.execute_notebook(NB, str(out), parameters={"preset": "tiny", "eps_clip": 0.1, "num_steps": 2,
                                                  "runs_root": str(tmp_path / "runs"), "live_view": False},
                        cwd=".", progress_bar=False, kernel_name="python3")
    (run_dir,) = list((tmp_path / "runs").iterdir())
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["config"]["eps_clip"] == 0.1 and saved["config"]["model"] == "tiny"
    assert saved["provenance"]["git_sha"]
    rows = [json.loads(x) for x in (run_dir / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("eps_clip_low") for r in rows[1:]] == [0.1, 0.1]  # what the loss was called with
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 2


def test_unknown_notebook_parameter_is_refused(tmp_path):
    with pytest.raises(pm.PapermillExecutionError, match=r"unknown notebook parameter 'eps_clp' \(did you mean eps_clip"):
        pm.execute_notebook(NB, str(tmp_path / "o.ipynb"), parameters={"preset": "tiny", "eps_clp": 0.1},
                            cwd=".", progress_bar=False, kernel_name="python3")


def test_collect_splits_and_ignores_notebook_internals():
    import math

    ns = {"preset": "tiny", "eps_clip": 0.1, "beta": None, "math": math, "In": [], "_x": 1}
    nb, over = collect(ns)
    assert nb["preset"] == "tiny" and over == {"eps_clip": 0.1}


def test_lr_preflight_refuses_a_schedule_that_never_warms_up(tmp_path):
    from rftlib.config import ConfigError
    from rftlib.workbench import start

    ns = {"preset": "tiny", "num_steps": 100, "warmup_ratio": 0.9, "runs_root": str(tmp_path)}
    with pytest.raises(ConfigError, match=r"LR preflight refused the launch: LR after 20 optimizer steps \(the LR of step 21\) is .* \(< 30%\)"):
        start(ns)
    assert not list(tmp_path.iterdir())  # nothing created for a refused launch
    run = start({**ns, "skip_preflight": True})
    assert run.run_dir.exists()
