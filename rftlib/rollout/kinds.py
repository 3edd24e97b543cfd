"""The rollout engines by name and what each declares before one is built: ``ENGINES``, ``EngineKind``.

Torch-free on purpose: the config checks ``rollout_engine`` and the engine's own rules, the memory
preflight and the launch plan read its declarations, all without importing an engine (HF generate,
vLLM) or torch. Each built-in engine is declared once here, by its factory's ``"module:attr"``
(rftlib.rollout.factory), imported when an engine is built (``ENGINES.get``).

How to add an engine (one place): a class with the RolloutEngine contract (rftlib.rollout.base) and
a factory ``factory(inputs, model, tok, run_dir, backend) -> engine`` (``inputs``: :class:`EngineInputs`, the
config's sections an engine reads), declared here (``ENGINES.declare`` with EngineKind's declarations) or
registered where it is defined::

    @register_engine("my_engine", on_trainer_module=False)
    def _my_engine(inputs: EngineInputs, model, tok, run_dir, backend):
        return MyEngine(...)

then ``rollout_engine: my_engine`` in a preset (tests/test_train_build.py registers a toy one).
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, fields
from typing import Callable, TypeVar

from rftlib.algo.registry import Registry
from rftlib.settings import (AttemptSettings, EngineSettings, EvalLogSettings, LaunchSettings, ModelSettings,
                             RolloutSettings, ScaleSettings, SeedScheduleSettings)

S = TypeVar("S")

ENGINES = Registry("rollout engine")
"""name -> the engine's factory(inputs, model, tok, run_dir, backend); ``engine_kind(name)`` its declarations"""


@dataclass(frozen=True)
class EngineInputs:
    """The sections of a run's settings an engine is declared and built from (typed, not the whole RunConfig):
    what its factory and its declarations (check_config, server_processes, serves) may read. Built from a
    config with ``EngineInputs.of(run_config.section)``."""

    model: ModelSettings  # the policy (model, dtype, autocast, lora_rank)
    rollout: RolloutSettings  # sampling (max_new_tokens)
    engine: EngineSettings  # rollout_engine and the vllm_* settings
    launch: LaunchSettings  # nnodes, vllm_urls, rollout_gpus
    scale: ScaleSettings  # device
    attempt: AttemptSettings  # seed
    schedule: SeedScheduleSettings  # prompt_max_len, eval_n_samples, eval_temperature
    evallog: EvalLogSettings  # torch_threads

    @classmethod
    def of(cls, section: Callable[[type[S]], S]) -> "EngineInputs":
        """Each field's section from ``section`` (a config's ``section`` method: section class -> instance)."""
        hints = typing.get_type_hints(cls)
        return cls(**{f.name: section(hints[f.name]) for f in fields(cls)})


def _no_problems(inputs: EngineInputs) -> list[str]:
    return []


def _no_servers(inputs: EngineInputs) -> int:
    return 0


def _in_process(inputs: EngineInputs) -> bool:
    return False


def _no_share(inputs: EngineInputs) -> float:
    return 0.0


def _overlaps_unless_on_module(kind_on_module: bool):
    def overlaps(inputs: EngineInputs) -> str | None:
        return None if not kind_on_module else ("it generates on the trainer's own module, so the next batch would "
                                                "be sampled from weights the update is changing, on the same device")
    return overlaps


@dataclass(frozen=True)
class EngineKind:
    """What a registered engine declares before one is built (its factory: ``ENGINES.get(name)``)."""

    name: str
    on_trainer_module: bool
    """generates with the trainer's own module: the generation's memory is on the trainer's GPU (the memory
    preflight counts its KV cache), and its greedy decoding is deterministic"""
    check_config: Callable[[EngineInputs], list[str]] = _no_problems
    """check_config(inputs) -> problems with the config under this engine, each a sentence naming the field"""
    server_processes: Callable[[EngineInputs], int] = _no_servers
    """server_processes(inputs) -> engine processes a launch starts on each node (0: in the trainer, or elsewhere)"""
    serves: Callable[[EngineInputs], bool] = _in_process
    """serves(inputs) -> runs in server processes of its own, on GPUs (started here or already running)"""
    trainer_gpu_share: Callable[[EngineInputs], float] = _no_share
    """trainer_gpu_share(inputs) -> the fraction of each trainer GPU the engine reserves beside the trainer (an
    engine in the trainer's process on its GPU: vLLM colocated), which the memory preflight counts; 0: none"""
    continues_from_ids: bool = False
    """generates a continuation of given token ids (``generate_ids``): what a multi-turn rollout source needs, which
    keeps the model's sampled ids and appends the environment's rendered turns (rftlib.rollout.multi_turn)"""
    overlaps: Callable[[EngineInputs], str | None] | None = None
    """overlaps(inputs) -> None when the engine can generate while the trainer updates (max_staleness > 0,
    rftlib.train.pipeline), else why not; undeclared: an engine off the trainer's module can"""

    def overlap_problem(self, inputs: EngineInputs) -> str | None:
        """Why this engine cannot generate the next batch while the trainer updates (None: it can)."""
        return (self.overlaps or _overlaps_unless_on_module(self.on_trainer_module))(inputs)


def register_engine(name: str, *, on_trainer_module: bool, **declarations):
    """Decorator: register ``factory(inputs, model, tok, run_dir, backend) -> engine`` as the engine ``name`` with
    its declarations (EngineKind's fields: check_config, server_processes, serves); returns the factory."""
    def add(factory):
        ENGINES.add(name, factory, on_trainer_module=on_trainer_module, **declarations)
        return factory

    return add


def engine_kind(name: str) -> EngineKind:
    """What the engine ``name`` declares, nothing imported (ValueError listing the valid names otherwise)."""
    return EngineKind(name, **ENGINES.decl(name))


def _hf_checks(inputs: EngineInputs) -> list[str]:
    """Sampled evals at temperature 0 repeat one greedy completion n times on HF generate."""
    return [f"eval_n_samples[{probe!r}]={n} at temperature 0: HF greedy samples are identical, so n > 1 "
            "only repeats work (seed 003 sec. 9: do not combine temp 0 with n > 1; its "
            "nondet_proxy_pass@8 measures vLLM batching nondeterminism only); set "
            f"eval_temperature[{probe!r}] (seed 003: 0.6) or n 1"
            for probe, n in inputs.schedule.eval_n_samples.items()
            if isinstance(n, int) and n > 1 and inputs.schedule.eval_temperature.get(probe, 0.0) == 0]


SERVER_GPU_MEMORY = 0.85  # seed 003's --vllm_gpu_memory_utilization: the engines own their GPUs
COLOCATED_GPU_MEMORY = 0.3  # TRL's colocate default: the trainer holds the rest of the GPU


def engine_gpu_memory(engine: EngineSettings) -> float:
    """``vllm_gpu_memory_utilization``, else the placement's default (a colocated engine at 0.85 would leave
    the trainer on the same GPU 15% of it)."""
    if engine.vllm_gpu_memory_utilization is not None:
        return engine.vllm_gpu_memory_utilization
    return COLOCATED_GPU_MEMORY if engine.vllm_placement == "colocate" else SERVER_GPU_MEMORY


def _vllm_trainer_gpu_share(inputs: EngineInputs) -> float:
    """A colocated engine reserves ``engine_gpu_memory`` of the trainer's GPU up front (vLLM's
    gpu_memory_utilization: weights, workspace and KV cache inside it); server engines have GPUs of their own.
    On a CPU the engine's KV cache is host memory (vllm_kv_cache_gib), not this GPU's."""
    return engine_gpu_memory(inputs.engine) if inputs.engine.vllm_placement == "colocate" else 0.0


def _vllm_serves(inputs: EngineInputs) -> bool:
    return inputs.engine.vllm_placement == "server"


def _vllm_overlaps(inputs: EngineInputs) -> str | None:
    """Server engines overlap with LoRA (a new adapter name per version while requests of the old one finish);
    the in-process engine runs on the trainer's thread (on a GPU it sleeps during the update), and full weights
    cannot hold two versions in one engine."""
    if inputs.engine.vllm_placement != "server":
        return ("vllm_placement colocate runs the engine inside the trainer's process, on its thread (and on a GPU "
                "asleep during the update), so it cannot generate while the trainer updates; use vllm_placement: "
                "server (engines of their own, `rft launch` starts them)")
    if inputs.model.lora_rank == 0:
        return ("full-weight syncs (lora_rank 0) replace the engine's one set of weights, so a batch in flight would "
                "change weights mid-completion; asynchronous rollouts need LoRA (a new adapter per version)")
    return None


def _vllm_server_processes(inputs: EngineInputs) -> int:
    """``vllm serve`` processes a launch starts per node: none colocated, none when vllm_urls name engines elsewhere."""
    return inputs.engine.vllm_num_engines if _vllm_serves(inputs) and not inputs.launch.vllm_urls else 0


ENGINES.declare("hf", "rftlib.rollout.factory:hf_engine", on_trainer_module=True, check_config=_hf_checks,
                continues_from_ids=True)
ENGINES.declare("vllm", "rftlib.rollout.factory:vllm_engine", on_trainer_module=False,
                server_processes=_vllm_server_processes, serves=_vllm_serves, overlaps=_vllm_overlaps,
                trainer_gpu_share=_vllm_trainer_gpu_share, continues_from_ids=True)
