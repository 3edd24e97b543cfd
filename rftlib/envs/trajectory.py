"""One episode's tokens as the engine and the trainer will see them: model tokens and environment tokens.

A trajectory is its prompt's ids, then one completion side that interleaves what the model sampled (mask 1,
with the engine's behaviour logprob) and what the environment appended (mask 0, logprob 0: the boundary
tokens after a stop token, the rendered messages, the next generation prompt; rftlib.envs.chat.env_span).
The engine continues from ``context()`` each turn; the trainer reads ``ids`` as the completion with
``model_mask`` as the (T,) row of the Rollout's model-token mask (docs/design-multiturn.md). Plain lists: the
rollout source stacks many trajectories into (N, T) tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence


@dataclass
class Trajectory:
    """The tokens of one episode: ``prompt_ids`` then ``ids`` (model and environment tokens in order)."""

    prompt_ids: list[int]
    ids: list[int] = field(default_factory=list)
    """(T,) the completion side: every token after the prompt, model's and environment's"""
    model_mask: list[int] = field(default_factory=list)
    """(T,) 1 where the model sampled the token, 0 where the environment put it"""
    logprobs: list[float] = field(default_factory=list)
    """(T,) the engine's behaviour logprob of each model token; 0.0 on environment tokens"""
    turns: int = 0
    """model turns so far"""

    def add_model(self, ids: Sequence[int], logprobs: Sequence[float] | None = None) -> None:
        """Append a model turn exactly as the engine sampled it (its stop token included), with its logprobs
        (None: zeros, as a greedy engine records none)."""
        lp = [0.0] * len(ids) if logprobs is None else [float(x) for x in logprobs]
        if len(lp) != len(ids):
            raise ValueError(f"add_model: {len(ids)} ids but {len(lp)} logprobs")
        self.ids += [int(t) for t in ids]
        self.model_mask += [1] * len(ids)
        self.logprobs += lp
        self.turns += 1

    def add_env(self, ids: Sequence[int]) -> None:
        """Append an environment span (rftlib.envs.chat.env_span): mask 0, no logprob."""
        self.ids += [int(t) for t in ids]
        self.model_mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)

    def context(self) -> list[int]:
        """What the engine continues from: the prompt and every token so far."""
        return self.prompt_ids + self.ids

    @property
    def model_tokens(self) -> int:
        return sum(self.model_mask)

    @property
    def env_tokens(self) -> int:
        return len(self.ids) - self.model_tokens
