"""The rollout engines by name: ``ENGINES`` and ``make_engine(cfg, model, tok, run_dir, backend=...)``.

hf: HF generate on the trainer's own module (shares_trainer_module=True: sync is a no-op, the
behaviour logprobs are the trainer's, no old-logprob pass, no TIS). vllm: a vLLM engine placed by
``vllm_placement`` (colocate: in-process; server: N ``vllm serve`` processes), synced once here so it
starts from exactly the trainer's weights (an init_adapter or a resumed checkpoint included).

An engine names its own needs. Its factory is handed the config, the policy, the tokenizer, the run
directory and the training backend, and reads what it needs from them: the hf engine generates on
the trainer's module, so under a backend that partitions the parameters across ranks
(``backend.partitions_params``: ZeRO-3) it must step in lock-step with the other ranks
(``synced_gpus``); a vLLM engine needs none of that. Nothing outside rftlib.rollout branches on an
engine's name: the trainer reads ``engine.shares_trainer_module`` and ``engine.shared_across_ranks``
off a built engine, and what must be known before one is built (the config's checks, the memory
preflight, the launch plan) is declared with the registration (:class:`EngineKind`).

How to add an engine (one place): a class with the RolloutEngine contract (rftlib.rollout.base),
and a factory registered here or in its own module::

    @register_engine("my_engine", on_trainer_module=False)
    def _my_engine(cfg, model, tok, run_dir, backend):
        return MyEngine(...)

then ``rollout_engine: my_engine`` in a preset (tests/test_train_build.py registers a toy one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from rftlib.algo.registry import Registry
from rftlib.models.loading import compute_dtype
from rftlib.rollout.hf import HFEngine
from rftlib.rollout.vllm import VLLMEngine, VLLMSettings
from rftlib.rollout.vllm_server import VLLMServerEngine

ENGINES = Registry("rollout engine")
"""name -> EngineKind (its factory and its declarations); register with :func:`register_engine`"""


def _no_problems(cfg) -> list[str]:
    return []


def _no_servers(cfg) -> int:
    return 0


def _in_process(cfg) -> bool:
    return False


@dataclass(frozen=True)
class EngineKind:
    """A registered engine: its factory, and what it declares before one is built."""

    name: str
    make: Callable[..., Any]
    """make(cfg, model, tok, run_dir, backend) -> RolloutEngine"""
    on_trainer_module: bool
    """generates with the trainer's own module: the generation's memory is on the trainer's GPU (the memory
    preflight counts its KV cache), and its greedy decoding is deterministic"""
    check_config: Callable[[Any], list[str]] = _no_problems
    """check_config(cfg) -> problems with the config under this engine, each a sentence naming the field"""
    server_processes: Callable[[Any], int] = _no_servers
    """server_processes(cfg) -> engine processes a launch starts on each node (0: in the trainer, or elsewhere)"""
    serves: Callable[[Any], bool] = _in_process
    """serves(cfg) -> runs in server processes of its own, on GPUs (started here or already running)"""


def register_engine(name: str, *, on_trainer_module: bool, **declarations):
    """Decorator: register ``factory(cfg, model, tok, run_dir, backend) -> engine`` as the engine ``name`` with
    its declarations (EngineKind's fields: check_config, server_processes, serves); returns the factory."""
    def add(factory):
        ENGINES.add(name, EngineKind(name, factory, on_trainer_module, **declarations))
        return factory

    return add


def engine_kind(name: str) -> EngineKind:
    """The registered engine ``name`` (ValueError listing the valid names otherwise)."""
    return ENGINES.get(name)


def _hf_checks(cfg) -> list[str]:
    """Sampled evals at temperature 0 repeat one greedy completion n times on HF generate."""
    return [f"eval_n_samples[{probe!r}]={n} at temperature 0: HF greedy samples are identical, so n > 1 "
            "only repeats work (seed 003 sec. 9: do not combine temp 0 with n > 1; its "
            "nondet_proxy_pass@8 measures vLLM batching nondeterminism only); set "
            f"eval_temperature[{probe!r}] (seed 003: 0.6) or n 1"
            for probe, n in cfg.eval_n_samples.items()
            if isinstance(n, int) and n > 1 and cfg.eval_temperature.get(probe, 0.0) == 0]


def _vllm_serves(cfg) -> bool:
    return cfg.vllm_placement == "server"


def _vllm_server_processes(cfg) -> int:
    """``vllm serve`` processes a launch starts per node: none colocated, none when vllm_urls name engines elsewhere."""
    return cfg.vllm_num_engines if _vllm_serves(cfg) and not cfg.vllm_urls else 0


@register_engine("hf", on_trainer_module=True, check_config=_hf_checks)
def _hf_engine(cfg, model, tok, run_dir, backend):
    """HF generate on the trainer's module; in lock-step across ranks when the backend partitions the weights,
    and then with the whole model gathered once per rollout where it fits (the backend's generation_gather:
    ZeRO-3, zero3_gather_for_generation) instead of every layer at every decode step."""
    if backend is None:
        return HFEngine(model, tok, amp=compute_dtype(cfg.dtype, cfg.autocast))
    gather, why = backend.generation_gather()
    if why and backend.dist.is_main:
        print(f"[rft] HF generate under ZeRO-3: {why}", flush=True)
    return HFEngine(model, tok, amp=compute_dtype(cfg.dtype, cfg.autocast), synced_gpus=backend.partitions_params,
                    gather=gather, gather_plan=why)


@register_engine("vllm", on_trainer_module=False, server_processes=_vllm_server_processes, serves=_vllm_serves)
def _vllm_engine(cfg, model, tok, run_dir, backend):
    """vLLM in this process (colocate) or in ``vllm serve`` processes (server)."""
    settings = VLLMSettings.from_config(cfg, model, run_dir)
    if cfg.vllm_placement == "colocate":
        return VLLMEngine(settings, tok, run_dir)
    if cfg.vllm_placement == "server":
        return VLLMServerEngine(settings, tok, run_dir)
    raise ValueError(f"vllm_placement='{cfg.vllm_placement}': choose colocate or server")


def make_engine(cfg, model, tok, run_dir, *, sync: bool = True, backend=None):
    """The engine ``cfg.rollout_engine`` names; with ``sync`` an engine that is not the trainer's module
    has had one sync (its result in .initial_sync). The trainer passes sync=False and syncs itself once
    its state is final (a resume restores the adapter after the engine starts; several ranks share a
    server engine's load). ``backend``: the training backend, for the needs of an engine that generates
    on the trainer's module (None: one process, nothing partitioned)."""
    engine = engine_kind(cfg.rollout_engine).make(cfg, model, tok, run_dir, backend)
    if sync and not engine.shares_trainer_module:
        try:
            engine.initial_sync = engine.sync_weights(model, verify=True)
        except BaseException:
            engine.close()
            raise
    return engine
