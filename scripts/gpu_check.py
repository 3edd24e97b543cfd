#!/usr/bin/env python3
"""The first thing to run on a GPU machine: a few stages, each in its own process with its own time
limit, each ending in one JSON row; then a table. Its CPU form (``--cpu``, what CI runs) takes
seconds and runs every stage at toy sizes, so the script cannot rot between GPU machines.

    python scripts/gpu_check.py                  # on the GPU machine (README: "A GPU machine")
    python scripts/gpu_check.py --cpu            # the CPU form
    python scripts/gpu_check.py --stages versions,probe_noise --out /tmp/gc

Built for a machine with no network and no model weights: every model is built from a config with
random weights (shapes of the reference setups in docs/reference-setups.md), the tokenizer is the
tiny test tokenizer. No vLLM or DeepSpeed is needed; what needs them says so in its row.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# (name, limit in seconds on a GPU) -- the stages run in this order; the limits sum to 10 minutes. Each limit is
# its stage's time on an H200 (2026-11-27, torch 2.11, transformers 5.17; the note of that session) plus a margin:
# versions 25 s, probe_noise 24, seed002 134 (HF generate at ~50-115 ms a token on that machine), seed000 81,
# mxfp4 79 (flex attention compiling during generate), smoke_single 32, gptoss_nograd: flex attention's first
# compile at T 4450 took 107 s, so it goes last and compiles one shape only
STAGES: list[tuple[str, int]] = [
    ("versions", 35),
    ("probe_noise", 40),
    ("seed002_fp16_lora", 160),
    ("seed000_full_step", 95),
    ("mxfp4_lora_step", 90),
    ("smoke_single", 40),
    ("gptoss_nograd", 140),
]


# ---------------------------------------------------------------------------------------------- stages

def stage_versions(cpu: bool) -> dict:
    """The software this machine runs, and what rftlib would make of it."""
    import platform

    import torch
    import transformers

    row = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
           "cuda": torch.version.cuda, "gpus": torch.cuda.device_count() if torch.cuda.is_available() else 0}
    for mod in ("peft", "accelerate", "vllm", "deepspeed", "trl", "papermill"):
        try:
            row[mod] = __import__(mod).__version__
        except Exception as e:  # noqa: BLE001 -- a missing optional package is a fact to report
            row[mod] = f"missing ({type(e).__name__})"
    if row["gpus"]:
        p = torch.cuda.get_device_properties(0)
        row.update(gpu=p.name, gpu_gib=round(p.total_memory / 2**30, 1), bf16=torch.cuda.is_bf16_supported(),
                   capability=f"{p.major}.{p.minor}")
    from rftlib.models.loading import autocast_dtype

    row["autocast_auto"] = str(autocast_dtype("auto"))
    row["status"] = "pass"
    return row


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
    "toy": dict(kind="llama", vocab_size=4096, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True, max_position_embeddings=1024),
}


def _hf_config(shape: str, init_std: float = 0.02):
    from transformers import LlamaConfig, Qwen2Config

    kw = dict(SHAPES[shape])
    cls = {"llama": LlamaConfig, "qwen2": Qwen2Config}[kw.pop("kind")]
    return cls(initializer_range=init_std, **kw)


def _random_model(shape: str, *, init_std: float, device: str, dtype):
    """A causal LM of a reference setup's shape with seeded random weights, built on ``device`` (no download)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(_hf_config(shape, init_std), dtype=torch.float32)
    return model.to(dtype=dtype).eval()


def _model_dir(shape: str, out: Path, device: str, dtype) -> Path:
    """A checkpoint directory (random weights of ``shape`` in ``dtype`` + the tiny test tokenizer) for the trainer
    to load: its pad and eos are the tokenizer's; ids the tokenizer does not know decode to nothing."""
    from rftlib.models.tiny import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    model = _random_model(shape, init_std=0.02, device=device, dtype=dtype)
    for c in (model.config, model.generation_config):
        c.eos_token_id, c.pad_token_id, c.bos_token_id = tok.eos_token_id, tok.pad_token_id, None
    model.save_pretrained(out)
    tok.save_pretrained(out)
    del model
    return out


def stage_probe_noise(cpu: bool) -> dict:
    """The sync probe's numerics on this device, as rftlib's probe computes them (rftlib.rollout.sync_probe):
    an "engine" (bf16 weights, sdpa: how vLLM holds them) samples the probe's tokens; the trainer (the same
    bf16 weights, eager attention: other kernels) scores them under bf16 autocast, and again with every op in
    float32 (the noise the first sync's threshold is derived from). Reports the engine gap, the noise, the
    threshold and whether the honest engine passes; also the gap between sdpa and eager in bf16."""
    import torch

    from rftlib.models.forward import completion_logprobs
    from rftlib.models.precision import float32_compute
    from rftlib.models.tiny import build_tiny_tokenizer
    from rftlib.rollout import sync_probe

    device = "cpu" if cpu else "cuda"
    tok = build_tiny_tokenizer()
    enc = tok(sync_probe.PROBE_PROMPTS, return_tensors="pt", padding=True)
    prompt_ids, prompt_mask = enc["input_ids"].to(device), enc["attention_mask"].to(device)
    rows = []
    shapes = ["toy"] if cpu else ["smollm2-135m", "qwen2.5-1.5b"]
    for shape in shapes:
        for init_std in (0.02, 0.2):  # 0.02: near-uniform next-token distributions; 0.2: peaked, like a trained LM
            t0 = time.time()
            model = _random_model(shape, init_std=init_std, device=device, dtype=torch.bfloat16)
            print(f"[probe_noise] {shape} init {init_std}: model built in {time.time() - t0:.1f} s", flush=True)
            g = torch.Generator(device=device).manual_seed(sync_probe.PROBE_SEED)
            ids, behaviour = [], []
            model.set_attn_implementation("sdpa")
            with torch.no_grad():  # the engine samples PROBE_TOKENS tokens per prompt, recording their logprobs
                cur, cur_mask = prompt_ids, prompt_mask
                for _ in range(sync_probe.PROBE_TOKENS):
                    pos = (cur_mask.cumsum(-1) - 1).clamp(min=0)
                    logits = model(input_ids=cur, attention_mask=cur_mask, position_ids=pos).logits[:, -1].float()
                    lp = torch.log_softmax(logits, -1)  # (N, V)
                    nxt = torch.multinomial(lp.exp(), 1, generator=g)  # (N, 1)
                    ids.append(nxt)
                    behaviour.append(lp.gather(1, nxt))
                    cur = torch.cat([cur, nxt], 1)
                    cur_mask = torch.cat([cur_mask, torch.ones_like(nxt)], 1)
            comp = torch.cat(ids, 1)  # (N, T)
            beh = torch.cat(behaviour, 1)  # (N, T)
            cmask = torch.ones_like(comp, dtype=torch.float32)

            def score(attn: str, ctx) -> torch.Tensor:
                model.set_attn_implementation(attn)
                with torch.no_grad(), ctx:
                    lp, _ = completion_logprobs(model, prompt_ids, prompt_mask, comp, cmask, with_entropy=False)
                return lp.float()  # (N, T)

            trainer = score("eager", torch.autocast(device, dtype=torch.bfloat16))
            sdpa = score("sdpa", torch.autocast(device, dtype=torch.bfloat16))
            ref = score("eager", float32_compute(device))
            noise = float((trainer - ref).abs().max())
            gap = float((beh - trainer).abs().max())
            threshold = sync_probe.sync_threshold(noise, 0.05)
            rows.append({"shape": shape, "init_std": init_std, "mean_logprob": round(float(beh.mean()), 3),
                         "engine_gap": round(gap, 4), "noise_bf16_vs_fp32": round(noise, 4),
                         "sdpa_vs_eager_bf16": round(float((trainer - sdpa).abs().max()), 4),
                         "gap_over_noise": round(gap / max(noise, 1e-12), 2), "threshold": round(threshold, 4),
                         "passes": gap <= threshold})
            print(json.dumps(rows[-1]), flush=True)  # progress in the stage's log: a timed-out stage keeps its rows
            del model
            if not cpu:
                torch.cuda.empty_cache()
    return {"status": "pass" if all(r["passes"] for r in rows) else "fail", "rows": rows}


def _reward(text, ex, truncated):
    """Varies within a group on a random model (whose ids mostly decode to nothing): the decoded length mod 5."""
    return (len(text) % 5) / 4.0, {"correctness": 0.0}


def _train_steps(preset: str, overrides: dict, steps: int, *, memory_cap_gb: float | None = None) -> dict:
    """Build the trainer for ``preset`` + ``overrides`` and take ``steps`` GRPO steps; the rows' figures."""
    import math
    import tempfile
    from dataclasses import replace

    import torch

    from rftlib.config import make_config
    from rftlib.train.build import build_task
    from rftlib.train.loop import Trainer

    if memory_cap_gb and torch.cuda.is_available():  # the GPU the seed ran on, emulated on a bigger one
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, memory_cap_gb * 1e9 / total))
    with tempfile.TemporaryDirectory() as d:
        # warmup off: a one-step check must step at the preset's LR, not at warmup's 0
        cfg = make_config(preset, {"runs_root": d, "report_to": [], "save_steps": 1000, "eval_size": 2,
                                   "task": "arithmetic", "num_steps": steps, "warmup_ratio": 0.0, **overrides})
        t0 = time.time()
        tr = Trainer(cfg, progress=False, task=replace(build_task(cfg), reward=_reward))
        load_s = time.time() - t0
        try:
            params = [p for p in tr.params]
            before = [p.detach().float().clone() for p in params[:4]]
            print(f"[train] trainer built in {load_s:.1f} s", flush=True)
            rows = []
            for _ in range(steps):
                rows.append(tr.step())
                r = rows[-1]
                print(f"[train] step {len(rows)}: {r.get('timing/step', 0.0):.1f} s, loss {r['loss']:.4f}, "
                      f"peak {r.get('memory/cuda_peak_gib', r.get('memory/peak_rss_gib', 0.0)):.2f} GiB", flush=True)
            moved = any(not torch.equal(b, p.detach().float()) for b, p in zip(before, params[:4]))
            est = tr.memory_estimate
        finally:
            tr.close()
    peak = max(r.get("memory/cuda_peak_gib", r.get("memory/peak_rss_gib", 0.0)) for r in rows)
    finite = all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for r in rows)
    out = {"load_s": round(load_s, 1), "step_s": [round(r.get("timing/step", 0.0), 1) for r in rows],
           "generate_s": [round(r.get("timing/generate", 0.0), 1) for r in rows],
           "loss": [round(r["loss"], 4) for r in rows], "grad_norm": [round(r["grad_norm"], 4) for r in rows],
           "advantage_std": [round(r.get("advantage_std", 0.0), 3) for r in rows], "weights_moved": moved,
           "peak_gib": round(peak, 2), "preflight_gib": None if est is None else round(est, 2),
           "dtype": cfg.dtype, "completion_tokens_mean": round(rows[-1].get("response_length_mean", 0.0), 1)}
    ok = finite and moved
    if est is not None and peak > 1.25 * est:  # rftlib.smoke.ESTIMATE_SLACK: the preflight must not under-count
        ok = False
        out["problem"] = f"peak {peak:.2f} GiB > 1.25 x the preflight's {est:.2f} GiB"
    out["status"] = "pass" if ok else "fail"
    return out


def stage_seed002_fp16_lora(cpu: bool) -> dict:
    """Seed 002 emulated: Qwen2.5-Coder-0.5B-shaped (random weights), fp16 LoRA, G 2, one prompt a step, 512
    tokens, memory capped at the RTX 3080's 10 GB, 3 steps (the arithmetic task: no sandbox on the GPU box)."""
    import tempfile

    import torch

    with tempfile.TemporaryDirectory() as d:
        if cpu:  # float16 is CUDA-only: the CPU form runs the same step in float32 at toy sizes
            model = _model_dir("toy", Path(d) / "m", "cpu", torch.float32)
            return _train_steps("seed002-fizzbuzz-rtx3080", {"model": str(model), "device": "cpu", "dtype": "float32",
                                                             "max_new_tokens": 16}, 3)
        model = _model_dir("qwen2.5-0.5b", Path(d) / "m", "cuda", torch.float16)
        return _train_steps("seed002-fizzbuzz-rtx3080", {"model": str(model), "device": "cuda"}, 3, memory_cap_gb=10)


def stage_seed000_full_step(cpu: bool) -> dict:
    """Seed 000: a Qwen2.5-1.5B-shaped full fine-tune step (random weights; bf16, gradient checkpointing, a frozen
    reference copy, G 8 x 16 prompts = 128 sequences in one micro-batch), its peak against the preflight."""
    import tempfile

    import torch

    with tempfile.TemporaryDirectory() as d:
        if cpu:
            model = _model_dir("toy", Path(d) / "m", "cpu", torch.float32)
            return _train_steps("seed000-phase15", {"model": str(model), "device": "cpu", "dtype": "float32",
                                                    "rollout_batch_size": 2, "micro_batch_size": 16,
                                                    "max_new_tokens": 16}, 1)
        model = _model_dir("qwen2.5-1.5b", Path(d) / "m", "cuda", torch.bfloat16)
        return _train_steps("seed000-phase15", {"model": str(model), "device": "cuda", "max_new_tokens": 256}, 1)


def stage_mxfp4_lora_step(cpu: bool) -> dict:
    """gpt-oss's MXFP4 experts (rftlib.models.gptoss: packed FP4 codes + E8M0 scales, as HF stores gpt-oss)
    dequantised on load on this device, then one LoRA GRPO step on the attention projections."""
    import tempfile

    from rftlib.models.gptoss import build_gptoss_mxfp4

    with tempfile.TemporaryDirectory() as d:
        shape = dict(layers=2, hidden=64, intermediate=64, experts=4) if cpu else dict(
            layers=4, hidden=1024, intermediate=1024, experts=8, heads=16, kv_heads=4, head_dim=64, sliding_window=128)
        model = build_gptoss_mxfp4(Path(d) / "gptoss", **shape)
        return _train_steps("tiny", {"model": str(model), "device": "cpu" if cpu else "cuda",
                                     "dtype": "float32" if cpu else "bfloat16", "max_new_tokens": 16,
                                     "lora_target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"], "beta": 0.0,
                                     "lr": 1e-2, "warmup_ratio": 0.0}, 1)


GPTOSS_20B_ATTN = dict(hidden=2880, heads=64, kv_heads=8, head_dim=64, sliding_window=128, intermediate=2880,
                       experts=32, experts_per_tok=4)  # gpt-oss-20b's config.json (docs/reference-setups.md, seed 003)


def stage_gptoss_nograd(cpu: bool) -> dict:
    """The reference / old-logprob pass of seed 003 (gpt-oss-20b, T ~ 4,450: prompt + 4,096 completion tokens) at
    its attention dims, 2 layers (one sliding-window, one full) with random weights: peak memory of one no-grad
    forward under flex attention (what rftlib picks for gpt-oss on CUDA; 8 rows, one compile) and eager (the model's
    default, whose (heads, T, T) scores the preflight counts; 1 row and the rows rftlib's auto logprob_batch_size
    would run on this GPU, at most 8), against rftlib.models.memory.nograd_row_bytes.
    Passes when no measured peak exceeds 1.25 x the estimate (the preflight must not under-count); the CPU form
    runs the eager forward at toy sizes and checks only that it runs and is estimated."""
    import torch
    from transformers import AutoModelForCausalLM, GptOssConfig

    from rftlib.models.memory import (estimator_attention, nograd_row_bytes, nograd_rows, pick_attention,
                                      shape_from_hf_config)

    dims = dict(hidden=64, heads=4, kv_heads=2, head_dim=16, sliding_window=16, intermediate=64, experts=4,
                experts_per_tok=2) if cpu else GPTOSS_20B_ATTN
    T, rows_list = (128, (1, 2)) if cpu else (4450, (1, 8))
    # flex compiles per input shape (the first at T 4450 took 107 s on an H200; a second row count recompiles, and
    # did not finish in the 72 s left): on a GPU flex runs one shape, 8 rows (per-row peak = peak / 8), eager both
    device = "cpu" if cpu else "cuda"
    dtype = torch.float32 if cpu else torch.bfloat16
    c = GptOssConfig(vocab_size=512, hidden_size=dims["hidden"], intermediate_size=dims["intermediate"],
                     num_hidden_layers=2, num_attention_heads=dims["heads"], num_key_value_heads=dims["kv_heads"],
                     head_dim=dims["head_dim"], num_local_experts=dims["experts"],
                     num_experts_per_tok=dims["experts_per_tok"], sliding_window=dims["sliding_window"],
                     max_position_embeddings=131072, tie_word_embeddings=False)
    auto = pick_attention("auto", default="eager", flex=True, device_type=device)
    attns = ["eager"] if cpu else [auto, "eager"]
    b = 4 if dtype == torch.float32 else 2
    out_rows, ok = [], True
    for attn in attns:
        torch.manual_seed(0)
        t0 = time.time()
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(c, dtype=dtype, attn_implementation=attn).eval()
        # progress on stdout (the stage's log): the first GPU run timed out at 90 s with nothing printed
        print(f"[gptoss_nograd] {attn}: model built in {time.time() - t0:.1f} s", flush=True)
        shape = shape_from_hf_config(model.config, "gpt-oss-20b-attn-2-layers")
        rows_here = rows_list
        if attn == "flex_attention":
            rows_here = rows_list[-1:]
        elif not cpu:  # eager: as many rows as rftlib's auto logprob_batch_size would run here (an H100 fits fewer)
            fits = nograd_rows(shape, T, b, "eager", free_bytes=torch.cuda.mem_get_info()[0], most=rows_list[-1])
            rows_here = sorted({1, fits})
        for rows in rows_here:
            ids = torch.randint(0, c.vocab_size, (rows, T), device=device)
            mask = torch.ones_like(ids)
            est = rows * nograd_row_bytes(shape, T, b, estimator_attention(attn))
            row = {"attention": attn, "rows": rows, "T": T, "estimate_gib": round(est / 2**30, 2)}
            try:
                with torch.no_grad():
                    t0 = time.time()
                    model.model(input_ids=ids, attention_mask=mask, use_cache=False)  # warm-up: flex compiles here
                    row["warmup_s"] = round(time.time() - t0, 2)
                    print(f"[gptoss_nograd] {attn}, {rows} row(s): warm-up forward {row['warmup_s']} s", flush=True)
                    if not cpu:
                        torch.cuda.synchronize()
                        torch.cuda.reset_peak_memory_stats()
                        base = torch.cuda.memory_allocated()
                    t0 = time.time()
                    before_layers = []  # the peak up to the first layer: the embeddings and the masks (flex's
                    # BlockMask is built from the padding mask here), apart from the layers' peak the estimate counts
                    hook = model.model.layers[0].register_forward_pre_hook(lambda *_: before_layers.append(
                        torch.cuda.max_memory_allocated() - base if not cpu else 0))
                    try:  # the transformer body, as rftlib's logprob passes run it: the logits are chunked apart
                        model.model(input_ids=ids, attention_mask=mask, use_cache=False)
                    finally:
                        hook.remove()
                    if not cpu:
                        torch.cuda.synchronize()
                        peak = torch.cuda.max_memory_allocated() - base
                        row.update(peak_gib=round(peak / 2**30, 2), peak_over_estimate=round(peak / est, 2),
                                   peak_before_layers_gib=round(before_layers[0] / 2**30, 2))
                        ok &= peak <= 1.25 * est
                    row["forward_s"] = round(time.time() - t0, 2)
            except torch.OutOfMemoryError as e:
                row["error"] = f"out of memory: {str(e).splitlines()[0][:160]}"
                ok = False
            out_rows.append(row)
            print(json.dumps(row), flush=True)
            del ids, mask
            if not cpu:
                torch.cuda.empty_cache()
        del model
    return {"status": "pass" if ok else "fail", "auto_attention": auto, "rows": out_rows}


def stage_smoke_single(cpu: bool) -> dict:
    """``rft smoke --lines single`` on the tiny model (the embedded default's weights do not travel to a
    machine with no network): one training step on this device, its table row."""
    import tempfile

    from rftlib.smoke import run_smoke

    with tempfile.TemporaryDirectory() as d:
        rows = run_smoke(("single",), model="tiny", runs_root=d, write=lambda s: print(s, flush=True))
        ran = [r for r in rows if r.status != "not run"]
        log = Path(d) / "smoke_single.log"
        tail = log.read_text(errors="replace").splitlines()[-15:] if log.exists() else []
    out = {"status": "pass" if ran and all(r.status == "pass" for r in ran) else "fail",
           "rows": [r.__dict__ for r in rows]}
    if out["status"] != "pass":
        out["log_tail"] = tail
    return out


# ---------------------------------------------------------------------------------------------- runner

def run_stage(name: str, limit: int, cpu: bool, out: Path) -> dict:
    """One stage in its own process group: a stage that hangs or leaks a server is killed whole."""
    res = out / f"{name}.json"
    res.unlink(missing_ok=True)
    log = out / f"{name}.log"
    cmd = [sys.executable, __file__, "--stage", name, "--json", str(res)] + (["--cpu"] if cpu else [])
    t = time.time()
    with open(log, "w") as f:
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                             env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            code = p.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            code = None
    row = json.loads(res.read_text()) if res.exists() else {"status": "fail"}
    if not res.exists():
        tail = log.read_text(errors="replace").strip().splitlines()[-12:]
        row["error"] = (f"timed out after {limit} s" if code is None else f"exited with code {code}")
        row["log_tail"] = tail
    row = {"stage": name, "seconds": round(time.time() - t, 1), **row}
    (out / "gpu_check.jsonl").open("a").write(json.dumps(row) + "\n")
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu", action="store_true", help="the CPU form: toy sizes, seconds (what CI runs)")
    p.add_argument("--stages", default=",".join(n for n, _ in STAGES))
    p.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "runs" / "gpu_check"))
    p.add_argument("--stage", help=argparse.SUPPRESS)
    p.add_argument("--json", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.stage:  # one stage, in this process (what run_stage starts)
        row = globals()[f"stage_{a.stage}"](a.cpu)
        Path(a.json).write_text(json.dumps(row, default=str))
        return 0
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check.jsonl").unlink(missing_ok=True)
    limits = dict(STAGES)
    rows = []
    for name in a.stages.split(","):
        if name not in limits:
            p.error(f"unknown stage '{name}': choose from {', '.join(limits)}")
        print(f"[gpu_check] {name} (limit {limits[name]} s) ...", flush=True)
        rows.append(run_stage(name, limits[name], a.cpu, out))
        print(json.dumps(rows[-1], default=str), flush=True)
    print("\nstage            status  seconds")
    for r in rows:
        print(f"{r['stage']:<16} {r['status']:<7} {r['seconds']:>7}")
    return 0 if all(r["status"] == "pass" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
