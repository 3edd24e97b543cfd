"""Rollout engines (HF generate, vLLM) behind one contract (rftlib.rollout.base: Rollout, RolloutEngine).

    base        the Rollout dataclass and the RolloutEngine protocol; the stop-token set
    factory     ENGINES (hf | vllm: EngineKind, each with its declarations), register_engine, make_engine:
                how to add an engine is in its docstring
    hf          HF generate on the trainer's own module
    vllm*       vLLM in-process (colocate) or as servers, LoRA / full-weight sync
    sync_probe  after every sync: engine and trainer logprobs must agree
    assemble    Rollout tensors from token lists (engine-independent)
"""

from rftlib.rollout.factory import make_engine
from rftlib.rollout.sync_probe import SyncProbeError

__all__ = ["make_engine", "SyncProbeError"]
