"""The training pool's prompt order: seeded per-epoch permutations behind a resumable cursor.

Every rank of a data-parallel run holds the same sampler and draws the same global order; the
trainer gives each rank its slice of every rollout's prompts, so no two ranks sample one prompt.
"""

from __future__ import annotations

import numpy as np

from rftlib.data.base import Sampler


class PromptSampler(Sampler):
    """Walks the training pool in seeded per-epoch permutations; its state is a resumable cursor."""

    def __init__(self, pool_size: int, seed: int, epoch: int = 0, pos: int = 0):
        self.pool_size, self.seed, self.epoch, self.pos = pool_size, seed, epoch, pos

    def _perm(self) -> np.ndarray:
        return np.random.default_rng(self.seed + 1_000_003 * self.epoch).permutation(self.pool_size)

    def next(self, k: int) -> list[int]:
        out: list[int] = []
        while len(out) < k:
            perm = self._perm()
            take = min(k - len(out), self.pool_size - self.pos)
            out += perm[self.pos:self.pos + take].tolist()
            self.pos += take
            if self.pos == self.pool_size:
                self.epoch, self.pos = self.epoch + 1, 0
        return out

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state(self, s: dict[str, int]) -> None:
        self.epoch, self.pos = s["epoch"], s["pos"]
