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

# (name, limit in seconds on a GPU) -- the stages run in this order; the sum stays under 10 minutes
STAGES: list[tuple[str, int]] = [
    ("versions", 60),
    ("probe_noise", 150),
    ("smoke_single", 240),
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


def _random_model(shape: str, *, init_std: float, device: str, dtype):
    """A causal LM of a reference setup's shape with seeded random weights (no download)."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    shapes = {
        # SmolLM2-135M-Instruct (the embedded default)
        "smollm2-135m": lambda: LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                                            num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                                            rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
                                            max_position_embeddings=8192),
        # Qwen2.5-1.5B (seed 000)
        "qwen2.5-1.5b": lambda: Qwen2Config(vocab_size=151936, hidden_size=1536, intermediate_size=8960,
                                            num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                                            rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=True,
                                            max_position_embeddings=32768),
        # the CPU form: small enough for seconds
        "toy": lambda: LlamaConfig(vocab_size=4096, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                                   max_position_embeddings=512),
    }
    cfg = shapes[shape]()
    cfg.initializer_range = init_std
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    return model.to(device=device, dtype=dtype).eval()


def stage_probe_noise(cpu: bool) -> dict:
    """The sync probe's numerics on this device: an "engine" (bf16 weights, sdpa, the way vLLM holds them)
    samples the probe's tokens; the trainer (float32 master weights) scores them under bf16 autocast with
    sdpa and with eager attention, and in float32. Reports each gap and the first-sync threshold the
    probe derives from the trainer's own honest gap (rftlib.rollout.sync_probe)."""
    import torch

    from rftlib.models.forward import completion_logprobs
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
            fp32 = _random_model(shape, init_std=init_std, device=device, dtype=torch.float32)
            engine = _random_model(shape, init_std=init_std, device=device, dtype=torch.bfloat16)
            g = torch.Generator(device=device).manual_seed(sync_probe.PROBE_SEED)
            ids, behaviour = [], []
            with torch.no_grad():  # the engine samples PROBE_TOKENS tokens per prompt, recording their logprobs
                cur, cur_mask = prompt_ids, prompt_mask
                for _ in range(sync_probe.PROBE_TOKENS):
                    pos = (cur_mask.cumsum(-1) - 1).clamp(min=0)
                    logits = engine(input_ids=cur, attention_mask=cur_mask, position_ids=pos).logits[:, -1].float()
                    lp = torch.log_softmax(logits, -1)  # (N, V)
                    nxt = torch.multinomial(lp.exp(), 1, generator=g)  # (N, 1)
                    ids.append(nxt)
                    behaviour.append(lp.gather(1, nxt))
                    cur = torch.cat([cur, nxt], 1)
                    cur_mask = torch.cat([cur_mask, torch.ones_like(nxt)], 1)
            comp = torch.cat(ids, 1)  # (N, T)
            beh = torch.cat(behaviour, 1)  # (N, T)
            cmask = torch.ones_like(comp, dtype=torch.float32)

            def score(model, attn: str, amp: bool) -> torch.Tensor:
                model.config._attn_implementation = attn
                model.set_attn_implementation(attn) if hasattr(model, "set_attn_implementation") else None
                ctx = torch.autocast(device, dtype=torch.bfloat16) if amp else torch.autocast(device, enabled=False)
                with torch.no_grad(), ctx:
                    lp, _ = completion_logprobs(model, prompt_ids, prompt_mask, comp, cmask, with_entropy=False)
                return lp.float()  # (N, T)

            t_sdpa = score(fp32, "sdpa", True)
            t_eager = score(fp32, "eager", True)
            t_fp32 = score(fp32, "sdpa", False)
            honest = float((t_sdpa - t_fp32).abs().max())
            row = {"shape": shape, "init_std": init_std,
                   "mean_logprob": round(float(beh.mean()), 3),
                   "engine_vs_trainer": float((beh - t_sdpa).abs().max()),
                   "sdpa_vs_eager_bf16": float((t_sdpa - t_eager).abs().max()),
                   "bf16_vs_fp32": honest}
            derive = getattr(sync_probe, "first_sync_threshold", None)
            if derive is not None:
                row["threshold"] = float(derive(honest))
                row["passes"] = row["engine_vs_trainer"] <= row["threshold"]
            rows.append({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()})
            del fp32, engine
            if not cpu:
                torch.cuda.empty_cache()
    ok = all(r.get("passes", True) for r in rows)
    return {"status": "pass" if ok else "fail", "rows": rows}


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
