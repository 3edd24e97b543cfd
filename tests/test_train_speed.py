"""The update's speed-ups change no gradient: zero-advantage rows skipped (normalisers unchanged),
micro-batches sorted by length, the LM head's recompute only where it saves memory.

The fixture reward gives half the prompts one reward for every completion (a constant group: every
advantage exactly 0) and the others the share of digits (advantages that vary), so a batch has rows
to skip and rows that train.
"""

from dataclasses import replace

import pytest
import torch

import rftlib.algo.logprobs as lp_mod
import rftlib.train.loop as loop
from rftlib.algo.logprobs import chunked_logprobs_entropy, recompute_needed
from rftlib.rewards.registry import Reward
from toy_rewards import half_constant_reward


def _capture(tr):
    """Make the trainer's optimizer step record the accumulated gradients and leave the weights as
    they are (so a second update sees the same policy); count the rows each forward runs."""
    grads, rows = [], []
    real_forward = tr.backend.forward

    def step(loss_finite):
        grads.append([p.grad.detach().clone() for p in tr.params])
        tr.optimizer.zero_grad(set_to_none=True)
        return 1.0, True

    def forward(**r):
        rows.append(r["completion_ids"].shape[0])
        return real_forward(**r)

    tr.backend.step = step
    tr.backend.forward = forward
    return grads, rows


@pytest.mark.parametrize("agg", ["seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"])
def test_skipping_zero_advantage_rows_keeps_the_gradient(tiny_cfg, task_with, agg):
    # 2 micro-batches of 8 per optimizer batch of 16 rows: the skip changes how rows fall into them.
    # fp32 (autocast off): under bf16 autocast (on by default where the CPU has avx512_bf16) the skip changes
    # the gemm shapes, so activations round to bf16 differently and the gradients differ at bf16's
    # precision (measured 2.7e-3 of the norm here) -- the cost of autocast, not of the skip
    cfg = tiny_cfg(loss_agg_mode=agg, lr=1e-2, autocast="none")
    seen = []  # the batch each update trained on
    tr = loop.Trainer(cfg, progress=False, task=task_with(cfg, half_constant_reward),
                      hooks=[lambda phase, s, res: phase == "advantages" and seen.append(res)])
    try:
        grads, rows = _capture(tr)
        row = tr.step()  # skip on (the default)
        batch = seen[-1]
        adv = batch.advantages
        zero = adv == 0  # (N,)
        assert zero.any() and not zero.all(), "the fixture must give both constant and varied groups"
        assert tr.skips_rows()
        run_skip = sum(rows)
        assert run_skip == int((~zero).sum())  # only the rows with signal went through the model
        assert row["update/skipped_row_frac"] == pytest.approx(float(zero.float().mean()))
        # frac_reward_zero_std: constant groups of 4 / 4 groups, counted from the rewards directly
        const = (adv.view(-1, 4) == 0).all(1)  # a group is constant iff all its advantages are 0 here
        assert row["frac_reward_zero_std"] == pytest.approx(float(const.float().mean()))
        rows.clear()
        tr.cfg = replace(tr.cfg, skip_zero_advantage_rows=False)
        tr.update(batch)
        assert sum(rows) == adv.shape[0] == 16  # every row run without the skip
        with_skip, without = grads
        assert any(float(g.abs().max()) > 0 for g in without), "the update must have a gradient to compare"
        # The two updates sum the same per-token terms (a skipped row's are exactly 0) grouped into other
        # micro-batches and gemm blocks: float32 summation in another order. Any order of n terms is within
        # gamma_n = n*u/(1-n*u) (u = 2^-24) of the exact sum, relative to the sum of the terms' magnitudes S
        # (Higham, Accuracy and Stability, 4.2). Here n < 10^3 (the 16 rows' prompt + completion tokens, the
        # MLP's 128, the vocabulary's 400), so each run is within 6e-5 * S of the exact gradient. Advantages
        # of both signs make S exceed |g| by a cancellation factor; allowing 1e-3 of the gradient's norm
        # covers two runs with a factor up to 8. Measured 0 (bitwise equal) with AVX-512 and with SSE4.1
        # kernels; one row with signal swapped for a skipped one moved the gradient by 33% of its norm.
        diff = sum(float(((a.double() - b.double()) ** 2).sum()) for a, b in zip(with_skip, without)) ** 0.5
        norm = sum(float((b.double() ** 2).sum()) for b in without) ** 0.5
        assert diff <= 1e-3 * norm, (diff, norm)
    finally:
        tr.close()


def test_an_update_with_nothing_to_learn_runs_no_forward_and_still_steps(tiny_cfg, task_with):
    cfg = tiny_cfg()
    tr = loop.Trainer(cfg, progress=False, task=task_with(cfg, lambda t, e, tr_: (1.0, {"correctness": 1.0})))
    try:
        grads, rows = _capture(tr)
        row = tr.step()  # every group constant: every advantage 0
        assert rows == []
        assert row["update/skipped_row_frac"] == 1.0 and row["frac_reward_zero_std"] == 1.0
        assert all(float(g.abs().max()) == 0.0 for g in grads[0])  # zero gradients, not missing ones
    finally:
        tr.close()


@pytest.mark.parametrize("field,value", [("beta", 0.04), ("entropy_coef", 0.01), ("gns_probe", True),
                                         ("skip_zero_advantage_rows", False)])
def test_no_skip_when_a_term_reads_every_row(tiny_cfg, field, value):
    tr = loop.Trainer(tiny_cfg(**{field: value}), progress=False)
    try:
        assert not tr.skips_rows()
    finally:
        tr.close()


def test_micro_batches_are_cut_from_rows_sorted_by_length(tiny_cfg):
    seen = []
    tr = loop.Trainer(tiny_cfg(skip_zero_advantage_rows=False), progress=False,
                      hooks=[lambda phase, s, res: phase == "advantages" and seen.append(res)])
    try:
        tr.step()
        ro, adv, lmask = seen[-1].rollout, seen[-1].advantages, seen[-1].loss_mask
        micro = tr.micro_batches(ro, torch.arange(16), adv, lmask, skip=False)
        order = torch.cat(micro)
        assert sorted(order.tolist()) == list(range(16)) and [len(m) for m in micro] == [8, 8]
        length = ro.prompt_mask.sum(-1) + ro.completion_mask.sum(-1)  # (N,)
        assert length.unique().numel() > 1, "the rollout must have rows of different lengths"
        ordered = length[order]
        assert bool((ordered[1:] >= ordered[:-1]).all())  # shortest first
    finally:
        tr.close()


def test_recompute_auto_only_checkpoints_several_chunks(monkeypatch):
    calls = []
    real = lp_mod.checkpoint
    monkeypatch.setattr(lp_mod, "checkpoint", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    torch.manual_seed(0)
    w = torch.randn(11, 5, requires_grad=True)  # (V, H)
    h = torch.randn(2, 3, 5, requires_grad=True)  # (N, T, H): 6 token rows
    tg = torch.randint(0, 11, (2, 3))
    grads = {}
    for mode, chunk, n_ckpt in [("auto", 6, 0), ("auto", 4, 2), (True, 6, 1), (False, 4, 0)]:
        calls.clear()
        w.grad = h.grad = None
        out, _ = chunked_logprobs_entropy(h, w, tg, chunk_size=chunk, checkpoint_chunks=mode)
        out.sum().backward()
        assert len(calls) == n_ckpt, (mode, chunk)  # one chunk: no recompute; 6 rows / 4 = 2 chunks: two
        grads[(mode, chunk)] = w.grad.clone()
    for g in grads.values():  # the recompute changes the cost, never the gradient
        torch.testing.assert_close(g, grads[("auto", 6)])
    with pytest.raises(ValueError, match="checkpoint_chunks"):
        chunked_logprobs_entropy(h, w, tg, checkpoint_chunks="sometimes")


def test_a_reward_with_a_batch_form_scores_the_rollout_in_one_call(tiny_cfg):
    calls = []

    def reward(text, ex, truncated):  # row by row: must not be called when the batch form exists
        raise AssertionError("the trainer scored row by row although the reward has a batch form")

    def batch(texts, examples, truncated):
        calls.append((list(texts), [e.prompt for e in examples], list(truncated)))
        return [(float(len(t) % 2), {"correctness": 0.0}) for t in texts]  # varies with the completion

    tr = loop.Trainer(tiny_cfg(), progress=False)
    tr.task.reward = Reward("test", reward, batch=batch)  # the batch form is declared (rftlib.rewards.registry)
    try:
        row = tr.step()
    finally:
        tr.close()
    assert len(calls) == 1  # one call for the rollout's 4 prompts x 4 completions
    texts, prompts, trunc = calls[0]
    assert len(texts) == len(prompts) == len(trunc) == 16
    assert prompts[0] == prompts[3] != prompts[4]  # prompt-major: rows 0-3 share a prompt
    # reward_mean is the mean of len % 2 over the 16 texts the batch form was handed
    assert row["reward_mean"] == pytest.approx(sum(len(t) % 2 for t in texts) / 16)


def test_recompute_needed_weighs_the_kept_logits_against_256_mib():
    # SmolLM2's micro-batch of 16 x 48 completion tokens: 768 x 49,152 x 4 B = 151 MiB kept -> no recompute
    assert not recompute_needed(768, 49_152, 341)
    # Qwen's 151,936 vocabulary: 442 x 151,936 x 4 = 268,622,848 B > 256 MiB = 268,435,456 B; 441 tokens fit
    assert recompute_needed(442, 151_936, 110) and not recompute_needed(441, 151_936, 110)
    assert not recompute_needed(110, 151_936, 110)  # one chunk: its logits live through backward either way
    assert recompute_needed(10, 11, 4, keep_bytes=0) and not recompute_needed(10, 11, 4, keep_bytes=440)
    assert not recompute_needed(4, 11, 4, keep_bytes=0)  # 4 tokens in one 4-row chunk


@pytest.mark.parametrize("mode", ["auto", "always", "never"])
def test_the_trainer_asks_recompute_needed_under_auto_only(tiny_cfg, monkeypatch, mode):
    import rftlib.models.forward as forward

    asked, passed = [], []
    monkeypatch.setattr(loop, "recompute_needed", lambda *a: asked.append(a) or True)
    real = forward.chunked_logprobs_entropy
    monkeypatch.setattr(forward, "chunked_logprobs_entropy",
                        lambda *a, **k: passed.append(k["checkpoint_chunks"]) or real(*a, **k))
    tr = loop.Trainer(tiny_cfg(logprob_recompute=mode, skip_zero_advantage_rows=False), progress=False)
    try:
        tr.step()
    finally:
        tr.close()
    assert passed, "no LM-head pass ran"
    if mode == "auto":  # (tokens of the micro-batch, the model's vocabulary, the chunk rows)
        assert asked and all(a[1:] == (tr.vocab_size, tr.logprob_chunk_size) and a[0] > 0 for a in asked)
        assert set(passed) == {True}
    else:
        assert not asked and set(passed) == {mode == "always"}
