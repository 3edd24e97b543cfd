"""The memory preflight against a measurement: peak RSS of one training step of the embedded
default on this CPU, against estimate_train_memory for the same plan (issue: within +-25%).

The measured figure is the peak resident set of a fresh process running one step minus the RSS
just before the model was loaded (interpreter, torch, transformers), so both sides count model,
LoRA, optimizer, activations, logits and the generation cache, and neither counts the libraries.
Prints both, the ratio and the breakdown. Usage: .venv/bin/python bench/memory_vs_estimate.py

``--load``: the load-time peak instead (issue 22 item 4). A gpt-oss-shaped MXFP4 checkpoint of ~630 MB
(fp32, dequantised; rftlib.models.gptoss) loaded on 2 CPU ranks under ZeRO-3, partitioned (rftlib's
load_policy) and whole (every rank loads it all, the path before), each rank's peak RSS above its pre-load
level against estimate_load_memory's rows for that rank. The measurement is tests/test_models_gptoss.py's
worker (the test asserts estimate <= measured <= 1.3 x estimate).
"""

from __future__ import annotations

import json
import subprocess
import sys

CHILD = r"""
import json, resource, sys, tempfile
import torch, transformers, peft  # libraries loaded before the baseline is read
from rftlib.config import make_config
from rftlib.train.loop import Trainer
def rss_mb():
    for line in open('/proc/self/status'):
        if line.startswith('VmRSS'):
            return int(line.split()[1]) / 1024
base = rss_mb()
cfg = make_config('default', {'runs_root': tempfile.mkdtemp(), 'num_steps': 1, 'eval_size': 8, 'save_steps': 0,
                              'eval_steps': 0})
tr = Trainer(cfg, progress=False)
tr.step()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({'baseline_mb': base, 'peak_mb': peak, 'G': cfg.n_samples_per_prompt, 'B': cfg.rollout_batch_size,
                  'micro': cfg.micro_batch_size, 'T': cfg.max_new_tokens, 'rank': cfg.lora_rank}))
"""


def main() -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True).stdout
    m = json.loads(out.strip().splitlines()[-1])
    measured_gb = (m["peak_mb"] - m["baseline_mb"]) * 2**20 / 1e9
    from rftlib.preflight.memory_check import estimate_train_memory

    prompt = 37  # SmolLM2's chat template with its default system prompt around "Calculate a - b."
    est = estimate_train_memory("SmolLM2-135M", gpu=24.0, train_dtype="fp32", finetune="lora", lora_rank=m["rank"],
                                sequences=m["micro"], seq_len=prompt + m["T"], gradient_checkpointing=False,
                                attention="sdpa", logits="chunked", logits_chunk=1024,
                                generation=(m["B"] * m["G"], prompt + m["T"]), overhead_gb=0.0,
                                title="embedded default, one step on CPU")
    print(est.table() if hasattr(est, "table") else est)
    ratio = est.total_gb / measured_gb
    print(f"\nmeasured peak (RSS above the post-import baseline): {measured_gb:.2f} GB")
    print(f"estimated peak: {est.total_gb:.2f} GB   estimate / measured = {ratio:.2f} "
          f"({'within' if abs(ratio - 1) <= 0.25 else 'OUTSIDE'} +-25%)")
    return {"measured_gb": measured_gb, "estimated_gb": est.total_gb, "ratio": ratio}


def main_load() -> list[dict]:
    from pathlib import Path
    from tempfile import mkdtemp

    from transformers import AutoConfig

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from test_models_gptoss import BIG, _run

    from rftlib.models.gptoss import gptoss_mxfp4_dir
    from rftlib.models.memory import GB, estimate_load_memory, shape_from_hf_config

    d = gptoss_mxfp4_dir(**BIG)
    shape = shape_from_hf_config(AutoConfig.from_pretrained(d), "gpt-oss-shaped, 24 layers, 32 experts")
    g_part, h_part = estimate_load_memory(shape, train_dtype="fp32", world_size=2, zero_stage=3, overhead_gb=0)
    _, h_whole = estimate_load_memory(shape, train_dtype="fp32", world_size=2, zero_stage=3, partitioned=False,
                                      overhead_gb=0, host_baseline_gb=0)
    print(g_part.table(), "\n", h_part.table(), "\n", h_whole.table(), sep="")
    deq = h_part.gb("MXFP4 dequantisation (rank 0)")
    est = {"partitioned": [g_part.total_gb + deq, g_part.total_gb], "whole": [h_whole.total_gb / 2] * 2}
    out = []
    print(f"\nmodel {shape.n_params * 4 / GB:.3f} GB in fp32; peak RSS above the pre-load level, per rank:")
    for mode in ("partitioned", "whole"):
        rows = sorted(_run(Path(mkdtemp()) / mode, d, mode), key=lambda r: r["rank"])
        for r, e in zip(rows, est[mode]):
            m = r["peak_bytes"] / GB
            out.append({"mode": mode, "rank": r["rank"], "measured_gb": m, "estimated_gb": e})
            print(f"  {mode:<11} rank {r['rank']}: measured {m:.3f} GB, estimated {e:.3f} GB, measured/estimate "
                  f"{m / e:.2f}")
    return out


if __name__ == "__main__":
    main_load() if "--load" in sys.argv[1:] else main()
