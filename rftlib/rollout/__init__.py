"""Rollout engines (HF generate, vLLM) behind one contract (rftlib.rollout.base.Rollout)."""

from rftlib.rollout.factory import make_engine
from rftlib.rollout.sync_probe import SyncProbeError

__all__ = ["make_engine", "SyncProbeError"]
