"""Plumbing of bench/grpo_step.py (rftlib vs TRL's GRPOTrainer) on the tiny model: no timings asserted.

Skipped when trl (the bench extra) is not installed.
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl", reason="bench/grpo_step.py compares against TRL: pip install -e '.[bench]' (trl==1.16.0)")

BENCH = Path(__file__).resolve().parents[1] / "bench"


def _grpo_step():
    sys.path.insert(0, str(BENCH))
    try:
        import grpo_step
    finally:
        sys.path.remove(str(BENCH))
    return grpo_step


def test_both_sides_generate_and_train_on_the_same_forced_tokens():
    """B=2 prompts x G=2 samples x 4 forced tokens: each side trains on 2*2*4 = 16 completion tokens
    in 4 rows, one step, whatever the tiny random model would have sampled (EOS is suppressed)."""
    res = _grpo_step().main(["--preset", "tiny", "--reps", "1", "--warmup", "0", "--threads", "1",
                             "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--max-new-tokens", "4",
                             "--micro-batch-size", "2"])
    for side in ("rftlib", "trl"):
        (step,) = res["sides"][side]["steps"]
        assert step["tokens"] == 16, (side, step)
        assert step["rows"] == 4, (side, step)
        assert step["generate"] > 0 and step["update"] > 0, (side, step)
        assert step["peak_mb"] >= step["base_mb"] > 0, (side, step)
        # the update's FLOP count is over the tokens it ran: at most every real token, forward + backward
        assert 0 <= step["fb_tokens"] <= step["tokens"] + step["prompt_tokens"], (side, step)
        assert 0 <= step["fb_rows"] <= 4, (side, step)  # rows the update ran (rftlib skips zero-advantage rows)
    (trl_step,) = res["sides"]["trl"]["steps"]
    assert trl_step["fb_tokens"] == trl_step["tokens"] + trl_step["prompt_tokens"]  # TRL runs every row
    assert trl_step["fb_rows"] == 4
    assert set(res["ratios"]) == {"wall", "generate", "reward", "reference", "update", "peak_mb"}


def test_update_mode_backpropagates_into_the_same_lora_tensors(monkeypatch):
    """The update alone, small vocabulary: LoRA r16 on q/k/v/o of a 2-layer model has 2*4 = 8 A and 8 B
    tensors; B starts at zero, so the first backward reaches the 8 B tensors only (A's gradient is
    B^T x ... = 0), on both sides.

    Run from a process that holds a one-rank group's rendezvous, as a pytest worker does after a ZeRO-3
    test (init_dist leaves RANK/WORLD_SIZE/MASTER_PORT with the port held): the TRL worker must not
    inherit them (its GRPOConfig sets up accelerate's group: EADDRINUSE, CI of stop 47)."""
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(held.getsockname()[1]))
    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "RFTLIB_ONE_RANK_GROUP": "1"}.items():
        monkeypatch.setenv(k, v)
    try:
        res = _grpo_step().main(["--mode", "update", "--threads", "1", "--rows", "2", "--prompt-len", "4",
                                 "--completion-len", "8", "--vocab", "1000", "--chunk-size", "8"])
    finally:
        held.close()
    assert res["rftlib"]["params_with_grad"] == 8, res["rftlib"]
    assert res["trl"]["params_with_grad"] == 8, res["trl"]
    assert res["ratios"]["seconds"] > 0
