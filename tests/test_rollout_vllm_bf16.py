"""The sync probe in the GPU's precision: a bf16 vLLM engine (vllm-cpu) against a trainer under bf16 autocast,
on the embedded SmolLM2 (real weights, so the bf16 noise is a real model's), as seed 003's engines and
trainer run on GPUs.

Every sync's threshold is measured, not a constant tuned on float32 (rftlib.rollout.sync_probe): the
trainer's own gap between bf16 autocast and float32 on the probe's tokens, times MARGIN. An honest bf16 sync
passes under it; a sync that left the engine on a stale adapter, or a full reload that missed the tied
lm_head, still fails. Needs a CPU with native bf16 (avx512_bf16 or AMX), where autocast is on: elsewhere the
rehearsal runs float32 (the plan and the report say so) and these tests skip with that reason.
"""

import os

import pytest
import torch

os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # vLLM must not pin threads on shared cores
pytest.importorskip("vllm", reason="vLLM is not installed here: `bash scripts/setup_vllm.sh` installs vllm-cpu")

from rftlib.config import make_config  # noqa: E402
from rftlib.models.loading import apply_lora, autocast_dtype, load_model_and_tokenizer  # noqa: E402
from rftlib.rollout import SyncProbeError, make_engine  # noqa: E402
from rftlib.rollout.kinds import EngineInputs  # noqa: E402
from rftlib.rollout.sync_probe import MARGIN, probe_gaps  # noqa: E402

pytestmark = pytest.mark.skipif(autocast_dtype("auto") != torch.bfloat16,
                                reason="this CPU has no native bf16 (avx512_bf16 / AMX): the CPU rehearsal runs "
                                       "float32 here, so there is no bf16 engine to check")
TOL = 0.05  # vllm_sync_probe_tol, the float32 floor


def _cfg(tmp_path, **kw):
    return make_config("default", {"runs_root": str(tmp_path / "runs"), "rollout_engine": "vllm", "device": "cpu",
                                   "dtype": "float32", "vllm_kv_cache_gib": 0.25, "vllm_max_model_len": 256,
                                   "torch_threads": 1, "lora_rank": 8, "lora_alpha": 16, **kw})


def _policy(cfg):
    torch.set_num_threads(1)
    model, tok = load_model_and_tokenizer(cfg.model, cfg.dtype)
    if cfg.lora_rank:
        model = apply_lora(model, rank=cfg.lora_rank, alpha=cfg.lora_alpha, dropout=0.0,
                           target_modules=cfg.lora_target_modules)
    return model, tok


def _perturb(model, pattern, std, seed):
    """Stand in for optimizer steps: move the parameters whose name contains pattern."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if pattern in n:
                p.add_(torch.randn(p.shape, generator=g) * std)


@pytest.fixture(scope="module")
def lora_bf16(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vllm_bf16")
    cfg = _cfg(tmp)
    model, tok = _policy(cfg)
    eng = make_engine(EngineInputs.of(cfg.section), model, tok, tmp / "run")  # start-up: the canary check, then the first sync
    yield eng, model
    eng.close()


def test_a_bf16_engine_with_honest_weights_passes_the_first_sync(lora_bf16):
    eng, model = lora_bf16
    first = eng.initial_sync
    print(f"bf16 first sync: gap {first['probe_max_diff']:.3g}, trainer noise (bf16 autocast vs float32) "
          f"{first['probe_noise']:.3g}, threshold {first['probe_threshold']:.3g}, "
          f"gap / noise {first['probe_max_diff'] / first['probe_noise']:.2f}")
    assert eng.s.dtype == "bfloat16"  # vllm_dtype auto: the trainer's compute precision on this CPU
    assert eng.probe_dtype == torch.bfloat16  # the trainer scores the probe in the engine's precision
    # a real model's bf16 noise, far above float32's ~1e-6 and above what the fixed 0.05 allowed
    assert first["probe_noise"] > 1e-2
    assert first["probe_threshold"] == pytest.approx(max(TOL, MARGIN * first["probe_noise"]))
    assert first["probe_max_diff"] > TOL  # the old fixed threshold would have refused this honest sync
    assert first["probe_max_diff"] <= first["probe_threshold"]
    # a second honest sync (the adapter moved a little, as after a step) passes too
    _perturb(model, "lora_B", 1e-3, seed=0)
    info = eng.sync_weights(model)
    assert info["probe_max_diff"] <= info["probe_threshold"]


def test_a_stale_adapter_still_fails_in_bf16(lora_bf16, monkeypatch):
    eng, model = lora_bf16
    _perturb(model, "lora_B", 0.3, seed=2)  # the adapter the engine has not seen
    stale = probe_gaps(eng, model, torch.bfloat16)["max_diff"]
    limit = eng.initial_sync["probe_threshold"]
    print(f"stale adapter gap in bf16 {stale:.3g} vs the first sync's threshold {limit:.3g}")
    assert stale > limit
    # a sync that silently skips the load
    monkeypatch.setattr(eng, "_load_lora", lambda name, lora_id, path: None)
    with pytest.raises(SyncProbeError, match="stale"):
        eng.sync_weights(model)
    monkeypatch.undo()
    info = eng.sync_weights(model)  # a real sync recovers
    assert info["probe_max_diff"] <= info["probe_threshold"]


def test_a_missed_tied_lm_head_still_fails_in_bf16(tmp_path, monkeypatch):
    import rftlib.rollout.vllm_worker as ext

    # full fine-tuning: reloads that skip the CPU repack of the tied head (a fresh engine, as the fp32 test)
    monkeypatch.setattr(ext, "refresh_tied_lm_head", lambda model: False)
    cfg = _cfg(tmp_path, lora_rank=0)
    model, tok = _policy(cfg)
    assert model.config.tie_word_embeddings
    eng = make_engine(EngineInputs.of(cfg.section), model, tok, tmp_path / "run")  # the first sync: same weights, passes
    try:
        assert eng.s.dtype == "bfloat16"
        _perturb(model, "embed_tokens", 0.05, seed=5)  # only the tied embedding / head moves
        with pytest.raises(SyncProbeError, match="stale"):
            eng.sync_weights(model)
    finally:
        eng.close()
