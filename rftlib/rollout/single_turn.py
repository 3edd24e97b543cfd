"""The ``single_turn`` rollout source: one prompt, G sampled completions, each scored once (the trainer's rollout
before issue 40, moved here unchanged so its metrics are the same bit for bit: tests/test_rollout_sources.py)."""

from __future__ import annotations

import time

from rftlib.rollout.base import format_prompts
from rftlib.rollout.sources import Produced, Sampling, Spans, no_spans


def single_turn(examples: list, *, engine, tok, system_prompt: str | None, reward, sampling: Sampling,
                group_size: int, device, spans: Spans = no_spans) -> Produced:
    """Format ``examples`` as chat prompts (the task's system prompt), sample ``group_size`` completions each
    (prompt-major rows), and score every row with ``reward`` (rftlib.rewards.registry.Reward) in one batched call:
    a reward that declares a batch form scores the whole rollout at once (the code sandbox's workers run rows
    side by side; row by row, the second worker idles)."""
    G = group_size
    t = time.time()
    with spans("generate"):
        ro = engine.generate(format_prompts(tok, examples, system_prompt), group_size=G,
                             **sampling.engine_kwargs()).to(device)
    t_generate = time.time() - t
    t = time.time()
    rows = [examples[i // G] for i in range(len(ro.texts))]
    trunc = [bool(cut) for cut in ro.truncated.tolist()]
    with spans("reward"):
        scored = reward.score(list(ro.texts), rows, trunc)
    rewards = [float(r) for r, _ in scored]
    diags = [d for _, d in scored]
    return Produced(ro, rewards, diags, t_generate, time.time() - t)
