"""The rollout engines by name: ``ENGINES`` and ``make_engine(inputs, model, tok, run_dir, backend=...)``.

hf: HF generate on the trainer's own module (shares_trainer_module=True: sync is a no-op, the
behaviour logprobs are the trainer's, no old-logprob pass, no TIS). vllm: a vLLM engine placed by
``vllm_placement`` (colocate: in-process; server: N ``vllm serve`` processes), synced once here so it
starts from exactly the trainer's weights (an init_adapter or a resumed checkpoint included).

An engine names its own needs. Its factory is handed the config's sections an engine reads
(rftlib.rollout.kinds.EngineInputs), the policy, the tokenizer, the run
directory and the training backend, and reads what it needs from them: the hf engine generates on
the trainer's module, so under a backend that partitions the parameters across ranks
(``backend.partitions_params``: ZeRO-3) it must step in lock-step with the other ranks
(``synced_gpus``); a vLLM engine needs none of that. Nothing outside rftlib.rollout branches on an
engine's name: the trainer reads ``engine.shares_trainer_module`` and ``engine.shared_across_ranks``
off a built engine, and what must be known before one is built (the config's checks, the memory
preflight, the launch plan) is declared with the name in rftlib.rollout.kinds (torch-free), which
also says how to add an engine.
"""

from __future__ import annotations

from rftlib.models.loading import compute_dtype
from rftlib.rollout.hf import HFEngine
from rftlib.rollout.kinds import ENGINES, EngineInputs, EngineKind, engine_kind, register_engine  # noqa: F401 (declared there)
from rftlib.rollout.vllm import VLLMEngine, VLLMSettings
from rftlib.rollout.vllm_server import VLLMServerEngine

def hf_engine(inputs: EngineInputs, model, tok, run_dir, backend):
    """HF generate on the trainer's module; in lock-step across ranks when the backend partitions the weights,
    and then with the whole model gathered once per rollout where it fits (the backend's generation_gather:
    ZeRO-3, zero3_gather_for_generation) instead of every layer at every decode step."""
    if backend is None:
        return HFEngine(model, tok, amp=compute_dtype(inputs.model.dtype, inputs.model.autocast))
    gather, why = backend.generation_gather()
    if why and backend.dist.is_main:
        print(f"[rft] HF generate under ZeRO-3: {why}", flush=True)
    return HFEngine(model, tok, amp=compute_dtype(inputs.model.dtype, inputs.model.autocast),
                    synced_gpus=backend.partitions_params, gather=gather, gather_plan=why)


def vllm_engine(inputs: EngineInputs, model, tok, run_dir, backend):
    """vLLM in this process (colocate) or in ``vllm serve`` processes (server); the trainer rank (the backend's)
    picks the seed stream this rank's calls draw from."""
    rank = backend.dist.rank if backend is not None else 0
    settings = VLLMSettings.from_config(inputs, model, run_dir, rank=rank)
    placement = inputs.engine.vllm_placement
    if placement == "colocate":
        return VLLMEngine(settings, tok, run_dir)
    if placement == "server":
        return VLLMServerEngine(settings, tok, run_dir)
    raise ValueError(f"vllm_placement='{placement}': choose colocate or server")


def make_engine(inputs: EngineInputs, model, tok, run_dir, *, sync: bool = True, backend=None):
    """The engine ``inputs.engine.rollout_engine`` names (``inputs``: ``EngineInputs.of(run_config.section)``);
    with ``sync`` an engine that is not the trainer's module has had one sync (its result in .initial_sync). The trainer passes sync=False and syncs itself once
    its state is final (a resume restores the adapter after the engine starts; several ranks share a
    server engine's load). ``backend``: the training backend, for the needs of an engine that generates
    on the trainer's module (None: one process, nothing partitioned)."""
    engine = ENGINES.get(inputs.engine.rollout_engine)(inputs, model, tok, run_dir, backend)
    if sync and not engine.shares_trainer_module:
        try:
            engine.initial_sync = engine.sync_weights(model, verify=True)
        except BaseException:
            engine.close()
            raise
    return engine
