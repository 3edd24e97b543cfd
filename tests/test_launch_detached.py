"""Detached attempts (rftlib.launch.supervise/status): the tiny preset on 2 CPU ranks under DDP, launched from the
CLI (`rft launch -p`): a planted crash of rank 1 (tests/launch_crash/sitecustomize.py) stops rank 0 and is reported
by attach and in control/status.json; the supervisor stops the engines when the trainer dies. No timing
assertions: every wait is a poll with a generous deadline.

The notebook launch (launch.ipynb under papermill: the kernel exits while the attempt runs on, `rft attach`,
`rft stop`, `rft launch --resume`, `rft status`) is tested on seed 003's a28b rehearsal in test_launch_rehearsal.py,
which starts the same supervisor, torchrun and ranks (issue 41: one launch instead of two).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from rftlib.launch.supervise import pid_alive, supervise

REPO = Path(__file__).resolve().parents[1]
# far more steps than the test lets run: the attempt must still be running when `rft stop` arrives, however
# fast this machine trains the tiny model and however long the CLI takes to start (it imports the whole stack)
TINY_DDP = {"backend": "ddp", "train_ranks": 2, "num_steps": 5000, "save_steps": 1, "max_ckpt_num": 2}


def env(**extra: str) -> dict[str, str]:
    e = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", **extra)
    return e


def rft(*args: str, timeout: int = 600, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rftlib.cli", *args], cwd=REPO, env=env(**extra),
                          capture_output=True, text=True, timeout=timeout)


def steps(run_dir: Path) -> list[int]:
    p = run_dir / "logs" / "metrics.jsonl"
    if not p.exists():
        return []
    return [json.loads(ln)["step"] for ln in p.read_text().splitlines() if ln.strip() and "reward_mean" in ln]


def wait_for(cond, what: str, deadline: float = 600):
    t = time.time()
    while time.time() - t < deadline:
        if v := cond():
            return v
        time.sleep(1)
    raise AssertionError(f"gave up waiting for {what}")


def status(run_dir: Path) -> dict:
    return json.loads((run_dir / "control" / "status.json").read_text())


def attempt_processes(run_dir: Path) -> list[int]:
    """Live processes whose command line names this attempt (supervisor, torchrun, every rank)."""
    import psutil

    out = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        if p.info["status"] != psutil.STATUS_ZOMBIE and str(run_dir) in " ".join(p.info["cmdline"] or []):
            out.append(p.info["pid"])
    return out


def kill_leftovers(run_dir: Path) -> None:
    """Test cleanup: kill what is left of this attempt if an assertion failed mid-run."""
    for pid in attempt_processes(run_dir):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def test_planted_crash_of_rank_1_stops_the_attempt(tmp_path):
    runs = tmp_path / "runs"
    crash = {"RFT_TEST_CRASH_RANK": "1", "RFT_TEST_CRASH_STEP": "2",
             "PYTHONPATH": f"{REPO / 'tests' / 'launch_crash'}{os.pathsep}{REPO}"}
    args = [a for k, v in {**TINY_DDP, "num_steps": 6, "runs_root": str(runs)}.items() for a in ("--set", f"{k}={v}")]
    r = subprocess.run([sys.executable, "-m", "rftlib.cli", "launch", "-p", "tiny", *args], cwd=REPO,
                       env={**env(), **crash}, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    (run_dir,) = runs.glob("attempt-01-tiny")
    try:
        a = rft("attach", str(run_dir))  # follows to the end
        assert a.returncode == 1, a.stdout
        assert "state: crashed - trainer exited with code 1 (RuntimeError: planted crash: rank 1 at step 2" in a.stdout
        st = status(run_dir)
        assert (st["state"], st["process"], st["exit_code"]) == ("crashed", "trainer", 1)
        assert steps(run_dir) == [1]  # step 1 ran on both ranks; rank 1 raised before step 2
        # rank 0, torchrun and the supervisor are gone: the supervisor writes the status attach reads before it
        # exits, so its own exit is awaited (under a loaded machine it was still alive when attach returned)
        wait_for(lambda: attempt_processes(run_dir.resolve()) == [], "every process of the crashed attempt to end", 60)
        assert " crashed " in rft("status", "--runs", str(runs)).stdout
    finally:
        kill_leftovers(run_dir.resolve())


def test_supervisor_stops_the_engines_when_the_trainer_dies(tmp_path):
    """A hand-written plan: a 'trainer' that exits 3 and an 'engine' that would run 10 minutes."""
    from rftlib.launch.plan import LaunchPlan, Process

    for d in ("logs", "control"):
        (tmp_path / d).mkdir()
    die = [sys.executable, "-c", "import time, sys; time.sleep(1); print('boom', flush=True); sys.exit(3)"]
    hang = [sys.executable, "-c", "import time; time.sleep(600)"]
    plan = LaunchPlan(str(tmp_path), "x", 1, ["localhost"], 0, 1, "single", None, {}, [],
                      [Process("trainer", "trainer", 0, "localhost", [], die, {}, "logs/trainer.log"),
                       Process("vllm_engine_0", "vllm", 0, "localhost", [], hang, {}, "logs/vllm_engine_0.log")])
    plan.save(tmp_path)
    try:
        assert supervise(tmp_path, poll=0.1) == 1
        st = status(tmp_path)
        assert st["state"] == "crashed" and st["exit_code"] == 3 and "boom" in st["log_tail"]
        assert st["reason"] == "trainer exited with code 3; stopped vllm_engine_0"
        engine = json.loads((tmp_path / "control" / "pids.json").read_text())["vllm_engine_0"]
        assert not pid_alive(engine)
    finally:
        kill_leftovers(tmp_path)  # the 'engine' names no run dir; its pid does
        engine = json.loads((tmp_path / "control" / "pids.json").read_text()).get("vllm_engine_0")
        if engine and pid_alive(engine):
            os.kill(engine, signal.SIGKILL)


def test_first_error_names_the_failing_ranks_exception():
    from rftlib.launch.supervise import first_error

    log = ("[rank1]: Traceback (most recent call last):\n[rank1]: RuntimeError: planted crash: rank 1\n"
           "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n")
    assert first_error(log) == "RuntimeError: planted crash: rank 1"  # not torchrun's ChildFailedError wrapper
    assert first_error("loading\nrft: error: micro_batch_size=3 must divide\n") == "error: micro_batch_size=3 must divide"
    assert first_error("all fine\n") == ""
