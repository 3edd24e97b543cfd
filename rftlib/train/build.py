"""Make an attempt's parts from its RunConfig; the Trainer receives them and runs the loop.

``build(cfg)`` returns :class:`Parts`: the ranks (``dist``), the run directory (locked by rank 0),
the task, the training reward, the policy (+ its tokenizer and KL reference), the training backend,
the rollout engine, the prompt sampler and the metrics logger. Each part comes from one function
here, and each choice of implementation from a registry, never from a branch on a name:

    task      rftlib.data.base.TASKS           (RunConfig.task, task_args)
    reward    rftlib.rewards.registry.REWARDS  (RunConfig.rewards; {} keeps the task's own)
    backend   rftlib.backends.BACKENDS   (RunConfig.backend)
    engine    rftlib.rollout.factory.ENGINES   (RunConfig.rollout_engine; it reads its needs off the backend)
    sampler   the task's own (Task.make_sampler) or the seeded PromptSampler

A caller may hand any part in instead (``build(cfg, task=my_task)``, ``engine=...``): tests give a
task with its own reward, a notebook a task it made by hand. The order of the calls is fixed: the
seeds are set before the LoRA weights are drawn, and a rank's own sampling stream is set after the
sampler, so a run with the same seed gives the same numbers.
"""

from __future__ import annotations

import dataclasses
import json
import random
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rftlib.attempts import (SFT_ROWS, AttemptLockedError, attempt_holding, create_attempt, lock_attempt, project_root,
                             read_attempt, run_dir_path)
from rftlib.config import ConfigError, RunConfig
from rftlib.data.base import Sampler, Task, build_task as build_registered_task, held_out_leaks
from rftlib.data.jsonl import read_jsonl
from rftlib.eval import format_prompts
from rftlib.models.loading import (Reference, adapter_mismatch, adapter_refusal, is_peft, load_policy,
                                   read_adapter_config)
from rftlib.monitor.metrics import MetricsLogger
from rftlib.rewards.registry import Reward, combine_rewards
from rftlib.rollout.factory import make_engine
from rftlib.rollout.kinds import EngineInputs
from rftlib.settings import ModelSettings, ScaleSettings
from rftlib.backends import BackendInputs, machine_problems, make_backend, partitioned_load_config
from rftlib.train.dist import Dist, init_dist, resolve_dtype
from rftlib.train.sampler import PromptSampler


@dataclass
class Parts:
    """Everything a Trainer runs with. ``cfg`` is the config as resolved for this device (dtype auto -> a dtype)."""

    cfg: RunConfig
    dist: Dist
    run_dir: Path
    lock: Any  # rank 0's open lock file on the attempt (rftlib.attempts.lock_attempt); None on other ranks
    task: Task
    reward: Reward | None  # the attempt's composite reward (RunConfig.rewards); None: the task's own, read each step
    model: torch.nn.Module  # the (peft-wrapped) policy on dist.device
    tok: Any
    reference: Reference  # the KL reference: the adapter disabled, never a second copy
    backend: Any  # rftlib.backends
    engine: Any  # rftlib.rollout.base.RolloutEngine
    sampler: Sampler  # rftlib.data.base.Sampler: next(k) / state() / load_state(); update() when adaptive
    logger: MetricsLogger | None  # rank 0 only
    load_seconds: float  # loading the policy, for the report


def check_world(cfg: RunConfig, world: int) -> None:
    """Every rank generates whole prompts (a group's advantages need all its G samples) and takes the
    same number of samples and micro-batches per optimizer step. An optimizer batch is counted in
    samples, as OpenRLHF counts it: a rank's share may be part of a group (seed 003 a28: 16 samples
    = 2 prompts over 4 ranks, 4 samples each), the advantages having been taken over whole groups."""
    G = cfg.n_samples_per_prompt
    rows = cfg.train_prompts * G
    if cfg.rollout_batch_size % world:
        raise ConfigError(f"rollout_batch_size={cfg.rollout_batch_size} prompts must divide among {world} ranks "
                          "(each rank generates whole groups)")
    if rows % world:
        raise ConfigError(f"an optimizer batch of {cfg.train_prompts} prompts x {G} = {rows} samples must divide "
                          f"among {world} ranks")
    sampled_probes = [p for p in cfg.eval_probes if cfg.eval_n_samples.get(p, 1) > 1
                      or cfg.eval_temperature.get(p, 0.0) > 0]
    if sampled_probes and world > 1:
        raise ConfigError(f"eval probes {sampled_probes} sample (eval_temperature/eval_n_samples); the sharded "
                          "eval of several ranks runs greedy_pass@1 only: evaluate those with `rft eval` after")
    if cfg.dynamic_sampling == "refill" and world > 1:
        raise ConfigError("dynamic_sampling 'refill' with several ranks: each rank would draw a different number "
                          "of extra prompts from the shared order; use dynamic_sampling 'mask' (TRL's) or one rank")
    if (rows // world) % cfg.micro_batch_size:
        raise ConfigError(f"micro_batch_size={cfg.micro_batch_size} must divide each rank's share of an optimizer "
                          f"batch, {rows} samples / {world} ranks = {rows // world}")


def seed_everything(seed: int) -> None:
    """python, numpy and torch from one seed: the same LoRA init on every rank."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def lock_run_dir(run_dir: Path, dist: Dist):
    """Rank 0 holds the attempt's lock (rftlib.attempts.lock_attempt) for the trainer's life. An attempt
    another live trainer holds is refused on every rank, each told by rank 0 (none hangs)."""
    lock, refused = None, None
    if dist.is_main:
        try:
            lock = lock_attempt(run_dir)
        except AttemptLockedError as e:
            refused = (e.pid, e.host)
    refused = dist.broadcast_object(refused)
    if refused is not None:
        raise AttemptLockedError(run_dir, *refused)
    return lock


def build_task(cfg: RunConfig) -> Task:
    """The task RunConfig.task names, with its builder's task_args."""
    return build_registered_task(cfg.task, eval_size=cfg.eval_size, **cfg.task_args)


def resolve_init_adapter(cfg: RunConfig) -> RunConfig:
    """``init_adapter`` as an absolute path, resolved once where the attempt starts (rftlib.attempts.run_dir_path:
    from the working directory when it is there, else from the project root), so config.yaml names the adapter
    it loaded: a resume, a replay or a notebook kernel in another working directory loads the same one."""
    if not cfg.init_adapter:
        return cfg
    return dataclasses.replace(cfg, init_adapter=str(run_dir_path(cfg.init_adapter)))


def check_init_adapter(cfg: RunConfig, *, say: bool) -> None:
    """Before anything loads: the starting adapter's LoRA (its adapter_config.json) is the one this config builds.
    A difference in rank, alpha, target modules or rsLoRA is refused with the ``--set`` that matches the adapter
    (rftlib.models.loading.adapter_refusal); a dropout difference changes only the noise of training from here,
    not where it starts, and is said (``say``: rank 0) but allowed."""
    if not cfg.init_adapter or not cfg.lora_rank:
        return
    try:
        saved = read_adapter_config(cfg.init_adapter)
    except (FileNotFoundError, ValueError) as e:
        raise ConfigError(str(e)) from None
    diffs = adapter_mismatch(saved, rank=cfg.lora_rank, alpha=cfg.lora_alpha, target_modules=cfg.lora_target_modules,
                             dropout=cfg.lora_dropout)
    msg = adapter_refusal(cfg.init_adapter, diffs)
    if msg:
        raise ConfigError(msg)
    if diffs and say:  # dropout only
        warnings.warn(f"init_adapter {cfg.init_adapter} was trained with lora_dropout={diffs[0][2]}; this attempt "
                      f"trains it with lora_dropout={cfg.lora_dropout} (dropout is off in every forward that "
                      "scores or samples, so the policy still starts where the adapter ended)")


def _sft_texts(run_dir: Path, adapter: Path) -> tuple[list[str], str] | None:
    """(inputs, where they were read) of the SFT rows the attempt ``run_dir`` trained the adapter on: its record
    (attempts.SFT_ROWS), or, for an SFT attempt written before that record existed, its config's sft_data file as
    it is now (said so: the file may have changed since); None when ``run_dir`` is not an SFT attempt."""
    if (run_dir / SFT_ROWS).exists():
        return [r["input"] for r in read_jsonl(run_dir / SFT_ROWS, required=["input"])], str(run_dir / SFT_ROWS)
    try:
        stage = json.loads((run_dir / "summary.json").read_text()).get("stage")
    except (OSError, json.JSONDecodeError):
        stage = None
    data = (read_attempt(run_dir).get("config") or {}).get("sft_data")
    if stage != "sft" and not (data and adapter == run_dir / "adapter"):
        return None
    if not data:
        return None
    path = Path(data).expanduser()
    path = path if path.is_absolute() else project_root() / path
    if not path.exists():
        raise ConfigError(f"init_adapter {adapter}: its SFT attempt {run_dir.name} kept no record of its rows "
                          f"({SFT_ROWS}) and its sft_data {data} is gone, so its overlap with this attempt's held-out "
                          "set cannot be checked; restore the file or rerun the SFT")
    return [r["input"] for r in read_jsonl(path, required=["input"])], f"{path} (as it is now: {run_dir.name} " \
        f"predates {SFT_ROWS})"


def check_sft_ancestry(cfg: RunConfig, task: Task, *, say: bool) -> None:
    """An attempt started from an adapter never evaluates on problems its SFT ancestors trained on: every SFT
    attempt up the init_adapter chain (an RL checkpoint's adapter leads to the attempt it came from, and on to
    that attempt's init_adapter) has its rows checked against this task's held-out set and disjoint probes by
    problem identity (rftlib.data.base.held_out_leaks); an overlap is refused (the held-out number would measure
    memorisation). An adapter outside any attempt cannot be checked: said (``say``: rank 0), not refused."""
    adapter, seen = cfg.init_adapter, set()
    while adapter:
        ad = Path(adapter).expanduser().resolve()
        run_dir = attempt_holding(ad)
        if run_dir is None:
            if say:
                warnings.warn(f"init_adapter {adapter} is not inside an rftlib attempt: the data it was trained on "
                              "cannot be checked against this attempt's held-out set")
            return
        if run_dir in seen:
            return
        seen.add(run_dir)
        found = _sft_texts(run_dir, ad)
        if found is not None:
            texts, where = found
            leaks = held_out_leaks(task, texts)
            if leaks:
                lk = leaks[0]
                n_eval = sum(x.eval_set == "heldout" for x in leaks)
                raise ConfigError(
                    f"init_adapter {cfg.init_adapter}: SFT attempt {run_dir.name} trained on {len(leaks)} problems of "
                    f"this attempt's eval sets ({n_eval} of its {len(task.eval)} held-out problems; compared by problem "
                    f"identity, rows from {where}), e.g. {lk.text!r:.100} is {lk.eval_set} problem {lk.example.id}: "
                    "the held-out accuracy would measure memorisation. Evaluate on a set disjoint from the SFT data "
                    "(the same task, task_args and eval_size as the SFT attempt, or a smaller eval_size), or SFT on "
                    "this task's training split only")
        adapter = (read_attempt(run_dir).get("config") or {}).get("init_adapter")


def build_reward(cfg: RunConfig, task: Task) -> Reward | None:
    """The composite reward RunConfig.rewards names (``task`` = the task's own reward), or None when it
    names none: the trainer then scores with the task's reward as it is at each step."""
    return combine_rewards(cfg.rewards, task.reward) if cfg.rewards else None


def build_policy(cfg: RunConfig, dist: Dist) -> tuple[torch.nn.Module, Any]:
    """(policy, tokenizer): the model in cfg.dtype (an MXFP4 checkpoint dequantised), loaded partitioned when
    the backend shards weights (ZeRO-3: the config it declares), gradient checkpointing, on dist.device, LoRA,
    and the starting adapter (init_adapter): rftlib.models.loading.load_policy."""
    return load_policy(cfg.section(ModelSettings), cfg.section(ScaleSettings), dist,
                       partitioned_load_config(backend_inputs(cfg), dist.world_size))


def backend_inputs(cfg: RunConfig) -> BackendInputs:
    """The sections of ``cfg`` a training backend reads (rftlib.backends.BackendInputs)."""
    return BackendInputs.of(cfg.section, train_prompts=cfg.train_prompts)


def engine_inputs(cfg: RunConfig) -> EngineInputs:
    """The sections of ``cfg`` a rollout engine reads (rftlib.rollout.kinds.EngineInputs)."""
    return EngineInputs.of(cfg.section)


def fit_prompts(task: Task, tok, max_len: int, *, say: bool) -> None:
    """Drop training prompts longer than prompt_max_len tokens, chat template included (OpenRLHF's
    --prompt_max_len filter), saying how many (``say``: rank 0); a pool left empty is an error."""
    prompts = format_prompts(tok, task.train, task.system_prompt)
    lengths = [len(ids) for ids in tok(prompts, add_special_tokens=False)["input_ids"]]
    keep = [e for e, n in zip(task.train, lengths) if n <= max_len]
    if not keep:
        raise ConfigError(f"prompt_max_len={max_len}: every training prompt is longer (shortest "
                          f"{min(lengths)} tokens with the chat template); raise it")
    if len(keep) < len(task.train) and say:
        warnings.warn(f"prompt_max_len={max_len}: dropped {len(task.train) - len(keep)} of "
                      f"{len(task.train)} training prompts longer than that (longest {max(lengths)} tokens)")
    task.train = keep


def check_full_weight_sync(backend, engine, model) -> None:
    """Refuse what would hand an engine empty weights: a full-weight sync (no LoRA) to an engine that is not the
    trainer's module reads ``model.state_dict()``, which under a backend that partitions the parameters (ZeRO-3
    over several ranks) holds each rank's empty placeholders. The LoRA path gathers (backend.adapter_state)."""
    if backend.partitions_params and not engine.shares_trainer_module and not is_peft(model):
        raise ConfigError("lora_rank: 0 with a separate rollout engine under ZeRO-3 over several ranks: the "
                          "full-weight sync does not gather the partitioned weights yet, the engine would get empty "
                          "shards. Use LoRA (lora_rank > 0), zero_stage: 2, one rank, or rollout_engine: hf")


def build_sampler(cfg: RunConfig, task: Task):
    """The task's own sampler (a curriculum, weighted mixing) or the seeded per-epoch PromptSampler."""
    return task.make_sampler(cfg.seed) or PromptSampler(len(task.train), cfg.seed)


def build(cfg: RunConfig, run_dir: str | Path | None = None, *, dist: Dist | None = None, task: Task | None = None,
          engine=None) -> Parts:
    """Every part of an attempt, in the order that keeps a seed's numbers: ranks, config for the device,
    seeds, run directory (created when None, then locked), task, reward, policy, reference, backend,
    engine, sampler, logger. The lock is released if a later part fails."""
    problems = machine_problems(backend_inputs(cfg))  # what the backend would fail on after the load (DeepSpeed's CPU Adam build)
    if problems:
        raise ConfigError("this machine cannot run the config's backend: " + "; ".join(problems))
    D = dist or init_dist(cfg)
    cfg = resolve_init_adapter(dataclasses.replace(cfg, dtype=resolve_dtype(cfg.dtype, D.device)))
    check_world(cfg, D.world_size)
    check_init_adapter(cfg, say=D.is_main)
    seed_everything(cfg.seed)
    if run_dir is None:
        run_dir = D.broadcast_object(str(create_attempt(cfg)) if D.is_main else None)
    run_dir = Path(run_dir)
    lock = lock_run_dir(run_dir, D)
    made = None  # the engine built here: stopped if a later part fails (its server processes hold cores or GPUs)
    try:
        task = task or build_task(cfg)
        check_sft_ancestry(cfg, task, say=D.is_main)
        reward = build_reward(cfg, task)
        t = time.time()
        model, tok = build_policy(cfg, D)
        load_seconds = time.time() - t
        reference = Reference(model, needed=cfg.needs_reference)
        backend = make_backend(backend_inputs(cfg), D, model, total_opt_steps=cfg.total_optimizer_steps,
                               warmup_steps=cfg.warmup_steps)
        made = None if engine is not None else make_engine(engine_inputs(cfg), model, tok, run_dir, sync=False,
                                                           backend=backend)
        engine = engine or made
        check_full_weight_sync(backend, engine, model)
        if cfg.prompt_max_len:
            fit_prompts(task, tok, cfg.prompt_max_len, say=D.is_main)
        sampler = build_sampler(cfg, task)
        if D.rank:  # ranks sample their own completions: distinct streams (rank 0 keeps the single-process one)
            torch.manual_seed(cfg.seed + 1_000_003 * D.rank)
        logger = MetricsLogger(run_dir) if D.is_main else None
    except BaseException:  # a kernel that lives on (a notebook) must not keep the attempt locked
        try:
            if made is not None:
                made.close()
        finally:
            if lock is not None:
                lock.close()
        raise
    return Parts(cfg=cfg, dist=D, run_dir=run_dir, lock=lock, task=task, reward=reward, model=model, tok=tok,
                 reference=reference, backend=backend, engine=engine, sampler=sampler, logger=logger,
                 load_seconds=load_seconds)
