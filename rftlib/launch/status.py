"""Watch detached attempts from their run directories: ``rft attach`` and ``rft status``.

Everything here reads files the trainer and the supervisor write (logs/metrics.jsonl,
logs/health.json, summary.json, control/status.json), so it works from any shell or notebook
kernel, as often as wanted, and never holds or stops the run: Ctrl-C in attach only detaches.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

from rftlib.attempts import run_dir_path, runs_root as resolve_root
from rftlib.launch.supervise import RUNNING, _read_json, _supervisor_alive, read_status

EVAL_KEY = "eval/heldout/greedy_pass@1"
ENDED = ("finished", "stopped", "crashed", "killed")


def _rows(path: Path, start: int = 0) -> tuple[list[dict[str, Any]], int]:
    """Complete JSON lines of ``path`` from byte ``start``; (rows, the offset to read on from)."""
    try:
        with open(path, "rb") as f:
            f.seek(start)
            data = f.read()
    except FileNotFoundError:
        return [], start
    end = data.rfind(b"\n") + 1  # a line still being written waits for the next poll
    rows = []
    for line in data[:end].splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows, start + end


def state_of(run_dir: Path) -> tuple[str, str]:
    """(state, reason): from control/status.json for a launched attempt (a supervisor that vanished
    while "running" reads as crashed), else from summary.json, else "not started"."""
    st = read_status(run_dir)
    if st:
        state = st.get("state", "?")
        if state in (RUNNING, "starting") and st.get("supervisor_pid") and not _supervisor_alive(run_dir):
            return "crashed", "the supervisor is gone (machine rebooted or killed?) while the attempt was running"
        return state, st.get("reason") or ""
    summ = _read_json(run_dir / "summary.json")
    if summ:
        reason = summ.get("stop_reason")
        return ("stopped" if reason == "stopped by user" else "finished"), reason or ""
    return ("running?" if (run_dir / "logs" / "metrics.jsonl").exists() else "not started"), ""


def _health(run_dir: Path) -> str:
    verdicts = _read_json(run_dir / "logs" / "health.json") or []
    bad = [v for v in verdicts if v.get("status") in ("fail", "warn")]
    if not verdicts:
        return "-"
    if not bad:
        return "ok"
    return ", ".join(f"{v['status'].upper()} {v['name']}" for v in bad)


def attempt_row(run_dir: Path) -> dict[str, Any]:
    """One attempt at a glance: step, last reward, held-out accuracy, health, state."""
    rows, _ = _rows(run_dir / "logs" / "metrics.jsonl")
    steps = [r for r in rows if "reward_mean" in r]
    ev = [r[EVAL_KEY] for r in rows if EVAL_KEY in r]
    summ = _read_json(run_dir / "summary.json") or {}
    state, reason = state_of(run_dir)
    return {"attempt": run_dir.name, "state": state, "reason": reason,
            "step": steps[-1]["step"] if steps else 0, "reward": steps[-1]["reward_mean"] if steps else None,
            "heldout": summ.get(EVAL_KEY, ev[-1] if ev else None), "health": _health(run_dir)}


def gpu_table() -> str:
    """Per-GPU memory and utilisation from nvidia-smi, or "" where there is none."""
    if not shutil.which("nvidia-smi"):
        return ""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,memory.used,memory.total,utilization.gpu",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    lines = ["GPU  memory used / total (MiB)  util"]
    for line in out.strip().splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) == 4:
            i, used, total, util = parts
            pct = 100 * float(used) / max(float(total), 1)
            lines.append(f"{i:>3}  {used:>8} / {total:<8} ({pct:3.0f}%)  {util:>3}%")
    return "\n".join(lines)


def _fmt(x: Any, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def status_text(runs_root: str | Path | None = None) -> str:
    """``rft status``: every attempt under ``runs_root`` (launched or not), newest last, then the GPUs.
    The root resolves as everywhere else (rftlib.attempts.runs_root: RFTLIB_RUNS, else <project>/runs)."""
    root = resolve_root(runs_root)
    dirs = sorted(d for d in root.glob("*") if (d / "config.yaml").exists()) if root.is_dir() else []
    lines = [f"{'attempt':<34} {'state':<11} {'step':>5} {'reward':>7} {'held-out':>8}  health / reason"]
    for d in dirs:
        r = attempt_row(d)
        extra = r["health"] + (f" | {r['reason']}" if r["reason"] and r["state"] != RUNNING else "")
        lines.append(f"{r['attempt']:<34} {r['state']:<11} {r['step']:>5} {_fmt(r['reward']):>7} "
                     f"{_fmt(r['heldout']):>8}  {extra}")
    if not dirs:
        lines.append(f"(no attempts under {root})")
    if gpus := gpu_table():
        lines += ["", gpus]
    return "\n".join(lines)


def _line(row: dict[str, Any], cfg=None, ev: float | None = None) -> str:
    """A metrics row as the trainer's own text line (rftlib.report.live.status_line, as TextView prints it)."""
    if cfg is not None and "reward_mean" in row:
        from rftlib.report.live import status_line  # ipywidgets, matplotlib: only when a config was read

        return "[rft] " + status_line(row, cfg, ev)
    if "reward_mean" not in row:
        ev = row.get(EVAL_KEY)
        return f"[rft] step {row.get('step', 0)} baseline" + (f": held-out greedy_pass@1 {ev:.3f}" if ev is not None
                                                                else "")
    parts = [f"[rft] step {row['step']}", f"reward {row['reward_mean']:.3f}"]
    for k, fmt in (("loss", ".4f"), ("kl", ".4f"), ("grad_norm", ".3f"), ("lr", ".2e"), (EVAL_KEY, ".3f")):
        if row.get(k) is not None:
            parts.append(f"{'held-out' if k == EVAL_KEY else k} {format(row[k], fmt)}")
    return "  ".join(parts)


def attach(run_dir: str | Path, *, write: Callable[[str], None] = print, poll: float = 1.0,
           timeout: float | None = None, from_start: bool = True) -> dict[str, Any]:
    """Stream an attempt's progress (metrics lines, health verdict changes, state changes) until it
    ends, ``timeout`` seconds pass, or Ctrl-C (which detaches; the attempt goes on). The last
    control/status.json (or {"state": ...} for an attempt launched otherwise). A relative ``run_dir`` is found
    as everywhere (rftlib.attempts.run_dir_path: from the working directory, else the project root)."""
    run_dir = run_dir_path(run_dir)
    if not (run_dir / "config.yaml").exists():
        raise FileNotFoundError(f"{run_dir}/config.yaml: not an attempt directory")
    metrics = run_dir / "logs" / "metrics.jsonl"
    offset = 0 if from_start else (metrics.stat().st_size if metrics.exists() else 0)
    seen_health: dict[str, str] = {}
    ev: list[float] = []
    from rftlib.train.loop import resume_config  # torch: rft attach only (rft status reads files)

    try:
        cfg = resume_config(run_dir)
    except Exception:  # a config this rftlib cannot read: plain lines
        cfg = None

    def show(rows: list[dict[str, Any]]) -> None:
        for r in rows:
            if EVAL_KEY in r:
                ev.append(r[EVAL_KEY])
            write(_line(r, cfg, ev[-1] if ev else None))

    last_state = None
    t0 = time.time()
    write(f"[rft attach] {run_dir} (Ctrl-C detaches; the attempt goes on)")
    try:
        while True:
            rows, offset = _rows(metrics, offset)
            show(rows)
            for v in _read_json(run_dir / "logs" / "health.json") or []:
                name, status, before = v.get("name"), v.get("status"), seen_health.get(v.get("name"))
                if status in ("warn", "fail") and status != before:  # as the trainer prints verdict changes
                    write(f"[health] {status.upper()} {name}: {v.get('message', '')}"
                          + (f" -> {v['action']}" if v.get("action") else ""))
                elif status == "pass" and before in ("warn", "fail"):
                    write(f"[health] ok again: {name}")
                seen_health[name] = status
            state, reason = state_of(run_dir)
            if state != last_state:
                write(f"[rft attach] state: {state}" + (f" - {reason}" if reason else ""))
                last_state = state
            if state in ENDED or state == "not started" and not read_status(run_dir):
                rows, offset = _rows(metrics, offset)
                show(rows)
                st = read_status(run_dir)
                if state == "crashed" and st.get("log_tail"):
                    write(f"[rft attach] last lines of {st.get('log')}:\n{st['log_tail'].rstrip()}")
                return st or {"state": state, "reason": reason}
            if timeout is not None and time.time() - t0 > timeout:
                write(f"[rft attach] detached after {timeout:g} s; the attempt goes on (state {state})")
                return read_status(run_dir) or {"state": state}
            time.sleep(poll)
    except KeyboardInterrupt:
        write("[rft attach] detached (Ctrl-C); the attempt goes on: rft attach / rft stop " + str(run_dir))
        return read_status(run_dir)
