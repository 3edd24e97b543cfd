"""A refusal's advice works where it is printed.

The LR preflight ended with "(pass skip_preflight=True to launch anyway)", and
``rft train -p tiny --set num_steps=1 --set skip_preflight=True`` answered "unknown parameter
'skip_preflight'". Each refusal that names a remedy is followed here from the place a user meets it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rftlib import cli

REPO = Path(__file__).resolve().parents[1]
# a schedule the LR preflight refuses (it never warms up within 20 optimizer steps), on the tiny model
REFUSED = {"num_steps": "100", "warmup_ratio": "0.9"}


def _sets(d: dict[str, str]) -> list[str]:
    return [a for k, v in d.items() for a in ("--set", f"{k}={v}")]


def test_rft_train_passes_skip_preflight_to_the_notebook_not_the_config(tmp_path, monkeypatch):
    seen = {}

    def execute(nb, out, parameters, **kw):  # the kernel is not started: what papermill would get is read
        seen.update(parameters)
        raise RuntimeError("stop here")

    import papermill

    monkeypatch.setattr(papermill, "execute_notebook", execute)
    with pytest.raises(RuntimeError, match="stop here"):
        cli.main(["train", "-p", "tiny", "--set", "num_steps=1", "--set", "skip_preflight=True",
                  "--set", f"runs_root={tmp_path / 'runs'}"])
    assert seen["skip_preflight"] is True and seen["num_steps"] == 1


def test_rft_train_after_a_one_rank_group_in_the_same_process_is_no_torchrun_rank(tmp_path, monkeypatch):
    """A one-rank DeepSpeed attempt earlier in this process (a notebook kernel's, a test worker's) leaves the
    rendezvous variables init_dist set (LOCAL_RANK, WORLD_SIZE). `rft train` read them as "a torchrun rank" and
    ended the process in exit_rank's os._exit: an xdist worker died so, inside this file. init_dist marks its own."""
    from rftlib.train.dist import ONE_RANK_ENV, started_as_a_rank, without_group_env

    mine = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_PORT": "1234", ONE_RANK_ENV: "1"}
    assert not started_as_a_rank(mine)
    assert started_as_a_rank({k: v for k, v in mine.items() if k != ONE_RANK_ENV})  # another launcher's
    assert started_as_a_rank({**mine, "TORCHELASTIC_RUN_ID": "x"})  # torchrun's, whatever else is set
    assert not set(without_group_env(mine))  # a child starts without them, the mark included
    for k, v in mine.items():
        monkeypatch.setenv(k, v)
    test_rft_train_passes_skip_preflight_to_the_notebook_not_the_config(tmp_path, monkeypatch)  # reaches papermill


def test_rft_ab_takes_skip_preflight_too():
    from rftlib.ab import plan_variants

    vs = plan_variants("tiny", {"skip_preflight": True, "num_steps": 1}, [("eps_clip", [0.1, 0.2])])
    assert [v.config.eps_clip for v in vs] == [0.1, 0.2]


def test_the_preflight_refusal_from_rft_and_its_advice_followed(tmp_path):
    """From a shell: the refusal is one error line (not papermill's traceback) naming the --set form, and
    that very form launches the attempt."""
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", RFTLIB_RUNS=str(tmp_path / "runs"))
    refused = subprocess.run([sys.executable, "-m", "rftlib.cli", "train", "-p", "tiny", *_sets(REFUSED)],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "rft: error: LR preflight refused the launch" in refused.stderr
    advice = re.search(r"`rft train \.\.\. (--set skip_preflight=True)`", refused.stderr)
    assert advice, refused.stderr[-2000:]
    ok = subprocess.run([sys.executable, "-m", "rftlib.cli", "train", "-p", "tiny", *_sets(REFUSED),
                         "--set", "stop_after_steps=1", *advice.group(1).split(" ", 1)],
                        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert len(list((tmp_path / "runs").glob("attempt-*-tiny/summary.json"))) == 1


def test_the_preflight_refusal_names_the_notebook_and_papermill_forms_that_exist():
    from rftlib.config import ConfigError
    from rftlib.notebooks import NOTEBOOK_PARAMS
    from rftlib.workbench import start

    with pytest.raises(ConfigError) as e:
        start({"preset": "tiny", "num_steps": 100, "warmup_ratio": 0.9, "runs_root": "/nonexistent/runs"})
    msg = str(e.value)
    assert "skip_preflight = True" in msg and "-p skip_preflight True" in msg
    assert "skip_preflight" in NOTEBOOK_PARAMS  # the name the notebook and papermill take


def test_the_code_rewards_sandbox_refusal_names_only_what_a_run_can_do(monkeypatch):
    from rftlib.rewards import code
    from rftlib.rewards.sandbox import SandboxUnavailable

    def no_bwrap(*a, **kw):
        raise SandboxUnavailable("no sandbox: bwrap not found. ...; or pass allow_unsandboxed=True to run it in a "
                                 "plain subprocess", "bwrap not found")

    monkeypatch.setattr(code, "Sandbox", no_bwrap)
    monkeypatch.setattr(code, "_DEFAULT", [])
    with pytest.raises(SandboxUnavailable) as e:
        code.default_sandbox()
    assert "bwrap not found" in str(e.value) and "scripts/setup_sandbox.sh" in str(e.value)
    assert "allow_unsandboxed" not in str(e.value)  # no config field, notebook parameter or flag reaches it
