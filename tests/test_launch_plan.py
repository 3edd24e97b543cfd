"""Launch plans (rftlib.launch.plan) against the seeds' own layouts, two nodes, refusals, papermill dry run.

The expected numbers are written from the seeds' text, not from the presets:
- seed 003 section 5 (20B): "Actor (training) | GPU 4, 5, 6, 7 | DeepSpeed ZeRO-3, NO CPU offload";
  "vLLM (rollout) | GPU 0, 1, 2, 3 | 2 engines x TP=2"; "--vllm_tensor_parallel_size 2",
  "--vllm_gpu_memory_utilization 0.85".
- seed 003 section 5 (120B): the same GPUs, "DeepSpeed ZeRO-3 + CPU offload (--offload --adam_offload)".
- seed 001: "torchrun --nproc_per_node=2 ... rl_runner.py" with "DDP: Multi-GPU distributed training".
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from rftlib.config import ConfigError, make_config
from rftlib.launch.plan import LaunchError, check_plan, commands_sh, format_plan, make_plan
from rftlib.rollout.kinds import EngineInputs
from rftlib.rollout.vllm_server import vllm_cli
from rftlib.settings import EngineSettings

REPO = Path(__file__).resolve().parents[1]


def dry(preset: str, **overrides) -> str:
    cfg = make_config(preset, overrides)
    plan = make_plan(cfg, "runs/ATTEMPT", preset=preset)
    check_plan(plan, cfg, dry_run=True, machine_gpus=0)
    return format_plan(plan)


def gpu_roles(text: str) -> dict[int, str]:
    return {int(g): role for g, role in re.findall(r"^  GPU (\d+): (.+)$", text, re.M)}


def command(text: str, name: str) -> str:
    (line,) = [ln for ln in text.splitlines() if ln.startswith(f"  [{name}] ")]
    return line


def test_a28b_matches_seed003_allocation():
    out = dry("seed003-gpt-oss-20b-a28b")
    roles = gpu_roles(out)
    # seed: GPUs 4-7 actor (ZeRO-3, no offload), 0-1 and 2-3 one TP-2 engine each
    assert [g for g, r in roles.items() if r.startswith("trainer")] == [4, 5, 6, 7]
    assert all(r.endswith("ZeRO-3") for g, r in roles.items() if g >= 4)  # no "+ CPU offload"
    assert [g for g, r in roles.items() if r.startswith("vllm_engine_0")] == [0, 1]
    assert [g for g, r in roles.items() if r.startswith("vllm_engine_1")] == [2, 3]
    trainer = command(out, "trainer")
    assert trainer.startswith("  [trainer] CUDA_VISIBLE_DEVICES=4,5,6,7 ")
    assert "--nproc_per_node=4 --standalone -m rftlib.cli train --run-dir runs/ATTEMPT" in trainer
    for k, gpus in ((0, "0,1"), (1, "2,3")):
        eng = command(out, f"vllm_engine_{k}")
        assert f"CUDA_VISIBLE_DEVICES={gpus} " in eng
        # vLLM's supported entry point (the CLI of this environment: vllm_cli), the model as its positional
        assert " ".join(vllm_cli(sys.executable) + ["serve", "openai/gpt-oss-20b"]) in eng
        assert "--tensor-parallel-size 2 " in eng and "--gpu-memory-utilization 0.85" in eng and "--enable-lora" in eng
        assert f"--port {8000 + k}" in eng
    assert "dry run on a machine without the GPUs" in out and "nothing was started" in out
    # 16 samples (2 prompts) per optimizer step over 4 ranks: 4 samples each, as OpenRLHF splits them
    assert "REFUSED" not in out


def test_120b_adds_cpu_offload_on_the_same_gpus():
    out = dry("seed003-gpt-oss-120b")
    roles = gpu_roles(out)
    assert [g for g, r in roles.items() if r.startswith("trainer")] == [4, 5, 6, 7]
    # seed: ZeRO-3 + CPU offload (--offload = parameters, --adam_offload = optimizer)
    assert all(r.endswith("ZeRO-3 + CPU offload (params, optimizer)") for g, r in roles.items() if g >= 4)
    assert len([ln for ln in out.splitlines()
                if "--tensor-parallel-size 2 " in ln and "--gpu-memory-utilization 0.85" in ln]) == 2
    assert "serve openai/gpt-oss-120b" in out and "--model" not in out


def test_seed001_two_gpu_ddp():
    out = dry("seed001-drgrpo-overnight")
    assert gpu_roles(out) == {0: "trainer rank 0 (local) - ddp", 1: "trainer rank 1 (local) - ddp"}
    trainer = command(out, "trainer")
    assert "CUDA_VISIBLE_DEVICES=0,1 " in trainer and "--nproc_per_node=2 --standalone" in trainer
    assert "vllm" not in out.split("commands on node 0")[1]  # HF rollouts in the trainer: no engine process


def test_two_nodes_span_hosts():
    cfg = make_config("seed003-gpt-oss-20b-a28b", {"nnodes": 2, "hosts": ["gpu-a", "gpu-b"]})
    plan = make_plan(cfg, "/r/A")
    assert plan.world_size == 8  # 4 trainer GPUs on each of 2 nodes
    t0, t1 = (p for p in plan.processes if p.role == "trainer")
    assert (t0.node, t0.host, t1.node, t1.host) == (0, "gpu-a", 1, "gpu-b")
    for node, t in ((0, t0), (1, t1)):
        assert f"--nnodes=2 --node_rank={node} --rdzv-backend=c10d --rdzv-endpoint=gpu-a:29400" in " ".join(t.cmd)
        assert "--standalone" not in t.cmd
    # each node serves its own two engines, addressed by host
    assert plan.engine_urls == ["http://gpu-a:8000/v1", "http://gpu-a:8001/v1",
                                "http://gpu-b:8000/v1", "http://gpu-b:8001/v1"]
    sh = commands_sh(plan)
    assert "# ---- node 0: gpu-a ----" in sh and "# ---- node 1: gpu-b ----" in sh
    assert sh.count("--node_rank=1") == 1 and "/r/A/logs/trainer_node1.log" in sh


def test_plan_engines_are_the_trainers_engines(tmp_path):
    """The plan's engine command and environment come from the function the trainer's own
    server engines use, so every flag the trainer relies on is there: runtime LoRA updating, the served
    name it asks for, processed logprobs (TIS), --generation-config vllm, the worker extension, and a
    --max-lora-rank vLLM accepts (seed 003's 20B rank 32; a rank 24 rounds up to 32)."""
    from rftlib.rollout.vllm import VLLMSettings
    from rftlib.rollout.vllm_server import server_command, server_env

    cfg = make_config("seed003-gpt-oss-20b-a28b", {"lora_rank": 24, "lora_alpha": 48})
    plan = make_plan(cfg, "r", gpus_per_node=8)
    engines = [p for p in plan.processes if p.role == "vllm"]
    s = VLLMSettings.for_launch(EngineInputs.of(cfg.section), on_gpu=True)
    for k, p in enumerate(engines):
        assert p.cmd[1:] == server_command(s, k, p.port)[1:]  # the same function (the python path aside)
        assert {key: p.env[key] for key in server_env(s, k)} == {**server_env(s, k),
                                                                 "CUDA_VISIBLE_DEVICES": ",".join(map(str, p.gpus))}
        flags = " ".join(p.cmd)
        for f in ("--served-model-name base", "--logprobs-mode processed_logprobs", "--generation-config vllm",
                  "--worker-extension-cls rftlib.rollout.vllm_worker.RftlibWorkerExtension", "--max-lora-rank 32",
                  "--host 127.0.0.1"):
            assert f in flags, f
        assert p.env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
        assert "VLLM_SERVER_DEV_MODE" not in p.env  # LoRA sync needs no dev routes
    assert [p.gpus for p in engines] == [[0, 1], [2, 3]]


def test_engines_listen_on_loopback_or_with_a_key():
    """One node binds loopback and needs no key; across nodes engines listen beyond
    loopback with an API key (in the environment, not on the command line) that the trainer is given;
    full-weight sync needs the dev routes --api-key does not guard, so across nodes it is refused."""
    one = make_plan(make_config("seed003-gpt-oss-20b-a28b"), "r", gpus_per_node=8)
    assert all("--host 127.0.0.1" in p.shell() and "VLLM_API_KEY" not in p.env for p in one.processes
               if p.role == "vllm")
    assert all(u.startswith("http://127.0.0.1:") for u in one.engine_urls)
    two_cfg = make_config("seed003-gpt-oss-20b-a28b", {"nnodes": 2, "hosts": ["gpu-a", "gpu-b"]})
    two = make_plan(two_cfg, "r", gpus_per_node=8)
    keys = {p.env["VLLM_API_KEY"] for p in two.processes if p.role == "vllm"}
    trainer_keys = {p.env["RFTLIB_VLLM_API_KEY"] for p in two.processes if p.role == "trainer"}
    assert len(keys) == 1 and keys == trainer_keys and len(keys.pop()) >= 24
    assert all("--host 0.0.0.0" in " ".join(p.cmd) and "api-key" not in " ".join(p.cmd)
               for p in two.processes if p.role == "vllm")
    # full fine-tuning under ZeRO-2 (ZeRO-3's full fine-tuning is refused with a KL reference or a separate engine
    # when the config is read: test_train_build), so what refuses it here is the launch plan's dev-route rule
    full = make_config("seed003-gpt-oss-20b-a28b", {"nnodes": 2, "hosts": ["gpu-a", "gpu-b"], "lora_rank": 0,
                                                     "zero_stage": 2})
    with pytest.raises(LaunchError, match="dev routes.*train a LoRA"):
        make_plan(full, "r", gpus_per_node=8)


def test_engines_elsewhere_start_no_engine_process():
    cfg = make_config("seed003-gpt-oss-20b-a28b", {"vllm_urls": ["http://infer:8000/v1"], "rollout_gpus": None})
    plan = make_plan(cfg, "r", gpus_per_node=8)
    assert [p.role for p in plan.processes] == ["trainer"] and plan.engine_urls == ["http://infer:8000/v1"]


def test_refusals_say_what_to_change():
    cfg = make_config("seed003-gpt-oss-20b-a28b")
    with pytest.raises(LaunchError, match=r"this machine shows 4 GPU\(s\).*change train_gpus / rollout_gpus"):
        check_plan(make_plan(cfg, "r"), cfg, machine_gpus=4)
    # on the seed's 8 GPUs the seed's batches split over 4 ranks (16 samples: 4 each); 6 prompts would not
    assert "GPUs: the plan uses [0, 1, 2, 3, 4, 5, 6, 7]; this machine shows 8" in check_plan(make_plan(cfg, "r"), cfg, machine_gpus=8)
    odd = make_config("seed003-gpt-oss-20b-a28b", {"rollout_batch_size": 6, "train_batch_size_samples": 48})
    with pytest.raises(LaunchError, match=r"rollout_batch_size=6 prompts must divide among 4 ranks.*change the "
                                          r"trainer ranks"):
        check_plan(make_plan(odd, "r"), odd, machine_gpus=8)
    ok = make_config("seed001-drgrpo-overnight")  # 32 prompts over 2 ranks, 2 GPUs: accepted
    assert "GPUs: the plan uses [0, 1]; this machine shows 2" in check_plan(make_plan(ok, "r"), ok, machine_gpus=2)
    small = make_config("seed003-gpt-oss-120b", {"offload_params": False, "offload_optimizer": False,
                                                 "launch_gpu_type": "A100-40GB"})
    # 117B bf16 / 4 ranks = 58 GB of weights per GPU > 42.9 GB: the memory preflight refuses
    with pytest.raises(LaunchError, match=r"trainer GPUs would run out of memory.*set offload_params"):
        check_plan(make_plan(small, "r"), small, machine_gpus=8)
    with pytest.raises(LaunchError, match=r"rollout_gpus=\[0, 1\] holds 2 GPU\(s\).*needs 4"):
        make_plan(make_config("seed003-gpt-oss-20b-a28b", {"rollout_gpus": [0, 1]}), "r")
    with pytest.raises(ConfigError, match=r"train_gpus=\[1, 4\] and rollout_gpus=\[0, 1, 2, 3\] share GPUs \[1\]"):
        make_config("seed003-gpt-oss-20b-a28b", {"train_gpus": [1, 4]})
    with pytest.raises(ConfigError, match=r"nnodes=2 needs hosts"):
        make_config("tiny", {"nnodes": 2})


def test_papermill_dry_run_headless(tmp_path):
    """The issue's command: papermill notebooks/launch.ipynb out.ipynb -p preset ...a28b -p dry_run True."""
    out = tmp_path / "out.ipynb"
    p = subprocess.run([sys.executable, "-m", "papermill", str(REPO / "notebooks" / "launch.ipynb"), str(out),
                        "-p", "preset", "seed003-gpt-oss-20b-a28b", "-p", "dry_run", "True", "--cwd", str(tmp_path),
                        "-k", "python3"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    text = out.read_text()
    assert "GPU 4: trainer rank 0 (local) - ZeRO-3" in text
    assert "dry run on a machine without the GPUs" in text
    assert not (tmp_path / "runs").exists()  # nothing launched


def test_rft_stop_waits_for_the_attempts_own_step_time(tmp_path):
    """A flat 300 s killed a 20B attempt mid-step (seed 003: 10-13 min a step), without
    the checkpoint the stop was for. The wait is twice the longest measured step plus eval."""
    import json

    from rftlib.launch.supervise import MIN_STOP_WAIT_S, stop_wait_seconds

    assert stop_wait_seconds(tmp_path) == MIN_STOP_WAIT_S == 300  # nothing measured yet
    (tmp_path / "logs").mkdir()
    rows = [{"step": 0, "eval/heldout/greedy_pass@1": 0.3, "timing/eval": 95.0},
            {"step": 1, "timing/step": 610.0}, {"step": 2, "timing/step": 780.0}]  # 20B-like: 13 min
    (tmp_path / "logs" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert stop_wait_seconds(tmp_path) == 2 * (780 + 95)  # 29 min, not 5
    (tmp_path / "logs" / "metrics.jsonl").write_text(json.dumps({"step": 1, "timing/step": 3.0}) + "\n")
    assert stop_wait_seconds(tmp_path) == 300  # the floor for fast attempts


def test_colocated_engines_leave_the_trainer_its_gpu(monkeypatch):
    """A colocated engine took 0.85 of a GPU the trainer uses (TRL's colocate default is
    0.3), and under torchrun every rank's in-process engine landed on cuda:0. Now colocate defaults to 0.3,
    server engines keep seed 003's 0.85, an explicit value wins, and a GPU engine under several ranks joins
    the launcher's ranks (vLLM's external_launcher backend: each rank's engine on its own GPU)."""
    from rftlib.rollout.vllm import VLLMEngine, VLLMSettings, engine_gpu_memory

    colo = make_config("tiny", {"rollout_engine": "vllm", "vllm_placement": "colocate"})
    assert engine_gpu_memory(colo.section(EngineSettings)) == 0.3
    assert engine_gpu_memory(make_config("seed003-gpt-oss-20b-a28b").section(EngineSettings)) == 0.85
    half = make_config("tiny", {"rollout_engine": "vllm", "vllm_gpu_memory_utilization": 0.5})
    assert engine_gpu_memory(half.section(EngineSettings)) == 0.5
    s = VLLMSettings.for_launch(EngineInputs.of(colo.section), on_gpu=True)
    monkeypatch.setenv("WORLD_SIZE", "2")
    kw = VLLMEngine.llm_kwargs(s)
    assert kw["gpu_memory_utilization"] == 0.3 and kw["distributed_executor_backend"] == "external_launcher"
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert "distributed_executor_backend" not in VLLMEngine.llm_kwargs(s)
    # issue 22 item 6: CUDA graphs on GPUs unless asked otherwise; eager on CPU, where it is required
    assert not s.enforce_eager and VLLMSettings.for_launch(EngineInputs.of(colo.section), on_gpu=False).enforce_eager
    eager = make_config("tiny", {"vllm_enforce_eager": True})
    assert VLLMSettings.for_launch(EngineInputs.of(eager.section), on_gpu=True).enforce_eager


def test_gpu_indices_count_the_gpus_the_shell_sees(monkeypatch):
    """train_gpus / rollout_gpus count the GPUs this shell sees, as torch's cuda:i does. A
    user given the second half of a 16-GPU node (CUDA_VISIBLE_DEVICES=8,...,15) runs seed 003's layout on
    GPUs 8-15; before the fix the plan passed the indices on as physical ids, so the trainer took GPUs 4-7 and
    the engines 0-3: other users' GPUs."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "8,9,10,11,12,13,14,15")
    cfg = make_config("seed003-gpt-oss-20b-a28b")
    plan = make_plan(cfg, "r")
    env = {p.name: p.env["CUDA_VISIBLE_DEVICES"] for p in plan.processes}
    assert env == {"trainer": "12,13,14,15", "vllm_engine_0": "8,9", "vllm_engine_1": "10,11"}
    notes = check_plan(plan, cfg, machine_gpus=8)
    assert any("4 -> 12" in n and "0 -> 8" in n for n in notes), notes


def test_a_plan_naming_gpus_the_shell_cannot_see_is_refused(monkeypatch):
    """Under CUDA_VISIBLE_DEVICES=0,1,2,3 seed 003's GPUs 4-7 do not exist for this shell;
    before the fix a launch went ahead (the machine count said 8) and put the trainer on GPUs 4-7 anyway."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    cfg = make_config("seed003-gpt-oss-20b-a28b")
    with pytest.raises(LaunchError, match=r"GPU\(s\) \[4, 5, 6, 7\] are not visible.*indices into "
                                          r"CUDA_VISIBLE_DEVICES"):
        check_plan(make_plan(cfg, "r"), cfg, machine_gpus=8)
    notes = check_plan(make_plan(cfg, "r"), cfg, dry_run=True, machine_gpus=8)  # a dry run prints it, says so
    assert any(n.startswith("dry run: the plan uses GPUs [0, 1, 2, 3, 4, 5, 6, 7]") for n in notes), notes


def test_a_server_engine_the_trainer_starts_lands_on_the_visible_gpu(monkeypatch):
    """The trainer's own engines (rft smoke's GPU line: train_gpus [0], rollout_gpus [1]): the
    engine's CUDA_VISIBLE_DEVICES is the rollout index's entry of this process's list (UUIDs too), and an index
    past that list is refused before any engine starts."""
    from rftlib.rollout.vllm import VLLMSettings
    from rftlib.rollout.vllm_server import server_env

    s = VLLMSettings.for_launch(EngineInputs.of(make_config("seed003-gpt-oss-20b-a28b").section), on_gpu=True)  # rollout_gpus 0-3, TP 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-aaaa,GPU-bbbb,GPU-cccc,GPU-dddd,4,5,6,7")
    assert [server_env(s, k)["CUDA_VISIBLE_DEVICES"] for k in (0, 1)] == ["GPU-aaaa,GPU-bbbb", "GPU-cccc,GPU-dddd"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "6,7,1")
    assert server_env(s, 0)["CUDA_VISIBLE_DEVICES"] == "6,7"
    with pytest.raises(ValueError, match=r"rollout_gpus=\[2, 3\]: GPU index\(es\) \[3\] are not among the 3"):
        server_env(s, 1)
    # CUDA's own reading of the list: up to the first invalid entry; unset is every GPU
    from rftlib.rollout.vllm_server import visible_gpus

    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "0, 1,-1,3"}) == ["0", "1"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == [] and visible_gpus({}) is None


def test_launch_and_preflight_refuse_offload_optimizer_where_cpu_adam_cannot_build(monkeypatch):
    """Seed 003's 120B plan offloads the optimizer (DeepSpeed's CPU Adam, a C++ build at
    start-up). On a machine without ninja the launch refuses with the fix (a dry run lists it), and rft
    preflight prints it; before the fix both said nothing and the trainer died after loading 234 GB."""
    import rftlib.backends.deepspeed as dsb
    from rftlib.preflight.memory_check import memory_preflight_text

    no_ninja = dict(unavailable="", prebuilt=False, needs_cuda=False, ninja=False, cxx="/usr/bin/c++", cuda_home=None,
                    nvcc=False, curand=False)
    monkeypatch.setattr(dsb, "cpu_adam_probe", lambda: no_ninja, raising=False)
    cfg = make_config("seed003-gpt-oss-120b")
    with pytest.raises(LaunchError, match=r"offload_optimizer builds DeepSpeed's CPU Adam.*lacks ninja.*"
                                          r"conda install -c conda-forge ninja"):
        check_plan(make_plan(cfg, "r"), cfg, machine_gpus=8)
    notes = check_plan(make_plan(cfg, "r"), cfg, dry_run=True, machine_gpus=8)
    assert any(n.startswith("on this machine: offload_optimizer builds DeepSpeed's CPU Adam") for n in notes), notes
    assert "REFUSED on this machine: offload_optimizer builds DeepSpeed's CPU Adam" in memory_preflight_text(cfg)
    a28b = make_config("seed003-gpt-oss-20b-a28b")  # no optimizer offload: nothing to build
    assert "REFUSED" not in memory_preflight_text(a28b)


def test_the_dry_run_prints_the_pipeline_it_will_run():
    """rft launch --dry-run says whether the steps are synchronous, and at max_staleness k what overlaps, how many
    adapters the engines keep and which estimator corrects the lag (rftlib.train.pipeline.pipeline_text)."""
    sync = dry("seed003-gpt-oss-20b-a28b")
    assert "pipeline: max_staleness 0 (synchronous)" in sync
    text = dry("seed003-gpt-oss-20b-a28b", max_staleness=2)
    assert "pipeline: max_staleness 2 (bounded-staleness asynchronous GRPO" in text
    assert "batches n+1..n+2" in text and "version n-3 or later" in text
    assert "engines keep up to 3 loaded (--max-loras 3)" in text
    assert "tis_cap=2" in text
