"""Detached launch: start an attempt's processes in their own sessions, watch them, stop them.

``launch()`` (``rft launch``, notebooks/launch.ipynb) makes the attempt directory, writes the
resolved plan (plan.json, commands.sh), starts ``python -m rftlib.launch.supervise RUN_DIR`` in a
new session and returns at once: closing the notebook, restarting its kernel or logging out does
not touch the run. The supervisor starts every process of node 0's plan, each in its own process
group (start_new_session), records their pids (control/pids.json) and its state
(control/status.json), and waits. If any process dies the supervisor stops every other one (the
whole process group: torchrun and its ranks, vLLM and its workers), records which process died,
its exit code and the tail of its log in control/status.json, and exits. A trainer that ends by
itself ends the attempt too (state finished, or stopped after ``rft stop``).

Run directory layout added here::

    plan.json, commands.sh           the resolved plan (what ran, re-runnable by hand)
    logs/trainer.log                 torchrun + every rank's output
    logs/vllm_engine_K.log           each vLLM server engine
    logs/supervisor.log              the supervisor's own lines
    control/pids.json                {"supervisor": pid, "<process>": pid}
    control/status.json              {"state": running|finished|stopped|crashed|killed, "reason", ...}
    control/stop                     written by ``rft stop``: the trainer checkpoints and stops
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

import psutil
import yaml

from rftlib.attempts import (AttemptLockedError, claim_attempt_dir, create_attempt, ensure_unlocked, next_attempt_id,
                             read_attempt, run_dir_path, runs_root, write_json)
from rftlib.config import make_config
from rftlib.monitor.metrics import read_metrics

# launch.plan, train.torchrun and train.loop (torch) and report.publish (papermill) are imported in the
# functions that start or end a run: rft status and rft stop read this module's file helpers and must
# answer without them (tests/test_cli_light.py)

TAIL_LINES = 60
RUNNING = "running"


def read_status(run_dir: str | Path) -> dict[str, Any]:
    """control/status.json, or {} when the attempt was never launched detached."""
    p = Path(run_dir) / "control" / "status.json"
    try:
        return json.loads(p.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _write_status(run_dir: Path, **fields: Any) -> None:
    st = read_status(run_dir)
    st.update(fields, updated=time.strftime("%Y-%m-%dT%H:%M:%S"))
    (run_dir / "control").mkdir(exist_ok=True)
    write_json(run_dir / "control" / "status.json", st)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, not yet reaped by its parent) is not running
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _tail(path: Path, n: int = TAIL_LINES) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(deque(f, maxlen=n))
    except FileNotFoundError:
        return ""


def first_error(log_text: str) -> str:
    """The first ``SomeError: message`` line of a log (a failing rank's exception, not torchrun's
    ChildFailedError wrapper), or ""."""
    for line in log_text.splitlines():
        if line.startswith("rft: error: "):  # rftlib.cli's own refusal (a ConfigError, ValueError, ...)
            return line[len("rft: "):].strip()
        m = re.search(r"\b([A-Za-z_.]*(?:Error|Exception|Interrupt)): (.+)", line)
        if m and "ChildFailedError" not in m.group(1):
            return f"{m.group(1).rsplit('.', 1)[-1]}: {m.group(2).strip()}"
    return ""


def launch(preset: str = "default", overrides: dict[str, Any] | None = None, *, resume: str | Path | None = None,
           dry_run: bool = False, machine_gpus: int | None = None, write=print) -> Path | None:
    """Plan, check and start an attempt detached; its run directory (None on a dry run).

    ``resume`` relaunches an existing attempt from its step_latest (its saved config; ``overrides``
    such as num_steps apply on top). ``dry_run`` prints the GPU map and the commands and starts
    nothing. Returns as soon as the supervisor is started; follow it with :func:`attach`.

    The attempt goes where every entry point puts it (:func:`rftlib.attempts.runs_root`: ``$RFTLIB_RUNS``, else
    ``<project root>/runs``), whatever the working directory (a launch.ipynb kernel runs in notebooks/), and the
    plan's trainer is told that very directory (absolute); ``resume`` is found the same way (run_dir_path).
    """
    from rftlib.launch.plan import check_plan, format_plan, make_plan
    from rftlib.train.torchrun import rank_env
    from rftlib.train.loop import resume_config

    overrides = dict(overrides or {})
    if resume:
        run_dir = run_dir_path(resume)
        if not (run_dir / "config.yaml").exists():
            raise FileNotFoundError(f"{run_dir}/config.yaml: not an attempt directory to resume")
        if read_status(run_dir).get("state") == RUNNING and _supervisor_alive(run_dir):
            raise RuntimeError(f"{run_dir} is still running (control/status.json); `rft stop {run_dir}` first")
        ensure_unlocked(run_dir)  # a trainer outside rft launch (a notebook, rft resume) holds it: refused
        cfg = resume_config(run_dir, **overrides)
        # the engines the last launch started (their URLs were written into the config for the trainer) are
        # gone with it: plan them again, unless the user names engines of their own now
        before = _read_json(run_dir / "plan.json") or {}
        started = {p.get("url") for p in before.get("processes", []) if p.get("role") == "vllm"}
        if started and "vllm_urls" not in overrides:
            cfg.vllm_urls = [u for u in cfg.vllm_urls if u not in started]
    else:
        cfg = make_config(preset, overrides)
        root = runs_root(cfg.runs_root)
        # a dry run names the number the next attempt would get; a launch claims it (atomically: a launch
        # beside this one gets the next number, never this directory)
        run_dir = root / next_attempt_id(root, cfg.name) if dry_run else claim_attempt_dir(root, cfg.name)
    plan = make_plan(cfg, run_dir, preset=str(preset), resume=bool(resume))
    try:
        check_plan(plan, cfg, dry_run=dry_run, machine_gpus=machine_gpus)
    except BaseException:
        if not resume and not dry_run:
            run_dir.rmdir()  # claimed just now, still empty: a refused launch leaves no attempt behind
        raise
    if dry_run:
        write(format_plan(plan))
        return None
    if not resume:
        if plan.engine_urls and plan.engine_urls != cfg.vllm_urls:
            cfg.vllm_urls = list(plan.engine_urls)  # the trainer connects to the engines this plan starts
        run_dir = create_attempt(cfg, run_dir.name)
    elif plan.engine_urls:
        doc = read_attempt(run_dir)  # the engines' URLs of this launch, for the trainer to read
        doc["config"]["vllm_urls"] = plan.engine_urls
        (run_dir / "config.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    for d in ("logs", "control"):
        (run_dir / d).mkdir(exist_ok=True)
    (run_dir / "control" / "stop").unlink(missing_ok=True)
    plan.save(run_dir)
    write_json(run_dir / "control" / "status.json",
               {"state": "starting", "resume": bool(resume), "started": time.strftime("%Y-%m-%dT%H:%M:%S")})
    with open(run_dir / "logs" / "supervisor.log", "a") as log:
        sup = subprocess.Popen([sys.executable, "-m", "rftlib.launch.supervise", str(run_dir.resolve())],
                               env=rank_env(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True, cwd=os.getcwd())
    _write_status(run_dir, supervisor_pid=sup.pid)
    write(f"[rft] launched {run_dir.name} detached (supervisor pid {sup.pid}): {run_dir}\n"
          f"[rft] follow it: rft attach {run_dir}   stop it (checkpoint first): rft stop {run_dir}")
    return run_dir


def _supervisor_alive(run_dir: Path) -> bool:
    pid = read_status(run_dir).get("supervisor_pid")
    return bool(pid) and pid_alive(int(pid))


def _killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)  # each process was started in its own session: pgid == pid
    except (ProcessLookupError, PermissionError):
        pass


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (torchrun starts each rank in a session of its own, so killing
    torchrun's process group alone can leave ranks behind)."""
    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:  # the process is already gone
        return []


def terminate(procs: dict[str, subprocess.Popen | int], grace: float = 20.0) -> None:
    """SIGTERM every process group (torchrun passes it on to its ranks, vLLM to its workers), then
    SIGKILL whatever is left of them and of their descendants after ``grace`` seconds."""
    pids = {n: (p.pid if isinstance(p, subprocess.Popen) else int(p)) for n, p in procs.items()}
    family = {d for pid in pids.values() for d in _descendants(pid)}
    for pid in pids.values():
        _killpg(pid, signal.SIGTERM)
    deadline = time.time() + grace
    while time.time() < deadline:
        for p in procs.values():
            if isinstance(p, subprocess.Popen):
                p.poll()
        if not any(pid_alive(pid) for pid in [*pids.values(), *family]):
            return
        time.sleep(0.2)
    for pid in pids.values():
        _killpg(pid, signal.SIGKILL)
    for pid in family:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _write_report(run_dir: Path) -> None:
    """The attempt's HTML report (held-out before/after, curves, verdicts), as a notebook run writes it; a
    report that fails is said in the log, never turned into a failed attempt."""
    try:
        from rftlib.report.publish import write_report

        print(f"[supervisor] report: {write_report(run_dir)}", flush=True)
    except Exception as e:  # noqa: BLE001 -- the training result stands whatever the report does
        print(f"[supervisor] the report could not be written ({type(e).__name__}: {e}); run `rft report {run_dir}`",
              flush=True)


def supervise(run_dir: str | Path, node: int = 0, poll: float = 0.5, handle_signals: bool = False) -> int:
    """The supervisor's body: start node ``node``'s processes, wait, stop all when one ends.
    ``handle_signals`` (the detached supervisor process): SIGTERM/SIGINT terminate every process."""
    from rftlib.launch.plan import LaunchPlan
    from rftlib.train.torchrun import rank_env

    run_dir = Path(run_dir)
    plan = LaunchPlan.from_json(json.loads((run_dir / "plan.json").read_text()))
    procs: dict[str, subprocess.Popen] = {}
    logs: dict[str, Path] = {}
    stopping = {"signal": None}

    def on_signal(signum, _frame):
        stopping["signal"] = signal.Signals(signum).name

    if handle_signals:
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
    base = rank_env()
    for p in plan.on_node(node):
        logs[p.name] = run_dir / p.log
        with open(logs[p.name], "a") as log:
            procs[p.name] = subprocess.Popen(p.cmd, env={**base, **p.env}, stdin=subprocess.DEVNULL, stdout=log,
                                             stderr=subprocess.STDOUT, start_new_session=True)
        print(f"[supervisor] started {p.name} pid {procs[p.name].pid}: {p.shell()}", flush=True)
    write_json(run_dir / "control" / "pids.json", {"supervisor": os.getpid(), **{n: q.pid for n, q in procs.items()}})
    _write_status(run_dir, state=RUNNING, processes=list(procs), node=node)
    trainer = next(n for n in procs if n.startswith("trainer"))
    while True:
        if stopping["signal"]:
            terminate(procs)
            _write_status(run_dir, state="killed", reason=f"the supervisor got {stopping['signal']}; every process "
                                                          "of the attempt was terminated (no checkpoint was asked)")
            return 1
        ended = {n: q.poll() for n, q in procs.items() if q.poll() is not None}
        if ended:
            break
        time.sleep(poll)
    name, code = next(((n, c) for n, c in ended.items() if c != 0), next(iter(ended.items())))
    rest = {n: q for n, q in procs.items() if n not in ended}
    if rest:
        print(f"[supervisor] {name} exited with code {code}; stopping {', '.join(rest)}", flush=True)
        terminate(rest)
    if name == trainer and code == 0:
        summary = _read_json(run_dir / "summary.json") or {}
        _write_report(run_dir)
        reason = summary.get("stop_reason")
        state = "stopped" if reason == "stopped by user" else "finished"
        _write_status(run_dir, state=state, reason=reason or f"the trainer finished {summary.get('steps', '?')} "
                                                             "step(s)", exit_code=0, process=name)
        return 0
    tail = _tail(logs[name])
    error = first_error(_tail(logs[name], 2000))
    reason = f"{name} exited with code {code}" + ("" if name == trainer else " (a rollout engine died)") + \
        (f" ({error})" if error else "") + (f"; stopped {', '.join(rest)}" if rest else "")
    _write_status(run_dir, state="crashed", reason=reason, process=name, exit_code=code, error=error,
                  log=str(logs[name]), log_tail=tail)
    print(f"[supervisor] crashed: {reason}\n{tail}", flush=True)
    return 1


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


MIN_STOP_WAIT_S = 300.0  # before a step has been measured, and the floor after


def stop_wait_seconds(run_dir: str | Path) -> float:
    """How long ``rft stop`` waits for a clean stop: the trainer finishes the step it is in, may run an
    eval, then checkpoints, so twice the longest measured step plus the longest eval (metrics.jsonl's
    timing/step, timing/eval), at least MIN_STOP_WAIT_S. Seed 003's 20B steps took 10-13 min: a flat
    300 s killed them mid-step, without the checkpoint the stop was for."""
    rows = read_metrics(run_dir)
    step = max((r.get("timing/step", 0.0) for r in rows), default=0.0)
    ev = max((r.get("timing/eval", 0.0) for r in rows), default=0.0)
    return max(MIN_STOP_WAIT_S, 2 * (step + ev))


def stop(run_dir: str | Path, timeout: float | None = None, write=print) -> dict[str, Any]:
    """Ask the trainer to checkpoint and stop (control/stop), wait up to ``timeout`` s (default:
    :func:`stop_wait_seconds`) for the attempt to end, then terminate what is left; the final
    control/status.json. A relative ``run_dir`` is found as everywhere (rftlib.attempts.run_dir_path)."""
    run_dir = run_dir_path(run_dir)
    if timeout is None:
        timeout = stop_wait_seconds(run_dir)
    st = read_status(run_dir)
    if not st:
        return _stop_held(run_dir, timeout, write)
    if st.get("state") not in (RUNNING, "starting") or not _supervisor_alive(run_dir):
        write(f"[rft] {run_dir.name} is not running (state {st.get('state')})")
        return st
    (run_dir / "control" / "stop").write_text(time.strftime("%Y-%m-%dT%H:%M:%S") + " rft stop\n")
    write(f"[rft] asked {run_dir.name} to stop (control/stop): the trainer checkpoints at the end of its step "
          f"(waiting up to {timeout:.0f} s)")
    deadline = time.time() + timeout
    while time.time() < deadline and _supervisor_alive(run_dir):
        time.sleep(0.5)
    if _supervisor_alive(run_dir):
        pids = _read_json(run_dir / "control" / "pids.json") or {}
        write(f"[rft] still running after {timeout:.0f} s: terminating {', '.join(pids)}")
        terminate({n: pid for n, pid in pids.items() if n != "supervisor"})
        terminate({"supervisor": pids.get("supervisor", st["supervisor_pid"])}, grace=5)
        _write_status(run_dir, state="killed", reason=f"rft stop: no clean stop within {timeout:.0f} s; terminated")
    st = read_status(run_dir)
    write(f"[rft] {run_dir.name}: {st.get('state')} - {st.get('reason')}")
    return st


def _trainer_pid(run_dir: Path) -> int | None:
    """The pid of the live trainer that holds the attempt (its control/trainer.lock), None when none holds it."""
    try:
        ensure_unlocked(run_dir)
    except AttemptLockedError as e:
        return e.pid or -1
    return None


def _stop_held(run_dir: Path, timeout: float, write=print) -> dict[str, Any]:
    """``rft stop`` of an attempt trained without ``rft launch`` (``rft train``, a notebook kernel, papermill): the
    same control/stop its live view's Stop button writes, then a wait for its trainer to let go of the attempt's
    lock (it checkpoints at the end of the step it is in). Nothing is killed after ``timeout``: the holder may be a
    notebook kernel with more in it than this attempt; the message names its pid."""
    if not (run_dir / "control").is_dir() and not (run_dir / "config.yaml").exists():
        raise FileNotFoundError(f"{run_dir}: no attempt there (no control/ or config.yaml)")
    pid = _trainer_pid(run_dir)
    if pid is None:
        write(f"[rft] {run_dir.name} is not running (no trainer holds {run_dir / 'control' / 'trainer.lock'})")
        return {"state": "not running"}
    (run_dir / "control").mkdir(exist_ok=True)
    (run_dir / "control" / "stop").write_text(time.strftime("%Y-%m-%dT%H:%M:%S") + " rft stop\n")
    write(f"[rft] asked {run_dir.name} to stop (control/stop): its trainer (pid {pid}) checkpoints at the end of its "
          f"step (waiting up to {timeout:.0f} s)")
    deadline = time.time() + timeout
    while time.time() < deadline and _trainer_pid(run_dir) is not None:
        time.sleep(0.5)
    if _trainer_pid(run_dir) is not None:
        write(f"[rft] {run_dir.name} still running after {timeout:.0f} s; nothing was killed (its trainer may be a "
              f"notebook kernel): wait longer, or `kill {pid}` (its last checkpoint is what a resume continues from)")
        return {"state": "running", "pid": pid}
    write(f"[rft] {run_dir.name}: stopped (its trainer let go of the attempt)")
    return {"state": "stopped", "pid": pid}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="the supervisor of a detached attempt (started by rft launch)")
    ap.add_argument("run_dir")
    ap.add_argument("--node", type=int, default=0, help="which node's processes of plan.json to run")
    a = ap.parse_args(argv)
    return supervise(a.run_dir, node=a.node, handle_signals=True)


if __name__ == "__main__":
    sys.exit(main())
