"""Chunked log-probs/entropy from hidden states vs the full-logits reference; peak memory."""

import math
import sys
from pathlib import Path

import pytest
import torch

from rftlib.algo.logprobs import auto_chunk_size, chunked_logprobs_entropy, full_logprobs_entropy

N, T, H, V = 3, 5, 8, 11  # N*T = 15 token rows


def _inputs(seed=0, bias=True):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(N, T, H, generator=g, requires_grad=True)  # (N, T, H)
    weight = torch.randn(V, H, generator=g).requires_grad_()  # (V, H)
    b = torch.randn(V, generator=g).requires_grad_() if bias else None  # (V,)
    targets = torch.randint(0, V, (N, T), generator=g)  # (N, T)
    upstream = torch.randn(N, T, generator=g)  # (N, T) weights so every token's gradient differs
    return hidden, weight, b, targets, upstream


def test_hand_computed_two_token_vocab():
    # logits [0, ln 3] -> p = [1/4, 3/4]; log p(token 1) = ln 0.75 = -0.287682
    # entropy = -(0.25 ln 0.25 + 0.75 ln 0.75) = 0.346574 + 0.215762 = 0.562335
    hidden = torch.ones(1, 1, 1)  # (N, T, H) = (1, 1, 1)
    weight = torch.tensor([[0.0], [math.log(3.0)]])  # (V, H) = (2, 1)
    lp, ent = chunked_logprobs_entropy(hidden, weight, torch.tensor([[1]]))
    torch.testing.assert_close(lp, torch.tensor([[-0.287682]]), atol=1e-6, rtol=0)
    torch.testing.assert_close(ent, torch.tensor([[0.562335]]), atol=1e-6, rtol=0)
    # temperature 2: logits [0, ln 3 / 2] -> p = [1, sqrt 3] / (1 + sqrt 3) = [0.366025, 0.633975]
    lp2, _ = chunked_logprobs_entropy(hidden, weight, torch.tensor([[1]]), temperature=2.0)
    torch.testing.assert_close(lp2, torch.tensor([[math.log(0.633975)]]), atol=1e-6, rtol=0)


@pytest.mark.parametrize("chunk_size", [1, 4, 5, 15, 100])  # 4 does not divide N*T=15, 5 does
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("checkpoint_chunks", [True, False])
def test_chunked_matches_full(chunk_size, temperature, checkpoint_chunks):
    hidden, weight, b, targets, upstream = _inputs()
    lp, ent = chunked_logprobs_entropy(hidden, weight, targets, temperature=temperature, chunk_size=chunk_size,
                                       lm_head_bias=b, checkpoint_chunks=checkpoint_chunks)
    grads = torch.autograd.grad((lp * upstream).sum(), (hidden, weight, b))

    logits = hidden @ weight.T + b  # (N, T, V)
    ref_lp, ref_ent = full_logprobs_entropy(logits, targets, temperature)
    ref_grads = torch.autograd.grad((ref_lp * upstream).sum(), (hidden, weight, b))

    assert lp.shape == (N, T) and lp.dtype == torch.float32 and ent.shape == (N, T)
    torch.testing.assert_close(lp, ref_lp, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent, ref_ent, atol=1e-5, rtol=0)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("chunk_size", [4, 15])
def test_entropy_grad_matches_full(chunk_size):
    hidden, weight, _, targets, upstream = _inputs(seed=1, bias=False)
    lp, ent = chunked_logprobs_entropy(hidden, weight, targets, temperature=0.7, chunk_size=chunk_size,
                                       entropy_grad=True)
    grads = torch.autograd.grad((lp * upstream + ent).sum(), (hidden, weight))
    ref_lp, ref_ent = full_logprobs_entropy(hidden @ weight.T, targets, 0.7, entropy_grad=True)
    ref_grads = torch.autograd.grad((ref_lp * upstream + ref_ent).sum(), (hidden, weight))
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_entropy_is_detached_by_default_and_optional():
    hidden, weight, _, targets, _ = _inputs(bias=False)
    lp, ent = chunked_logprobs_entropy(hidden, weight, targets, chunk_size=4)
    assert lp.requires_grad and not ent.requires_grad
    _, ref_ent = full_logprobs_entropy(hidden @ weight.T, targets)
    assert not ref_ent.requires_grad
    lp2, none = chunked_logprobs_entropy(hidden, weight, targets, chunk_size=4, with_entropy=False)
    assert none is None
    torch.testing.assert_close(lp2, lp)


def test_no_grad_and_low_precision_hidden():
    hidden, weight, _, targets, _ = _inputs(bias=False)
    with torch.no_grad():
        lp, _ = chunked_logprobs_entropy(hidden, weight, targets, chunk_size=4)
    assert not lp.requires_grad
    # bf16 hidden and weight: logits are upcast, so the outputs are float32
    lp16, ent16 = chunked_logprobs_entropy(hidden.detach().bfloat16(), weight.detach().bfloat16(), targets)
    assert lp16.dtype == torch.float32 and ent16.dtype == torch.float32
    torch.testing.assert_close(lp16, lp, atol=0.2, rtol=0.05)


def test_bad_inputs():
    hidden, weight, _, targets, _ = _inputs(bias=False)
    with pytest.raises(ValueError, match="chunk_size"):
        chunked_logprobs_entropy(hidden, weight, targets, chunk_size=0)
    with pytest.raises(ValueError, match=r"targets \(N, T\)"):
        chunked_logprobs_entropy(hidden, weight, targets[:, :2])


def test_chunked_peak_memory_is_lower():
    """Structural claim: forward + backward without the (N*T, V) logits peaks lower (fresh process).

    N*T=1024, V=16000: one fp32 logits tensor is 62.5 MiB; a chunk of 128 rows is 7.8 MiB.
    """
    bench = Path(__file__).resolve().parents[1] / "bench"
    sys.path.insert(0, str(bench))
    try:
        import bench_logprobs
    finally:
        sys.path.remove(str(bench))
    kw = dict(tokens=1024, vocab=32000, hidden_size=32, chunk_size=128, env=bench_logprobs.MMAP_ENV)
    full = bench_logprobs.measure("full", **kw)
    chunked = bench_logprobs.measure("chunked", **kw)
    # Each delta is the peak above the resident size just before the measured call (the peak is
    # reset there, so the ~740 MiB import spike no longer hides it). Full holds several 125 MiB
    # (N*T, V) fp32 tensors at once (measured ~625 MiB); chunked a few 15.6 MiB chunks (~85 MiB).
    assert full["delta_mb"] > 250, full
    assert chunked["delta_mb"] * 3 < full["delta_mb"], (full, chunked)


def test_auto_chunk_size_keeps_one_chunks_logits_within_64_mib():
    # 64 MiB / (4 bytes x V): Qwen 67,108,864 / 607,744 = 110.4 -> 110; SmolLM2 / 196,608 = 341.3 -> 341
    assert auto_chunk_size(151_936) == 110
    assert auto_chunk_size(49_152) == 341
    assert auto_chunk_size(16_384) == 1024 and auto_chunk_size(1_000) == 1024  # capped at 1024 rows
    assert auto_chunk_size(10**8) == 16  # never below 16 rows
    with pytest.raises(ValueError, match="vocab_size"):
        auto_chunk_size(0)
