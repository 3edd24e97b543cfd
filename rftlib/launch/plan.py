"""The launch plan of an attempt: which process runs where, with which environment and command.

Seed 003 ran its 8xH100 layout from a shell script under ``tee`` (actor ranks on GPUs 4-7 under
DeepSpeed ZeRO-3, two vLLM engines x TP 2 on GPUs 0-3) and lost track of which command ran. A
:class:`LaunchPlan` is that layout written down from a preset's launch-layout fields
(``train_gpus``, ``rollout_gpus``, ``nnodes``, ``hosts``, ...): one :class:`Process` per trainer node
(torchrun) and per vLLM server engine, each with its GPUs, ``CUDA_VISIBLE_DEVICES``, environment,
command line and log file. :func:`check_plan` holds it against the machine (enough GPUs, the memory
preflight of each role) and refuses with a message that says what to change; :func:`format_plan`
prints the GPU map and the commands (``dry_run``). The same layout repeats on every node of a
multi-node plan: torchrun's c10d rendezvous joins the trainer ranks, each node's engines are
addressed by ``http://HOST:PORT``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rftlib.algo.logprobs import auto_chunk_size
from rftlib.config import ConfigError, RunConfig
from rftlib.preflight.memory_check import MODELS, estimate_for_config, estimate_rollout_memory, shape_name_for_model
from rftlib.rollout.kinds import EngineInputs, engine_kind
from rftlib.models.precision import describe as describe_precision, float16_note
from rftlib.rollout.vllm import (API_KEY_ENV, VLLMSettings, engine_dtype, engine_gpu_memory, engine_max_len,
                                 trainer_compute)
from rftlib.rollout.vllm_server import physical_gpus, server_command, server_env, visible_gpus
from rftlib.backends import backend_class, machine_problems, sharding_of
from rftlib.settings import EngineSettings, ModelSettings, OptimizationSettings, RolloutSettings
from rftlib.train.pipeline import pipeline_text
from rftlib.train.build import backend_inputs, check_world, engine_inputs
from rftlib.train.torchrun import torchrun_command

DEFAULT_RDZV_PORT = 29400
NCCL_DEFAULTS = {"NCCL_DEBUG": "WARN", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}


class LaunchError(RuntimeError):
    """The plan does not fit the machine (or the config); the message says what to change."""


@dataclass
class Process:
    """One process of the attempt: the trainer's torchrun on a node, or one vLLM server engine."""

    name: str  # "trainer" (node 0), "trainer_node1", "vllm_engine_0", ...
    role: str  # "trainer" | "vllm"
    node: int
    host: str
    gpus: list[int]  # GPU indices on that node as the planning shell numbers them (its CUDA_VISIBLE_DEVICES
    # entries are in env); [] on CPU
    cmd: list[str]
    env: dict[str, str]  # only what the plan sets on top of the inherited environment
    log: str  # relative to the run directory
    url: str | None = None  # vLLM engines: the OpenAI-compatible base URL
    port: int | None = None

    def shell(self) -> str:
        """The command as one shell line, its environment in front."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        return (env + " " if env else "") + shlex.join(self.cmd)


@dataclass
class LaunchPlan:
    """Every process of an attempt across its nodes, and what the check of the machine said."""

    run_dir: str
    preset: str
    nnodes: int
    hosts: list[str]
    gpus_per_node: int  # the GPUs the layout assumes on each node (0 on a CPU plan)
    train_ranks_per_node: int
    backend: str
    zero_stage: int | None  # None unless backend deepspeed
    offload: dict[str, bool]
    engine_urls: list[str]  # the trainer's rollout engines (started here or given by vllm_urls)
    processes: list[Process] = field(default_factory=list)
    visible_gpus: list[str] | None = None  # node 0's CUDA_VISIBLE_DEVICES when planned (None: unset, every GPU)
    checks: list[str] = field(default_factory=list)  # what check_plan found (notes and memory verdicts)
    precision: dict[str, str] = field(default_factory=dict)  # last, so positional plans keep their order; rftlib.models.precision.describe: trainer, engine, note
    pipeline: str = ""  # rftlib.train.pipeline.pipeline_text: synchronous, or what max_staleness k overlaps

    @property
    def world_size(self) -> int:
        return self.nnodes * self.train_ranks_per_node

    def on_node(self, node: int) -> list[Process]:
        return [p for p in self.processes if p.node == node]

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> LaunchPlan:
        d = dict(d)
        d["processes"] = [Process(**p) for p in d["processes"]]
        return cls(**d)

    def save(self, run_dir: str | Path) -> None:
        """plan.json (what the supervisor reads) and commands.sh (what a person can re-run by hand)."""
        run_dir = Path(run_dir)
        for name, text in (("plan.json", json.dumps(self.to_json(), indent=1)), ("commands.sh", commands_sh(self))):
            path = run_dir / name
            path.write_text(text)
            if any(API_KEY_ENV in p.env or "VLLM_API_KEY" in p.env for p in self.processes):
                os.chmod(path, 0o600)  # they hold the engines' API key


def detect_gpus() -> int:
    """GPUs this machine shows: torch.cuda.device_count(), else nvidia-smi's list, else 0."""
    try:
        if torch.cuda.is_available():
            return torch.cuda.device_count()
    except Exception:  # a broken CUDA install counts as no GPU, the check then says so
        pass
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
            return sum(1 for line in out.splitlines() if line.startswith("GPU "))
        except (OSError, subprocess.SubprocessError):
            return 0
    return 0


def _uses_gpus(cfg: RunConfig) -> bool:
    return cfg.device != "cpu" and (cfg.device.startswith("cuda") or bool(cfg.train_gpus or cfg.rollout_gpus)
                                    or engine_kind(cfg.rollout_engine).serves(engine_inputs(cfg)))


def _server_engines(cfg: RunConfig) -> int:
    """Engine server processes this launch starts per node, as the engine declares them (vLLM: vllm_num_engines
    when served, none when vllm_urls name engines elsewhere)."""
    return engine_kind(cfg.rollout_engine).server_processes(engine_inputs(cfg))


def make_plan(cfg: RunConfig, run_dir: str | Path, *, preset: str = "", resume: bool = False,
              gpus_per_node: int | None = None, python: str = sys.executable) -> LaunchPlan:
    """The launch plan of ``cfg`` for the attempt at ``run_dir`` (no check against the machine).

    ``gpus_per_node`` (tests, or a plan for other machines) overrides ``cfg.gpus_per_node`` and the
    detection; it only matters when ``train_gpus`` is None (the trainer takes the GPUs left over).
    """
    gpu = _uses_gpus(cfg)
    n_gpu = gpus_per_node if gpus_per_node is not None else (cfg.gpus_per_node or (detect_gpus() if gpu else 0))
    tp, n_eng = cfg.vllm_tensor_parallel_size, _server_engines(cfg)
    rollout = list(cfg.rollout_gpus) if cfg.rollout_gpus is not None else list(range(n_eng * tp))
    if n_eng and len(rollout) != n_eng * tp:
        raise LaunchError(f"rollout_gpus={rollout} holds {len(rollout)} GPU(s), but vllm_num_engines={n_eng} x "
                          f"vllm_tensor_parallel_size={tp} needs {n_eng * tp}: change one of them")
    if not n_eng or not gpu:  # a CPU plan (the rehearsal): engines share the cores, no GPU to hand out
        rollout = []
    if cfg.train_gpus is not None:
        train = list(cfg.train_gpus)
    elif gpu:
        train = [g for g in range(n_gpu) if g not in rollout]
    else:
        train = []
    ranks = cfg.train_ranks or len(train) or 1
    if train and ranks != len(train):
        raise LaunchError(f"train_ranks={ranks} but train_gpus={train}: one trainer rank per GPU")
    if ranks > 1 and backend_class(cfg.backend).single_process:
        raise LaunchError(f"{ranks} trainer ranks with backend '{cfg.backend}', which runs one process: choose a "
                          "backend that runs ranks (ddp, or ZeRO's) (or train_ranks 1 / one train GPU)")
    hosts = list(cfg.hosts) or ["localhost"]
    if cfg.nnodes > 1 and len(hosts) != cfg.nnodes:
        raise LaunchError(f"nnodes={cfg.nnodes} needs one host per node in hosts (got {hosts})")
    rdzv = cfg.rdzv_endpoint or (f"{hosts[0]}:{DEFAULT_RDZV_PORT}" if cfg.nnodes > 1 else None)
    run_dir = str(run_dir)

    # GPU indices count the GPUs the planning shell sees (CUDA_VISIBLE_DEVICES: index i is its i-th entry, as
    # torch's cuda:i); each process's CUDA_VISIBLE_DEVICES names those entries. A plan naming a GPU that is not
    # visible keeps its indices as they are and check_plan refuses it (a dry run prints it with a note)
    vis = visible_gpus() if gpu else None
    mappable = vis is None or all(g < len(vis) for g in train + rollout)
    environ = None if mappable else {}
    procs: list[Process] = []
    urls: list[str] = list(cfg.vllm_urls)
    # engines on other nodes' reach listen beyond loopback, so they require a key the trainer sends
    api_key = secrets.token_urlsafe(24) if n_eng and cfg.nnodes > 1 else None
    engine = VLLMSettings.for_launch(engine_inputs(cfg), on_gpu=gpu, api_key=api_key) if n_eng else None
    for node in range(cfg.nnodes):
        host = hosts[node]
        for k in range(n_eng):
            gpus = rollout[k * tp:(k + 1) * tp]  # [] on a CPU plan
            port = cfg.vllm_base_port + k
            try:  # the trainer's own engine command and environment (rftlib.rollout.vllm_server), this GPU slice
                node_engine = dataclasses.replace(engine, rollout_gpus=tuple(rollout))
                cmd = server_command(node_engine, k, port, python=python)
                env = {**server_env(node_engine, k, environ), **NCCL_DEFAULTS, **cfg.nccl_env}
            except ValueError as e:
                raise LaunchError(str(e)) from None
            if not gpu:
                env.pop("CUDA_VISIBLE_DEVICES", None)
            name = f"vllm_engine_{k}" + (f"_node{node}" if node else "")
            url = f"http://{host if cfg.nnodes > 1 else '127.0.0.1'}:{port}/v1"
            urls.append(url)
            procs.append(Process(name, "vllm", node, host, gpus, cmd, env, f"logs/{name}.log", url=url, port=port))
    for node in range(cfg.nnodes):
        args = ["train", "--run-dir", run_dir] + (["--resume"] if resume else [])
        cmd = torchrun_command(ranks, args, nnodes=cfg.nnodes, node_rank=node, rdzv_endpoint=rdzv, python=python)
        env = ({"CUDA_VISIBLE_DEVICES": ",".join(physical_gpus(train, "train_gpus", environ))} if gpu
               else {"CUDA_VISIBLE_DEVICES": ""})
        if gpu or cfg.nnodes > 1:
            env.update(NCCL_DEFAULTS)
        env.update(cfg.nccl_env)
        if api_key:
            env[API_KEY_ENV] = api_key  # the trainer sends it to the engines (rftlib.rollout.vllm_server)
        name = "trainer" + (f"_node{node}" if node else "")
        procs.insert(node, Process(name, "trainer", node, hosts[node], train, cmd, env, f"logs/{name}.log"))
    weights = cfg.dtype if cfg.dtype != "auto" else ("bfloat16" if gpu else "float32")  # resolve_dtype's rule
    precision = describe_precision(weights, trainer_compute(cfg.autocast, weights, on_gpu=gpu),
                                   engine.dtype if engine else (None if engine_kind(cfg.rollout_engine).on_trainer_module
                                                                else engine_dtype(cfg.vllm_dtype, cfg.autocast, weights,
                                                                                  on_gpu=gpu)),
                                   "cuda" if gpu else "cpu")
    risk = float16_note(weights, cfg.model, cfg.launch_gpu_type if gpu else None)
    if risk:  # the config's dtype is kept; the plan says what it risks and the alternative
        precision["note"] = "; ".join(n for n in (precision["note"], risk) if n)
    return LaunchPlan(run_dir=run_dir, preset=preset, nnodes=cfg.nnodes, hosts=hosts, gpus_per_node=n_gpu,
                      train_ranks_per_node=ranks, backend=cfg.backend,
                      zero_stage=sharding_of(backend_inputs(cfg)).zero_stage or None,
                      offload={"params": cfg.offload_params, "optimizer": cfg.offload_optimizer},
                      engine_urls=urls, processes=procs, visible_gpus=vis, precision=precision,
                      pipeline=pipeline_text(cfg.max_staleness, engine=cfg.rollout_engine,
                                             placement=cfg.vllm_placement,
                                             lora=cfg.lora_rank > 0, tis_cap=cfg.tis_cap, tis_level=cfg.tis_level))


def _max_len(cfg: RunConfig) -> int:
    """Tokens per sequence: the engines' rule (vllm_max_model_len, else prompt_max_len or 1024 + max_new_tokens)."""
    return engine_max_len(cfg.section(EngineSettings), cfg.prompt_max_len, cfg.max_new_tokens, None)


def memory_checks(plan: LaunchPlan, cfg: RunConfig) -> list[tuple[str, Any]]:
    """(role, MemoryEstimate) for one trainer GPU and one engine GPU of the plan (rftlib.preflight.memory_check)."""
    shape = shape_name_for_model(cfg.model)
    if shape is None or not any(p.gpus for p in plan.processes):
        return []
    out = []
    trainer = plan.processes[0]
    if trainer.gpus:
        sharding = sharding_of(backend_inputs(cfg))
        # rft preflight's estimate (the trainer's rules: the no-grad passes' rows, the attention that runs), on
        # the plan's GPUs: dtype auto is bf16 there
        gcfg = cfg if cfg.dtype != "auto" else dataclasses.replace(cfg, dtype="bfloat16")
        est = estimate_for_config(gcfg.section(ModelSettings), cfg.section(RolloutSettings),
                                  cfg.section(OptimizationSettings), shape, needs_reference=cfg.needs_reference,
                                  on_policy=cfg.on_policy,
                                  gpu=cfg.launch_gpu_type, world_size=plan.world_size,
                                  seq_len=_max_len(cfg), chunk_rows=cfg.logprob_chunk_size
                                  or auto_chunk_size(MODELS[shape].vocab), sharding=sharding,
                                  hf_generate=engine_kind(cfg.rollout_engine).on_trainer_module,
                                  engine_share=engine_kind(cfg.rollout_engine).trainer_gpu_share(
                                      EngineInputs.of(cfg.section)))
        est.title = f"trainer rank GPU ({cfg.launch_gpu_type}, {plan.backend}{sharding.label} x {plan.world_size})"
        out.append(("trainer", est))
    eng = [p for p in plan.processes if p.role == "vllm"]
    if eng:
        out.append(("vllm", estimate_rollout_memory(
            shape, gpu=cfg.launch_gpu_type, gpu_memory_utilization=engine_gpu_memory(cfg.section(EngineSettings)),
            tensor_parallel=cfg.vllm_tensor_parallel_size, weight_dtype="mxfp4" if "gpt-oss" in shape else "bf16",
            max_model_len=_max_len(cfg),
            title=f"vLLM engine GPU ({cfg.launch_gpu_type}, TP {cfg.vllm_tensor_parallel_size})")))
    return out


def generation_gather_note(cfg: RunConfig, trainer_est) -> str:
    """What an engine that generates on the trainer's module does with partitioned weights (ZeRO-3: the
    backend's plan_generation_gather), judged from the preflight: the whole model's bf16 weights against the
    GPU's room beside the estimate. '' where the engine is separate or every rank holds whole weights."""
    shape = shape_name_for_model(cfg.model)
    if shape is None or not engine_kind(cfg.rollout_engine).on_trainer_module:
        return ""
    model_bytes = int(MODELS[shape].n_params * 2)  # bf16 weights, gathered whole
    free = max(0, int((trainer_est.capacity_gb - trainer_est.total_gb) * 1e9))
    plan = backend_class(cfg.backend).plan_generation_gather(backend_inputs(cfg), model_bytes, free)
    return "" if plan is None else f"HF generate under ZeRO-3: {plan[1]}"


def check_plan(plan: LaunchPlan, cfg: RunConfig, *, dry_run: bool = False,
               machine_gpus: int | None = None) -> list[str]:
    """Hold the plan against this machine; the notes (also kept in ``plan.checks``), or LaunchError.

    Checks: each node has the GPUs the layout names (``machine_gpus`` overrides the detection, for
    tests), the trainer's ranks can share the batch (whole prompts per rank, the trainer's own
    rule), and the memory preflight of a trainer GPU and an engine GPU does not say OOM. With
    ``dry_run`` nothing raises: a machine without the GPUs is a note ("dry run on a machine without
    the GPUs"), so a plan for an 8xH100 node can be printed on a laptop, and what a launch would
    refuse is listed as "REFUSED (a launch would stop here): ..." under the plan.
    """
    notes: list[str] = []
    problems: list[str] = []
    used = sorted({g for p in plan.on_node(0) for g in p.gpus})
    have = detect_gpus() if machine_gpus is None else machine_gpus
    vis = plan.visible_gpus
    hidden = bool(used) and vis is not None and max(used) >= len(vis)
    if hidden:
        msg = (f"the plan uses GPUs {used} (indices into the GPUs this shell sees), but CUDA_VISIBLE_DEVICES="
               f"{','.join(vis)} shows {len(vis)}: GPU(s) {[g for g in used if g >= len(vis)]} are not visible, and "
               "passing them on would put a process on a GPU outside the set (another user's)")
        if dry_run:
            notes.append(f"dry run: {msg}; nothing was started")
        else:
            problems.append(msg + ": give train_gpus / rollout_gpus as indices into CUDA_VISIBLE_DEVICES, or widen "
                                  "it (or unset it) to the GPUs the plan names")
    elif used and vis is not None:
        notes.append(f"GPU indices count CUDA_VISIBLE_DEVICES={','.join(vis)}: "
                     + ", ".join(f"{g} -> {vis[g]}" for g in used))
    if used and hidden and not dry_run:
        pass  # refused above: the count of GPUs would only repeat it
    elif used:
        need = max(used) + 1
        if have < need:
            msg = (f"the plan uses GPUs {used} on each node (up to index {need - 1}) but this machine shows {have} "
                   f"GPU(s)")
            if dry_run:
                notes.append(f"dry run on a machine without the GPUs: {msg}; nothing was started")
            else:
                problems.append(msg + ": run it on a machine with them, or change train_gpus / rollout_gpus / "
                                      "vllm_num_engines / vllm_tensor_parallel_size")
        else:
            notes.append(f"GPUs: the plan uses {used}; this machine shows {have}")
    else:
        notes.append(f"CPU plan: {plan.train_ranks_per_node} trainer rank(s) per node, no GPU")
    for problem in machine_problems(backend_inputs(cfg)):  # what the trainer would refuse at start-up (it runs on this node)
        if dry_run:
            notes.append(f"on this machine: {problem}")
        else:
            problems.append(problem)
    try:  # the trainer's own rule for sharding prompts over ranks, checked before anything starts
        check_world(cfg, plan.world_size)
    except ConfigError as e:
        problems.append(f"{e}: change the trainer ranks (train_gpus / train_ranks / nnodes) or the batch sizes")
    for role, est in memory_checks(plan, cfg):
        notes.append(f"memory preflight, {role}: {est.verdict} ({est.total_gb:.1f} of {est.capacity_gb:.1f} GB, "
                     f"dominant term {est.dominant})")
        if role == "trainer" and (gather := generation_gather_note(cfg, est)):
            notes.append(gather)
        if est.verdict == "OOM":
            fix = ("set offload_params/offload_optimizer (backend deepspeed, zero_stage 3), add train_gpus, or lower "
                   "micro_batch_size / max_new_tokens" if role == "trainer" else
                   "raise vllm_tensor_parallel_size or vllm_gpu_memory_utilization")
            if est.dominant.startswith("no-grad"):  # the reference / old-logprob passes' own width
                fix = ("lower logprob_batch_size (0: sized from memory), or attn_implementation flex_attention / "
                       "auto where eager attention's scores dominate")
            problems.append(f"the {role} GPUs would run out of memory: {est.problem or est.dominant + ' dominates'}; "
                            f"{fix}\n{est.table()}")
    plan.checks = notes + [f"REFUSED{' (a launch would stop here)' if dry_run else ''}: {p}" for p in problems]
    if problems and not dry_run:
        raise LaunchError("the launch plan does not fit:\n- " + "\n- ".join(problems))
    return notes


def gpu_map(plan: LaunchPlan) -> str:
    """One line per GPU of node 0 (the layout repeats on every node): its role and process."""
    lines = []
    owner: dict[int, str] = {}
    for p in plan.on_node(0):
        for i, g in enumerate(p.gpus):
            if p.role == "trainer":
                z = f"ZeRO-{plan.zero_stage}" if plan.zero_stage else plan.backend
                off = [k for k, v in plan.offload.items() if v]
                owner[g] = f"trainer rank {i} (local) - {z}" + (f" + CPU offload ({', '.join(off)})" if off else "")
            else:
                owner[g] = f"{p.name} TP rank {i} of {len(p.gpus)} - port {p.port}"
    for g in range(max(list(owner) + [plan.gpus_per_node - 1]) + 1):
        lines.append(f"  GPU {g}: {owner.get(g, 'idle')}")
    if not owner:
        lines.append(f"  (CPU) trainer: {plan.train_ranks_per_node} rank(s), backend {plan.backend}")
    return "\n".join(lines)


def commands_sh(plan: LaunchPlan) -> str:
    """A shell script of the plan, node by node (what ``rft launch`` ran on node 0)."""
    out = ["#!/usr/bin/env bash",
           f"# launch plan of {plan.run_dir} (preset {plan.preset or '-'}); written by rft launch",
           "# each line runs in the background on its node; logs under the run directory", "set -euo pipefail"]
    for node in range(plan.nnodes):
        out.append(f"\n# ---- node {node}: {plan.hosts[node]} ----")
        for p in plan.on_node(node):
            out.append(f"{p.shell()} > {shlex.quote(str(Path(plan.run_dir) / p.log))} 2>&1 &")
    out.append("wait")
    return "\n".join(out) + "\n"


def format_plan(plan: LaunchPlan) -> str:
    """The GPU map, the engines' URLs, the per-process commands and the check's notes, as printed by dry_run."""
    z = f", ZeRO-{plan.zero_stage}" if plan.zero_stage else ""
    lines = [f"launch plan: {plan.nnodes} node(s) {plan.hosts}, {plan.world_size} trainer rank(s) "
             f"({plan.train_ranks_per_node} per node, backend {plan.backend}{z}), "
             f"{len([p for p in plan.processes if p.role == 'vllm'])} vLLM server engine(s)",
             "GPU map (every node):", gpu_map(plan)]
    if plan.engine_urls:
        lines.append("rollout engines: " + ", ".join(plan.engine_urls))
    if plan.precision:
        p = plan.precision
        lines.append(f"precision: trainer {p['trainer']}; rollouts {p['engine']}" +
                     (f"\n  NOTE: {p['note']}" if p.get("note") else ""))
    if plan.pipeline:
        lines.append(plan.pipeline)
    for node in range(plan.nnodes):
        lines.append(f"commands on node {node} ({plan.hosts[node]}):")
        lines += [f"  [{p.name}] {p.shell()}" for p in plan.on_node(node)]
    lines += [f"check: {c}" for c in plan.checks]
    return "\n".join(lines)
