"""scripts/gpu_check.py: its CPU form runs every stage at toy sizes in its own process and session and passes (so
the GPU check cannot rot between GPU machines, README: "A GPU machine"); its stages can fail (versions without a
GPU, a memory estimate off on either side, a stand-in engine that ignores its adapter or serves the previous one);
a stage killed at its limit takes every process it started along, in whatever session."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import gpu_check  # noqa: E402


def test_the_gpu_check_cpu_form_runs_every_stage(tmp_path):
    p = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_check.py"), "--cpu", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(REPO)})
    rows = [json.loads(ln) for ln in (tmp_path / "gpu_check.jsonl").read_text().splitlines()]
    assert [r["stage"] for r in rows] == [name for name, _ in gpu_check.STAGES], p.stdout[-3000:]
    assert p.returncode == 0 and all(r["status"] == "pass" for r in rows), p.stdout[-6000:]
    by = {r["stage"]: r for r in rows}
    # the sync probe through rftlib's engine code: the honest engine passes, each negative control is refused
    assert [(r["engine"], r["outcome"]) for r in by["sync_probe"]["rows"]] == [
        ("honest", "passes"), ("ignores_adapter", "canary fails"), ("serves_previous", "probe fails after the step")]
    for stage in ("seed002_fp16_lora", "seed000_full_step", "mxfp4_lora_step", "deepspeed_zero3"):  # each trained
        assert by[stage]["weights_moved"] and max(by[stage]["advantage_std"]) > 0, by[stage]
    assert by["seed002_fp16_lora"]["dtype"] == "float16"  # the GradScaler path, on the CPU
    assert by["deepspeed_zero3"]["sync/probe_max_diff"] <= by["deepspeed_zero3"]["sync/probe_threshold"]
    assert [r["term"] for r in by["gptoss_layer"]["rows"]] == ["nograd_row_eager", "saved_for_backward"]
    assert [r["mode"] for r in by["generate_split"]["rows"]] == ["plain", "lora", "merged"]
    assert "not run in the CPU form" in by["smoke_zero3"]["note"] and "not run" in by["flex_mix"]["note"]


def test_the_stage_limits_fit_the_budget():
    """The whole check fits 420 s of a GPU lease: the fixed limits sum to the budget, and flex_mix (0) gets what
    is left of it at run time."""
    assert gpu_check.BUDGET_S == 420
    assert sum(limit for _, limit in gpu_check.STAGES) + gpu_check.DEEPSPEED_INSTALL_S == 420
    assert gpu_check.STAGES[-1] == ("flex_mix", 0) and all(limit > 0 for _, limit in gpu_check.STAGES[:-1])


def test_versions_fails_without_a_usable_gpu():
    """This machine has no CUDA GPU: the GPU form of the stage must fail and say so (it was hard-coded to pass)."""
    row = gpu_check.stage_versions(cpu=False)
    assert row["status"] == "fail" and any("no usable CUDA GPU" in p for p in row["problems"]), row


def test_version_problems_lists_every_deviation():
    pins = {"torch": ("2.13.0", True), "transformers": ("5.19.0", True), "peft": ("0.21.2", True),
            "vllm": ("0.32.0", False), "deepspeed": ("0.19.8", False)}
    facts = {"torch": "2.11.0+cu130", "cuda": "13.0", "gpus": 1, "driver": "570.86.15", "nccl": None,
             "capability": "7.5", "packages": {"torch": "2.11.0+cu130", "transformers": "5.19.0",
                                                "deepspeed": "0.18.0"}}
    problems, absent = gpu_check.version_problems(facts, pins, gpu=True)
    assert problems == ["deepspeed 0.18.0 != pinned 0.19.8", "peft not installed (pinned 0.21.2)",
                        "torch 2.11.0+cu130 != pinned 2.13.0",
                        "driver 570.86.15 < R580, which torch's CUDA 13.0 needs (README: older drivers)",
                        "NCCL not available to torch.distributed (the ZeRO-3 and multi-GPU paths need it)",
                        "compute capability 7.5 < 8.0: no bf16"]
    assert absent == ["vllm not installed (pinned 0.32.0)"]  # an optional extra: reported, not a deviation
    ok = {"torch": "2.13.0", "cuda": "13.0", "gpus": 1, "driver": "580.65.06", "nccl": "2.27.3", "capability": "9.0",
          "packages": {"torch": "2.13.0+cu130", "transformers": "5.19.0", "peft": "0.21.2"}}
    assert gpu_check.version_problems(ok, pins, gpu=True) == ([], ["deepspeed not installed (pinned 0.19.8)",
                                                                   "vllm not installed (pinned 0.32.0)"])


def test_read_pins_reads_the_pyproject_pins():
    pins = gpu_check.read_pins()
    assert pins["torch"] == ("2.13.0", True) and pins["deepspeed"] == ("0.19.8", False)
    assert "numpy" not in pins  # a floor (>=) is not a pin


def test_memory_verdict_is_two_sided():
    # peak/estimate: 1.30 > 1.25 fails (under-count); 0.50 < 0.6 is flagged (over-count); 1.0 and the edges pass
    assert gpu_check.memory_verdict(1.3, 1.0)["memory"] == "fail"
    assert gpu_check.memory_verdict(0.5, 1.0)["memory"] == "flag"
    assert [gpu_check.memory_verdict(p, 1.0)["memory"] for p in (0.6, 1.0, 1.25)] == ["pass"] * 3
    assert gpu_check.memory_verdict(0.032, 0.485)["peak_over_estimate"] == 0.07  # smoke_single on the H200: 15x
    assert gpu_check.memory_verdict(1.0, None)["memory"] == "pass"


def _run_stage_in_a_fresh_interpreter(tmp_path: Path, stage_body: str, limit: float) -> dict:
    """``gpu_check.run_stage("versions", limit, ...)`` with ``stage_versions`` replaced by ``stage_body``, run in a
    new interpreter: run_stage forks the process that calls it, and a fork of a pytest-xdist worker (its execnet
    channel and threads included) took the worker down ("node down: Not properly terminated", make
    test-parallel on aa9df2f). The fork, the kill at the limit and the leftover scan are run_stage's own."""
    script = (
        "import json, subprocess, sys, time\n"
        f"sys.path.insert(0, {str(REPO / 'scripts')!r})\n"
        "import gpu_check\n"
        f"def stage(cpu):\n{stage_body}\n"
        "gpu_check.stage_versions = stage\n"
        f"print(json.dumps(gpu_check.run_stage('versions', {limit}, True, __import__('pathlib').Path({str(tmp_path)!r}))))\n")
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_a_killed_stage_takes_its_other_sessions_along(tmp_path):
    """A stage that starts a process in a session of its own (as run_smoke starts a line) and hangs: at the limit
    both are killed. Killing the stage's process group alone left the other session's process running."""
    marker = f"gpu-check-hang-{tmp_path.name}"  # in the grandchild's argv, for pgrep
    body = (f"    subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)', {marker!r}], "
            "start_new_session=True)\n    time.sleep(300)")
    row = _run_stage_in_a_fresh_interpreter(tmp_path, body, 2)
    assert row["status"] == "fail" and "timed out after 2 s" in row["error"]
    time.sleep(0.3)
    out = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout
    assert not out.strip(), f"a stage's child outlived its time limit: {out}"


def test_a_stage_that_leaves_a_process_behind_fails(tmp_path):
    marker = f"gpu-check-leak-{tmp_path.name}"
    body = (f"    subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)', {marker!r}], "
            "start_new_session=True)\n"
            "    time.sleep(0.5)  # the child has exec'd, so its environment carries the stage's token\n"
            "    return {'status': 'pass'}")
    row = _run_stage_in_a_fresh_interpreter(tmp_path, body, 30)
    assert row["status"] == "fail" and "left 1 process" in row["error"], row
    time.sleep(0.3)
    assert not subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.strip()
