"""A trainer's own server engines end with it (issue 43 item 10): each ``vllm serve`` the trainer starts runs in a
session of its own (so closing it stops its whole group), and nothing in that group noticed a trainer killed -9:
the engines kept their cores or GPUs while the resume started a second set. Each engine now has a watchdog
(rftlib.rollout.engine_watchdog) that stops it once the trainer is gone. The engines here are stand-ins for
``vllm serve`` (tests/engine_watchdog_worker.py: a process with a child of its own, answering /health) started by
the trainer's own code, VLLMServerEngine."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

HERE = Path(__file__).parent
WAIT_S = 60.0  # the longest a test waits for processes to start or to end


def _live_with(marker: str) -> list[psutil.Process]:
    """Processes (not zombies) whose command line holds ``marker``."""
    out = []
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and any(marker in a for a in (p.info["cmdline"] or [])):
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out


def _wait_until(cond, what: str, timeout: float = WAIT_S) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if cond():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def _kill_left(marker: str) -> None:
    """Clean up what a failing test left: the stand-ins this test started (by pid, found by their marker)."""
    for p in _live_with(marker):
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def test_no_engine_process_is_left_after_kill9_of_its_trainer(tmp_path):
    """The worker starts 2 engines (each a process and its child) and is killed -9: within the watchdog's poll
    (0.5 s) and the engines' exit on SIGTERM, no process of either engine is left."""
    marker = f"{tmp_path}-engine"  # in the stand-ins' command lines (the worker's holds tmp_path alone)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.Popen([sys.executable, str(HERE / "engine_watchdog_worker.py"), str(tmp_path)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_until(lambda: (tmp_path / "pids.json").exists() or p.poll() is not None, "the engines to start")
        assert p.poll() is None, p.stdout.read()
        engines = json.loads((tmp_path / "pids.json").read_text())
        _wait_until(lambda: len(_live_with(marker)) >= 4, "2 engines and their children")
        assert len(_live_with(marker)) == 4  # 2 engines x (server + its child)
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        _wait_until(lambda: not _live_with(marker), "the engines to end after their trainer's kill -9", timeout=30)
        assert all(not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
                   for pid in engines)
    finally:
        if p.poll() is None:
            p.kill()
        _kill_left(marker)


def test_closing_the_engines_ends_their_watchdogs(tmp_path, monkeypatch):
    """A trainer that closes its engines itself (the normal end) leaves neither an engine nor a watchdog."""
    import engine_watchdog_worker as worker

    import rftlib.rollout.vllm_server as vs

    monkeypatch.setattr(vs, "import_vllm", vs.import_vllm)  # restored after: start_engines replaces both
    monkeypatch.setattr(vs, "server_command", vs.server_command)
    eng = worker.start_engines(tmp_path, str(tmp_path))
    marker = f"{tmp_path}-engine"
    try:
        watchdogs = [srv.watchdog for srv in eng.servers]
        assert all(w.poll() is None for w in watchdogs) and len(_live_with(marker)) == 4
    finally:
        eng.close()
    assert all(w.returncode is not None for w in watchdogs)  # ended and reaped
    _wait_until(lambda: not _live_with(marker), "the engines' children to end")
    _kill_left(marker)
