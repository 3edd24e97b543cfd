"""Where a launched attempt goes: ``rft launch`` from any working directory, and with
``RFTLIB_RUNS`` set, tells the trainer the directory it created the attempt in.

It once built the trainer's ``--run-dir`` from ``runs_root`` relative to the working directory while
``create_attempt`` wrote under the resolved runs root, so a launch.ipynb kernel (working directory
notebooks/) crashed every time: "No such file or directory: .../config.yaml".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import yaml

from rftlib.launch import supervise

REPO = Path(__file__).resolve().parents[1]


def _fake_popen(started: list):
    class FakePopen:  # the supervisor is not started: the test reads what it would have been given
        def __init__(self, cmd, **kw):
            started.append((cmd, kw))
            self.pid = 2 ** 22 + 1

    return types.SimpleNamespace(Popen=FakePopen, DEVNULL=subprocess.DEVNULL, STDOUT=subprocess.STDOUT)


def test_launch_from_another_directory_with_rftlib_runs_plans_the_attempts_own_directory(tmp_path, monkeypatch):
    runs = tmp_path / "data" / "runs"
    cwd = tmp_path / "notebooks"
    cwd.mkdir()
    monkeypatch.setenv("RFTLIB_RUNS", str(runs))
    monkeypatch.chdir(cwd)
    started: list = []
    monkeypatch.setattr(supervise, "subprocess", _fake_popen(started))
    run_dir = supervise.launch("tiny", {"num_steps": 2}, write=lambda s: None)
    assert run_dir == runs / "attempt-01-tiny"
    assert (run_dir / "config.yaml").exists()
    plan = json.loads((run_dir / "plan.json").read_text())
    assert Path(plan["run_dir"]) == run_dir
    (trainer,) = [p for p in plan["processes"] if p["role"] == "trainer"]
    told = Path(trainer["cmd"][trainer["cmd"].index("--run-dir") + 1])
    assert told.is_absolute() and told == run_dir and (told / "config.yaml").exists()
    assert str(run_dir / "logs") in (run_dir / "commands.sh").read_text()
    (sup_cmd, _), = started
    assert Path(sup_cmd[-1]) == run_dir
    assert not (cwd / "runs").exists()  # nothing under the working directory

    # a second launch from here takes the next number
    assert supervise.launch("tiny", {"num_steps": 2}, write=lambda s: None) == runs / "attempt-02-tiny"


def test_a_refused_launch_leaves_no_attempt_directory(tmp_path, monkeypatch):
    from rftlib.launch.plan import LaunchError

    monkeypatch.setenv("RFTLIB_RUNS", str(tmp_path / "runs"))
    monkeypatch.setattr(supervise, "subprocess", _fake_popen([]))
    try:  # 3 trainer ranks cannot share a rollout of 4 prompts: the plan check refuses before anything starts
        supervise.launch("tiny", {"backend": "ddp", "train_ranks": 3}, write=lambda s: None)
    except LaunchError:
        pass
    else:
        raise AssertionError("the launch was not refused")
    runs = tmp_path / "runs"
    assert not runs.exists() or list(runs.iterdir()) == []


def test_launch_notebook_kernel_in_notebooks_dir_trains_to_the_end(tmp_path):
    """launch.ipynb executed with its kernel in notebooks/ (JupyterLab's working directory for it) and
    RFTLIB_RUNS set: the detached attempt trains to its end and finishes, its plan naming its own directory."""
    runs = tmp_path / "runs"
    out = tmp_path / "launch-out.ipynb"
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", RFTLIB_RUNS=str(runs))
    p = subprocess.run([sys.executable, "-m", "papermill", str(REPO / "notebooks" / "launch.ipynb"), str(out),
                        "-p", "preset", "tiny", "-p", "dry_run", "False", "-y",
                        yaml.safe_dump({"overrides": {"num_steps": 2}}), "-k", "python3",
                        "--cwd", str(REPO / "notebooks")],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    run_dir = runs / "attempt-01-tiny"
    deadline = time.time() + 600
    status = {}
    while time.time() < deadline:
        status = json.loads((run_dir / "control" / "status.json").read_text())
        if status.get("state") not in ("starting", "running"):
            break
        time.sleep(1)
    assert status.get("state") == "finished", (status, (run_dir / "logs" / "trainer.log").read_text()[-3000:])
    assert Path(json.loads((run_dir / "plan.json").read_text())["run_dir"]) == run_dir
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 2
    assert not (REPO / "notebooks" / "runs").exists()
