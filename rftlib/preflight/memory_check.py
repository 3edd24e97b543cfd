"""Memory preflight: before a launch, will the run fit on one trainer GPU, while loading, and in host RAM?

The arithmetic (every term, its formula and its source) is rftlib.models.memory, below the trainer in
the package graph, so the trainer logs the same estimate it is judged by. This module is the
preflight's face of it: the names the notebooks and ``rft launch`` use, and :func:`memory_preflight`,
which turns a RunConfig into the three estimates ``rft preflight`` prints (training peak of one GPU,
that GPU while the model loads, host RAM of one node).
"""

from __future__ import annotations

import dataclasses

from rftlib.algo.logprobs import auto_chunk_size
from rftlib.rollout.kinds import EngineInputs, engine_kind
from rftlib.settings import ModelSettings, OptimizationSettings, RolloutSettings
from rftlib.backends import BackendInputs, machine_problems, sharding_of
from rftlib.models.memory import (  # noqa: F401  (re-exported: the preflight's public names)
    ALL_LINEAR, ATTENTION, BYTES, GB, GPUS, LOGITS_LEAN, LOGITS_NAIVE, MODELS, TIGHT, MemoryEstimate, ModelShape,
    estimate_for_config, estimate_load_memory, estimate_rollout_memory, estimate_train_memory, get_model,
    gpu_capacity_gb, lora_params, shape_from_hf_config, train_dtype_of,
)


def shape_name_for_model(model: str) -> str | None:
    """The name a model id is registered under in MODELS ("openai/gpt-oss-120b" -> "gpt-oss-120b"), or None."""
    tail = model.rstrip("/").rsplit("/", 1)[-1].lower()
    return next((name for name in MODELS if name.lower() == tail), None)


def shape_for_model(model: str) -> ModelShape | None:
    """The registered shape of a model id ("openai/gpt-oss-120b" -> gpt-oss-120b), or None."""
    name = shape_name_for_model(model)
    return MODELS[name] if name is not None else None


def trainer_world(cfg) -> tuple[int, int]:
    """(trainer ranks in all, trainer ranks per node) of a config's launch layout."""
    per_node = cfg.train_ranks or len(cfg.train_gpus or []) or 1
    return cfg.nnodes * per_node, per_node


def memory_preflight(cfg) -> list[MemoryEstimate]:
    """[training peak of one trainer GPU, that GPU while the model loads, host RAM of one node] for ``cfg``
    on ``cfg.launch_gpu_type`` GPUs; [] when the model has no registered shape (MODELS)."""
    shape = shape_for_model(cfg.model)
    if shape is None:
        return []
    world, per_node = trainer_world(cfg)
    sharding = sharding_of(_backend_inputs(cfg))
    seq_len = (cfg.prompt_max_len or 1024) + cfg.max_new_tokens
    dtype_cfg = cfg if cfg.dtype != "auto" else _with_dtype(cfg, "bfloat16")  # auto on a GPU: bf16
    train = estimate_for_config(dtype_cfg.section(ModelSettings), cfg.section(RolloutSettings),
                                cfg.section(OptimizationSettings), shape, needs_reference=cfg.needs_reference,
                                on_policy=cfg.on_policy,
                                gpu=cfg.launch_gpu_type, world_size=world, seq_len=seq_len,
                                chunk_rows=cfg.logprob_chunk_size or auto_chunk_size(shape.vocab), sharding=sharding,
                                hf_generate=engine_kind(cfg.rollout_engine).on_trainer_module,
                                engine_share=engine_kind(cfg.rollout_engine).trainer_gpu_share(EngineInputs.of(cfg.section)))
    train.title = (f"{shape.name} training: one trainer GPU ({cfg.launch_gpu_type}, {cfg.backend}{sharding.label} "
                   f"x {world} rank(s))")
    trainable = lora_params(shape, cfg.lora_rank, _targets(shape, cfg)) if cfg.lora_rank else shape.n_params
    load, host = estimate_load_memory(
        shape, gpu=cfg.launch_gpu_type, train_dtype=train_dtype_of(dtype_cfg.dtype), world_size=world,
        ranks_per_node=per_node, zero_stage=sharding.zero_stage, offload=sharding.offload_params,
        adam_offload=sharding.offload_optimizer, trainable=trainable)
    return [train, load, host]


def memory_preflight_text(cfg) -> str:
    """memory_preflight's tables (or one line saying why there are none), then what this machine lacks to run
    the config's backend (Backend.check_machine: the trainer refuses it before loading the model)."""
    ests = memory_preflight(cfg)
    if not ests:
        text = (f"  memory: no registered shape for model '{cfg.model}' (rftlib.models.memory.MODELS); the trainer logs "
                "its estimate from the loaded config on a GPU (memory/preflight_gib)")
    else:
        text = "\n\n".join(e.table() for e in ests)
    return text + "".join(f"\n  REFUSED on this machine: {p}" for p in machine_problems(_backend_inputs(cfg)))


def _backend_inputs(cfg) -> BackendInputs:
    return BackendInputs.of(cfg.section, train_prompts=cfg.train_prompts)


def _targets(shape: ModelShape, cfg) -> tuple[str, ...]:
    allowed = ATTENTION if shape.is_moe else ALL_LINEAR
    return tuple(t for t in cfg.lora_target_modules if t in allowed) or ATTENTION


def _with_dtype(cfg, dtype: str):
    return dataclasses.replace(cfg, dtype=dtype)
