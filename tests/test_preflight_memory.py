"""rftlib.preflight.memory_check: term formulas by hand, then the four memory situations of the seeds."""

import pytest

from rftlib.preflight.memory_check import (
    ALL_LINEAR, GB, LOGITS_NAIVE, MODELS, estimate_rollout_memory, estimate_train_memory, lora_params,
)


@pytest.mark.parametrize("name, total, active", [
    ("Qwen2.5-0.5B", 494_032_768, None),  # HF model card / peft printout in seed 002
    ("Qwen2.5-1.5B", 1_543_714_304, None),
    ("SmolLM2-135M", 134_515_008, None),
    ("gpt-oss-20b", 20_914_757_184, 3_608_307_264),  # model card: 21B total, 3.6B active
    ("gpt-oss-120b", 116_829_156_672, 5_132_849_472),  # model card: 117B total, 5.1B active
])
def test_param_counts_from_shapes(name, total, active):
    m = MODELS[name]
    assert m.n_params == total
    if active:
        assert m.n_active == active


def test_lora_params_match_seed_002_printout():
    # seed 002: "trainable params: 8,798,208 || all params: 502,830,976 || trainable%: 1.7497"
    n = lora_params("Qwen2.5-Coder-0.5B-Instruct", 16, ALL_LINEAR)
    assert n == 8_798_208
    assert n / (n + MODELS["Qwen2.5-0.5B"].n_params) == pytest.approx(0.017497, abs=1e-6)
    # gpt-oss-20b, rank 32, attention only: 24 * 32 * ((2880+4096)*2 + (2880+512)*2)
    assert lora_params("gpt-oss-20b", 32) == 24 * 32 * (2 * 6976 + 2 * 3392)
    with pytest.raises(ValueError, match="MoE"):
        lora_params("gpt-oss-20b", 32, ALL_LINEAR)  # seed 003 §6: no all-linear on MoE


def test_term_formulas_by_hand():
    e = estimate_train_memory("Qwen2.5-1.5B", gpu=80, finetune="full", reference="copy", sequences=2,
                              seq_len=100, gradient_checkpointing=False, generation=(2, 100))
    P = 1_543_714_304
    assert e.gb("policy weights") == pytest.approx(P * 2 / GB)
    assert e.gb("reference model (frozen copy)") == pytest.approx(P * 2 / GB)
    assert e.gb("optimizer states (AdamW m+v)") == pytest.approx(P * 8 / GB)
    assert e.gb("logits") == pytest.approx(2 * 100 * 151936 * 4 * 3 / GB)
    # per token per layer, bf16 full fine-tuning on the torch backends (float32 masters: the residual stream,
    # so both norms' in/out, is float32): 4*4*1536 + 2*(3*1536 + 3*256 + 4*8960) + 8*1536 = 119,296 bytes
    assert e.gb("activations") == pytest.approx(200 * 28 * 119_296 / GB)
    kv = [g for t, g, _ in e.aside if t == "generation KV cache"][0]
    assert kv == pytest.approx(2 * 28 * 2 * 128 * 2 * 100 * 2 / GB)  # 2 * L * kv * hd * bytes * tokens * seqs
    # ZeRO-3 over 4 ranks divides weights, grads, optimizer; offload moves weights off the GPU
    z = estimate_train_memory("Qwen2.5-1.5B", gpu=80, finetune="full", zero_stage=3, world_size=4, offload=True,
                              adam_offload=True)
    assert z.gb("policy weights") == 0 and z.gb("optimizer states (AdamW m+v)") == 0
    assert z.gb("gradients") == pytest.approx(P * 2 / 4 / GB)
    # DeepSpeed 0.19.8's stage3.py allocates one flat gradient bucket of reduce_bucket_size (5e8 by default) elements
    # on the GPU whatever the model: 0.93 GiB in bf16 (the H200 check measured the tiny model's ZeRO-3 step at a 1.0
    # GiB peak that the estimate put at 0.48 without it); not there without ZeRO-3
    assert z.gb("ZeRO-3 gradient bucket") == pytest.approx(5e8 * 2 / GB)
    assert all(t != "ZeRO-3 gradient bucket" for t, _, _ in e.rows)


def test_seed000_phase14_a100_oom():
    """Seed 000, Phase 14: Qwen 1.5B policy + frozen reference copy, 2 prompts x 4 samples on an A100 40GB: OOM.

    The seed is silent on everything but the model, the GPU and the 8 sequences. Assumed (a hand-written
    GRPO script): full fine-tuning; bf16 weights (the seed: "~3GB per copy in bfloat16"); AdamW moments in
    fp32 and no separate master copy; the reference a second bf16 copy; 8 sequences x 768 tokens
    (~256-token MBPP prompt + 512 generated); no gradient checkpointing; SDPA attention; logits
    materialised in fp32 over the 151,936 vocabulary, lean handling (3 copies).

    Predicted: OOM at ~52 GB of 42.9, dominated by activations (18.4 GB), then optimizer states (12.4 GB)
    and logits (7.5 GB). The seed blamed "two 1.5B models"; the two copies are only 6.2 GB of it.
    Sensitivity (checked below): at 512 tokens in all the same plan is "tight" (98%), not OOM; with
    gradient checkpointing it fits (35 GB) unless the loop also keeps the reference model's logits
    (LOGITS_NAIVE), which reproduces the seed's "checkpointing helps but not enough" (OOM, logits dominant).
    """
    plan = dict(gpu="A100-40GB", finetune="full", train_dtype="bf16", reference="copy", optimizer_dtype="fp32",
                master_weights=False, sequences=8, generation=(8, 768))
    e = estimate_train_memory("Qwen2.5-1.5B", seq_len=768, gradient_checkpointing=False, **plan)
    print(e.table())
    assert e.verdict == "OOM" and e.dominant == "activations"
    assert e.gb("reference model (frozen copy)") + e.gb("policy weights") < 0.15 * e.total_gb
    assert estimate_train_memory("Qwen2.5-1.5B", seq_len=512, gradient_checkpointing=False, **plan).verdict == "tight"
    assert estimate_train_memory("Qwen2.5-1.5B", seq_len=768, gradient_checkpointing=True, **plan).verdict == "fits"
    naive = estimate_train_memory("Qwen2.5-1.5B", seq_len=768, gradient_checkpointing=True,
                                  logits_copies=LOGITS_NAIVE, **plan)
    assert naive.verdict == "OOM" and naive.dominant == "logits"


def test_seed000_phase15_h100_plan():
    """Seed 000, Phase 15 plan: 16 prompts x 8 samples = 128 sequences x 512 tokens in one micro-batch
    (GRAD_ACCUM = 1) on an H100 80GB, same assumptions as Phase 14, with gradient checkpointing.

    Predicted: OOM (~161 GB): the (128, 512, 151936) fp32 logits alone are 40 GB a copy. Chunked logits
    (rftlib's chunked_logprobs_entropy) bring it to ~44 GB: fits.
    """
    plan = dict(gpu="H100-80GB", finetune="full", reference="copy", master_weights=False, sequences=128,
                seq_len=512, gradient_checkpointing=True, generation=(128, 512))
    e = estimate_train_memory("Qwen2.5-1.5B", **plan)
    print(e.table())
    assert e.verdict == "OOM" and e.dominant == "logits"
    fixed = estimate_train_memory("Qwen2.5-1.5B", logits="chunked", **plan)
    print(fixed.table())
    assert fixed.verdict == "fits"


def test_seed002_rtx3080_tight():
    """Seed 002: Qwen2.5-Coder-0.5B-Instruct, LoRA (1.75% of params), fp16, frozen reference copy, G=2,
    max length 512, on an RTX 3080 10GB: "~9.5 GB of 10 GB".

    Assumed: 2 sequences x 512 tokens in all; LoRA r=16 on all linear layers (reproduces the seed's
    8,798,208 trainable params) with dropout 0.05, adapters in fp32 (peft's default on a half model);
    AdamW fp32; no gradient checkpointing; the hand-written loop keeps policy and reference fp32 logits
    and log-probs (LOGITS_NAIVE); HF generate on the same GPU.

    Predicted: tight (9.8 GB, 91% of the 10.7 GB nvidia-smi total; the seed saw ~9.5 GB), dominated by
    logits. The seed's own breakdown puts 6-7 GB in "KV cache";
    the KV cache of 2 x 512 tokens is 0.01 GB: that space is the two models' logits over a 151,936 vocabulary.
    Sensitivity: with lean logits handling (3 copies) the same run would be ~74% (fits).
    """
    plan = dict(gpu="RTX3080-10GB", train_dtype="fp16", finetune="lora", lora_rank=16, lora_targets=ALL_LINEAR,
                lora_dropout=0.05, reference="copy", sequences=2, seq_len=512, gradient_checkpointing=False,
                generation=(2, 512))
    e = estimate_train_memory("Qwen2.5-Coder-0.5B-Instruct", logits_copies=LOGITS_NAIVE, **plan)
    print(e.table())
    assert e.verdict == "tight" and e.dominant == "logits"
    kv = [g for t, g, _ in e.aside if t == "generation KV cache"][0]
    assert kv < 0.02
    assert estimate_train_memory("Qwen2.5-Coder-0.5B-Instruct", **plan).verdict == "fits"


def test_seed003_gpt_oss_allocations():
    """Seed 003 §5: actor GPUs 4-7 under ZeRO-3 (world 4), LoRA attention-only, checkpointing, micro batch 1.

    - 20B: "84 GB bf16 / 4 = 21 GB/GPU". 20.91B params x 2 B (bf16) is 41.8 GB, i.e. 10.5 GB/GPU; the
      seed's 84 GB is 4 bytes/param (an fp32 dequantisation). Both are reproduced: 10.46 and 20.91 GB/GPU.
      Either way it fits without offload (prompt 1024 + generate 4096 tokens).
    - 120B: "234 GB bf16 / 4 = 58.5 GB/GPU, requires CPU offload": 116.83B x 2 B / 4 = 58.4 GB/GPU;
      without offload the ZeRO-3 gathered layers (2 x 3.2B params) and fp32 logits push it to ~98%
      (tight); with --offload --adam_offload it fits.
    - vLLM GPUs 0-3 at gpu_memory_utilization 0.85: 72.7 GB = 67.7 GiB of the H100's 79.6 GiB (the
      seed's "~68 GB/80 GB used"), MXFP4 weights / TP=2 leave the rest to KV cache.
    """
    z3 = dict(gpu="H100-80GB", finetune="lora", zero_stage=3, world_size=4, sequences=1, gradient_checkpointing=True)
    e20 = estimate_train_memory("gpt-oss-20b", lora_rank=32, seq_len=1024 + 4096, **z3)
    print(e20.table())
    assert e20.gb("policy weights") == pytest.approx(10.46, abs=0.01) and e20.verdict == "fits"
    e20_seed = estimate_train_memory("gpt-oss-20b", lora_rank=32, seq_len=5120, train_dtype="fp32", **z3)
    assert e20_seed.gb("policy weights") == pytest.approx(21.0, abs=0.1) and e20_seed.verdict == "fits"

    e120 = estimate_train_memory("gpt-oss-120b", lora_rank=64, seq_len=1024 + 3072, **z3)
    print(e120.table())
    assert e120.gb("policy weights") == pytest.approx(58.4, abs=0.1)
    assert e120.verdict in ("tight", "OOM")
    off = estimate_train_memory("gpt-oss-120b", lora_rank=64, seq_len=4096, offload=True, adam_offload=True, **z3)
    print(off.table())
    assert off.verdict == "fits" and off.gb("policy weights") == 0

    for name in ("gpt-oss-20b", "gpt-oss-120b"):
        r = estimate_rollout_memory(name, gpu="H100-80GB", gpu_memory_utilization=0.85, tensor_parallel=2,
                                    max_model_len=5120)
        print(r.table())
        assert r.total_gb * GB / 2**30 == pytest.approx(67.7, abs=0.1)
        assert r.verdict == "fits" and r.gb("KV cache pool") > 30


def test_bad_inputs_name_the_valid_ones():
    with pytest.raises(ValueError, match="known"):
        estimate_train_memory("llama-7b")
    with pytest.raises(ValueError, match="known"):
        estimate_train_memory("Qwen2.5-1.5B", gpu="TPU")
    with pytest.raises(ValueError, match="zero_stage=3"):
        estimate_train_memory("Qwen2.5-1.5B", offload=True)
    short = estimate_rollout_memory("gpt-oss-120b", tensor_parallel=1, gpu_memory_utilization=0.5)
    assert short.verdict == "OOM" and "exceed" in short.problem


def test_gpt_oss_counts_eager_attention():
    """transformers runs gpt-oss with eager attention (no SDPA path; tests/test_models_gptoss.py
    checks the loaded model says so), which holds (heads, T, T) score tensors; SDPA models do not.

    gpt-oss-20b, N=1, T=5120, bf16: the computed layer's scores x 2 + 2 causal masks =
    5120 * (2*64*5120 + 2*5120) * 2 B = 6.816 GB; the saved softmax output, per token per layer,
    64 heads x 5121 columns (the sink) x 2 B, enters the activations (x2: one layer recomputed with grads)."""
    from rftlib.preflight.memory_check import estimate_train_memory

    plan = dict(gpu="H100-80GB", zero_stage=3, world_size=4, sequences=1, seq_len=5120, lora_rank=32)
    e = estimate_train_memory("gpt-oss-20b", **plan)
    assert e.gb("eager attention scores") == pytest.approx(5120 * (2 * 64 * 5120 + 2 * 5120) * 2 / GB, rel=1e-12)
    sdpa = estimate_train_memory("gpt-oss-20b", attention="sdpa", **plan)
    assert sdpa.gb("eager attention scores") == 0
    saved = 2 * 5120 * 64 * 5121 * 2 / GB  # 2 x one layer's saved softmax, all tokens
    assert e.gb("activations") - sdpa.gb("activations") == pytest.approx(saved, rel=1e-12)
    assert estimate_train_memory("Qwen2.5-1.5B", gpu=80).gb("eager attention scores") == 0  # SDPA by default


def test_load_and_host_ram_of_gpt_oss_120b():
    """The load-time peak and host RAM. gpt-oss-120b, 4 ranks on one node, bf16:
    P = 116,829,156,672 params -> 233.66 GB. Loading whole (every rank, then to its GPU): 233.66 GB on an
    85.5 GB GPU (OOM) and 4 x 233.66 GB of host RAM + every rank's dequantisation of one layer's fused
    experts (128 x 2880 x 5760 = 2,123,366,400 values x (2.5 + 2.5 x 2) B = 15.93 GB). Partitioned with
    --offload --adam_offload: the GPU holds one gathered parameter (that tensor, 4.25 GB) + 0.5 GB context;
    host RAM the 4 offloaded partitions (233.66 GB), rank 0's dequantisation, CPU Adam on the LoRA
    (47.8M x 12 B) and 4 x 3 GB process allowances."""
    from rftlib.preflight.memory_check import estimate_load_memory, lora_params

    P, n = 116_829_156_672, 128 * 2880 * 5760
    whole_gpu, whole_host = estimate_load_memory("gpt-oss-120b", world_size=4, zero_stage=3, partitioned=False)
    assert whole_gpu.gb("whole model") == pytest.approx(P * 2 / GB) and whole_gpu.verdict == "OOM"
    assert whole_host.total_gb == pytest.approx((4 * P * 2 + 4 * n * 7.5) / GB + 4 * 3.0)
    lora = lora_params("gpt-oss-120b", 64)
    gpu, host = estimate_load_memory("gpt-oss-120b", world_size=4, zero_stage=3, offload=True, adam_offload=True,
                                     trainable=lora)
    assert gpu.total_gb == pytest.approx(n * 2 / GB + 0.5) and gpu.verdict == "fits"
    assert host.total_gb == pytest.approx((P * 2 + n * 7.5 + lora * 12) / GB + 4 * 3.0)
    # without offload each GPU holds its quarter: 58.4 GB + the gathered tensor
    gpu_no, _ = estimate_load_memory("gpt-oss-120b", world_size=4, zero_stage=3)
    assert gpu_no.total_gb == pytest.approx((P * 2 / 4 + n * 2) / GB + 0.5)
    with pytest.raises(ValueError, match="zero_stage=3"):
        estimate_load_memory("gpt-oss-120b", partitioned=True)


def test_rft_preflight_prints_memory_for_seed003_presets():
    from rftlib.config import make_config
    from rftlib.preflight.memory_check import memory_preflight, memory_preflight_text

    train, load, host = memory_preflight(make_config("seed003-gpt-oss-120b"))
    # flex attention on the GPUs (issue 29 item 3): no (heads, T, T) scores, in the update or the no-grad passes
    assert _term(train, "eager attention scores") == 0 and _term(train, "no-grad forward activations") > 0
    assert train.verdict == "fits"
    assert load.gb("weights partition") == 0 and load.verdict == "fits"  # offloaded partitions
    assert host.gb("offloaded weight partitions") == pytest.approx(116_829_156_672 * 2 / GB)
    assert "host RAM of one node" in memory_preflight_text(make_config("seed003-gpt-oss-20b-a28b"))
    assert "no registered shape" in memory_preflight_text(make_config("tiny"))


def test_seed000_counts_the_float32_residual_stream_its_masters_make():
    """Seed 000's preset (Qwen2.5-1.5B, full fine-tuning in bf16 on the single backend,
    gradient checkpointing, 128 sequences in one micro-batch) trains float32 master weights under bf16
    autocast, so the embedding's output and every residual add are float32 (tests/test_train_precision.py
    checks the running model): each checkpointed layer input is 4 bytes per element, not 2.

    By hand, T = 1024 (prompt_max_len unset) + 512, N = 128, L = 28, h = 1536, hq = 1536, hkv = 256,
    I = 8960: one layer's activations per token 4*4h (norm in/out, fp32) + 2*(3hq + 3hkv + 4I) (bf16
    projections and MLP) + 8h (the norms' fp32 upcasts) = 119,296 B; checkpointing keeps L inputs of 4h B
    plus two layers' share: N*T*(28*4*1536 + 2*119,296) = 80.73 GB, where the bf16 count said 58.99 GB."""
    from rftlib.config import make_config
    from rftlib.preflight.memory_check import memory_preflight

    cfg = make_config("seed000-phase15")
    assert (cfg.backend, cfg.dtype, cfg.lora_rank, cfg.gradient_checkpointing) == ("single", "bfloat16", 0, True)
    train = memory_preflight(cfg)[0]
    N, T, L, h = 128, 1024 + 512, 28, 1536
    per_tl = 4 * 4 * h + 2 * (3 * 1536 + 3 * 256 + 4 * 8960) + 8 * h
    assert per_tl == 119_296
    assert train.gb("activations") == pytest.approx(N * T * (L * 4 * h + 2 * per_tl) / GB, rel=1e-12)
    assert train.gb("activations") == pytest.approx(80.73, abs=0.01)
    # DeepSpeed keeps bf16 module weights (its masters live in the optimizer): there the stream is bf16
    ds = estimate_train_memory("Qwen2.5-1.5B", finetune="full", zero_stage=2, world_size=1, sequences=N, seq_len=T,
                               gradient_checkpointing=True)
    assert ds.gb("activations") == pytest.approx(N * T * (L * 2 * h + 2 * (per_tl - 2 * 4 * h)) / GB, rel=1e-12)


# ---- issue 29 item 3: the no-grad passes (reference / old logprobs) at the rows they run -------------------
def _term(e, name: str) -> float:
    """GB of a term, whether it is in the peak or shown aside as another phase's (0 if absent)."""
    return sum(g for t, g, _ in e.rows + e.aside if t == name)


def _a28b(**over):
    from rftlib.config import make_config

    return make_config("seed003-gpt-oss-20b-a28b", over)


def test_the_eager_term_scales_with_the_rows_the_no_grad_passes_run():
    """Seed 003's a28b trains at micro_batch_size 1, but its old-logprob pass (the vLLM engine is not the
    trainer's module) and reference pass (beta 0.001) run logprob_batch_size rows a forward (auto: 8). With
    eager attention each row holds 3 (heads, T, T + sink) score tensors and 2 causal masks at T = 1024 + 4096:
    5120 * (3 * 64 * 5121 + 2 * 5120) * 2 B = 10.17 GB a row. Before the fix the preflight counted 1 row of
    scores (micro_batch_size) and said 8 rows fit; 8 rows of scores alone are 81 GB."""
    from rftlib.preflight.memory_check import memory_preflight

    T = 1024 + 4096
    one = T * (3 * 64 * (T + 1) + 2 * T) * 2
    assert one / GB == pytest.approx(10.173, abs=1e-3)
    by_rows = {k: memory_preflight(_a28b(attn_implementation="eager", logprob_batch_size=k))[0] for k in (1, 2, 8)}
    for k, e in by_rows.items():
        assert _term(e, "no-grad eager attention scores") == pytest.approx(k * one / GB, rel=1e-12), k
        # the update's own eager term stays at its micro-batch of 1: 2 score tensors + 2 masks
        assert _term(e, "eager attention scores") == pytest.approx(T * (2 * 64 * T + 2 * T) * 2 / GB, rel=1e-12)
    assert by_rows[8].verdict == "OOM" and by_rows[8].dominant == "no-grad eager attention scores"
    assert by_rows[1].verdict == "fits"


def test_auto_no_grad_rows_are_sized_from_memory_where_eager_scores_dominate():
    """logprob_batch_size 0 (auto) with eager attention: the most rows (of max(micro_batch_size, 8)) whose no-grad
    peak fits 80% of what the static terms leave of the H100's 85.5 GB (the trainer's rule, from the memory free
    at run time). One row by hand (gpt-oss-20b, bf16, LoRA under ZeRO-3: residual stream bf16): the scores above,
    plus the stream in and out of a layer and one layer's intermediates, per token
    2*2*2880 + [2*4*2880 + 2*(3*4096 + 3*512) + 8*2880 + 2*4*(2880 + 9*2880)] = 11,520 + 304,128 B (the MoE
    block's no-grad peak: per routed pair the token's copy and 9 I-wide tensors, memory._moe_nograd_bytes_per_token)."""
    from rftlib.preflight.memory_check import memory_preflight

    T = 1024 + 4096
    per_row = T * (3 * 64 * (T + 1) + 2 * T) * 2 + T * (11_520 + 304_128)
    e = memory_preflight(_a28b(attn_implementation="eager", logprob_batch_size=0))[0]
    phase = ("no-grad forward activations", "no-grad eager attention scores", "no-grad logits")
    train_phase = [t for t, _, _ in e.rows + e.aside if t not in phase and t in (
        "activations", "eager attention scores", "logits", "gradients", "LoRA input casts")]
    static = sum(g for t, g, _ in e.rows if t not in phase and t not in train_phase) * GB
    logits = 83 * 201_088 * 4 * 2  # one chunk's fp32 logits + log-softmax: 64 MiB / (4 B x 201,088) = 83 rows
    k = round(_term(e, "no-grad eager attention scores") * GB / (T * (3 * 64 * (T + 1) + 2 * T) * 2))
    assert 1 <= k < 8
    free = e.capacity_gb * GB - static
    assert k * per_row <= 0.8 * free - logits < (k + 1) * per_row
    assert e.verdict != "OOM"


def test_gpt_oss_plans_flex_attention_on_gpus_and_holds_no_scores():
    """attn_implementation auto: gpt-oss (no SDPA path in transformers, a flex one) runs flex_attention on the
    GPUs a preflight plans for, so neither the update nor the no-grad passes hold (heads, T, T) scores, and the
    no-grad passes run their 8 rows. Before the fix the preflight counted eager scores for every gpt-oss plan."""
    from rftlib.preflight.memory_check import memory_preflight

    e = memory_preflight(_a28b())[0]
    assert _term(e, "eager attention scores") == 0 and _term(e, "no-grad eager attention scores") == 0
    assert _term(e, "no-grad forward activations") > 0  # the passes are counted, at 8 rows
    assert "auto: 8 of at most 8" in next(d for t, _, d in e.rows + e.aside if t == "no-grad forward activations")
    assert e.verdict == "fits"


def test_a_colocated_vllm_engine_reserves_its_share_of_the_trainer_gpu(capsys, tmp_path):
    """vLLM colocated takes gpu_memory_utilization of the trainer's GPU up front (0.3 by default, TRL's), so the
    preflight counts it as a row of the trainer GPU's peak, and `rft preflight` prints it; server engines have GPUs
    of their own, HF generate none. Before the fix no estimate had the row (estimate_for_config never passed it)."""
    from rftlib import cli
    from rftlib.config import make_config
    from rftlib.preflight.memory_check import memory_preflight

    row = "vLLM reservation (colocated)"
    on_3080 = {"rollout_engine": "vllm", "launch_gpu_type": "RTX3080-10GB"}  # 10240 MiB = 10.737 GB
    train = memory_preflight(make_config("seed002-fizzbuzz-rtx3080", on_3080))[0]
    assert train.gb(row) == pytest.approx(0.3 * 10240 * 2**20 / GB)  # 3.221 GB
    half = memory_preflight(make_config("seed002-fizzbuzz-rtx3080", {**on_3080, "vllm_gpu_memory_utilization": 0.5}))[0]
    assert half.gb(row) == pytest.approx(0.5 * 10240 * 2**20 / GB)
    assert half.total_gb - train.total_gb == pytest.approx(0.2 * 10240 * 2**20 / GB)  # nothing else moved
    server = memory_preflight(make_config("seed002-fizzbuzz-rtx3080", {**on_3080, "vllm_placement": "server"}))[0]
    assert server.gb(row) == 0 and memory_preflight(make_config("seed002-fizzbuzz-rtx3080"))[0].gb(row) == 0
    cli.main(["preflight", "-p", "seed002-fizzbuzz-rtx3080", "--set", "rollout_engine=vllm",
              "--set", "launch_gpu_type=RTX3080-10GB"])
    out = capsys.readouterr().out
    assert f"  {row}" in out and "gpu_memory_utilization 0.3 x 10.7 GB" in out
    # rft launch's plan judges the trainer GPU with the same row
    from rftlib.launch.plan import make_plan, memory_checks

    cfg = make_config("seed002-fizzbuzz-rtx3080", {**on_3080, "device": "cuda", "runs_root": str(tmp_path)})
    trainer = dict(memory_checks(make_plan(cfg, tmp_path / "run", gpus_per_node=1), cfg))["trainer"]
    assert trainer.gb(row) == pytest.approx(0.3 * 10240 * 2**20 / GB)
