"""The GRPO trainer: rollout -> reward -> advantages -> micro-batched update -> log/eval/checkpoint.

It only orchestrates: the math is in rftlib.algo (looked up by name, never branched on), the
model plumbing in rftlib.models, generation behind the rollout engine interface. One call of
:meth:`Trainer.step` is one rollout; it makes ``num_updates_per_rollout x B / train_batch_size``
optimizer steps. When that is exactly one, the update is on-policy: the old logprobs *are* the
current ones (detached), so no extra forward is spent on them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import random
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from rftlib.algo.advantages import compute_advantages
from rftlib.algo.diagnostics import simple_noise_scale
from rftlib.algo.filtering import constant_groups
from rftlib.algo.correction import tis_weights
from rftlib.algo.losses import grpo_loss
from rftlib.algo.logprobs import auto_chunk_size, recompute_needed
from rftlib.attempts import STOP_FILE, AttemptLockedError, create_attempt, lock_attempt, read_attempt, write_json
from rftlib.config import ConfigError, RunConfig, make_config
from rftlib.data.tasks import build_task
from rftlib.eval import check_precision, eval_precision, evaluate, format_prompts, greedy_eval
from rftlib.models.loading import (Reference, apply_lora, causal_lm, compute_dtype, is_peft, load_adapter_weights,
                                   load_model_and_tokenizer)
from rftlib.monitor.metrics import MetricsLogger
from rftlib.rollout.factory import make_engine
from rftlib.rollout.hf import HFEngine
from rftlib.train import checkpoint as ckpt
from rftlib.train import steps
from rftlib.train.backends import make_backend
from rftlib.train.dist import Dist, init_dist, resolve_dtype
from rftlib.train.forward import completion_logprobs
from rftlib.train.memory import preflight_gib, step_memory
from rftlib.train.sampler import PromptSampler
from rftlib.train.schedule import lr_at, warmup_steps_for
from rftlib.train.step_metrics import step_metrics

EVAL_KEY = "eval/heldout/greedy_pass@1"


def _read_rows(path: Path) -> list[dict[str, Any]]:
    from rftlib.monitor.metrics import read_metrics

    return read_metrics(path.parent.parent)


class Trainer:
    """One attempt's training state. Build it, then :meth:`train` (or :meth:`step` by hand).

    The trainer is handed its parts -- the rank/device (``dist``), the task, the rollout engine --
    or builds the defaults from the config; the training backend (single | ddp | deepspeed) comes
    from rftlib.train.backends. Under torchrun every rank runs this same object on its share of
    each rollout's prompts; rank 0 alone writes files.
    """

    def __init__(self, cfg: RunConfig, run_dir: str | Path | None = None, *, resume: bool = False,
                 progress: bool = True, callbacks: list[Callable[[dict], None]] | None = None,
                 reward_override: Callable | None = None, dist: Dist | None = None, task=None, engine=None):
        self.dist = D = dist or init_dist(cfg)
        self.cfg = cfg = dataclasses.replace(cfg, dtype=resolve_dtype(cfg.dtype, D.device))
        self.progress = progress
        self.callbacks = list(callbacks or [])
        self._check_world(cfg, D.world_size)
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)  # the same LoRA init on every rank
        if run_dir is None:
            run_dir = D.broadcast_object(str(create_attempt(cfg)) if D.is_main else None)
        self.run_dir = Path(run_dir)
        self._lock = self._lock_attempt()
        try:
            self._build(resume, reward_override, task, engine)
        except BaseException:  # a kernel that lives on (a notebook) must not keep the attempt locked
            self._unlock()
            raise

    def _lock_attempt(self):
        """Rank 0 holds the attempt's lock (rftlib.attempts.lock_attempt) for this trainer's life. An
        attempt another live trainer holds is refused on every rank, each told by rank 0 (none hangs)."""
        lock, refused = None, None
        if self.dist.is_main:
            try:
                lock = lock_attempt(self.run_dir)
            except AttemptLockedError as e:
                refused = (e.pid, e.host)
        refused = self.dist.broadcast_object(refused)
        if refused is not None:
            raise AttemptLockedError(self.run_dir, *refused)
        return lock

    def _unlock(self) -> None:
        if self._lock is not None:
            self._lock.close()  # the kernel drops the flock with the file
            self._lock = None

    def _build(self, resume: bool, reward_override: Callable | None, task, engine) -> None:
        """Everything else a trainer holds: the task, the model and its backend, the engine, the sampler,
        the logger; then the checkpoint when resuming."""
        cfg, D = self.cfg, self.dist
        self.task = task or build_task(cfg.task, eval_size=cfg.eval_size, **cfg.task_args)
        if reward_override is not None:  # tests inject faults through this
            self.task.reward = reward_override
        t = time.time()
        model, self.tok = load_model_and_tokenizer(cfg.model, cfg.dtype)
        if cfg.gradient_checkpointing:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": cfg.gradient_checkpointing_use_reentrant})
        model.to(D.device)
        self.model = apply_lora(model, rank=cfg.lora_rank, alpha=cfg.lora_alpha, dropout=cfg.lora_dropout,
                                target_modules=cfg.lora_target_modules)
        if cfg.init_adapter:
            load_adapter_weights(self.model, cfg.init_adapter)
        self.load_seconds = time.time() - t
        # LM-head chunk rows: the configured count, or sized from the vocabulary (config.vocab_size: the
        # output embedding's weight is an empty shard under ZeRO-3)
        self.vocab_size = causal_lm(self.model).config.vocab_size
        self.logprob_chunk_size = cfg.logprob_chunk_size or auto_chunk_size(self.vocab_size)
        self.ref = Reference(self.model, needed=cfg.beta > 0)
        self.opt_steps_per_rollout = cfg.optimizer_steps_per_rollout
        self.on_policy = self.opt_steps_per_rollout == 1
        self.total_opt_steps = cfg.num_steps * self.opt_steps_per_rollout
        self.warmup_steps = warmup_steps_for(self.total_opt_steps, cfg.warmup_ratio)
        self.backend = make_backend(cfg, D, self.model, total_opt_steps=self.total_opt_steps,
                                    warmup_steps=self.warmup_steps)
        # forward passes in the weights' half dtype (trainable masters are float32), else bf16 autocast where the
        # hardware has native bf16 (auto)
        self.amp = compute_dtype(cfg.dtype, cfg.autocast)
        if engine is None and cfg.rollout_engine == "hf":
            # ZeRO-3: gather the whole model once per rollout where it fits (zero3_gather_for_generation)
            gather, self.generation_gather = getattr(self.backend, "generation_gather", lambda: (None, ""))()
            if D.is_main and self.generation_gather:
                print(f"[rft] HF generate under ZeRO-3: {self.generation_gather}", flush=True)
            engine = HFEngine(self.model, self.tok, amp=self.amp, gather=gather,
                              synced_gpus=cfg.backend == "deepspeed" and cfg.zero_stage == 3 and D.distributed)
        self.engine = engine or make_engine(cfg, self.model, self.tok, self.run_dir, sync=False)
        # an engine that is not the trainer's module samples from its own numerics: the old logprobs
        # come from the trainer, and truncated IS weights correct the loss for the mismatch
        self.on_policy = self.on_policy and self.engine.shares_trainer_module
        # every eval in one declared precision (rftlib.eval), checked now: an engine that cannot switch refuses
        self.eval_precision = eval_precision(cfg.eval_dtype, cfg.dtype)
        check_precision(self.engine, self.eval_precision)
        if cfg.prompt_max_len:
            self._fit_prompts(cfg.prompt_max_len)
        make = getattr(self.task, "make_sampler", None)  # curriculum / weighted mixing tasks bring their own
        self.sampler = make(cfg.seed) if make else PromptSampler(len(self.task.train), cfg.seed)
        if D.rank:  # ranks sample their own completions: distinct streams (rank 0 keeps the single-process one)
            torch.manual_seed(cfg.seed + 1_000_003 * D.rank)
        self.step_num = 0
        self.eval_history: list[dict[str, Any]] = []
        self.skipped_steps = 0
        self.logger = MetricsLogger(self.run_dir) if D.is_main else None
        self.memory_estimate = None
        if D.device.type == "cuda":
            self.memory_estimate = preflight_gib(cfg, causal_lm(self.model).config, D.world_size, prompt_len=256,
                                                chunk_rows=self.logprob_chunk_size)
        if resume:
            self._resume()
        if not self.engine.shares_trainer_module:  # once the weights are final: a resume restored the adapter
            self.engine.initial_sync = sync = self._sync_engine(verify=True)
            if D.is_main:
                print(f"[rft] engine synced at step {self.step_num}{' (resumed)' if resume else ''}: probe gap "
                      f"{sync['probe_max_diff']:.3g} (the baseline later syncs are judged by)", flush=True)

    def _fit_prompts(self, max_len: int) -> None:
        """Drop training prompts longer than prompt_max_len tokens, chat template included (OpenRLHF's
        --prompt_max_len filter), saying how many; a pool left empty is an error."""
        prompts = format_prompts(self.tok, self.task.train, self.task.system_prompt)
        lengths = [len(ids) for ids in self.tok(prompts, add_special_tokens=False)["input_ids"]]
        keep = [e for e, n in zip(self.task.train, lengths) if n <= max_len]
        if not keep:
            raise ConfigError(f"prompt_max_len={max_len}: every training prompt is longer (shortest "
                              f"{min(lengths)} tokens with the chat template); raise it")
        if len(keep) < len(self.task.train) and self.dist.is_main:
            warnings.warn(f"prompt_max_len={max_len}: dropped {len(self.task.train) - len(keep)} of "
                          f"{len(self.task.train)} training prompts longer than that (longest {max(lengths)} tokens)")
        self.task.train = keep

    @staticmethod
    def _check_world(cfg: RunConfig, world: int) -> None:
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

    # the optimizer state lives in the backend (DeepSpeed partitions it)
    @property
    def optimizer(self):
        return self.backend.optimizer

    @property
    def scheduler(self):
        return self.backend.scheduler

    @property
    def params(self):
        return self.backend.params

    # ---- checkpointing ----------------------------------------------------------------------
    def _trainer_state(self) -> dict[str, Any]:
        return {"step": self.step_num, "sampler": self.sampler.state(), "eval_history": self.eval_history,
                "skipped_steps": self.skipped_steps, "num_steps": self.cfg.num_steps,
                "world_size": self.dist.world_size, "backend": self.cfg.backend}

    def save(self) -> Path:
        def write(tmp: Path) -> None:
            self.backend.save(tmp)
            if is_peft(self.model):  # a peft adapter directory others can load
                state = self.backend.adapter_state()  # gathered under ZeRO-3 (every rank takes part)
                if self.dist.is_main:
                    self.model.save_pretrained(tmp / "adapter", **({"state_dict": state} if state else {}))

        return ckpt.save_step(self.run_dir, self.step_num, dist=self.dist, write=write,
                              trainer_state=self._trainer_state(), max_keep=self.cfg.max_ckpt_num)

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

    def _sync_engine(self, verify: bool = False) -> dict:
        """Hand the engine the current weights: every rank gathers the adapter (a collective under ZeRO-3),
        the rank that owns the engine loads it (rank 0 for engines all ranks share), every rank probes."""
        eng, D = self.engine, self.dist
        if eng.shares_trainer_module:
            return eng.sync_weights(self.model)
        state = self.backend.adapter_state() if is_peft(self.model) else None
        return eng.sync_weights(self.model, state, push=D.is_main or not eng.shared_across_ranks,
                                barrier=D.barrier if D.distributed else None, verify=verify)

    def _resume(self) -> None:
        d = ckpt.latest_dir(self.run_dir)
        ts = json.loads((d / "trainer_state.json").read_text())
        saved_world, saved_backend = ts.get("world_size", 1), ts.get("backend", "single")
        if saved_world != self.dist.world_size or (saved_backend == "deepspeed") != (self.cfg.backend == "deepspeed"):
            raise RuntimeError(
                f"{d} was saved by {saved_world} rank(s) with backend {saved_backend}; resuming with "
                f"{self.dist.world_size} rank(s) and backend {self.cfg.backend} would not continue the same run "
                f"(per-rank sampling streams{' and ZeRO partitions' if 'deepspeed' in (saved_backend, self.cfg.backend) else ''}"
                f" differ). Resume with {saved_world} rank(s), or start a new attempt from its weights with "
                f"init_adapter={d / 'adapter'}")
        self.backend.load(d)
        # the saved state carries the old lr/betas/weight decay: the resumed config's values win, and
        # the LR continues on this config's schedule from the saved step
        self.scheduler.base_lrs = [self.cfg.lr] * len(self.optimizer.param_groups)
        for g in self.optimizer.param_groups:
            g.update(initial_lr=self.cfg.lr, betas=(self.cfg.adam_beta1, self.cfg.adam_beta2),
                     weight_decay=self.cfg.weight_decay)
            g["lr"] = self.cfg.lr * self.scheduler.lr_lambdas[0](self.scheduler.last_epoch)
        ckpt.set_rng_state(ckpt.load_rng(d, self.dist.rank))
        self.step_num = ts["step"]
        self.sampler.load_state(ts["sampler"])
        self.eval_history = ts["eval_history"]
        self.skipped_steps = ts.get("skipped_steps", 0)
        if self.logger is not None:
            # metrics lines past the checkpoint (a crash after the save) would be duplicated: drop them
            lines = self.logger.path.read_text().splitlines()
            keep = [json.dumps(r) for r in _read_rows(self.logger.path) if r.get("step", 0) <= self.step_num]
            if len(keep) != len(lines):
                self.logger._f.close()
                self.logger.path.write_text("".join(ln + "\n" for ln in keep))
                self.logger._f = open(self.logger.path, "a", buffering=1)

    # ---- evaluation -------------------------------------------------------------------------
    def evaluate(self) -> dict[str, Any]:
        """greedy_pass@1 on every eval probe, sharded over ranks (the same number as one process
        gives); results in eval/step_N[_probe].json and the history."""
        D = self.dist
        t0 = time.time()
        summary: dict[str, Any] = {"step": self.step_num}
        if D.is_main:
            (self.run_dir / "eval").mkdir(exist_ok=True)
        for probe in self.cfg.eval_probes:
            exs = self.task.eval_set(probe)
            mine = exs[D.rank::D.world_size]
            n_mine = len(mine)
            per_rank = -(-len(exs) // D.world_size)
            mine = mine + [exs[0]] * (per_rank - n_mine)  # equal generate calls on every rank (ZeRO-3 needs them)
            n = self.cfg.eval_n_samples.get(probe, 1)
            temp = self.cfg.eval_temperature.get(probe, 0.0)
            if n > 1 or temp > 0:  # seed 003 section 9: e.g. AIME at 0.6 with 8 samples, sampling_pass@8
                mode = f"sampling_pass@{n}" if temp > 0 else f"nondet_proxy_pass@{n}"
                res = evaluate(self.engine, self.tok, self.task, exs, mode=mode, n=n, temperature=temp,
                               max_new_tokens=self.cfg.max_new_tokens, batch_size=self.cfg.eval_batch_size,
                               dataset=probe, precision=self.eval_precision)
                if D.is_main:
                    write_json(self.run_dir / "eval" / f"step_{self.step_num}_{probe}.json", res)
                summary[f"eval/{probe}/{res['mode']}"] = res[res["mode"]]
                summary[f"eval/{probe}/pass@1"] = res["pass@1"]
                continue
            res = greedy_eval(self.engine, self.tok, self.task, mine, max_new_tokens=self.cfg.max_new_tokens,
                              batch_size=self.cfg.eval_batch_size, dataset=probe, precision=self.eval_precision)
            if D.distributed:
                parts = D.gather_objects(res["results"][:n_mine])
                merged = [parts[k % D.world_size][k // D.world_size] for k in range(len(exs))]
                n = max(len(merged), 1)
                res.update(results=merged, n_problems=len(merged),
                           **{"greedy_pass@1": sum(r["correct"] for r in merged) / n,
                              "mean_length": sum(r["length"] for r in merged) / n})
            if D.is_main:
                suffix = "" if probe == "heldout" else f"_{probe}"
                write_json(self.run_dir / "eval" / f"step_{self.step_num}{suffix}.json", res)
            summary[f"eval/{probe}/greedy_pass@1"] = res["greedy_pass@1"]
            summary[f"eval/{probe}/mean_length"] = res["mean_length"]
        summary["timing/eval"] = time.time() - t0  # rft stop sizes its wait from this and timing/step
        self.eval_history.append(summary)
        return summary

    def early_stop_reason(self) -> str | None:
        """Why to stop now (the probe dropped at ``patience`` consecutive evals), else None."""
        cfg = self.cfg
        if cfg.early_stop_probe is None:
            return None
        key = f"eval/{cfg.early_stop_probe}/greedy_pass@1"
        vals = [e[key] for e in self.eval_history if key in e]
        k = cfg.early_stop_patience
        if len(vals) > k and all(vals[-i] < vals[-i - 1] for i in range(1, k + 1)):
            trail = " -> ".join(f"{v:.3f}" for v in vals[-k - 1:])
            return f"{key} dropped at {k} consecutive evals ({trail})"
        return None

    # ---- one rollout step -------------------------------------------------------------------
    def _rows(self, ro, idx: torch.Tensor) -> dict[str, torch.Tensor]:
        """The rows ``idx`` of a rollout, trimmed to their own longest prompt and completion: a
        micro-batch pays for its own padding, not the rollout's (prompts are left-padded, so leading
        all-pad columns go; completions right-padded, so trailing ones go). Positions come from the
        attention mask, so the trim changes no logprob; results are (n, T') with T' <= T."""
        pm, cm = ro.prompt_mask[idx], ro.completion_mask[idx]  # (n, P), (n, T)
        p0 = int(pm.any(0).float().argmax())  # first prompt column any row uses
        used = cm.any(0).nonzero()
        t1 = int(used.max()) + 1 if used.numel() else 1  # last completion column any row uses, + 1
        return dict(prompt_ids=ro.prompt_ids[idx][:, p0:], prompt_mask=pm[:, p0:],
                    completion_ids=ro.completion_ids[idx][:, :t1], completion_mask=cm[:, :t1])

    def _full_width(self, lp: torch.Tensor, T: int) -> torch.Tensor:
        """(n, T') logprobs of a trimmed micro-batch -> (n, T), zero where trimmed (all masked there)."""
        return torch.nn.functional.pad(lp, (0, T - lp.shape[1]))

    def _autocast(self):
        if self.amp is None:
            return contextlib.nullcontext()
        return torch.autocast(self.dist.device.type, dtype=self.amp)

    def _logprobs(self, rows, *, with_entropy: bool, entropy_grad: bool = False, module=None):
        """(logprobs, entropy) of rows through the backend's wrapped policy (or ``module``, a frozen copy)."""
        mode = self.cfg.logprob_recompute
        recompute = mode == "always" or (mode == "auto" and recompute_needed(
            rows["completion_ids"].numel(), self.vocab_size, self.logprob_chunk_size))
        kw = dict(temperature=self.cfg.temperature, chunk_size=self.logprob_chunk_size,
                  with_entropy=with_entropy, entropy_grad=entropy_grad, checkpoint_chunks=recompute)
        with self._autocast():
            if module is not None:
                return completion_logprobs(module, **rows, **kw)
            return self.backend.forward(**rows, **kw)

    @torch.no_grad()
    def _no_grad_logprobs(self, ro, module=None) -> torch.Tensor:
        """(N, T) logprobs of every rollout row for the reference or old-logprob pass, in forwards of
        ``logprob_batch_size`` rows (auto: max(micro_batch_size, 8)): no activations are kept for a
        backward, so these batch wider than the update's micro-batches (seed 003 trains at 1)."""
        N, T = ro.num_rows, ro.completion_ids.shape[1]
        k = self.cfg.logprob_batch_size or max(self.cfg.micro_batch_size, 8)
        return torch.cat([self._full_width(self._logprobs(self._rows(ro, torch.arange(s, min(s + k, N))),
                                                          with_entropy=False, module=module)[0], T)
                          for s in range(0, N, k)])  # (N, T)

    def _sample_groups(self, n_prompts: int) -> steps.Groups:
        """This rank's share of ``n_prompts`` prompts from the global order, generated and scored:
        one Groups item per prompt, (rollout, group index, example, pool index, the G reward diagnostics)."""
        cfg, G, D = self.cfg, self.cfg.n_samples_per_prompt, self.dist
        share = n_prompts // D.world_size
        indices = self.sampler.next(n_prompts)[D.rank * share:(D.rank + 1) * share]  # same global order on every rank
        examples = [self.task.train[i] for i in indices]
        t = time.time()
        ro = self.engine.generate(format_prompts(self.tok, examples, self.task.system_prompt), group_size=G,
                                  max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
                                  top_p=cfg.top_p).to(self.dist.device)
        self._timing["generate"] = self._timing.get("generate", 0.0) + time.time() - t
        t = time.time()
        rows = [examples[i // G] for i in range(len(ro.texts))]
        trunc = [bool(cut) for cut in ro.truncated.tolist()]
        # a reward with a ``batch`` form scores the whole rollout in one call (the code sandbox's
        # workers run rows side by side; row by row, the second worker idles)
        batch_reward = getattr(self.task.reward, "batch", None)
        if batch_reward is not None:
            scored = batch_reward(list(ro.texts), rows, trunc)
            if len(scored) != len(rows):
                raise ValueError(f"task {self.task.name}: reward.batch returned {len(scored)} results for {len(rows)} rows")
        else:
            scored = [self.task.reward(text, ex, cut) for text, ex, cut in zip(ro.texts, rows, trunc)]
        rewards = [float(r) for r, _ in scored]
        diags = [d for _, d in scored]
        self._timing["reward"] = self._timing.get("reward", 0.0) + time.time() - t
        items = [(ro, g, ex, idx, diags[g * G:(g + 1) * G]) for g, (ex, idx) in enumerate(zip(examples, indices))]
        return steps.Groups(items, torch.tensor(rewards))  # rewards (n*G,) host

    def step(self) -> dict[str, Any]:
        cfg, G, D = self.cfg, self.cfg.n_samples_per_prompt, self.dist
        self._timing = timing = {}
        t_step = time.time()
        first = self._sample_groups(cfg.rollout_batch_size)
        batch = steps.dynamic_sampling(first, self._sample_groups, group_size=G, mode=cfg.dynamic_sampling,
                                       max_rounds=cfg.dynamic_sampling_max_rounds)
        items = batch.items
        if all(it[0] is items[0][0] for it in items) and [it[1] for it in items] == list(range(len(items))):
            ro = items[0][0]  # the first rollout as it came
        else:  # groups kept from several generate calls: one batch of the widest shapes
            ro = steps.gather_groups([(it[0], it[1]) for it in items], self.tok.pad_token_id)
        examples = [it[2] for it in items]
        indices = [it[3] for it in items]
        diags = [d for it in items for d in it[4]]
        rewards = batch.rewards.tolist()
        N, T = ro.num_rows, ro.completion_ids.shape[1]
        if hasattr(self.sampler, "update"):  # a curriculum moves on the measured solve rate, the same on every rank
            correct = [float(d.get("correctness", r)) for d, r in zip(diags, rewards)]
            parts = D.gather_objects(([i for i in indices for _ in range(G)], correct))
            self.sampler.update([i for p in parts for i in p[0]], [c for p in parts for c in p[1]])

        t = time.time()
        ref_lp = old_lp = None
        self.backend.train(False)  # reference and old logprobs without dropout, or the ratio is noise
        if cfg.beta > 0:
            with self.ref.active() as ref_model:
                ref_lp = self._no_grad_logprobs(ro, None if ref_model is self.model else ref_model)  # (N, T)
        if not self.on_policy:
            old_lp = self._no_grad_logprobs(ro)  # (N, T)
        timing["reference"] = time.time() - t
        # rewards the advantages see: DAPO's overlong penalty, KL in the reward; then the advantages
        shaped, shaping = steps.shape_rewards(
            cfg, batch.rewards, ro.lengths().cpu(),
            behaviour_logprobs=(old_lp if old_lp is not None else ro.behaviour_logprobs).cpu(),
            ref_logprobs=None if ref_lp is None else ref_lp.cpu(), completion_mask=ro.completion_mask.cpu())
        advantages = self._global_advantages(shaped, G)  # (N,) host
        advantages_dev = advantages.to(D.device)
        lmask = steps.loss_mask(cfg, ro.completion_mask, ro.truncated,
                                None if cfg.dynamic_sampling == "off" else batch.row_mask.to(D.device))  # (N, T)

        t = time.time()
        upd = self._update(ro, advantages_dev, ref_lp, old_lp, lmask)
        timing["update"] = time.time() - t
        sync = self._sync_engine()  # the engine samples the new policy next step (probe-checked)
        timing["sync"] = sync.get("seconds", 0.0)
        self.step_num += 1
        timing["step"] = time.time() - t_step
        # TRL's frac_reward_zero_std: groups of the first rollout whose G rewards are all equal (no signal)
        extra = {**shaping, **batch.metrics, "frac_reward_zero_std": float(constant_groups(first.rewards, G).float().mean())}

        # every rank's rollout and update accumulators, so the metrics are those of the global batch
        local = {"rewards": rewards, "diags": diags, "extra": [extra], "advantages": advantages.tolist(),
                 "lengths": ro.lengths().cpu().tolist(), "truncated": ro.truncated.cpu().tolist(),
                 "texts": ro.texts, "examples": [(e.prompt, e.answer) for e in examples],
                 **{k: upd[k] for k in ("tok", "metrics", "entropy", "behaviour_diff", "seq_log_ratio", "gns")}}
        parts = D.gather_objects(local)
        allr = {k: [x for p in parts for x in p[k]] for k in local}
        row = step_metrics(allr, upd, timing, step=self.step_num, world_size=D.world_size,
                           skipped_steps=self.skipped_steps)
        for k in (allr["extra"][0] if allr["extra"] else {}):  # per-rank step metrics: the mean over ranks
            row[k] = float(np.mean([e[k] for e in allr["extra"]]))
        if hasattr(self.sampler, "metrics"):
            row.update(self.sampler.metrics())
        row.update(step_memory(D.device))
        if not self.engine.shares_trainer_module:
            row.update({"sync/bytes": float(sync.get("bytes", 0)), "sync/probe_max_diff": sync.get("probe_max_diff", 0.0),
                        "sync/probe_baseline": sync.get("probe_baseline", 0.0)})
        if self.memory_estimate is not None:
            row["memory/preflight_gib"] = self.memory_estimate
        self._group = self._sample_group(allr, G)
        if D.is_main:
            self._write_step_logs(row, allr, G)
        return row

    @staticmethod
    def _sample_group(allr: dict[str, list], G: int) -> dict[str, Any]:
        """The G completions of the step's first prompt, for the live view."""
        prompt, answer = allr["examples"][0]
        return {"prompt": prompt, "answer": answer, "completions": [
            {"text": allr["texts"][i], "reward": allr["rewards"][i], "advantage": allr["advantages"][i],
             "truncated": bool(allr["truncated"][i])} for i in range(G)]}

    def _write_step_logs(self, row: dict[str, Any], allr: dict[str, list], G: int) -> None:
        cfg = self.cfg
        exs = allr["examples"]
        if not math.isfinite(row["grad_norm_max"]) or row["grad_norm_max"] > cfg.spike_grad_norm:
            self.logger.spike({"step": self.step_num, "grad_norm": row["grad_norm_max"],
                               "prompt_hashes": [hashlib.md5(p.encode()).hexdigest() for p, _ in exs],
                               **{k: row[k] for k in row if k.startswith(("log_ratio", "ratio_"))}})
        if cfg.save_steps and self.step_num % cfg.save_steps == 0:
            self.logger.samples(self.step_num, [
                {"prompt": exs[i // G][0], "answer": exs[i // G][1], "completion": allr["texts"][i],
                 "reward": allr["rewards"][i], "advantage": allr["advantages"][i],
                 "truncated": bool(allr["truncated"][i])}
                for i in range(min(cfg.log_samples, len(allr["texts"])))])

    def _skips_rows(self) -> bool:
        """Whether the update may leave out rows that add nothing to the gradient: no loss term may read
        a row beyond its advantage (a KL in the loss, an entropy bonus), the GNS probe's per-micro-batch
        gradients assume full micro-batches, DDP needs every rank to run the same micro-batches, and a
        backend that counts micro-steps itself (DeepSpeed, even on one rank) needs all of them."""
        cfg = self.cfg
        return (cfg.skip_zero_advantage_rows and steps.loss_kwargs(cfg)["beta"] == 0 and cfg.entropy_coef == 0
                and not cfg.gns_probe and self.dist.world_size == 1 and not self.backend.fixed_micro_steps)

    def _micro_batches(self, ro, batch: torch.Tensor, advantages: torch.Tensor, lmask: torch.Tensor,
                       skip: bool) -> list[torch.Tensor]:
        """The micro-batches (row indices) one optimizer batch ``batch`` is run as.

        With ``skip``, rows whose advantage is exactly 0 or whose loss mask is empty are left out:
        every policy loss is A times something per token (0 for A = 0) and the aggregation selects
        masked tokens out, so such a row's loss and gradient are exactly 0 -- the normalisers
        (computed by the caller over the whole ``batch``) still count it. With
        cfg.sort_micro_batches_by_length the rows are ordered by prompt + completion length first,
        so each micro-batch (trimmed to its own longest row by ``_rows``) carries less padding."""
        cfg, mb = self.cfg, self.cfg.micro_batch_size
        rows = batch
        if skip:
            live = (advantages[batch] != 0) & (lmask[batch].sum(-1) > 0)  # (b,) bool
            rows = batch[live.cpu()]
        if cfg.sort_micro_batches_by_length and not cfg.gns_probe and len(rows) > mb:  # GNS wants random micro-batches
            length = (ro.prompt_mask[rows].sum(-1) + ro.completion_mask[rows].sum(-1)).cpu()  # (b,)
            rows = rows[torch.sort(length, stable=True).indices]
        return [rows[m0:m0 + mb] for m0 in range(0, len(rows), mb)]

    def _update(self, ro, advantages, ref_lp, old_lp, lmask) -> dict[str, Any]:
        """The micro-batched, gradient-accumulated update; returns what the metrics need.

        Each rank holds 1/W of every optimizer batch. The loss of a micro-batch is normalised by the
        optimizer batch's *global* totals (sequences, valid tokens, the Dr-GRPO constant), so the
        micro-batch losses of all ranks sum to the one-process loss; it is back-propagated times W
        because DDP and DeepSpeed average gradients over ranks. ``lmask`` (N, T) is the loss's mask:
        the completion mask less truncated completions or masked groups, when configured.
        """
        cfg, G, N, D = self.cfg, self.cfg.n_samples_per_prompt, ro.num_rows, self.dist
        W = D.world_size
        tb_rows = cfg.train_prompts * G // W  # this rank's rows of one optimizer batch
        mb = cfg.micro_batch_size
        loss_kw = steps.loss_kwargs(cfg)  # the policy loss, its own clip range, KL, aggregation, entropy
        norm_const = cfg.loss_norm_const if cfg.loss_norm_const is not None else float(cfg.max_new_tokens)
        acc: dict[str, list] = {"tok": [], "metrics": [], "entropy": [], "grad_norm": [], "loss": [], "lr": [],
                                "gns": [], "behaviour_diff": [], "seq_log_ratio": [], "rows_run": 0, "rows_seen": 0}
        skip = self._skips_rows()
        gen = torch.Generator().manual_seed(cfg.seed * 7919 + self.step_num * 104729 + D.rank)
        self.backend.train(True)
        for epoch in range(cfg.num_updates_per_rollout):
            # later passes (and several optimizer batches) see the rows in a fresh order, whole groups kept
            order = torch.arange(N)
            if cfg.num_updates_per_rollout > 1 or tb_rows < N:
                order = (torch.randperm(N // G, generator=gen).unsqueeze(1) * G + torch.arange(G)).reshape(-1)
            for b0 in range(0, N, tb_rows):
                batch = order[b0:b0 + tb_rows]
                num_seqs, num_tokens = steps.loss_totals(cfg, lmask[batch], D.all_sum)  # global rows, tokens
                loss_total = 0.0
                gns = cfg.gns_probe and len(batch) > mb and cfg.backend != "deepspeed"
                prev, micro_sq, seq_lr = None, [], []
                micro = self._micro_batches(ro, batch, advantages, lmask, skip)
                n_micro = len(micro)
                acc["rows_seen"] += len(batch)
                acc["rows_run"] += sum(len(ix) for ix in micro)
                if not micro:  # nothing to learn from: zero gradients, so the optimizer steps as it would have
                    for p in self.params:
                        p.grad = torch.zeros_like(p)
                for j, ix in enumerate(micro):
                    rows = self._rows(ro, ix)
                    t1 = rows["completion_ids"].shape[1]  # this micro-batch's own completion width
                    bonus = cfg.entropy_coef != 0
                    with self.backend.accumulate(last=j == n_micro - 1):
                        logp, ent = self._logprobs(rows, with_entropy=epoch == 0 or bonus, entropy_grad=bonus)  # (n, T)
                        old = logp.detach() if old_lp is None else old_lp[ix, :t1]
                        is_w = tis = None
                        if not self.engine.shares_trainer_module:  # (n, T) truncated IS weights pi_old / pi_behaviour
                            is_w, tis = tis_weights(old, ro.behaviour_logprobs[ix, :t1], rows["completion_mask"],
                                                    cap=cfg.tis_cap, level=cfg.tis_level)
                        loss, m = grpo_loss(
                            logp, old, advantages[ix], lmask[ix, :t1],
                            ref_logprobs=None if ref_lp is None else ref_lp[ix, :t1],
                            num_seqs=num_seqs, num_tokens=num_tokens, norm_const=norm_const, entropy=ent,
                            is_weights=is_w, **loss_kw)
                        if tis is not None:
                            m.update({f"tis/{k}": v for k, v in tis.items()})
                        self.backend.backward(loss * W)
                    loss_total += float(loss.detach())
                    mask = rows["completion_mask"]
                    seq_lr.append(((logp.detach() - old) * mask).sum(-1).float().cpu())  # (n,) sequence log-ratio
                    if gns:  # this micro-batch's own gradient, rescaled to its mean gradient
                        flat = torch.cat([p.grad.reshape(-1) for p in self.params if p.grad is not None])
                        g = flat if prev is None else flat - prev
                        micro_sq.append((g * (len(batch) / len(ix))).pow(2).sum())
                        prev = flat.clone()
                    if epoch == 0:
                        valid = mask > 0
                        acc["entropy"].append(ent.detach()[valid].float().cpu())
                        # the engine's sampling logprobs against the trainer's (0 up to float noise for
                        # HF generate; a vLLM engine's numerics show up here)
                        acc["behaviour_diff"].append((logp.detach() - ro.behaviour_logprobs[ix, :t1]).abs()[valid]
                                                     .float().cpu())
                    acc["tok"].append(float(mask.sum()))
                    acc["metrics"].append({k: float(v) for k, v in m.items()})
                if gns and prev is not None:
                    acc["gns"].append({k: float(v) for k, v in
                                       simple_noise_scale(torch.stack(micro_sq), prev.pow(2).sum(), mb,
                                                          len(batch)).items()})
                acc["seq_log_ratio"].append(torch.cat(seq_lr) if seq_lr else torch.zeros(0))
                loss_global = float(D.all_sum(torch.tensor([loss_total], device=D.device))[0])
                acc["lr"].append(self.backend.lr())
                grad_norm, stepped = self.backend.step(math.isfinite(loss_global))
                if not stepped:
                    # a non-finite loss would poison the weights and every later checkpoint: skip the step
                    self.skipped_steps += 1
                    warnings.warn(f"step {self.step_num + 1}: non-finite loss ({loss_global}) or grad_norm "
                                  f"({grad_norm}); optimizer step skipped, weights unchanged "
                                  f"(total skipped: {self.skipped_steps})")
                acc["grad_norm"].append(grad_norm)
                acc["loss"].append(loss_global)
        gmax = max(acc["grad_norm"], key=lambda g: math.inf if not math.isfinite(g) else g)  # NaN counts as a spike
        return {**acc, "grad_norm_max": gmax, "clip": (loss_kw["clip_low"], loss_kw["clip_high"])}

    # ---- the loop -------------------------------------------------------------------------------
    def stop_requested(self, started: float | None = None) -> str | None:
        """Why to stop from outside the run, else None: a researcher asked (``<run_dir>/control/stop``;
        the live view's Stop button and ``rft stop`` write it), or the time budget (max_train_minutes,
        counted from ``started``) is spent. Rank 0 decides (one file, one clock); every rank gets its answer."""
        reason, budget = None, self.cfg.max_train_minutes
        if self.dist.is_main:
            if (self.run_dir / STOP_FILE).exists():
                reason = "stopped by user"
            elif budget is not None and started is not None and time.time() - started >= 60 * budget:
                reason = f"time budget spent: max_train_minutes={budget:g} reached at step {self.step_num}"
        return self.dist.broadcast_object(reason)

    def train(self) -> dict[str, Any]:
        """Run to num_steps (or stop_after_steps more); eval at 0, every eval_steps and at the end.

        Stops early when the early-stop probe drops at ``early_stop_patience`` consecutive evals,
        or, with ``health_abort``, when a health verdict fails, or when a stop is requested, or when
        ``max_train_minutes`` have passed since this call; each way it checkpoints first and records
        why in summary.json. Verdict changes are printed as ``[health step N]`` lines unless a
        callback's object shows the verdicts itself (``shows_verdicts``: the live panel).
        """
        from rftlib.monitor.health import run_verdicts

        started = time.time()
        cfg, main = self.cfg, self.dist.is_main
        say_health = main and not any(getattr(getattr(cb, "__self__", cb), "shows_verdicts", False)
                                      for cb in self.callbacks)
        start = self.step_num
        end = cfg.num_steps if cfg.stop_after_steps is None else min(cfg.num_steps, start + cfg.stop_after_steps)
        if self.step_num == 0 and not self.eval_history:
            self._emit(self.evaluate())
        bar = None
        if self.progress and main:
            from tqdm.auto import tqdm

            bar = tqdm(total=cfg.num_steps, initial=start, desc=self.run_dir.name, unit="step")
        rows = [r for r in _read_rows(self.run_dir / "logs" / "metrics.jsonl")] if main else []
        rows = self.dist.broadcast_object(rows)
        self.stop_reason = None
        seen_bad: set[tuple[str, str]] = set()
        while self.step_num < end:
            row = self.step()
            final = self.step_num == cfg.num_steps
            is_eval = final or (cfg.eval_steps and self.step_num % cfg.eval_steps == 0)
            if is_eval:
                row.update({k: v for k, v in self.evaluate().items() if k != "step"})
                self.stop_reason = self.early_stop_reason()
            self._emit(row)
            rows.append(row)
            # the live panel's and the report's verdicts (one list everywhere); the same rows on every rank
            verdicts = run_verdicts(rows, cfg, self.task.health_skip)
            if main:
                write_json(self.run_dir / "logs" / "health.json", [v.__dict__ for v in verdicts])
            for v in verdicts:
                if v.status in ("warn", "fail") and (v.name, v.status) not in seen_bad:
                    seen_bad.add((v.name, v.status))
                    if say_health:
                        print(f"[health step {self.step_num}] {v.status.upper()} {v.name}: {v.message} -> {v.action}")
                    if v.status == "fail" and cfg.health_abort and self.stop_reason is None:
                        self.stop_reason = f"health verdict {v.name} failed: {v.message}"
            if self.stop_reason is None:
                self.stop_reason = self.stop_requested(started)
            stop = self.stop_reason is not None
            if final or stop or self.step_num == end or (cfg.save_steps and self.step_num % cfg.save_steps == 0) \
                    or (is_eval and cfg.early_stop_probe):
                self.save()
            if bar is not None:
                bar.update(1)
                bar.set_postfix(reward=f"{row['reward_mean']:.2f}", len=f"{row['response_length_mean']:.0f}",
                                s=f"{row['timing/step']:.0f}")
            if stop:
                if main:
                    print(f"[early stop at step {self.step_num}] {self.stop_reason}")
                    (self.run_dir / STOP_FILE).unlink(missing_ok=True)  # honoured: a resume goes on
                break
        if bar is not None:
            bar.close()
        return self.summary()

    def _emit(self, row: dict[str, Any]) -> None:
        if not self.dist.is_main:
            return
        self.logger.log(row)
        group = getattr(self, "_group", None)
        for cb in self.callbacks:
            cb({**row, "_group": group} if group is not None and "reward_mean" in row else row)

    def summary(self) -> dict[str, Any]:
        evals = [e for e in self.eval_history if EVAL_KEY in e]
        base = evals[0][EVAL_KEY] if evals else None
        last = evals[-1][EVAL_KEY] if evals else None
        best = max(evals, key=lambda e: e[EVAL_KEY]) if evals else None
        probes = {}
        for p in self.cfg.eval_probes:
            key = f"eval/{p}/greedy_pass@1"
            vals = [(e["step"], e[key]) for e in self.eval_history if key in e]
            if vals:
                bs, bv = max(vals, key=lambda x: (x[1], -x[0]))
                probes[p] = {"baseline": vals[0][1], "final": vals[-1][1], "best": bv, "best_step": bs}
        out = {"attempt_id": self.run_dir.name, "run_dir": str(self.run_dir), "steps": self.step_num,
               "stop_reason": getattr(self, "stop_reason", None), "probes": probes,
               "baseline": base, "final": last, "gain": None if base is None or last is None else last - base,
               "best_step": best["step"] if best else None, "best": best[EVAL_KEY] if best else None,
               "skipped_steps": self.skipped_steps, "eval_mode": "greedy_pass@1", "eval_dataset": "heldout",
               "eval_n": len(self.task.eval), "eval_precision": self.eval_precision, "world_size": self.dist.world_size, "backend": self.cfg.backend,
               "device": str(self.dist.device)}
        if self.dist.is_main:
            write_json(self.run_dir / "summary.json", out)
        return out

    def close(self) -> None:
        try:
            self.engine.close()
            if self.logger is not None:
                self.logger.close()
            self.backend.close()
        finally:
            self._unlock()


def resume_config(run_dir: str | Path, **overrides: Any) -> RunConfig:
    """The saved config of an attempt, with overrides (e.g. num_steps for more steps, seed 001's
    ``--from-step latest --additional-steps k``). Extending num_steps stretches the rest of the LR
    schedule over the new total."""
    saved = read_attempt(run_dir)["config"]
    saved.update(overrides)
    return make_config(None, saved)


def lr_schedule_preview(cfg: RunConfig) -> list[float]:
    """LR of each optimizer step of this config (what the scheduler will do)."""
    total = cfg.num_steps * cfg.optimizer_steps_per_rollout
    w = warmup_steps_for(total, cfg.warmup_ratio)
    return [lr_at(s, total_steps=total, warmup_steps=w, lr=cfg.lr, min_lr_ratio=cfg.min_lr_ratio) for s in range(total)]
