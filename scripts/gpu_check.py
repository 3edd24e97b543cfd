#!/usr/bin/env python3
"""The first thing to run on a GPU machine: stages, each in its own process and session with its own time limit,
each ending in one JSON row; then a table. Its CPU form (``--cpu``, what CI runs) runs every stage at toy sizes
in seconds, through every branch a CPU can run, so the script cannot rot between GPU machines.

    bash scripts/fetch_deepspeed.sh             # where a package registry is reachable: DeepSpeed travels along
    python scripts/gpu_check.py                 # on the GPU machine (README: "A GPU machine")
    python scripts/gpu_check.py --cpu           # the CPU form
    python scripts/gpu_check.py --stages versions,sync_probe --out /tmp/gc

Built for a machine with no network and no model weights: every model is built on the CPU from a config with
random weights (shapes of the reference setups in docs/reference-setups.md), the tokenizer is the tiny test
tokenizer. No vLLM is needed: the sync and the probe run rftlib's engine code over an HF stand-in engine
(scripts/standin_engine.py). DeepSpeed is installed offline from .gpu_wheels/deepspeed when it is missing.

Every stage can fail. Memory verdicts are two-sided (:func:`memory_verdict`): a peak above ESTIMATE_SLACK x the
preflight's estimate fails (the preflight under-counts: a run it admits can die of OOM); below OVERCOUNT x it is
flagged (the preflight over-counts: safe, but it shrinks or refuses runs that fit; the note must explain it).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

BUDGET_S = 420  # the whole check on a GPU: DeepSpeed's install and the limits below sum to it (tests/test_scripts_gpu_check.py)
DEEPSPEED_INSTALL_S = 35  # main()'s offline install, before the stages (24.1 s twice on the H200, 2026-11-27)
# (name, limit in seconds on a GPU), run in this order: the stages whose GPU answer is least known first, so a short
# lease still answers what is unknown. Each limit is a time measured on the H200 (2026-11-27, the second version's
# two runs) plus a margin, or, where that run showed the stage too slow and it was cut, the cut stage's time worked
# out from those figures (HF generate there: 23.6 ms a token plain, 65 ms under an unmerged LoRA, host-bound).
STAGES: list[tuple[str, int]] = [
    ("versions", 15),  # 0.5 s, 0.4 s (H200 runs, 2026-11-27: times after '#')
    ("sync_probe", 30),  # 20.7 s, 14.5 s
    ("deepspeed_zero3", 40),  # 23.2 s (passed its sync probe; peak 0.51 of the estimate: flagged)
    ("cpu_adam", 60),  # 37.9 s (built in 33.8 s); the JIT build is given CPU_ADAM_BUILD_S
    ("gptoss_layer", 40),  # 27.1 s, 22.1 s
    ("generate_split", 35),  # 20.6 s (plain, LoRA, merged)
    ("smoke_zero3", 35),  # 25.0 s, 27.9 s, 18.6 s
    ("seed002_fp16_lora", 50),  # 34.8 s with 8 layers (56.5 s with all 24)
    ("seed000_full_step", 60),  # 43.8 s with 6 layers (over 80 s with all 28)
    ("mxfp4_lora_step", 20),  # 3.8 s
    ("flex_mix", 0),  # last, the rest: with flex's main kernel its mix compiled 47 graphs in 148 s, unfinished
]
FLEX_MIN_S = 20  # flex_mix runs only with at least this much of the budget left
ESTIMATE_SLACK = 1.25  # rftlib.smoke.ESTIMATE_SLACK: a peak above this x the estimate fails
OVERCOUNT = 0.6  # a peak below this x the estimate is flagged: an over-count to explain
STAGE_TOKEN_ENV = "RFTLIB_GPU_CHECK_STAGE"
DEEPSPEED_STAGES = {"deepspeed_zero3", "cpu_adam", "smoke_zero3"}  # main() installs DeepSpeed first for these
DEEPSPEED_INSTALL: dict = {}  # what main()'s offline install did (the GPU form), reported in those stages' rows  # every process a stage starts inherits it, whatever its session


# ---------------------------------------------------------------------------------------------- verdicts

def memory_verdict(peak: float, estimate: float | None) -> dict:
    """{peak_over_estimate, memory: pass | fail | flag, why}: fail above ESTIMATE_SLACK (an under-count: the
    preflight admits runs that die of OOM); flag below OVERCOUNT (an over-count: never an OOM, so not a failure of
    this machine or of the step, but the preflight shrinks logprob batches and refuses configs that fit, so the
    session's note must explain it or the estimator be fixed); pass between. No estimate: nothing to judge."""
    if not estimate:
        return {"memory": "pass", "why": "no estimate to compare"}
    r = peak / estimate
    out = {"peak_over_estimate": round(r, 2)}
    if r > ESTIMATE_SLACK:
        return {**out, "memory": "fail", "why": f"peak {peak:.3g} > {ESTIMATE_SLACK} x the estimate {estimate:.3g}: "
                                                "the preflight under-counts"}
    if r < OVERCOUNT:
        return {**out, "memory": "flag", "why": f"peak {peak:.3g} < {OVERCOUNT} x the estimate {estimate:.3g}: the "
                                                "preflight over-counts (explain it in the note)"}
    return {**out, "memory": "pass", "why": f"{OVERCOUNT} <= peak/estimate {r:.2f} <= {ESTIMATE_SLACK}"}


def read_pins(pyproject: Path = ROOT / "pyproject.toml") -> dict[str, tuple[str, bool]]:
    """{distribution: (pinned version, core)} from pyproject.toml's ``name==version`` requirements; core: in
    ``dependencies`` (must be installed), else an optional extra (reported when absent, a deviation when present
    at another version)."""
    try:
        import tomllib
    except ImportError:  # python 3.10: pip's vendored copy of the same parser
        from pip._vendor import tomli as tomllib

    proj = tomllib.loads(pyproject.read_text())["project"]
    pins: dict[str, tuple[str, bool]] = {}
    groups = [(proj["dependencies"], True)] + [(reqs, False) for reqs in proj["optional-dependencies"].values()]
    for reqs, core in groups:
        for req in reqs:
            m = re.fullmatch(r"\s*([A-Za-z0-9_.\-]+)\s*==\s*([^\s;]+)\s*", req)
            if m:
                name = m.group(1).lower().replace("_", "-")
                pins[name] = (m.group(2), core or pins.get(name, ("", False))[1])
    return pins


# the R-series driver each CUDA major of torch's wheels needs (NVIDIA's CUDA toolkit release notes, minor version
# compatibility: CUDA 12.x needs >= 525.60.13, CUDA 13.x >= 580.65.06)
DRIVER_FLOOR = {12: 525, 13: 580}
MIN_CAPABILITY = (8, 0)  # bf16 (rftlib's GPU default dtype) needs Ampere or newer


def version_problems(facts: dict, pins: dict[str, tuple[str, bool]], *, gpu: bool) -> tuple[list[str], list[str]]:
    """(problems, absent): every deviation from the pins (a core package missing, any package at another version;
    local tags like +cu130 ignored), and with ``gpu``: no usable CUDA GPU, a driver below the floor of torch's CUDA,
    no NCCL, a capability below MIN_CAPABILITY. ``absent``: optional pinned packages not installed."""
    problems, absent = [], []
    installed = facts.get("packages", {})
    for name, (want, core) in sorted(pins.items()):
        have = installed.get(name)
        if have is None:
            (problems if core else absent).append(f"{name} not installed (pinned {want})")
        elif have.split("+")[0] != want:
            problems.append(f"{name} {have} != pinned {want}")
    if not gpu:
        return problems, absent
    if not facts.get("gpus"):
        problems.append(f"no usable CUDA GPU (torch {facts.get('torch')} built for CUDA {facts.get('cuda')}: "
                        f"{facts.get('cuda_error') or 'torch.cuda.is_available() is False'})")
    cuda, driver = facts.get("cuda"), facts.get("driver")
    if cuda and driver:
        floor = DRIVER_FLOOR.get(int(str(cuda).split(".")[0]))
        if floor and int(str(driver).split(".")[0]) < floor:
            problems.append(f"driver {driver} < R{floor}, which torch's CUDA {cuda} needs (README: older drivers)")
    elif cuda:
        problems.append("driver version unknown (nvidia-smi did not answer)")
    if not facts.get("nccl"):
        problems.append("NCCL not available to torch.distributed (the ZeRO-3 and multi-GPU paths need it)")
    cap = facts.get("capability")
    if cap and tuple(int(x) for x in cap.split(".")) < MIN_CAPABILITY:
        problems.append(f"compute capability {cap} < {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]}: no bf16")
    return problems, absent


# ---------------------------------------------------------------------------------------------- stages

def stage_versions(cpu: bool) -> dict:
    """The software and GPU this machine has, against the pins (pyproject.toml) and what the GPU path needs.
    Fails on any deviation; the CPU form checks the pins only."""
    import importlib.metadata as md
    import platform
    import subprocess

    import torch

    pins = read_pins()
    facts: dict = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
                   "packages": {}}
    for name in pins:
        try:
            facts["packages"][name] = md.version(name)
        except md.PackageNotFoundError:
            pass
    if not cpu:
        try:
            facts["gpus"] = torch.cuda.device_count() if torch.cuda.is_available() else 0
        except Exception as e:  # noqa: BLE001 -- a driver too old for this CUDA raises here: the fact to report
            facts["gpus"], facts["cuda_error"] = 0, f"{type(e).__name__}: {e}"
        try:
            facts["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                             capture_output=True, text=True, timeout=20).stdout.split()[0]
        except Exception:  # noqa: BLE001 -- no nvidia-smi: the problem list says so
            facts["driver"] = None
        import torch.distributed as tdist

        facts["nccl"] = ".".join(map(str, torch.cuda.nccl.version())) if tdist.is_nccl_available() else None
        if facts["gpus"]:
            p = torch.cuda.get_device_properties(0)
            facts.update(gpu=p.name, gpu_gib=round(p.total_memory / 2**30, 1), capability=f"{p.major}.{p.minor}",
                         bf16=torch.cuda.is_bf16_supported())
    problems, absent = version_problems(facts, pins, gpu=not cpu)
    return {"status": "fail" if problems else "pass", "problems": problems, "absent": absent,
            **{k: v for k, v in facts.items() if k != "packages"}}


SHAPES = {
    # SmolLM2-135M-Instruct (the embedded default)
    "smollm2-135m": dict(kind="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, rope_theta=100000.0, rms_norm_eps=1e-5,
                         tie_word_embeddings=True, max_position_embeddings=8192),
    # Qwen2.5-Coder-0.5B-Instruct (seed 002)
    "qwen2.5-0.5b": dict(kind="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, rope_theta=1e6, rms_norm_eps=1e-6,
                         tie_word_embeddings=True, max_position_embeddings=32768),
    # Qwen2.5-1.5B (seed 000)
    "qwen2.5-1.5b": dict(kind="qwen2", vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                         num_attention_heads=12, num_key_value_heads=2, rope_theta=1e6, rms_norm_eps=1e-6,
                         tie_word_embeddings=True, max_position_embeddings=32768),
    # the CPU form: small enough for seconds (heads of 32, as every tiny model here)
    "toy": dict(kind="llama", vocab_size=4096, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True, max_position_embeddings=1024),
}


def _hf_config(shape: str, init_std: float = 0.02, layers: int | None = None):
    """``shape``'s config; ``layers``: fewer decoder layers, set at construction so that what the config derives
    from the count (Qwen2's ``layer_types``, one per layer: transformers 5.17 refuses a count that differs from
    it on save, seen on the H200 2026-11-27) follows it."""
    from transformers import LlamaConfig, Qwen2Config

    kw = dict(SHAPES[shape])
    if layers:
        kw["num_hidden_layers"] = layers
    cls = {"llama": LlamaConfig, "qwen2": Qwen2Config}[kw.pop("kind")]
    return cls(initializer_range=init_std, **kw)


def _model_dir(shape: str, out: Path, dtype, layers: int | None = None) -> Path:
    """A checkpoint directory (random weights of ``shape`` in ``dtype``, built on the CPU, + the tiny test
    tokenizer) for the trainer to load: its pad and eos are the tokenizer's; ids it does not know decode to
    nothing. ``layers``: fewer decoder layers than the shape's (its other dims kept): the preflight estimates the
    model it is given, layer for layer, so a few layers check its terms at a fraction of the build and step time."""
    import torch
    from transformers import AutoModelForCausalLM

    from rftlib.models.tiny import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    torch.manual_seed(0)
    hf = _hf_config(shape, layers=layers)
    model = AutoModelForCausalLM.from_config(hf, dtype=dtype)
    for c in (model.config, model.generation_config):
        c.eos_token_id, c.pad_token_id, c.bos_token_id = tok.eos_token_id, tok.pad_token_id, None
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def _reset_peak(cpu: bool) -> None:
    """Measure from here: the fixtures' (and an earlier phase's) allocations are not the stage's peak."""
    if not cpu:
        import torch

        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def stage_sync_probe(cpu: bool) -> dict:
    """rftlib's weight sync and sync probe (rftlib.rollout.vllm's engine logic, rollout.sync_probe) on this device,
    through the HF stand-in engine: an honest engine passes the start-up canary, the first sync and the sync after
    a step at a visible learning rate; an engine that ignores adapters must fail the canary; one that serves the
    previous adapter must fail the probe after the step. Reports each sync's gap, noise and threshold."""
    import tempfile

    import torch

    from rftlib.config import make_config
    from rftlib.models.loading import apply_lora, load_model_and_tokenizer
    from rftlib.rollout.kinds import EngineInputs
    from rftlib.rollout.sync_probe import SyncProbeError
    from standin_engine import StandInEngine, register_standin, settings_for

    device = "cpu" if cpu else "cuda"
    with tempfile.TemporaryDirectory() as d:
        mdir = _model_dir("toy" if cpu else "smollm2-135m", Path(d) / "m", torch.float32)
        model, tok = load_model_and_tokenizer(str(mdir), "float32")
        model = apply_lora(model.to(device), rank=8, alpha=16, dropout=0.0,
                           target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
        register_standin()
        cfg = make_config("tiny", {"model": str(mdir), "runs_root": d, "device": device, "lora_rank": 8,
                                   "rollout_engine": "standin"})
        inputs = EngineInputs.of(cfg.section)
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)

        def step() -> None:  # one AdamW step at a visible LR on the probe prompts' next-token log-likelihood
            x = tok(["The capital of France is", "def add(a, b):"], return_tensors="pt", padding=True).to(device)
            logits = model(input_ids=x["input_ids"], attention_mask=x["attention_mask"]).logits[:, -1]  # (2, V)
            loss = -torch.log_softmax(logits.float(), -1).max(-1).values.mean()
            loss.backward()
            opt.step()
            opt.zero_grad()

        rows, ok = [], True

        def engine(fault):
            return StandInEngine(settings_for(inputs, model, Path(d) / (fault or "honest")), tok,
                                 Path(d) / (fault or "honest"), device=device, fault=fault)

        state0 = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
        for fault, expect in ((None, "passes"), ("ignores_adapter", "canary fails"), ("serves_previous",
                                                                                     "probe fails after the step")):
            with torch.no_grad():  # every engine starts from the same adapter (B = 0)
                for n, p in model.named_parameters():
                    if p.requires_grad:
                        p.copy_(state0[n])
            opt.state.clear()
            eng, row = engine(fault), {"engine": fault or "honest", "expect": expect}
            t0 = time.time()
            try:
                first = eng.sync_weights(model, verify=True)
                row["first_sync"] = {k: round(v, 5) for k, v in first.items() if k.startswith("probe")}
                step()
                after = eng.sync_weights(model)
                row["after_step"] = {k: round(v, 5) for k, v in after.items() if k.startswith("probe")}
                row["outcome"] = "passes"
            except SyncProbeError as e:
                row["outcome"] = "canary fails" if "start-up check" in str(e) else "probe fails after the step"
                row["message"] = str(e)[:200]
            finally:
                eng.close()
            row["seconds"] = round(time.time() - t0, 1)
            row["ok"] = row["outcome"] == expect
            ok &= row["ok"]
            rows.append(row)
            print(json.dumps(row), flush=True)
    return {"status": "pass" if ok else "fail", "rows": rows}


_REWARD_CALLS = [0]


def _reward(text, ex, truncated):
    """0, 1, 0, 1, ... in call order: every group of two or more has a reward signal, whatever a random model
    samples (the H200 run of 2026-11-27: seed002's two 128-token completions of ids the tiny tokenizer does not
    know both decoded to nothing, so a text-based reward gave both the same and the step did not move)."""
    _REWARD_CALLS[0] += 1
    return float(_REWARD_CALLS[0] % 2), {"correctness": 0.0}


def _train_steps(preset: str, overrides: dict, steps: int, *, cpu: bool, memory_cap_gb: float | None = None,
                 dist=None) -> dict:
    """Build the trainer for ``preset`` + ``overrides`` and take ``steps`` GRPO steps; the rows' figures, the peak
    against the preflight (two-sided, :func:`memory_verdict`)."""
    import math
    import tempfile
    from dataclasses import replace

    import torch

    from rftlib.config import make_config
    from rftlib.train.build import build_task
    from rftlib.train.loop import Trainer

    if memory_cap_gb and not cpu:  # the GPU the seed ran on, emulated on a bigger one
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, memory_cap_gb * 1e9 / total))
    with tempfile.TemporaryDirectory() as d:
        # warmup off: a one-step check must step at the preset's LR, not at warmup's 0
        cfg = make_config(preset, {"runs_root": d, "report_to": [], "save_steps": 1000, "eval_size": 2,
                                   "task": "arithmetic", "num_steps": steps, "warmup_ratio": 0.0, **overrides})
        _reset_peak(cpu)
        t0 = time.time()
        if dist is not None:
            dist = dist(cfg)
        tr = Trainer(cfg, progress=False, task=replace(build_task(cfg), reward=_reward),
                     **({"dist": dist} if dist is not None else {}))
        load_s = time.time() - t0
        try:
            params = list(tr.params)
            before = [getattr(p, "ds_tensor", p).detach().float().clone() for p in params[:4]]
            print(f"[train] trainer built in {load_s:.1f} s", flush=True)
            rows = []
            for _ in range(steps):
                rows.append(tr.step())
                r = rows[-1]
                print(f"[train] step {len(rows)}: {r.get('timing/step', 0.0):.1f} s, loss {r['loss']:.4f}, "
                      f"peak {r.get('memory/cuda_peak_gib', r.get('memory/peak_rss_gib', 0.0)):.2f} GiB", flush=True)
            moved = any(not torch.equal(b, getattr(p, "ds_tensor", p).detach().float())
                        for b, p in zip(before, params[:4]))
            est = tr.memory_estimate
            engine = getattr(tr.engine, "initial_sync", None)
        finally:
            tr.close()
            if dist is not None:
                from rftlib.train.dist import shutdown_dist

                shutdown_dist()
    peak = max(r.get("memory/cuda_peak_gib", r.get("memory/peak_rss_gib", 0.0)) for r in rows)
    finite = all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for r in rows)
    out = {"load_s": round(load_s, 1), "step_s": [round(r.get("timing/step", 0.0), 1) for r in rows],
           "generate_s": [round(r.get("timing/generate", 0.0), 1) for r in rows],
           "loss": [round(r["loss"], 4) for r in rows], "grad_norm": [round(r["grad_norm"], 4) for r in rows],
           "advantage_std": [round(r.get("advantage_std", 0.0), 3) for r in rows], "weights_moved": moved,
           "peak_gib": round(peak, 2), "preflight_gib": None if est is None else round(est, 2),
           "dtype": cfg.dtype, "completion_tokens_mean": round(rows[-1].get("response_length_mean", 0.0), 1)}
    for k in ("sync/probe_max_diff", "sync/probe_threshold", "sync/probe_noise"):
        if k in rows[-1]:
            out[k] = round(rows[-1][k], 5)
    if engine is not None:
        out["initial_sync"] = {k: round(v, 5) for k, v in engine.items() if k.startswith("probe")}
    problems = [] if finite else ["loss or grad norm not finite"]
    if not moved:
        problems.append("no trainable weight moved")
    if not cpu:  # the CPU's peak RSS is the process's, not the step's: the verdict is a GPU one
        out.update(memory_verdict(peak, est))
        if out["memory"] == "fail":
            problems.append(out["why"])
    out["status"] = "fail" if problems else ("flag" if out.get("memory") == "flag" else "pass")
    if problems:
        out["problems"] = problems
    return out


def stage_seed002_fp16_lora(cpu: bool) -> dict:
    """Seed 002 emulated: Qwen2.5-Coder-0.5B-shaped (8 of its 24 layers, random weights), fp16 LoRA through a GradScaler, G 2, one
    prompt a step, memory capped at the RTX 3080's 10 GB, one step of 128 tokens (the arithmetic task: no sandbox
    on the GPU box). The CPU form runs float16 weights through torch.amp.GradScaler("cpu") at toy sizes: the
    config refuses float16 on a CPU for speed (rftlib.backends.whole_model_rules), so this process registers the
    single backend once more without that one rule."""
    import tempfile

    import torch

    with tempfile.TemporaryDirectory() as d:
        # 8 of its 24 layers: the H200 run spent ~38 s building and loading the whole 0.5B, 17.5 s on its step
        model = _model_dir("toy" if cpu else "qwen2.5-0.5b", Path(d) / "m", torch.float16, layers=None if cpu else 8)
        if cpu:  # rftlib refuses float16 on a CPU twice, for speed: the config's rule and the trainer's dtype
            from unittest import mock

            from rftlib.backends import BACKENDS, whole_model_rules
            from rftlib.train import build

            BACKENDS.declare("single_fp16_cpu", "rftlib.backends.torch_backend:TorchBackend",
                             check_config=lambda inputs: [p for p in whole_model_rules(inputs)
                                                          if not p.startswith("dtype float16 on CPU")])
            with mock.patch.object(build, "resolve_dtype", lambda name, device: name):
                out = _train_steps("seed002-fizzbuzz-rtx3080", {"model": str(model), "device": "cpu",
                                                                "backend": "single_fp16_cpu", "max_new_tokens": 16}, 1,
                                   cpu=True)
        else:
            out = _train_steps("seed002-fizzbuzz-rtx3080", {"model": str(model), "device": "cuda",
                                                            "max_new_tokens": 128}, 1, cpu=False, memory_cap_gb=10)
    return out


def stage_seed000_full_step(cpu: bool) -> dict:
    """Seed 000: a Qwen2.5-1.5B-shaped full fine-tune step (6 of its 28 layers, random weights; bf16, gradient checkpointing, a frozen
    reference copy, G 8 x 4 prompts in one micro-batch, 128 tokens), its peak against the preflight."""
    import tempfile

    import torch

    with tempfile.TemporaryDirectory() as d:
        if cpu:
            model = _model_dir("toy", Path(d) / "m", torch.float32)
            return _train_steps("seed000-phase15", {"model": str(model), "device": "cpu", "dtype": "float32",
                                                    "rollout_batch_size": 2, "micro_batch_size": 16,
                                                    "max_new_tokens": 16}, 1, cpu=True)
        # 6 of its 28 layers: the whole 1.5B had not finished its first generate 80 s into the stage (H200)
        model = _model_dir("qwen2.5-1.5b", Path(d) / "m", torch.bfloat16, layers=6)
        return _train_steps("seed000-phase15", {"model": str(model), "device": "cuda", "rollout_batch_size": 4,
                                                "micro_batch_size": 32, "max_new_tokens": 128}, 1, cpu=False)


def stage_mxfp4_lora_step(cpu: bool) -> dict:
    """gpt-oss's MXFP4 experts (rftlib.models.gptoss: packed FP4 codes + E8M0 scales, as HF stores gpt-oss)
    dequantised on load on the CPU (rftlib loads whole models on the CPU, then moves them to the device), then one
    LoRA GRPO step on the attention projections on this device. Eager attention: flex's compile (107 s per shape
    on the H200) is flex_mix's subject, not this stage's."""
    import tempfile

    from rftlib.models.gptoss import build_gptoss_mxfp4

    with tempfile.TemporaryDirectory() as d:
        shape = dict(layers=2, hidden=64, intermediate=64, experts=4) if cpu else dict(
            layers=4, hidden=1024, intermediate=1024, experts=8, heads=16, kv_heads=4, head_dim=64, sliding_window=128)
        model = build_gptoss_mxfp4(Path(d) / "gptoss", **shape)
        return _train_steps("tiny", {"model": str(model), "device": "cpu" if cpu else "cuda",
                                     "dtype": "float32" if cpu else "bfloat16", "max_new_tokens": 8,
                                     "attn_implementation": "eager",
                                     "lora_target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"], "beta": 0.0,
                                     "lr": 1e-2}, 1, cpu=cpu)


def _install_deepspeed() -> dict:
    """deepspeed importable, or installed offline from the carried wheels (scripts/fetch_deepspeed.sh) with its
    CUDA ops off (DS_BUILD_OPS=0); {installed: how, seconds}."""
    import importlib.util
    import subprocess

    if importlib.util.find_spec("deepspeed") is not None:
        return {"deepspeed": "already installed"}
    wheels = ROOT / ".gpu_wheels" / "deepspeed"
    if not wheels.is_dir():
        raise RuntimeError(f"deepspeed is not installed and {wheels} is missing: run scripts/fetch_deepspeed.sh "
                           "where a package registry is reachable and carry the folder along")
    t0 = time.time()
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--find-links", str(wheels)]
    subprocess.run(pip + ["setuptools", "wheel"], check=True, timeout=DEEPSPEED_INSTALL_S)
    subprocess.run(pip + ["--no-build-isolation", "deepspeed==0.19.8"], check=True,
                   env={**os.environ, "DS_BUILD_OPS": "0"}, timeout=max(1.0, DEEPSPEED_INSTALL_S - (time.time() - t0)))
    return {"deepspeed": "installed offline", "install_s": round(time.time() - t0, 1)}


def _deepspeed_here() -> dict:
    """DeepSpeed importable in this stage: main()'s install before transformers was imported (its record), or
    this process's check (the CPU form, a stage run alone); main()'s install error is raised here."""
    if "error" in DEEPSPEED_INSTALL:
        raise RuntimeError(f"the offline DeepSpeed install failed: {DEEPSPEED_INSTALL['error']}")
    return dict(DEEPSPEED_INSTALL) or _install_deepspeed()


def stage_deepspeed_zero3(cpu: bool) -> dict:
    """DeepSpeed ZeRO-3 on one rank (NCCL on a GPU, gloo on the CPU) with LoRA: one GRPO step whose sync runs the
    backend's real gather (adapter_state under ZeRO-3) into the stand-in engine, which the probe checks."""
    import tempfile

    import torch

    from rftlib.backends import ZERO_BACKEND
    from rftlib.train.dist import init_dist
    from standin_engine import register_standin

    out = _deepspeed_here()
    register_standin()
    with tempfile.TemporaryDirectory() as d:
        model = _model_dir("toy" if cpu else "smollm2-135m", Path(d) / "m", torch.float32)
        # bf16 weights in the CPU form too: the probe's float32 noise reference then runs over bf16 ZeRO-3
        # partitions, as on a GPU (float32 partitions hid its failure to gather them until the H200, 2026-11-27)
        res = _train_steps("tiny", {"model": str(model), "device": "cpu" if cpu else "cuda",
                                    "dtype": "bfloat16", "backend": ZERO_BACKEND,
                                    "zero_stage": 3, "lora_rank": 8, "rollout_engine": "standin",
                                    "max_new_tokens": 8, "lr": 1e-2, "beta": 0.0}, 1, cpu=cpu, dist=init_dist)
    if "sync/probe_max_diff" not in res:
        res.setdefault("problems", []).append("no sync probe ran after the step")
        res["status"] = "fail"
    return {**out, **res}


CPU_ADAM_BUILD_S = 50  # the JIT build's own limit, inside cpu_adam's (the H200 run: not done in 25 s)


def _kill_session(sid: int) -> None:
    """SIGKILL every process of session ``sid`` (its leader's pid), whatever process group it is in."""
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if os.getsid(int(d.name)) == sid:
                    os.kill(int(d.name), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _cpu_adam_build(limit: float) -> dict:
    """CPUAdamBuilder().load() in a process of its own session, killed with its compilers at ``limit``: a build
    that does not finish in time is a finding ({built: False, why}), not a stage lost to its limit."""
    import subprocess

    code = ("import time; from deepspeed.ops.op_builder import CPUAdamBuilder; t = time.time(); "
            "CPUAdamBuilder().load(verbose=False); print(round(time.time() - t, 1))")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    try:
        text, _ = p.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        _kill_session(p.pid)  # ninja starts each compiler in a process group of its own: the session holds them
        p.communicate()
        return {"built": False, "why": f"the JIT build did not finish in {limit:.0f} s"}
    lines = text.strip().splitlines() or [""]
    if p.returncode == 0:
        return {"built": True, "build_s": float(lines[-1])}
    return {"built": False, "why": f"the JIT build failed (exit {p.returncode}): {lines[-1][:200]}"}


def stage_cpu_adam(cpu: bool) -> dict:
    """Whether DeepSpeedCPUAdam (offload_optimizer's optimizer) can be built here: DS_BUILD_OPS=0 leaves it to a
    JIT build at first use (ninja + a C++ compiler; on a CUDA torch also the CUDA toolkit's headers). Reports the
    prerequisites; the GPU form tries the build (a limit hit is the answer "not at start-up"). Passes when the
    facts were gathered: feasibility is a finding, not this machine's failure."""
    import shutil

    out = _deepspeed_here() if not cpu else {}
    out.update(ninja=shutil.which("ninja") is not None, cxx=shutil.which(os.environ.get("CXX", "c++")) is not None,
               cuda_home=os.environ.get("CUDA_HOME") or (shutil.which("nvcc") and str(Path(shutil.which("nvcc")).parents[1])))
    try:
        from deepspeed.ops.op_builder import CPUAdamBuilder

        b = CPUAdamBuilder()
        out["compatible"] = bool(b.is_compatible(verbose=False))
        if not cpu and out["compatible"]:
            out.update(_cpu_adam_build(CPU_ADAM_BUILD_S))
    except Exception as e:  # noqa: BLE001 -- what failed is the finding
        out["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    out["status"] = "pass"
    return out


GPTOSS_20B = dict(hidden=2880, heads=64, kv_heads=8, head_dim=64, sliding_window=128, intermediate=2880,
                  experts=32, experts_per_tok=4)  # gpt-oss-20b's config.json (docs/reference-setups.md, seed 003)


def _gptoss_config(dims: dict, layers: int, layer_types=None):
    from transformers import GptOssConfig

    kw = {"layer_types": layer_types} if layer_types else {}
    return GptOssConfig(vocab_size=512, hidden_size=dims["hidden"], intermediate_size=dims["intermediate"],
                        num_hidden_layers=layers, num_attention_heads=dims["heads"],
                        num_key_value_heads=dims["kv_heads"], head_dim=dims["head_dim"],
                        num_local_experts=dims["experts"], num_experts_per_tok=dims["experts_per_tok"],
                        sliding_window=dims["sliding_window"], max_position_embeddings=131072,
                        tie_word_embeddings=False, **kw)


def stage_gptoss_layer(cpu: bool) -> dict:
    """The preflight's gpt-oss terms against one gpt-oss-20b layer (full attention) on this device, no compile:
    (a) a no-grad forward at T 4450 (seed 003's prompt + 4,096 tokens), one row, eager attention: its peak against
    rftlib.models.memory.nograd_row_bytes (the MoE block's grouped_mm temporaries and eager's score copies);
    (b) with grad, the bytes still allocated after the forward (what autograd saved) against the backward term
    (_activation_bytes_per_token_layer) plus at most four (T, h) tensors outside the layer. Built on the CPU in
    bf16, peaks reset before each. The CPU form runs both at toy dims and checks only that they run and are
    estimated (tests/test_models_moe_nograd_memory.py measures the live tensors on a CPU)."""
    import torch
    from transformers import AutoModelForCausalLM

    from rftlib.models.memory import _activation_bytes_per_token_layer, nograd_row_bytes, shape_from_hf_config

    dims = dict(hidden=64, heads=4, kv_heads=2, head_dim=16, sliding_window=16, intermediate=64, experts=4,
                experts_per_tok=2) if cpu else GPTOSS_20B
    T, device = (128, "cpu") if cpu else (4450, "cuda")
    dtype, b = (torch.float32, 4) if cpu else (torch.bfloat16, 2)
    torch.manual_seed(0)
    t0 = time.time()
    model = AutoModelForCausalLM.from_config(_gptoss_config(dims, 1, ["full_attention"]), dtype=dtype,
                                             attn_implementation="eager").to(device)
    print(f"[gptoss_layer] one layer built on the CPU and moved in {time.time() - t0:.1f} s", flush=True)
    shape = shape_from_hf_config(model.config, "gpt-oss-20b-one-layer")
    ids = torch.randint(0, 512, (1, T), device=device)
    mask = torch.ones_like(ids)
    rows, status = [], "pass"

    def measure(name: str, est: float, fn) -> None:
        nonlocal status
        _reset_peak(cpu)
        base = 0 if cpu else torch.cuda.memory_allocated()
        t = time.time()
        kept = fn()
        row = {"term": name, "T": T, "estimate_gib": round(est / 2**30, 3), "seconds": round(time.time() - t, 2)}
        if not cpu:
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() - base
            alive = torch.cuda.memory_allocated() - base
            meas = alive if name.startswith("saved") else peak
            row.update(measured_gib=round(meas / 2**30, 3), **memory_verdict(meas, est))
            status = "fail" if row["memory"] == "fail" or status == "fail" else (
                "flag" if row["memory"] == "flag" else status)
        del kept
        rows.append(row)
        print(json.dumps(row), flush=True)

    with torch.no_grad():
        model.model(input_ids=ids[:, :16], attention_mask=mask[:, :16], use_cache=False)  # lazily built buffers
        measure("nograd_row_eager", nograd_row_bytes(shape, T, b, "eager"),
                lambda: model.model(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state)
    model.train()
    outside = 4 * T * dims["hidden"] * b
    measure("saved_for_backward", T * _activation_bytes_per_token_layer(shape, b, T, "eager") + outside,
            lambda: model.model(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state)
    return {"status": status, "rows": rows}


def stage_generate_split(cpu: bool) -> dict:
    """HF generate's time per token on this device, split into GPU-busy time (the profiler's CUDA kernel time)
    and the rest (host: Python, launches, sync): plain, with an unmerged LoRA on q/k/v/o (what HFEngine runs
    under LoRA), and merged. SmolLM2-shaped, bf16, one prompt, greedy, 16 tokens after a warm-up; wall time
    unprofiled, GPU-busy time from a third, profiled run. The CPU form
    reports wall time only."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    from transformers import AutoModelForCausalLM, GenerationConfig

    from rftlib.models.loading import apply_lora

    device = "cpu" if cpu else "cuda"
    dtype = torch.float32 if cpu else torch.bfloat16
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(_hf_config("toy" if cpu else "smollm2-135m"), dtype=dtype).to(device)
    n = 8 if cpu else 16
    gc = GenerationConfig(do_sample=False, max_new_tokens=n, min_new_tokens=n, pad_token_id=0, eos_token_id=None)
    ids = torch.randint(0, 1000, (1, 32), device=device)
    rows = []

    def timed(name, m):
        def gen():
            m.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=gc)
            if not cpu:
                torch.cuda.synchronize()

        gen()  # warm-up
        t = time.time()
        gen()  # wall time without the profiler (which adds host time per op)
        wall = time.time() - t
        row = {"mode": name, "tokens": n, "ms_per_token": round(1e3 * wall / n, 2)}
        if not cpu:
            # the device's activity only: with the CPU's ops too, parsing the events of one 16-token generate
            # outlasted the stage's 45 s on the H200 (2026-11-27)
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                gen()
            # kernels, copies and memsets as the device ran them (one stream: they do not overlap), in seconds
            busy = sum(e.time_range.elapsed_us() for e in prof.events() if e.device_type == DeviceType.CUDA) / 1e6
            row.update(gpu_busy_ms_per_token=round(1e3 * busy / n, 2),
                       host_ms_per_token=round(1e3 * (wall - busy) / n, 2))
        rows.append(row)
        print(json.dumps(row), flush=True)

    timed("plain", model)
    lora = apply_lora(model, rank=16, alpha=32, dropout=0.0, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    for m in lora.modules():  # a trained adapter's B is not 0: the LoRA kernels run either way
        if hasattr(m, "lora_B"):
            for lin in m.lora_B.values():
                torch.nn.init.normal_(lin.weight, std=0.01)
    timed("lora", lora.to(dtype))
    timed("merged", lora.merge_and_unload())
    return {"status": "pass", "rows": rows}


def stage_smoke_zero3(cpu: bool) -> dict:
    """``rft smoke --lines zero3`` on the tiny model (the embedded default's weights do not travel to a machine
    with no network): one ZeRO-3 step on one rank, its table row; the line runs in its own session (a killed stage
    takes it along: run_stage)."""
    import tempfile

    from rftlib.smoke import run_smoke

    if cpu:  # 46 s here (a process of its own); tests/test_smoke.py runs the CPU zero3 line in CI already
        return {"status": "pass", "note": "not run in the CPU form: tests/test_smoke.py runs rft smoke's zero3 line",
                "rows": []}
    _deepspeed_here()
    with tempfile.TemporaryDirectory() as d:
        rows = run_smoke(("zero3",), model="tiny", runs_root=d, write=lambda s: print(s, flush=True))
        ran = [r for r in rows if r.status != "not run"]
        log = Path(d) / "smoke_zero3.log"
        tail = log.read_text(errors="replace").splitlines()[-15:] if log.exists() else []
    out = {"status": "pass" if ran and all(r.status == "pass" for r in ran) else "fail",
           "rows": [r.__dict__ for r in rows]}
    if out["status"] != "pass":
        out["log_tail"] = tail
    return out


def stage_flex_mix(cpu: bool) -> dict:
    """Flex attention under the trainer's call mix (bench/flex_recompiles.py: grad / no-grad, bf16 / float32, rows
    1/3/8, several T) on this device: recompiles counted with rftlib's bound in place, and whether any call fell
    back. GPU: gpt-oss-20b's attention dims, 2 layers; the CPU form: the bench's small Llama."""
    if cpu:  # measured here: the mix's flex compiles took 88 s of CPU, and flex has no backward on a CPU
        return {"status": "pass", "note": "not run in the CPU form (88 s of compiles; no flex backward on a CPU): "
                                          "python bench/flex_recompiles.py"}
    import torch._inductor.config

    # compiles in this process: inductor's pool of compile workers outlived the stage on the H200 (2026-11-27) and
    # failed it as a leftover process
    torch._inductor.config.compile_threads = 1
    # inductor drops a flex template choice it cannot generate with one INFO line ("Cannot Append Choice", with its
    # stack), then fails with NoValidChoicesError, which names no cause (both H200 runs, 2026-11-27): the stage log
    # keeps those lines
    import logging

    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(lambda r: "Choice" in r.getMessage() or r.levelno >= logging.WARNING)
    lg = logging.getLogger("torch._inductor")
    lg.setLevel(logging.INFO)
    lg.addHandler(handler)
    sys.path.insert(0, str(ROOT / "bench"))
    from flex_recompiles import run_mix

    return run_mix(device="cpu" if cpu else "cuda", gptoss=not cpu)


# ---------------------------------------------------------------------------------------------- runner

def _stage_pids(token: str) -> list[int]:
    """Every process that inherited this stage's token (a /proc scan): whatever session it made."""
    from rftlib.launch.procs import processes_with_token  # os only: no torch import to count a stage's leftovers

    return processes_with_token(token, var=STAGE_TOKEN_ENV)


def _kill_stage(pid: int, token: str, *, alive: bool) -> int:
    """SIGKILL every process that carries the stage's token, by process group and by pid (a smoke line, a DeepSpeed
    or compile worker in a session of its own included), and the stage itself when it is ``alive`` (still running
    at its limit: not yet reaped, so its pid is its own), never this process's group; returns how many processes
    carried the token."""
    own = os.getpgrp()
    found = [p for p in _stage_pids(token) if p not in (pid, os.getpid())]
    for p in [pid] * alive + found:
        try:
            group = os.getpgid(p)
            if group != own:
                os.killpg(group, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            os.kill(p, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return len(found)


def run_stage(name: str, limit: float, cpu: bool, out: Path) -> dict:
    """One stage in a forked process that leads a session of its own, its output in ``<name>.log``, its row in
    ``<name>.json``. At ``limit`` seconds it is killed with every process it started (:func:`_kill_stage`); a
    stage that ends but leaves a process behind fails. Forked, not started afresh: the parent has imported torch
    and transformers once (and initialised no CUDA), so a stage costs its work, not ~5 s of imports."""
    import uuid

    res, log = out / f"{name}.json", out / f"{name}.log"
    res.unlink(missing_ok=True)
    token = uuid.uuid4().hex
    t = time.time()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the stage
        code = 1
        try:
            os.setsid()
            os.environ[STAGE_TOKEN_ENV] = token
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            import faulthandler

            # a stage still running near its limit leaves every thread's stack in its log: where the time went
            faulthandler.dump_traceback_later(max(1.0, limit - 2.0), exit=False)
            row = globals()[f"stage_{name}"](cpu)
            res.write_text(json.dumps(row, default=str))
            code = 0
        except BaseException:  # noqa: BLE001 -- the traceback is the stage's log
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    code = None
    while time.time() - t < limit:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            break
        time.sleep(0.05)
    left = _kill_stage(pid, token, alive=code is None)  # at the limit: the stage and all; after an exit: leftovers
    if code is None:
        os.waitpid(pid, 0)
    row = json.loads(res.read_text()) if res.exists() else {"status": "fail"}
    if not res.exists():
        row["error"] = f"timed out after {limit:.0f} s" if code is None else f"exited with code {code}"
        row["log_tail"] = log.read_text(errors="replace").strip().splitlines()[-12:] if log.exists() else []
    if left and code is not None:
        row.update(status="fail", error=f"left {left} process(es) running after it ended (killed)")
    row = {"stage": name, "seconds": round(time.time() - t, 1), **row}
    with (out / "gpu_check.jsonl").open("a") as f:
        f.write(json.dumps(row, default=str) + "\n")
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu", action="store_true", help="the CPU form: toy sizes, seconds (what CI runs)")
    p.add_argument("--stages", default=",".join(n for n, _ in STAGES))
    p.add_argument("--limits", default="", help="NAME=SECONDS,... in place of a stage's limit (a diagnosis run)")
    p.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "runs" / "gpu_check"))
    a = p.parse_args(argv)
    limits = dict(STAGES)
    for item in filter(None, a.limits.split(",")):
        name, _, sec = item.partition("=")
        if name not in limits or not sec.replace(".", "", 1).isdigit():
            p.error(f"--limits: '{item}' is not STAGE=SECONDS for a stage in {', '.join(limits)}")
        limits[name] = float(sec)
    names = a.stages.split(",")
    for name in names:
        if name not in limits:
            p.error(f"unknown stage '{name}': choose from {', '.join(limits)}")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check.jsonl").unlink(missing_ok=True)
    # imported once here, before the stages fork; no CUDA call in this process (a CUDA context does not survive a
    # fork), and torch.cuda.is_available() answers from NVML, which initialises no CUDA, wherever it is called here
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    t0 = time.time()  # the budget counts the install too
    if not a.cpu and DEEPSPEED_STAGES & set(names):
        # before transformers is imported: it decides at import whether DeepSpeed is there
        # (transformers.integrations.deepspeed: HfDeepSpeedConfig's base is object without it), and every stage
        # is forked from this process; an install from inside a stage left ZeRO-3 loading on that object
        # (the H200 run of 2026-11-27: "object.__init__() takes exactly one argument")
        t = time.time()
        try:
            DEEPSPEED_INSTALL.update(_install_deepspeed())
        except Exception as e:  # noqa: BLE001 -- the DeepSpeed stages report it
            DEEPSPEED_INSTALL.update(error=f"{type(e).__name__}: {e}"[:300])
        DEEPSPEED_INSTALL["install_total_s"] = round(time.time() - t, 1)
        print(f"[gpu_check] deepspeed: {json.dumps(DEEPSPEED_INSTALL)}", flush=True)
    import torch  # noqa: F401
    import transformers  # noqa: F401

    import rftlib.train.loop  # noqa: F401
    rows = []
    for name in names:
        limit = limits[name] or (BUDGET_S - (time.time() - t0))  # 0: the budget's rest (flex_mix)
        if limits[name] == 0 and limit < FLEX_MIN_S and not a.cpu:
            rows.append({"stage": name, "status": "not run", "seconds": 0.0,
                         "error": f"{limit:.0f} s of the {BUDGET_S} s budget left (< {FLEX_MIN_S})"})
            continue
        print(f"[gpu_check] {name} (limit {limit:.0f} s) ...", flush=True)
        rows.append(run_stage(name, limit if not a.cpu else max(limit, 60), a.cpu, out))
        print(json.dumps(rows[-1], default=str), flush=True)
    print(f"\nstage              status  seconds  (budget {BUDGET_S} s, used {time.time() - t0:.0f} s)")
    for r in rows:
        why = r.get("error") or "; ".join(r.get("problems", [])) or r.get("why", "")
        print(f"{r['stage']:<18} {r['status']:<7} {r['seconds']:>7}  {why[:100]}")
    flagged = [r["stage"] for r in rows if r["status"] == "flag"]
    if flagged:
        print(f"flagged (the preflight over-counts; explain in the note): {', '.join(flagged)}")
    return 0 if all(r["status"] in ("pass", "flag") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
