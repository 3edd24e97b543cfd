"""The reference and old-logprob passes run in their own, wider forwards.

Seed 003 trains at micro-batch 1; its no-grad passes (reference logprobs for the KL, old logprobs when
the update is off-policy) keep no activations for a backward, so they run ``logprob_batch_size`` rows
a forward (auto: max(micro_batch_size, 8)). The result must be the micro-batch-1 pass's, up to the
rounding of other GEMM shapes and paddings.
"""

from dataclasses import replace

import pytest
import torch

import rftlib.train.loop as loop
import rftlib.train.update_parts as update_parts
from toy_rewards import isdigit_share as digit_reward  # varied rewards from the untrained tiny model: advantages non-zero

# Same weights, same rows; only the batching (and so the trim to a batch's longest row, i.e. left
# padding that the attention mask and mask-derived positions make inert) differs, so the two passes
# are one float32 function evaluated with GEMMs of other shapes: each reduction (n <= 400 terms: the
# tiny model's hidden 64, MLP 128, 400-token vocabulary, <= 64 positions) is within gamma_400 =
# 2.4e-5 of exact relative to its terms' magnitudes, O(1) here; through 2 layers and the log-softmax
# that is <~1e-4 per logprob. Measured: bitwise equal with AVX-512 kernels.
TOL = 1e-4


def test_reference_and_old_logprobs_run_wider_forwards_with_the_same_result(tiny_cfg, task_with):
    # 4 prompts x G 4 = 16 rows; train_batch_size 2 prompts: 2 optimizer steps per rollout, so the update is
    # off-policy and needs old logprobs; beta > 0 needs reference logprobs; seed 003's micro-batch 1
    cfg = tiny_cfg(micro_batch_size=1, train_batch_size=2, beta=0.04, autocast="none", lr=1e-2,
                   max_new_tokens=16)
    tr = loop.Trainer(cfg, progress=False, task=task_with(cfg, digit_reward))
    try:
        ro = tr.rollout(cfg.rollout_batch_size).items[0][0]
        N = ro.num_rows
        assert N == 16 and not tr.on_policy
        calls = []  # rows of each forward of the policy or reference
        tr.hooks.append(lambda phase, s, res: phase == "forward" and calls.append(res.rows["completion_ids"].shape[0]))
        tr.backend.train(False)
        results = {}
        for k in (1, 0, 16):  # 0: auto = max(micro_batch_size 1, 8) = 8
            tr.cfg = replace(cfg, logprob_batch_size=k)
            calls.clear()
            old = tr.no_grad_logprobs(ro)  # (N, T)
            with tr.ref.active() as ref_model:
                ref = tr.no_grad_logprobs(ro, None if ref_model is tr.model else ref_model)  # (N, T)
            results[k] = (old, ref, list(calls))
        old1, ref1, calls1 = results[1]
        assert calls1 == [1] * N * 2  # micro-batch 1: one forward per row, per pass
        assert results[0][2] == [8, 8] * 2  # auto: 8 rows a forward, 2 forwards per pass
        assert results[16][2] == [16, 16]  # one forward per pass
        mask = ro.completion_mask > 0
        assert float(old1[mask].abs().min()) > 0  # real logprobs where the completion is
        for k in (0, 16):
            old, ref, _ = results[k]
            assert old.shape == ref.shape == ro.completion_ids.shape
            assert float((old - old1).abs().max()) <= TOL and float((ref - ref1).abs().max()) <= TOL
            assert bool((old[~mask] == 0).all())  # zero where masked, as the micro-batch pass leaves it
        # the step itself uses the wide pass and still trains
        tr.cfg = replace(cfg, logprob_batch_size=0)
        calls.clear()
        before = [p.detach().clone() for p in tr.params]
        row = tr.step()
        assert calls[:4] == [8, 8, 8, 8]  # reference (2 forwards of 8) then old logprobs (2 of 8)
        assert row["advantage_std"] > 0
        assert any(not torch.equal(b, p) for b, p in zip(before, tr.params))
    finally:
        tr.close()


def test_logprob_batch_size_is_validated(tiny_cfg):
    from rftlib.config import ConfigError

    with pytest.raises(ConfigError, match="logprob_batch_size=-1"):
        tiny_cfg(logprob_batch_size=-1)


@pytest.mark.parametrize("eager", [True, False], ids=["gpt-oss-eager", "llama-sdpa"])
def test_auto_no_grad_rows_fit_the_free_memory_where_eager_scores_dominate(tiny_cfg, task_with, monkeypatch, eager):
    """With eager attention (gpt-oss: no SDPA path; here the MXFP4 gpt-oss-shaped test model on
    the CPU) auto logprob_batch_size is the most rows, of max(micro_batch_size, 8), whose no-grad scores fit 80%
    of the memory free now. The free memory is set to what 3.5 rows need (a GPU's torch.cuda.mem_get_info is
    the one call this cannot run): 3 rows a forward. Before the fix the passes ran 8 rows whatever the memory.
    A model on SDPA holds no (heads, T, T) scores: 8 rows however little is free.

    One row of T tokens by hand (the test model: 2 layers, h 64, 4 heads and 2 kv heads of 16, experts of 64,
    2 of 4 per token, sinks, a sliding and a full mask; float32 without autocast, b = 4): the stream in and
    out of a layer 2*4*64 plus one layer's intermediates 4*4*64 + 4*(3*64 + 3*32) + 8*64 + 4*2*(64 + 9*64)
    = 7,808 B per token (the MoE block's no-grad peak: per routed pair the token's copy and 9 I-wide tensors,
    rftlib.models.memory._moe_nograd_bytes_per_token), and 3 score tensors (4, T, T + 1) + 2 masks (T, T) of 4 B."""
    from rftlib.models.gptoss import gptoss_mxfp4_dir
    from rftlib.models.loading import causal_lm

    over = dict(micro_batch_size=1, train_batch_size=2, beta=0.04, autocast="none", max_new_tokens=16)
    if eager:
        over.update(model=str(gptoss_mxfp4_dir()), lora_target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    cfg = tiny_cfg(**over)
    tr = loop.Trainer(cfg, progress=False, task=task_with(cfg, digit_reward))
    try:
        ro = tr.rollout(cfg.rollout_batch_size).items[0][0]
        lm = causal_lm(tr.model)
        assert (lm.config._attn_implementation == "eager") == eager
        T = ro.prompt_ids.shape[1] + ro.completion_ids.shape[1]  # the widest a forward of these rows gets
        per_row = T * (2 * 4 * 64 + 7_808) + T * (3 * 4 * (T + 1) + 2 * T) * 4
        logits = min(8 * T, tr.logprob_chunk_size) * tr.vocab_size * 8  # one chunk's fp32 logits + log-softmax
        monkeypatch.setattr(update_parts, "free_bytes", lambda device: int((3.5 * per_row + logits) / 0.8))
        calls = []  # rows of each forward
        tr.hooks.append(lambda phase, s, res: phase == "forward" and calls.append(res.rows["completion_ids"].shape[0]))
        tr.backend.train(False)
        tr.no_grad_logprobs(ro)
        assert ro.num_rows == 16 and calls == ([3, 3, 3, 3, 3, 1] if eager else [8, 8])
    finally:
        tr.close()
