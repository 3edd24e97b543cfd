"""scripts/gpu_check.py's CPU form: every stage runs at toy sizes in its own process and passes, so the GPU
check cannot rot between GPU machines (README: "A GPU machine")."""

import json
import subprocess
import time
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_gpu_check_cpu_form_runs_every_stage(tmp_path):
    p = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_check.py"), "--cpu", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=900, env={**__import__("os").environ,
                                                                          "PYTHONPATH": str(REPO)})
    rows = [json.loads(ln) for ln in (tmp_path / "gpu_check.jsonl").read_text().splitlines()]
    sys.path.insert(0, str(REPO / "scripts"))
    import gpu_check

    assert [r["stage"] for r in rows] == [name for name, _ in gpu_check.STAGES]
    assert sum(limit for _, limit in gpu_check.STAGES) <= 600  # README: the whole check in under 10 minutes
    assert p.returncode == 0 and all(r["status"] == "pass" for r in rows), p.stdout[-4000:]
    by = {r["stage"]: r for r in rows}
    assert all(r["passes"] and r["threshold"] >= 0.05 for r in by["probe_noise"]["rows"])
    for stage in ("seed002_fp16_lora", "seed000_full_step", "mxfp4_lora_step"):  # each trained
        assert by[stage]["weights_moved"] and max(by[stage]["advantage_std"]) > 0, by[stage]
    nograd = by["gptoss_nograd"]["rows"]  # the eager forward ran at both row counts and was estimated
    assert [r["rows"] for r in nograd] == [1, 2] and all(r["estimate_gib"] >= 0 and "forward_s" in r for r in nograd)


def test_a_stage_that_hangs_is_killed_with_its_process_group(tmp_path, monkeypatch):
    sys.path.insert(0, str(REPO / "scripts"))
    import gpu_check

    hang = tmp_path / "hang.py"
    marker = f"gpu-check-hang-{tmp_path.name}"  # in the grandchild's argv, for pgrep
    hang.write_text("import subprocess, sys, time\n"
                    f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)', '{marker}'])\n"
                    "time.sleep(300)\n")
    monkeypatch.setattr(gpu_check, "__file__", str(hang))
    row = gpu_check.run_stage("versions", 3, True, tmp_path)
    assert row["status"] == "fail" and "timed out after 3 s" in row["error"]
    time.sleep(0.5)  # the grandchild had time to start before the limit, so it exists unless it was killed
    out = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout
    assert not out.strip(), f"a stage's child outlived its time limit: {out}"
