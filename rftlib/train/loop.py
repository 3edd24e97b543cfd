"""The GRPO trainer: rollout -> reward -> advantages -> micro-batched update -> sync -> log/eval/checkpoint.

It only orchestrates. The parts come from rftlib.train.build (task, reward, policy, backend, engine,
sampler, logger; each chosen from a registry), the maths from rftlib.algo (looked up by name, never
branched on), generation from the rollout engine. The class reads top to bottom as one GRPO step of
public phases, each returning a dataclass of rftlib.train.phases: :meth:`Trainer.rollout` (generate +
score) -> :meth:`Trainer.advantages` (reference / old logprobs, shaped rewards, advantages, loss mask)
-> :meth:`Trainer.update` (micro-batched, gradient-accumulated loss) -> :meth:`Trainer.sync` -> metrics;
:meth:`Trainer.evaluate` scores the held-out set. The run around the steps (evals, checkpoints, health, stops, the
summary: :meth:`Trainer.train`) is rftlib.train.run's ``RunLoop``, mixed in; the bookkeeping a checkpoint saves is
``Trainer.state`` (rftlib.train.state); where the next batch comes from (inline, or a producer thread k batches
ahead, and the adapters shared engines keep for it) is rftlib.train.pipeline's; ``Trainer.timeline`` records where
the time goes (rftlib.train.timeline_hook). ``Trainer.hooks`` see every phase (its name, seconds
and result), ``Trainer.around`` wrap them: how a bench, a validation or a test observes a step without
patching the trainer.
One call of :meth:`Trainer.step` is one rollout; it makes ``num_updates_per_rollout x B /
train_batch_size`` optimizer steps. When that is exactly one, the update is on-policy: the old
logprobs *are* the current ones (detached), so no extra forward is spent on them.
"""

from __future__ import annotations

import contextlib
import functools
import math
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from rftlib.algo.advantages import compute_advantages
from rftlib.algo.filtering import constant_groups, void_turn_row_mask
from rftlib.algo.logprobs import auto_chunk_size, recompute_needed
from rftlib.algo.losses import grpo_loss
from rftlib.algo.schedule import lr_at
from rftlib.attempts import read_attempt
from rftlib.config import RunConfig, make_config
from rftlib.envs.chat import check_prefix_preserving
from rftlib.eval import check_precision, eval_precision
from rftlib.models.forward import completion_logprobs
from rftlib.models.loading import causal_lm, compute_dtype, is_peft
from rftlib.models.precision import describe as describe_precision
from rftlib.monitor import records
from rftlib.rewards.registry import Reward, as_reward
from rftlib.rollout.base import transcript_spans
from rftlib.rollout.sources import SOURCES, Sampling, source_name
from rftlib.train import checkpoint as ckpt
from rftlib.train import steps
from rftlib.train.build import Parts, build
from rftlib.train.dist import Dist
from rftlib.train.evaluation import EVAL_KEY, evaluate_probes  # noqa: F401  EVAL_KEY: importers of loop
from rftlib.train.step_memory import preflight_gib, step_memory
from rftlib.train.phases import (Advantaged, Around, EvalResult, Forward, Hook, Scored, SyncResult, UpdateResult,
                                 phase)
from rftlib.train.pipeline import engine_seed, hold_for_other_ranks, log_trained, make_source, staleness_metrics
from rftlib.train.record import Recorder
from rftlib.train.run import BUDGET_STOP, RunLoop  # noqa: F401  BUDGET_STOP: importers of loop
from rftlib.train.state import TrainerState
from rftlib.train.step_metrics import first_group, step_metrics, write_step_logs
from rftlib.train.timeline_hook import TrainerTimeline
from rftlib.train.update_parts import (NoiseScaleProbe, full_width, no_grad_batch_rows, rows_of, sequence_log_ratio,
                                      token_diagnostics, truncated_is)



class Trainer(RunLoop):
    """One attempt's training state. Build it, then :meth:`train` (or :meth:`step` by hand).

    The trainer receives its parts (rftlib.train.build.Parts: ``Trainer(cfg, parts=build(cfg,
    task=...))``), or builds them from the config when none are given. Under torchrun every rank
    runs this same object on its share of each rollout's prompts; rank 0 alone writes files. Another
    reward: a task with it (``task=Task(..., reward=fn)``), or rewards named in RunConfig.rewards.
    """

    hooks: list[Hook] | tuple = ()  # the instance's lists (__init__); empty for a trainer built without one
    around: list[Around] | tuple = ()
    trace = None  # rftlib.train.record.UpdateTrace while a recorded step's update runs (record_batches)
    timeline: TrainerTimeline | None = None  # logs/timeline.jsonl (rftlib.train.timeline_hook), from _setup's sync on

    def __init__(self, cfg: RunConfig, run_dir: str | Path | None = None, *, resume: bool = False,
                 progress: bool = True, callbacks: list[Callable[[dict], None]] | None = None,
                 dist: Dist | None = None, task=None, engine=None, parts: Parts | None = None,
                 hooks: list[Hook] | None = None, around: list[Around] | None = None):
        parts = parts or build(cfg, run_dir, dist=dist, task=task, engine=engine)
        self.parts = parts
        self.cfg, self.dist, self.run_dir, self._lock = parts.cfg, parts.dist, parts.run_dir, parts.lock
        self.task, self.reward, self.model, self.tok = parts.task, parts.reward, parts.model, parts.tok
        self.ref, self.backend, self.engine = parts.reference, parts.backend, parts.engine
        self.sampler, self.logger, self.load_seconds = parts.sampler, parts.logger, parts.load_seconds
        self.progress = progress
        self.callbacks = list(callbacks or [])  # each metrics row (rank 0)
        self.hooks: list[Hook] = list(hooks or [])  # hook(phase, seconds, result) after each phase (rftlib.train.phases)
        self.around: list[Around] = list(around or [])  # around(phase): a context manager around each phase
        try:
            self._setup(resume)
        except BaseException as e:  # a refused first sync or resume: stop the engines started for it (their
            try:  # processes, GPUs) and release the lock (a kernel that lives on, a notebook, must not keep it)
                self.close(e)
            except Exception as failed:  # noqa: BLE001 -- the start's error is the one to raise
                warnings.warn(f"closing the trainer after its start failed also failed: {failed!r}")
            raise

    def _setup(self, resume: bool) -> None:
        """The trainer's own state over its parts, then the checkpoint when resuming, then the engine's first sync."""
        cfg, D = self.cfg, self.dist
        # LM-head chunk rows: the configured count, or sized from the vocabulary (config.vocab_size: the
        # output embedding's weight is an empty shard under ZeRO-3)
        self.vocab_size = causal_lm(self.model).config.vocab_size
        self.logprob_chunk_size = cfg.logprob_chunk_size or auto_chunk_size(self.vocab_size)
        self.opt_steps_per_rollout = cfg.optimizer_steps_per_rollout
        # forward passes in the weights' half dtype (trainable masters are float32), else bf16 autocast where the
        # hardware has native bf16 (auto)
        self.amp = compute_dtype(cfg.dtype, cfg.autocast)
        # what this attempt computes in, trainer and engines, and (on a CPU) whether that is the GPU's bf16
        self.precision = describe_precision(cfg.dtype, self.amp, None if self.engine.shares_trainer_module
                                            else getattr(self.engine, "precision", None), self.dist.device.type)
        if self.precision["note"] and self.dist.is_main and not self.engine.shares_trainer_module:
            print(f"[rft] precision: {self.precision['note']}", flush=True)
        # an engine that is not the trainer's module samples from its own numerics: the old logprobs
        # come from the trainer, and truncated IS weights correct the loss for the mismatch
        self.on_policy = self.opt_steps_per_rollout == 1 and self.engine.shares_trainer_module
        # every eval in one declared precision (rftlib.eval), checked now: an engine that cannot switch refuses
        self.eval_precision = eval_precision(cfg.eval_dtype, cfg.dtype, self.engine)
        check_precision(self.engine, self.eval_precision)
        # what turns a batch's examples into its scored rollout (rftlib.rollout.sources): cfg.env selects it
        self.rollout_source = SOURCES.get(source_name(cfg.env))
        if cfg.env != "single_turn":  # token-in/token-out needs a template that keeps earlier turns as rendered
            check_prefix_preserving(self.tok, stop_ids=self.engine.stop_ids)
            self.rollout_source = functools.partial(
                self.rollout_source, task=self.task, env=cfg.env, env_args=dict(cfg.env_args), max_turns=cfg.max_turns,
                max_trajectory_tokens=cfg.max_trajectory_tokens or cfg.max_new_tokens,
                max_observation_tokens=cfg.max_observation_tokens, max_episode_seconds=cfg.max_episode_seconds)
        self.state = TrainerState()  # step, evals, skipped steps, pending batches: what a checkpoint saves
        self.memory_estimate = None
        if D.device.type == "cuda":
            self.memory_estimate = preflight_gib(cfg, causal_lm(self.model).config, D.world_size, prompt_len=256,
                                                chunk_rows=self.logprob_chunk_size)
        self.session_end: int | None = None  # the step train() stops at this session (None: num_steps)
        self.timeline = None  # nothing is recorded before the resume below: the timeline starts after it
        if resume:
            ckpt.resume_trainer(self)
            if D.is_main:  # the steps after the checkpoint run again and are recorded again
                records.truncate_after(self.run_dir, self.step_num)
        self.recorder = Recorder(self)  # records/step_N: the batches record_batches names (rftlib.train.record)
        # every rank records where its time goes (its rows' timing/*_busy); rank 0 writes them
        self.timeline = TrainerTimeline(self.run_dir, rank=D.rank, is_main=D.is_main, engine=self.engine,
                                        step=lambda: self.step_num, resume_step=self.step_num if resume else None)
        if not self.engine.shares_trainer_module:  # once the weights are final: a resume restored the adapter
            sync = self.sync(verify=True)
            self.engine.initial_sync = sync.details
            if D.is_main:
                print(f"[rft] engine synced at step {self.step_num}{' (resumed)' if resume else ''}: probe gap "
                      f"{sync.details['probe_max_diff']:.3g} <= {sync.details['probe_threshold']:.3g} (4 x this "
                      f"precision's noise on the probe, measured {sync.details['probe_noise']:.3g} now, a high quantile "
                      "of the recent syncs' measurements; at least vllm_sync_probe_tol)", flush=True)
        # where each step's batch comes from: the rollout on this thread (max_staleness 0), or a producer thread
        # generating up to k batches ahead (rftlib.train.pipeline); the engine holds the version it starts with
        self.source = make_source(cfg.max_staleness, produce_inline=self.rollout, produce_indices=self.rollout_of,
                                  draw=self.sampler.next,
                                  next_seed=lambda: engine_seed(self.engine), produce=self.produce, engine=self.engine,
                                  version=self.step_num, adapter=getattr(self.engine, "adapter", None))
        self.source.load_pending(self.state.pending)
        if self.state.pending and D.is_main:
            b = sorted(int(p["batch"]) for p in self.state.pending)
            print(f"[rft] resume: {len(b)} batch(es) the checkpoint had permitted but not trained (step "
                  f"{', '.join(map(str, b))}) are generated first, from the resumed weights, each when max_staleness "
                  f"{cfg.max_staleness} allows: their prompts are trained once, none skipped", flush=True)

    # the run's bookkeeping lives in self.state (rftlib.train.state); these names stay for the notebooks and callers
    @property
    def step_num(self) -> int:
        return self.state.step

    @step_num.setter
    def step_num(self, value: int) -> None:
        self.state.step = value

    @property
    def eval_history(self) -> list[dict[str, Any]]:
        return self.state.eval_history

    @property
    def skipped_steps(self) -> int:
        return self.state.skipped_steps

    @skipped_steps.setter
    def skipped_steps(self, value: int) -> None:
        self.state.skipped_steps = value

    @property
    def optimizer(self):
        return self.backend.optimizer

    @property
    def scheduler(self):
        return self.backend.scheduler

    @property
    def params(self):
        return self.backend.params

    # ---- one GRPO step: rollout -> advantages -> update -> sync -> metrics -------------------------------
    def step(self) -> dict[str, Any]:
        """One GRPO step (one rollout) from the public phases, in the order they run; returns the step's
        metrics row (also handed to every hook as phase ``step``).

        1. :meth:`rollout`: ``rollout_batch_size`` prompts x G completions, scored (dynamic sampling may
           call it again for more groups);
        2. :meth:`advantages`: reference and old logprobs, shaped rewards, group-relative advantages over
           the global batch, the loss mask;
        3. :meth:`update`: the micro-batched, gradient-accumulated update (one or more optimizer steps);
        4. :meth:`sync`: hand the rollout engine the new weights (probe-checked);
        5. the metrics row of the global batch (rank 0 writes the logs).
        """
        t = time.time()
        row = self._step()
        for hook in self.hooks:
            hook("step", time.time() - t, row)
        return row

    def _step(self) -> dict[str, Any]:
        cfg, G = self.cfg, self.cfg.n_samples_per_prompt
        t_step = time.time()
        drawn: list[Scored] = []  # every generate call of this step (dynamic sampling may make several)
        waited = 0.0  # seconds the trainer blocked on a batch the producer had not finished (max_staleness > 0)

        def draw(n_prompts: int) -> Scored:
            nonlocal waited
            if drawn:  # dynamic sampling's refill: more prompts now (synchronous only: config.validate)
                drawn.append(self.rollout(n_prompts))
                return drawn[-1]
            t_wait = time.time()
            # no batch is permitted past this session's last step (stop_after_steps): none is generated untrained
            scored, waited = self.source.take(self.step_num + 1, n_prompts, last=self.session_end or cfg.num_steps)
            if self.source.threaded:  # the producer generated it: the rollout phase's observers see it here
                self.timeline.wait(t_wait, waited)
                for hook in self.hooks:
                    hook("rollout", waited, scored)
            drawn.append(scored)
            return scored

        first = draw(cfg.rollout_batch_size)  # 1
        batch = steps.dynamic_sampling(first, draw, group_size=G, mode=cfg.dynamic_sampling,
                                       max_rounds=cfg.dynamic_sampling_max_rounds)
        self._move_sampler([it[3] for it in batch.items], [d for it in batch.items for d in it[4]],
                           batch.rewards.tolist())
        adv = self.advantages(batch)  # 2
        versions = [drawn[0].version] * adv.rollout.num_rows  # the policy version each trained row was sampled by
        self.recorder.begin(self.step_num + 1)  # a recorded step: the weights the update starts from
        t = time.time()
        upd = self.update(adv)  # 3
        t_update = time.time() - t
        recorded = self.recorder.finish(self.step_num + 1, adv, upd, versions)  # records/step_N (record_batches)
        sync = self.sync()  # 4: the engine samples the new policy next step
        self.step_num += 1
        self.state.held_for_others = hold_for_other_ranks(self.engine, self.dist, self.source.threaded,
                                                          self.state.held_for_others)
        self.source.publish(self.step_num, getattr(self.engine, "adapter", None))  # batches started now sample it
        t_end = time.time()
        timing = {"generate": sum(s.generate_seconds for s in drawn), "reward": sum(s.reward_seconds for s in drawn),
                  "reference": adv.reference_seconds, "update": t_update, "sync": sync.seconds,
                  "wait_rollout": waited, "step": t_end - t_step}
        timing.update(self.timeline.busy_shares(t_step, t_end))
        # TRL's frac_reward_zero_std: groups of the first rollout whose G rewards are all equal (no signal)
        zero_std = float(constant_groups(first.rewards, G).float().mean())
        extra = {**adv.metrics, **batch.metrics, "frac_reward_zero_std": zero_std}
        if "seconds" in recorded:
            timing["record"] = recorded["seconds"]
        row = self._step_row(adv, upd, sync, timing, extra, versions, recorded)  # 5
        return row

    @phase("rollout")
    def rollout(self, n_prompts: int) -> Scored:
        """This rank's share of ``n_prompts`` prompts from the global order, generated and scored now (the
        synchronous rollout): one item per prompt, (rollout, group index, example, pool index, the G reward
        diagnostics), and the rewards."""
        return self.produce(self.sampler.next(n_prompts))

    @phase("rollout")
    def rollout_of(self, global_indices: list[int]) -> Scored:
        """The synchronous rollout of given prompts (pool indices of the global batch): a checkpoint's batch that an
        asynchronous attempt drew and did not train, resumed at max_staleness 0."""
        return self.produce(global_indices)

    def produce(self, global_indices: list[int], *, seed: int | None = None, adapter: str | None = None,
                version: int | None = None, batch: int | None = None) -> Scored:
        """Generate and score this rank's share of a batch whose pool indices (the global batch, in the sampler's
        order) are ``global_indices``, through the attempt's rollout source (``self.rollout_source``,
        rftlib.rollout.sources: generation and scoring are the source's; the rank's slice, the policy version and
        packing the groups are the trainer's). It touches only the engine, the tokenizer, the task and the training
        reward (never the trainer's module, optimizer or a collective), so a producer thread may run it while
        the trainer updates (rftlib.train.pipeline). ``seed`` / ``adapter``: the engine's base seed and the
        adapter (policy version) to sample from, given by a threaded producer (None: the engine's own, now);
        ``version``: the policy version that adapter holds (default: the trainer's now)."""
        cfg, G, D = self.cfg, self.cfg.n_samples_per_prompt, self.dist
        share = len(global_indices) // D.world_size
        indices = global_indices[D.rank * share:(D.rank + 1) * share]  # same global order on every rank
        examples = [self.task.train[i] for i in indices]
        version = self.step_num if version is None else version
        batch = self.step_num + 1 if batch is None else batch
        out = self.rollout_source(examples, engine=self.engine, tok=self.tok, system_prompt=self.task.system_prompt,
                                  reward=self.training_reward(), group_size=G, device=self.dist.device,
                                  sampling=Sampling(cfg.max_new_tokens, cfg.temperature, cfg.top_p, seed, adapter),
                                  spans=self.timeline.produce_spans(len(examples), batch=batch, version=version))
        ro, diags = out.rollout, out.diags
        items = [(ro, g, ex, idx, diags[g * G:(g + 1) * G]) for g, (ex, idx) in enumerate(zip(examples, indices))]
        return Scored(items, torch.tensor(out.rewards), generate_seconds=out.generate_seconds,
                      reward_seconds=out.reward_seconds, version=version)

    def training_reward(self) -> Reward:
        """The reward the rollouts are scored with: the attempt's composite (RunConfig.rewards), else the
        task's own as it is now (rftlib.validate swaps it for a control between steps)."""
        return self.reward if self.reward is not None else as_reward(self.task.reward)

    @phase("advantages")
    def advantages(self, batch: steps.Groups | steps.DynamicBatch) -> Advantaged:
        """The batch the update trains on, from scored groups (a :meth:`rollout`, or dynamic sampling's
        batch with its row mask): the kept groups as one rollout, reference and old logprobs (no grad),
        the rewards the advantages see (DAPO's overlong penalty, KL in the reward), the group-relative
        advantages over the global batch, and the loss mask."""
        cfg, G, D = self.cfg, self.cfg.n_samples_per_prompt, self.dist
        ro, examples, indices, diags = self._one_rollout(batch.items)
        t = time.time()
        ref_lp, old_lp = self.reference_and_old_logprobs(ro)  # (N, T) each, or None
        t_reference = time.time() - t
        shaped, shaping = steps.shape_rewards(
            cfg, batch.rewards, ro.lengths().cpu(),
            behaviour_logprobs=(old_lp if old_lp is not None else ro.behaviour_logprobs).cpu(),
            ref_logprobs=None if ref_lp is None else ref_lp.cpu(), completion_mask=ro.model_mask.cpu())
        advantages = self._global_advantages(shaped, G)  # (N,) host
        row_mask = getattr(batch, "row_mask", None)
        # the overlong penalty above counts every completion-side token (the trajectory's budget), KL in the reward
        # only the model's; the loss covers the tokens the model sampled (Rollout.model_mask)
        lmask = steps.loss_mask(cfg, ro.model_mask, ro.truncated,
                                None if cfg.dynamic_sampling == "off" or row_mask is None
                                else row_mask.to(D.device))  # (N, T)
        if cfg.filter_void_turns:  # SimpleTIR: trajectories with a void turn leave the loss
            keep = void_turn_row_mask(torch.tensor([float(d.get("void_turns", 0.0)) for d in diags]))  # (N,)
            lmask = lmask * keep.to(lmask.device).unsqueeze(-1)  # (N, T)
            shaping["void_filtered_frac"] = float(1.0 - keep.mean())
        return Advantaged(ro, examples, indices, batch.rewards.tolist(), diags, advantages, lmask, ref_lp, old_lp,
                          shaping, t_reference)

    def _one_rollout(self, items) -> tuple[Any, list, list[int], list[dict]]:
        """The kept groups as one Rollout (the first rollout as it came when nothing was dropped or added),
        with their examples, pool indices and per-row reward diagnostics."""
        if all(it[0] is items[0][0] for it in items) and [it[1] for it in items] == list(range(len(items))):
            ro = items[0][0]  # the first rollout as it came
        else:  # groups kept from several generate calls: one batch of the widest shapes
            ro = steps.gather_groups([(it[0], it[1]) for it in items], self.tok.pad_token_id)
        return ro, [it[2] for it in items], [it[3] for it in items], [d for it in items for d in it[4]]

    def _move_sampler(self, indices: list[int], diags: list[dict], rewards: list[float]) -> None:
        """A sampler that moves on the measured solve rate (a curriculum) sees every rank's results, so it
        moves the same way on every rank."""
        if not self.sampler.adaptive:
            return
        G = self.cfg.n_samples_per_prompt
        correct = [float(d.get("correctness", r)) for d, r in zip(diags, rewards)]
        parts = self.dist.gather_objects(([i for i in indices for _ in range(G)], correct))
        self.sampler.update([i for p in parts for i in p[0]], [c for p in parts for c in p[1]])

    def reference_and_old_logprobs(self, ro) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(reference logprobs, old logprobs), each (N, T) or None: the KL reference's (beta > 0) and the
        policy's before the update when it is not on-policy (several optimizer steps per rollout, or an
        engine that is not the trainer's module), in their own wider forwards, without dropout or grad."""
        ref_lp = old_lp = None
        self.backend.train(False)  # reference and old logprobs without dropout, or the ratio is noise
        if self.cfg.needs_reference:
            with self.ref.active() as ref_model:
                ref_lp = self.no_grad_logprobs(ro, None if ref_model is self.model else ref_model)  # (N, T)
        if not self.on_policy:
            old_lp = self.no_grad_logprobs(ro)  # (N, T)
        return ref_lp, old_lp

    @torch.no_grad()
    def no_grad_logprobs(self, ro, module=None) -> torch.Tensor:
        """(N, T) logprobs of every rollout row for the reference or old-logprob pass, in forwards of
        ``logprob_batch_size`` rows (auto: rftlib.train.update_parts.no_grad_batch_rows): no activations are kept for a
        backward, so these batch wider than the update's micro-batches (seed 003 trains at 1). Each
        forward is a ``forward`` phase. The backend's train/eval mode is the caller's."""
        N, T = ro.num_rows, ro.completion_ids.shape[1]
        k = no_grad_batch_rows(self.cfg, self.model, ro, amp=self.amp, chunk_rows=self.logprob_chunk_size,
                               vocab_size=self.vocab_size, device=self.dist.device)
        return torch.cat([full_width(self.forward(rows_of(ro, torch.arange(s, min(s + k, N))),
                                                  with_entropy=False, module=module).logprobs, T)
                          for s in range(0, N, k)])  # (N, T)

    def _global_advantages(self, shaped: torch.Tensor, G: int) -> torch.Tensor:
        """This rank's advantages, computed over the whole global batch: every rank's shaped rewards (whole
        groups each) gathered in rank order, the estimator run once, this rank's rows taken back. Group
        estimators would give the same per rank, but batch statistics (reinforce_pp_baseline's mean/std,
        scale_rewards: batch) over one rank's share differ from one process's. shaped: (N,) -> (N,)."""
        D = self.dist
        parts = D.gather_objects(shaped.tolist())  # float32 -> float -> float32 is exact
        every = torch.tensor([x for p in parts for x in p], dtype=shaped.dtype)  # (sum of N over ranks,)
        adv = compute_advantages(self.cfg.advantage_estimator, every, G, self.cfg.adv_eps,
                                 scale_rewards=self.cfg.scale_rewards)
        start = sum(len(p) for p in parts[:D.rank])
        return adv[start:start + shaped.shape[0]]  # (N,)

    @phase("update")
    def update(self, batch: Advantaged) -> UpdateResult:
        """The micro-batched, gradient-accumulated update of ``batch`` (an :meth:`advantages` result; replace
        its loss_mask to train on another); returns what the metrics need.

        Each rank holds 1/W of every optimizer batch. The loss of a micro-batch is normalised by the
        optimizer batch's *global* totals (sequences, valid tokens, the Dr-GRPO constant), so the
        micro-batch losses of all ranks sum to the one-process loss; it is back-propagated times W
        because DDP and DeepSpeed average gradients over ranks. The loss mask (N, T) is the completion
        mask less truncated completions or masked groups, when configured.
        """
        cfg, G, D = self.cfg, self.cfg.n_samples_per_prompt, self.dist
        ro, lmask = batch.rollout, batch.loss_mask
        advantages = batch.advantages.to(D.device)  # (N,)
        N, W = ro.num_rows, D.world_size
        tb_rows = cfg.train_prompts * G // W  # this rank's rows of one optimizer batch
        mb = cfg.micro_batch_size
        loss_kw = steps.loss_kwargs(cfg)  # the policy loss, its own clip range, KL, aggregation, entropy
        norm_const = cfg.loss_norm_const if cfg.loss_norm_const is not None else float(cfg.max_new_tokens)
        out = UpdateResult(clip=(loss_kw["clip_low"], loss_kw["clip_high"]))
        skip = self.skips_rows()
        gen = torch.Generator().manual_seed(cfg.seed * 7919 + self.step_num * 104729 + D.rank)
        trace = self.trace  # a recorded step's (rftlib.train.record): what each micro-batch and optimizer step did
        self.backend.train(True)
        for epoch in range(cfg.num_updates_per_rollout):
            # later passes (and several optimizer batches) see the rows in a fresh order, whole groups kept
            order = torch.arange(N)
            if cfg.num_updates_per_rollout > 1 or tb_rows < N:
                order = (torch.randperm(N // G, generator=gen).unsqueeze(1) * G + torch.arange(G)).reshape(-1)
            for b0 in range(0, N, tb_rows):
                rows_b = order[b0:b0 + tb_rows]
                num_seqs, num_tokens = steps.loss_totals(cfg, lmask[rows_b], D.all_sum)  # global rows, tokens
                totals = dict(num_seqs=num_seqs, num_tokens=num_tokens, norm_const=norm_const)
                probe = (NoiseScaleProbe(self.params, len(rows_b), mb)
                         if cfg.gns_probe and len(rows_b) > mb and self.backend.micro_step_grads else None)
                seq_lr = []
                micro = self.micro_batches(ro, rows_b, advantages, lmask, skip)
                out.rows_seen += len(rows_b)
                out.rows_run += sum(len(ix) for ix in micro)
                if not micro:  # nothing to learn from: zero gradients, so the optimizer steps as it would have
                    self.zero_backward()

                def after(ix, fwd, loss, m, old, epoch=epoch, seq_lr=seq_lr, probe=probe):  # what the row reports
                    logp, ent = fwd.logprobs, fwd.entropy  # (n, T')
                    t1 = logp.shape[1]  # this micro-batch's own completion width
                    mask = ro.model_mask[ix, :t1]  # (n, T') the tokens the model sampled: ESS, entropy, gap, tokens
                    if trace is not None:
                        trace.micro_batch(epoch=epoch, rows=ix, loss=float(loss.detach()), logprobs=logp, entropy=ent,
                                          tokens=float(mask.sum()), metrics=m)
                    seq_lr.append(sequence_log_ratio(logp, old, mask))  # (n,)
                    if probe is not None:
                        probe.after_backward(len(ix))
                    if epoch == 0:
                        entropy, behaviour_diff = token_diagnostics(logp, ent, ro.behaviour_logprobs[ix, :t1], mask)
                        out.entropy.append(entropy)
                        out.behaviour_diff.append(behaviour_diff)
                    out.tokens.append(float(mask.sum()))
                    out.micro_metrics.append({k: float(v) for k, v in m.items()})

                loss_total = self.backward_batch(batch, advantages, micro, epoch=epoch, totals=totals, loss_kw=loss_kw,
                                                 after=after)
                if probe is not None and (gns := probe.result()) is not None:
                    out.gns.append(gns)
                out.seq_log_ratio.append(torch.cat(seq_lr) if seq_lr else torch.zeros(0))
                loss_global = float(D.all_sum(torch.tensor([loss_total], device=D.device))[0])
                out.lr.append(self.backend.lr())
                if trace is not None:
                    trace.before_step(self, batch, advantages, epoch=epoch, rows=rows_b, micro=micro, totals=totals,
                                      loss_kw=loss_kw, loss=loss_global)
                grad_norm, stepped = self.backend.step(math.isfinite(loss_global))
                if trace is not None:
                    trace.optimizer_step(grad_norm=grad_norm, stepped=stepped, lr=out.lr[-1])
                if not stepped:
                    # a non-finite loss would poison the weights and every later checkpoint: skip the step
                    self.skipped_steps += 1
                    warnings.warn(f"step {self.step_num + 1}: non-finite loss ({loss_global}) or grad_norm "
                                  f"({grad_norm}); optimizer step skipped, weights unchanged "
                                  f"(total skipped: {self.skipped_steps})")
                out.grad_norm.append(grad_norm)
                out.loss.append(loss_global)
        return out

    def backward_batch(self, batch: Advantaged, advantages: torch.Tensor, micro: list[torch.Tensor], *, epoch: int,
                       totals: dict[str, Any], loss_kw: dict[str, Any], after=None) -> float:
        """The forwards and backwards of one optimizer batch's micro-batches ``micro`` (row indices): each
        :meth:`micro_loss` is back-propagated times W (DDP and DeepSpeed average over ranks) inside the backend's
        accumulation context, which all-reduces on the last. ``after(ix, fwd, loss, metrics, old)`` sees each
        micro-batch once its backward ran. Returns this rank's sum of the micro-batch losses (float, in order)."""
        W = self.dist.world_size
        loss_total = 0.0
        for j, ix in enumerate(micro):
            with self.backend.accumulate(last=j == len(micro) - 1):
                fwd, loss, m, old = self.micro_loss(batch, advantages, ix, epoch=epoch, totals=totals, loss_kw=loss_kw)
                self.backend.backward(loss * W)
            loss_total += float(loss.detach())
            if after is not None:
                after(ix, fwd, loss, m, old)
        return loss_total

    def micro_loss(self, batch: Advantaged, advantages: torch.Tensor, ix: torch.Tensor, *, epoch: int,
                   totals: dict[str, Any], loss_kw: dict[str, Any]):
        """One micro-batch's forward and loss, as the update runs it: the rows ``ix`` of ``batch`` trimmed to their
        own widths, the policy's logprobs (and entropy on the first pass, or with an entropy bonus), the old
        logprobs (the forward's own, detached, when on-policy), truncated IS weights for an engine that is not the
        trainer's module, and the policy loss normalised by the optimizer batch's global ``totals`` (num_seqs,
        num_tokens, norm_const). ``advantages``: (N,) on the device. Returns (Forward, loss, its metrics,
        old logprobs (n, T')). ``rft replay`` calls it with another ``loss_kw`` for a counterfactual."""
        cfg, ro = self.cfg, batch.rollout
        bonus = cfg.entropy_coef != 0
        fwd = self.forward(rows_of(ro, ix), with_entropy=epoch == 0 or bonus, entropy_grad=bonus)
        logp, ent = fwd.logprobs, fwd.entropy  # (n, T')
        t1 = logp.shape[1]  # this micro-batch's own completion width
        mask = ro.model_mask[ix, :t1]  # (n, T') TIS over the sampled tokens (environment tokens have no behaviour logprob)
        old = logp.detach() if batch.old_logprobs is None else batch.old_logprobs[ix, :t1]
        is_w = tis = None
        if not self.engine.shares_trainer_module:  # the engine's own numerics sampled the rows
            is_w, tis = truncated_is(old, ro.behaviour_logprobs[ix, :t1], mask, cap=cfg.tis_cap, level=cfg.tis_level)
        ref = batch.ref_logprobs
        loss, m = grpo_loss(logp, old, advantages[ix], batch.loss_mask[ix, :t1],
                            ref_logprobs=None if ref is None else ref[ix, :t1], entropy=ent, is_weights=is_w,
                            **totals, **loss_kw)
        if tis is not None:
            m.update(tis)
        return fwd, loss, m, old

    def zero_backward(self) -> None:
        """Give every trainable parameter a zero gradient through the backend's own backward, for an optimizer
        batch whose rows all drop out (every advantage 0: seed 002's FizzBuzz once every group scores 1.0).

        Zero-filling ``p.grad`` directly left the backend's loss scaling out: a float16 GradScaler had never
        scaled a loss, so its ``unscale_`` raised ("_scale is None") and the run died at its first all-solved
        batch. A zero loss through ``backend.backward`` is the path every batch takes, so the scaler (and any
        backend that counts backwards) sees an ordinary step whose gradient is exactly 0."""
        zero = sum(p.sum() for p in self.params) * 0.0  # () on the parameters' device; d/dp = 0 for every p
        with self.backend.accumulate(last=True):
            self.backend.backward(zero)

    def micro_batches(self, ro, batch: torch.Tensor, advantages: torch.Tensor, lmask: torch.Tensor,
                      skip: bool) -> list[torch.Tensor]:
        """The micro-batches (row indices) one optimizer batch ``batch`` is run as.

        With ``skip``, rows whose advantage is exactly 0 or whose loss mask is empty are left out:
        every policy loss is A times something per token (0 for A = 0) and the aggregation selects
        masked tokens out, so such a row's loss and gradient are exactly 0 -- the normalisers
        (computed by the caller over the whole ``batch``) still count it. With
        cfg.sort_micro_batches_by_length the rows are ordered by prompt + completion length first,
        so each micro-batch (trimmed to its own longest row by ``rows_of``) carries less padding."""
        cfg, mb = self.cfg, self.cfg.micro_batch_size
        rows = batch
        if skip:
            live = (advantages[batch] != 0) & (lmask[batch].sum(-1) > 0)  # (b,) bool
            rows = batch[live.cpu()]
        if cfg.sort_micro_batches_by_length and not cfg.gns_probe and len(rows) > mb:  # GNS wants random micro-batches
            length = (ro.prompt_mask[rows].sum(-1) + ro.completion_mask[rows].sum(-1)).cpu()  # (b,)
            rows = rows[torch.sort(length, stable=True).indices]
        return [rows[m0:m0 + mb] for m0 in range(0, len(rows), mb)]

    def skips_rows(self) -> bool:
        """Whether the update may leave out rows that add nothing to the gradient: no loss term may read
        a row beyond its advantage (a KL in the loss, an entropy bonus), the GNS probe's per-micro-batch
        gradients assume full micro-batches, DDP needs every rank to run the same micro-batches, and a
        backend that counts micro-steps itself (DeepSpeed, even on one rank) needs all of them."""
        cfg = self.cfg
        return (cfg.skip_zero_advantage_rows and steps.loss_kwargs(cfg)["beta"] == 0 and cfg.entropy_coef == 0
                and not cfg.gns_probe and self.dist.world_size == 1 and not self.backend.fixed_micro_steps)

    @phase("sync")
    def sync(self, verify: bool = False) -> SyncResult:
        """Hand the engine the current weights: every rank gathers the adapter (a collective under ZeRO-3),
        the rank that owns the engine loads it (rank 0 for engines all ranks share), every rank probes."""
        eng, D = self.engine, self.dist
        if eng.shares_trainer_module:
            return SyncResult.of(eng.sync_weights(self.model))
        state = self.backend.adapter_state() if is_peft(self.model) else None
        return SyncResult.of(eng.sync_weights(self.model, state, push=D.is_main or not eng.shared_across_ranks,
                                              barrier=D.barrier if D.distributed else None, verify=verify))

    def _step_row(self, adv: Advantaged, upd: UpdateResult, sync: SyncResult, timing: dict[str, float],
                  extra: dict[str, float], versions: list[int], recorded: dict | None = None) -> dict[str, Any]:
        """The step's metrics row from every rank's rollout and update accumulators (the global batch's
        metrics); rank 0 writes the spike log and the samples. Keeps the first group for the live view."""
        D, G, ro = self.dist, self.cfg.n_samples_per_prompt, adv.rollout
        local = {"rewards": adv.rewards, "diags": adv.diags, "extra": [extra], "advantages": adv.advantages.tolist(),
                 "lengths": ro.model_lengths().cpu().tolist(), "truncated": ro.truncated.cpu().tolist(),
                 "trajectory_lengths": ro.lengths().cpu().tolist(),
                 "texts": ro.texts, "examples": [(e.prompt, e.answer) for e in adv.examples],
                 "tok": upd.tokens, "metrics": upd.micro_metrics, "entropy": upd.entropy,
                 "behaviour_diff": upd.behaviour_diff, "seq_log_ratio": upd.seq_log_ratio, "gns": upd.gns,
                 "versions": versions, "indices": adv.indices}
        # a multi-turn batch's transcripts (model and environment runs) for the samples file, decoded only on the
        # steps that write it (every save_steps); single-turn, or another step: None each
        dumps = bool(self.cfg.save_steps) and self.step_num % self.cfg.save_steps == 0
        local["transcripts"] = (transcript_spans(self.tok, ro.completion_ids, ro.completion_mask, ro.model_mask,
                                                 getattr(self.engine, "stop_ids", ()))
                                if dumps and ro.model_mask is not ro.completion_mask
                                and not torch.equal(ro.model_mask, ro.completion_mask) else [None] * ro.num_rows)
        parts = D.gather_objects(local)
        allr = {k: [x for p in parts for x in p[k]] for k in local}
        row = step_metrics(allr, upd, timing, step=self.step_num, world_size=D.world_size,
                           skipped_steps=self.skipped_steps)
        # how far behind the trainer the trained rows were sampled (issue 32; every row at lag 0 when synchronous)
        row.update(staleness_metrics(allr["versions"], self.step_num, self.cfg.max_staleness))
        # what the step delivered per second of its wall time (the number the overlap of max_staleness > 0 moves)
        row["throughput/samples_per_s"] = len(allr["rewards"]) / max(timing["step"], 1e-9)
        row["throughput/tokens_per_s"] = float(sum(allr["trajectory_lengths"])) / max(timing["step"], 1e-9)
        for k in (allr["extra"][0] if allr["extra"] else {}):  # per-rank step metrics: the mean over ranks
            row[k] = float(np.mean([e[k] for e in allr["extra"]]))
        row.update(self.sampler.metrics())
        row.update(step_memory(D.device))
        if not self.engine.shares_trainer_module:
            row.update({"sync/bytes": float(sync.bytes), "sync/probe_max_diff": sync.probe_max_diff,
                        "sync/probe_baseline": sync.probe_baseline, "sync/probe_threshold": sync.probe_threshold,
                        "sync/probe_noise": sync.probe_noise})
        if self.memory_estimate is not None:
            row["memory/preflight_gib"] = self.memory_estimate
        self._group = first_group(allr, G)
        self.timeline.flush()
        if D.is_main:
            write_step_logs(self.logger, self.cfg, self.step_num, row, allr, record=(recorded or {}).get("path"))
            log_trained(self.run_dir, self.step_num, allr["indices"], allr["versions"])
        return row

    # ---- the policy's logprobs over some rows -----------------------------------------------------------
    # one per micro-batch inside the update: a synchronize each would stall CUDA's launch queue between forward
    # and backward, and no timeline interval is drawn from it (on CUDA its seconds are the launch's)
    @phase("forward", synchronize=False)
    def forward(self, rows: dict[str, torch.Tensor], *, with_entropy: bool, entropy_grad: bool = False,
                module=None) -> Forward:
        """(n, T') logprobs and entropies of ``rows`` (a rollout's rows, trimmed: rftlib.train.update_parts.rows_of)
        through the backend's wrapped policy, or through ``module`` (a frozen reference)."""
        mode = self.cfg.logprob_recompute
        recompute = mode == "always" or (mode == "auto" and recompute_needed(
            rows["completion_ids"].numel(), self.vocab_size, self.logprob_chunk_size))
        kw = dict(temperature=self.cfg.temperature, chunk_size=self.logprob_chunk_size,
                  with_entropy=with_entropy, entropy_grad=entropy_grad, checkpoint_chunks=recompute)
        with self._autocast():
            if module is not None:
                logp, ent = completion_logprobs(module, **rows, **kw)
            else:
                logp, ent = self.backend.forward(**rows, **kw)
        return Forward(rows, logp, ent, torch.is_grad_enabled())

    def _autocast(self):
        if self.amp is None:
            return contextlib.nullcontext()
        return torch.autocast(self.dist.device.type, dtype=self.amp)

    def close(self, error: BaseException | None = None) -> None:
        """Release the engine, logger (its trackers) and backend, then the attempt's lock. Called from a ``finally``
        while an exception propagates (a crash, a KeyboardInterrupt), that exception is the ``error`` unless one is
        given: the trackers then mark the run failed instead of finished."""
        error = error if error is not None else sys.exc_info()[1]
        try:
            source = getattr(self, "source", None)
            if source is not None:  # the producer stops before the engine it samples from
                source.close()
            self.engine.close()
            if self.logger is not None:
                self.logger.close(error)
            self.backend.close()
        finally:
            self._unlock()

    # ---- evaluation -------------------------------------------------------------------------------------
    @phase("eval")
    def evaluate(self) -> EvalResult:
        """greedy_pass@1 (or the probe's sampling mode) on every eval probe, sharded over ranks (the same
        number as one process gives); results in eval/step_N[_probe].json and the history."""
        engine = self.timeline.eval_engine(self.engine) if self.timeline is not None else self.engine
        row = evaluate_probes(self.cfg, engine, self.tok, self.task, self.dist, self.run_dir, self.step_num,
                              self.eval_precision)
        self.eval_history.append(row)
        return EvalResult(self.step_num, row)

    # ---- checkpoints and resume (rftlib.train.checkpoint) -------------------------------------------------
    def save(self) -> Path:
        """Checkpoint this step: the backend's weights and optimizer, the peft adapter, RNG, sampler, evals."""
        with self.timeline.save_span() if self.timeline is not None else contextlib.nullcontext():
            return ckpt.save_trainer(self)

    def _unlock(self) -> None:
        if self._lock is not None:
            self._lock.close()  # the kernel drops the flock with the file
            self._lock = None


def resume_config(run_dir: str | Path, **overrides: Any) -> RunConfig:
    """The saved config of an attempt, with overrides (e.g. num_steps for more steps, seed 001's
    ``--from-step latest --additional-steps k``). Extending num_steps stretches the rest of the LR
    schedule over the new total."""
    saved = read_attempt(run_dir)["config"]
    saved.update(overrides)
    return make_config(None, saved)


def lr_schedule_preview(cfg: RunConfig) -> list[float]:
    """LR of each optimizer step of this config (what the scheduler will do)."""
    total, w = cfg.total_optimizer_steps, cfg.warmup_steps
    return [lr_at(s, total_steps=total, warmup_steps=w, lr=cfg.lr, min_lr_ratio=cfg.min_lr_ratio) for s in range(total)]
