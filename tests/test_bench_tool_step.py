"""Plumbing of bench/tool_step.py (issue 40 item 8: a multi-turn step with a calculator tool, rftlib beside TRL's
GRPOTrainer(tools=[...])) on the tiny model: both workers start (TRL accepts the bench's chat template, which the
TRL worker checks renders the calculator's prompts and tool turns to the tokens the model's own template gives),
each runs one step of B x G = 2 x 2 trajectories under the same budget, and the driver prints ratios. No timings
asserted; the random tiny model makes no tool call, so the tool loop itself runs only in the real bench.

Skipped when trl (the bench extra) is not installed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("trl", reason="bench/tool_step.py compares against TRL: pip install -e '.[bench]' (trl==1.16.0)")

BENCH = Path(__file__).resolve().parents[1] / "bench"


def test_both_sides_play_the_calculator_episodes_under_one_budget():
    sys.path.insert(0, str(BENCH))
    try:
        import tool_step
    finally:
        sys.path.remove(str(BENCH))
    res = tool_step.main(["--model", "tiny", "-B", "2", "-G", "2", "--reps", "1", "--warmup", "0", "--threads", "1"])
    assert res["config"]["B"] == 2 and res["config"]["G"] == 2 and res["config"]["budget"] == 224  # calc-cpu's
    for side in ("rftlib", "trl"):
        (step,) = res["sides"][side]["steps"]
        assert step["rows"] == 4, (side, step)
        # model tokens trained on: at least one per trajectory, at most the budget each (tool tokens excluded)
        assert 4 <= step["model_tokens"] <= 4 * 224, (side, step)
        assert step["wall"] >= step["rollout"] > 0 and step["peak_mb"] >= step["base_mb"] > 0, (side, step)
    assert set(res["ratios"]) == {"wall", "rollout", "update", "peak_mb", "seconds_per_model_token"}
