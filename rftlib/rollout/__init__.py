"""Rollout engines (HF generate, vLLM) behind one contract (rftlib.rollout.base: Rollout, RolloutEngine).

    base        the Rollout dataclass and the RolloutEngine protocol; the stop-token set
    kinds       ENGINES (hf | vllm), EngineKind (each one's declarations), register_engine: torch-free;
                how to add an engine is in its docstring
    factory     the engines' factories and make_engine
    hf          HF generate on the trainer's own module
    vllm*       vLLM in-process (colocate) or as servers, LoRA / full-weight sync
    sync_probe  after every sync: engine and trainer logprobs must agree
    assemble    Rollout tensors from token lists (engine-independent)
"""

import importlib

_WHERE = {"make_engine": "factory", "SyncProbeError": "sync_probe"}


def __getattr__(name: str):
    """make_engine and SyncProbeError, imported on first use: importing rftlib.rollout.kinds (what the config
    reads) must not import the engines and torch through this package."""
    if name not in _WHERE:
        raise AttributeError(f"module 'rftlib.rollout' has no attribute '{name}'")
    return getattr(importlib.import_module(f"rftlib.rollout.{_WHERE[name]}"), name)

__all__ = ["make_engine", "SyncProbeError"]
