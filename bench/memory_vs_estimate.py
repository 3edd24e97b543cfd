"""The memory preflight against a measurement: peak RSS of one training step of the embedded
default on this CPU, against estimate_train_memory for the same plan (issue: within +-25%).

The measured figure is the peak resident set of a fresh process running one step minus the RSS
just before the model was loaded (interpreter, torch, transformers), so both sides count model,
LoRA, optimizer, activations, logits and the generation cache, and neither counts the libraries.
Prints both, the ratio and the breakdown. Usage: .venv/bin/python bench/memory_vs_estimate.py
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
    from rftlib.preflight.memory import estimate_train_memory

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


if __name__ == "__main__":
    main()
