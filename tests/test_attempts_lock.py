"""One trainer per attempt: the live trainer holds ``<run_dir>/control/trainer.lock``.

After ``kill -9`` of ``rft train`` its kernel can run on and finish a checkpoint while a resume of the
same attempt starts; with the lock the second trainer (``Trainer``, ``rft resume``, ``rft launch
--resume``) is refused naming the holder's pid, and the kernel frees the lock when the holder dies
(SIGKILL included), so the next trainer gets it with nothing to clean up. Under torchrun rank 0 holds
it and every rank is refused (none hangs on a broadcast).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rftlib.attempts import LOCK_FILE, AttemptLockedError, create_attempt, ensure_unlocked, lock_attempt
from rftlib.train import checkpoint as ckpt
from rftlib.train import loop

REPO = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")

# a real trainer in its own process: the tiny preset with a step budget it never reaches, a checkpoint
# every step; it prints "training" once it holds the attempt and trains on until it is killed
TRAINER = textwrap.dedent("""
    import sys
    from rftlib.config import make_config
    from rftlib.train.loop import Trainer

    run_dir = sys.argv[1]
    tr = Trainer(make_config("tiny", {"num_steps": 10000, "save_steps": 1, "runs_root": sys.argv[2]}), run_dir,
                 progress=False)
    print("training", flush=True)
    tr.train()
""")


def trained_steps(run_dir: Path) -> list[int]:
    p = run_dir / "logs" / "metrics.jsonl"
    rows = [json.loads(x) for x in p.read_text().splitlines() if x.strip()] if p.exists() else []
    return [r["step"] for r in rows if "reward_mean" in r]


def wait_for(cond, what: str, deadline: float = 300.0):
    t = time.time()
    while time.time() - t < deadline:
        if v := cond():
            return v
        time.sleep(0.2)
    raise AssertionError(f"gave up waiting for {what}")


def test_a_second_trainer_is_refused_with_the_holders_pid_until_it_is_killed(tiny_cfg):
    cfg = tiny_cfg(num_steps=10000, save_steps=1)
    run_dir = create_attempt(cfg)
    log = run_dir / "holder.log"
    holder = subprocess.Popen([sys.executable, "-c", TRAINER, str(run_dir), cfg.runs_root], env=ENV, cwd=REPO,
                              stdout=open(log, "w"), stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: "training" in log.read_text() or holder.poll() is not None, "the holder to start")
        assert holder.poll() is None, log.read_text()
        wait_for(lambda: ckpt.list_steps(run_dir), "the holder's first checkpoint")

        # a resume while it trains: refused before it loads anything, naming the holder
        with pytest.raises(AttemptLockedError) as e:
            loop.Trainer(loop.resume_config(run_dir), run_dir, resume=True, progress=False)
        assert e.value.pid == holder.pid and f"pid {holder.pid}" in str(e.value)
        cli = subprocess.run([sys.executable, "-m", "rftlib.cli", "resume", str(run_dir), "--additional-steps", "1"],
                             env=ENV, cwd=REPO, capture_output=True, text=True, timeout=120)
        assert cli.returncode == 2 and f"is being trained by pid {holder.pid}" in cli.stderr, cli.stderr
        assert not list(run_dir.glob("notebook-resume-*.ipynb"))  # refused before a kernel started
        from rftlib.launch.supervise import launch

        with pytest.raises(AttemptLockedError, match=f"pid {holder.pid}"):
            launch(resume=run_dir, write=lambda s: None)
        assert not (run_dir / "plan.json").exists()

        holder.send_signal(signal.SIGKILL)  # no handler, no finally: only the kernel can free the lock
        holder.wait(60)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(60)
    assert (run_dir / LOCK_FILE).read_text().split()[0] == str(holder.pid)  # the dead holder's line is still there
    ensure_unlocked(run_dir)  # ...but no process holds the lock
    last = ckpt.list_steps(run_dir)[-1]
    tr = loop.Trainer(loop.resume_config(run_dir, num_steps=last + 1), run_dir, resume=True, progress=False)
    try:
        assert (run_dir / LOCK_FILE).read_text().split()[0] == str(os.getpid())
        assert tr.train()["steps"] == last + 1
        assert trained_steps(run_dir)[-1] == last + 1
    finally:
        tr.close()
    lock_attempt(run_dir).close()  # close() let it go


def test_one_process_two_trainers_and_a_failed_init_frees_the_lock(tiny_cfg):
    cfg = tiny_cfg(num_steps=1)
    first = loop.Trainer(cfg, progress=False)
    run_dir = first.run_dir
    with pytest.raises(AttemptLockedError, match=f"pid {os.getpid()} \\(this process: close\\(\\) the Trainer"):
        loop.Trainer(cfg, run_dir, progress=False)
    first.close()
    # a trainer whose set-up fails after it took the lock (every prompt too long) lets it go: a kernel that
    # lives on (a notebook) could otherwise never train this attempt again. The traceback is kept, as
    # IPython keeps sys.last_traceback: its frames hold the half-built trainer, so no GC closes the file
    from rftlib.config import ConfigError

    with pytest.raises(ConfigError, match="prompt_max_len=1") as failed:
        loop.Trainer(tiny_cfg(num_steps=1, prompt_max_len=1), run_dir, progress=False)
    ensure_unlocked(run_dir)
    loop.Trainer(cfg, run_dir, progress=False).close()
    assert failed.tb is not None  # (kept alive to here)


def test_every_rank_is_refused_on_a_held_attempt(tiny_cfg):
    """2 CPU ranks under torchrun: rank 0 finds the lock held and tells rank 1, so both raise (rank 1 would
    otherwise wait in the next collective until torchrun's timeout)."""
    cfg = tiny_cfg(backend="ddp", train_ranks=2)
    run_dir = create_attempt(cfg)
    held = lock_attempt(run_dir)
    try:
        p = subprocess.run([sys.executable, "-m", "rftlib.cli", "train", "--nproc", "2", "--run-dir", str(run_dir)],
                           env=ENV, cwd=REPO, capture_output=True, text=True, timeout=300)
    finally:
        held.close()
    out = p.stdout + p.stderr
    assert p.returncode != 0
    for rank in (0, 1):
        assert f"[rank{rank}]: rftlib.attempts.AttemptLockedError: {run_dir.name} is being trained by pid " \
               f"{os.getpid()}" in out, out[-3000:]
    assert trained_steps(run_dir) == []


HOLDER = textwrap.dedent("""
    import sys, time
    from rftlib.attempts import lock_attempt
    f = lock_attempt(sys.argv[1])
    print("holding", flush=True)
    time.sleep(600)
""")


def test_rft_stop_stops_a_trainer_it_did_not_launch_and_kills_nothing(tiny_cfg):
    """``rft stop`` of an attempt ``rft train`` or a notebook kernel trains (no rft launch, no control/status.json):
    it writes the Stop button's control/stop, the trainer checkpoints the step it is in and lets go of the attempt;
    one that does not let go within --timeout is named and left running (it may be a kernel holding more)."""
    cfg = tiny_cfg(num_steps=10000, save_steps=1)
    run_dir = create_attempt(cfg)
    stop = [sys.executable, "-m", "rftlib.cli", "stop", str(run_dir)]
    idle = subprocess.run(stop, env=ENV, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert idle.returncode == 1 and "is not running" in idle.stdout, idle.stdout + idle.stderr
    assert not (run_dir / "control" / "stop").exists()

    log = run_dir / "holder.log"
    holder = subprocess.Popen([sys.executable, "-c", TRAINER, str(run_dir), cfg.runs_root], env=ENV, cwd=REPO,
                              stdout=open(log, "w"), stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: ckpt.list_steps(run_dir) or holder.poll() is not None, "the trainer's first checkpoint")
        assert holder.poll() is None, log.read_text()
        got = subprocess.run(stop, env=ENV, cwd=REPO, capture_output=True, text=True, timeout=300)
        assert got.returncode == 0 and f"pid {holder.pid}" in got.stdout and "stopped" in got.stdout, got.stdout
        assert holder.wait(60) == 0, log.read_text()  # it ended by itself, after its checkpoint
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(60)
    steps = trained_steps(run_dir)
    assert ckpt.list_steps(run_dir)[-1] == steps[-1] < 10000  # the stop's checkpoint is of the last step trained
    assert json.loads((run_dir / "summary.json").read_text())["stop_reason"] == "stopped by user"

    other = create_attempt(cfg)
    log = other / "holder.log"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(other)], env=ENV, cwd=REPO,
                              stdout=open(log, "w"), stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: "holding" in log.read_text() or holder.poll() is not None, "the holder to take the lock")
        got = subprocess.run(stop[:-1] + [str(other), "--timeout", "1"], env=ENV, cwd=REPO, capture_output=True,
                             text=True, timeout=120)
        assert got.returncode == 1 and "nothing was killed" in got.stdout and f"kill {holder.pid}" in got.stdout
        assert holder.poll() is None  # still running
    finally:
        holder.kill()
        holder.wait(60)
