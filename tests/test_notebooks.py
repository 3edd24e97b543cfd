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


def _parameters(nb) -> dict:
    """The names a notebook's parameters cell defines, with their values."""
    (cell,) = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    ns: dict = {}
    exec(cell.source, ns)
    return {k: v for k, v in ns.items() if not k.startswith("__")}


def test_every_notebook_takes_a_preset_and_overrides_and_none_for_the_presets_value():
    """One convention for "preset plus overrides" (rftlib.notebooks' docstring): every notebook that starts from a
    preset has ``preset`` and an ``overrides`` dict, and every RunConfig field it names is None (the preset's),
    as are the not-given controls; no "" or 0 stands for "keep the preset's"."""
    from rftlib.config import config_fields
    from rftlib.notebooks import TEMPLATES

    fields = set(config_fields())
    with_preset = {name for name, build in TEMPLATES.items() if "preset" in _parameters(build())}
    assert with_preset == {"train.ipynb", "sft.ipynb", "validate.ipynb", "launch.ipynb"}
    for name in with_preset:
        p = _parameters(TEMPLATES[name]())
        assert p["overrides"] == {}, name
        named = {k: v for k, v in p.items() if k in fields}
        assert all(v is None for v in named.values()), (name, {k: v for k, v in named.items() if v is not None})
        assert bool(named) == (name != "launch.ipynb")  # launch.ipynb names no field: overrides only
        for control in ("attempt_id", "resume", "attach", "watch_seconds"):
            assert p.get(control) is None, (name, control, p.get(control))
        assert "" not in p.values(), (name, [k for k, v in p.items() if v == ""])


def test_preset_overrides_keeps_0_false_and_empty_and_refuses_a_field_given_twice():
    from rftlib.config import ConfigError
    from rftlib.notebooks import preset_overrides

    over = preset_overrides({"beta": 0, "gradient_checkpointing": False}, num_steps=0, notes="", model=None)
    assert over == {"beta": 0, "gradient_checkpointing": False, "num_steps": 0, "notes": ""}
    assert preset_overrides(None, beta=0.0) == {"beta": 0.0}
    assert preset_overrides({"beta": 0}, beta=0) == {"beta": 0}  # the same value twice is one value
    with pytest.raises(ConfigError, match=r"beta is given twice: beta = 0.1 and overrides\['beta'\] = 0"):
        preset_overrides({"beta": 0}, beta=0.1)
    with pytest.raises(ConfigError, match="overrides must be a dict"):
        preset_overrides("beta=0")


def test_train_notebook_takes_the_overrides_dict_as_the_others_do():
    from rftlib.config import ConfigError

    nb, over = collect({"preset": "tiny", "overrides": {"beta": 0, "save_steps": 0}, "eps_clip": 0.1, "beta": None})
    assert nb["overrides"] == {"beta": 0, "save_steps": 0} and over == {"beta": 0, "save_steps": 0, "eps_clip": 0.1}
    with pytest.raises(ConfigError, match="eps_clip is given twice"):
        collect({"preset": "tiny", "overrides": {"eps_clip": 0.2}, "eps_clip": 0.1})
    # `rft train --set overrides={...}` (the CLI checks the config and, with --nproc, makes the attempt itself)
    from rftlib.cli.common import config_overrides

    assert config_overrides({"preset": "tiny", "overrides": {"beta": 0}, "eps_clip": 0.1, "nproc": 2,
                             "init_adapter": None}) == {"beta": 0, "eps_clip": 0.1, "init_adapter": None}


def test_papermill_validate_beta_0_reaches_the_config(tmp_path):
    """``-p beta 0`` on validate.ipynb is beta 0 in the attempt's config, though the preset sets 0.04 (the old
    parameters cell had no beta and read "" and 0 as "keep the preset's": beta 0 was dropped)."""
    from rftlib.rewards.sandbox import check_available

    if not check_available()[0]:
        pytest.skip(f"no sandbox here: {check_available()[1]}")
    preset = "seed002-fizzbuzz-rtx3080-tiny-cpu"
    assert yaml.safe_load(open(f"params/{preset}.yaml"))["beta"] > 0
    pm.execute_notebook("notebooks/validate.ipynb", str(tmp_path / "out.ipynb"), cwd=".", progress_bar=False,
                        kernel_name="python3", parameters={"preset": preset, "beta": 0, "num_steps": 1,
                                                           "control_steps": 0, "runs_root": str(tmp_path / "runs")})
    (run_dir,) = list((tmp_path / "runs").iterdir())
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())["config"]
    assert saved["beta"] == 0 and saved["num_steps"] == 1 and saved["model"] == "tiny"
