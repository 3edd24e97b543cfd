"""The GRPO trainer: rollout -> reward -> advantages -> micro-batched update -> log/eval/checkpoint.

It only orchestrates: the math is in rftlib.algo (looked up by name, never branched on), the
model plumbing in rftlib.models, generation behind the rollout engine interface. One call of
:meth:`Trainer.step` is one rollout; it makes ``num_updates_per_rollout x B / train_batch_size``
optimizer steps. When that is exactly one, the update is on-policy: the old logprobs *are* the
current ones (detached), so no extra forward is spent on them.
"""

from __future__ import annotations

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

from rftlib.algo.advantages import advantage_stats, compute_advantages
from rftlib.algo.diagnostics import importance_ess, simple_noise_scale
from rftlib.algo.losses import grpo_loss
from rftlib.attempts import create_attempt, read_attempt, write_json
from rftlib.config import RunConfig, make_config
from rftlib.data.tasks import build_task
from rftlib.eval import format_prompts, greedy_eval
from rftlib.models.loading import (Reference, apply_lora, autocast, autocast_dtype, is_peft, load_adapter_weights,
                                   load_model_and_tokenizer, load_trainable_state, trainable_state)
from rftlib.monitor.metrics import MetricsLogger
from rftlib.rollout.hf import HFEngine
from rftlib.train import checkpoint as ckpt
from rftlib.train.forward import completion_logprobs
from rftlib.train.schedule import lr_at, make_scheduler, warmup_steps_for

EVAL_KEY = "eval/heldout/greedy_pass@1"


def _read_rows(path: Path) -> list[dict[str, Any]]:
    from rftlib.monitor.metrics import read_metrics

    return read_metrics(path.parent.parent)


class PromptSampler:
    """Walks the training pool in seeded per-epoch permutations; its state is a resumable cursor."""

    def __init__(self, pool_size: int, seed: int, epoch: int = 0, pos: int = 0):
        self.pool_size, self.seed, self.epoch, self.pos = pool_size, seed, epoch, pos

    def _perm(self) -> np.ndarray:
        return np.random.default_rng(self.seed + 1_000_003 * self.epoch).permutation(self.pool_size)

    def next(self, k: int) -> list[int]:
        out: list[int] = []
        while len(out) < k:
            perm = self._perm()
            take = min(k - len(out), self.pool_size - self.pos)
            out += perm[self.pos:self.pos + take].tolist()
            self.pos += take
            if self.pos == self.pool_size:
                self.epoch, self.pos = self.epoch + 1, 0
        return out

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state(self, s: dict[str, int]) -> None:
        self.epoch, self.pos = s["epoch"], s["pos"]


def _q(x: torch.Tensor, q: float) -> float:
    return float(torch.quantile(x.float(), q)) if x.numel() else 0.0


class Trainer:
    """One attempt's training state. Build it, then :meth:`train` (or :meth:`step` by hand)."""

    def __init__(self, cfg: RunConfig, run_dir: str | Path | None = None, *, resume: bool = False,
                 progress: bool = True, callbacks: list[Callable[[dict], None]] | None = None,
                 reward_override: Callable | None = None):
        self.cfg = cfg
        self.progress = progress
        self.callbacks = list(callbacks or [])
        if cfg.torch_threads:
            torch.set_num_threads(cfg.torch_threads)
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        self.run_dir = Path(run_dir) if run_dir is not None else create_attempt(cfg)
        self.task = build_task(cfg.task, eval_size=cfg.eval_size, **cfg.task_args)
        if reward_override is not None:  # tests inject faults through this
            self.task.reward = reward_override
        t = time.time()
        model, self.tok = load_model_and_tokenizer(cfg.model, cfg.dtype)
        if cfg.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.model = apply_lora(model, rank=cfg.lora_rank, alpha=cfg.lora_alpha, dropout=cfg.lora_dropout,
                                target_modules=cfg.lora_target_modules)
        if cfg.init_adapter:
            load_adapter_weights(self.model, cfg.init_adapter)
        self.load_seconds = time.time() - t
        self.ref = Reference(self.model, needed=cfg.beta > 0)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2),
                                           weight_decay=cfg.weight_decay)
        self.opt_steps_per_rollout = cfg.optimizer_steps_per_rollout
        self.on_policy = self.opt_steps_per_rollout == 1
        self.total_opt_steps = cfg.num_steps * self.opt_steps_per_rollout
        self.warmup_steps = warmup_steps_for(self.total_opt_steps, cfg.warmup_ratio)
        self.scheduler = make_scheduler(self.optimizer, total_steps=self.total_opt_steps,
                                        warmup_steps=self.warmup_steps, min_lr_ratio=cfg.min_lr_ratio)
        self.amp = autocast_dtype(cfg.autocast)
        self.engine = HFEngine(self.model, self.tok, amp=self.amp)
        make = getattr(self.task, "make_sampler", None)  # curriculum / weighted mixing tasks bring their own
        self.sampler = make(cfg.seed) if make else PromptSampler(len(self.task.train), cfg.seed)
        self.step_num = 0
        self.eval_history: list[dict[str, Any]] = []
        self.skipped_steps = 0
        self.logger = MetricsLogger(self.run_dir)
        if resume:
            self._resume()

    # ---- checkpointing ----------------------------------------------------------------------
    def _trainer_state(self) -> dict[str, Any]:
        return {"step": self.step_num, "sampler": self.sampler.state(), "eval_history": self.eval_history,
                "skipped_steps": self.skipped_steps, "num_steps": self.cfg.num_steps}

    def save(self) -> Path:
        saver = None
        if is_peft(self.model):
            saver = lambda d: self.model.save_pretrained(d)  # noqa: E731
        return ckpt.save_checkpoint(self.run_dir, self.step_num, trainable=trainable_state(self.model),
                                    optimizer=self.optimizer.state_dict(), scheduler=self.scheduler.state_dict(),
                                    trainer_state=self._trainer_state(), max_keep=self.cfg.max_ckpt_num,
                                    adapter_saver=saver)

    def _resume(self) -> None:
        d = ckpt.latest_dir(self.run_dir)
        state = ckpt.load_checkpoint(d)
        load_trainable_state(self.model, state["trainable"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        # the saved state carries the old lr/betas/weight decay: the resumed config's values win, and
        # the LR continues on this config's schedule from the saved step
        self.scheduler.base_lrs = [self.cfg.lr] * len(self.optimizer.param_groups)
        for g in self.optimizer.param_groups:
            g.update(initial_lr=self.cfg.lr, betas=(self.cfg.adam_beta1, self.cfg.adam_beta2),
                     weight_decay=self.cfg.weight_decay)
            g["lr"] = self.cfg.lr * self.scheduler.lr_lambdas[0](self.scheduler.last_epoch)
        ckpt.set_rng_state(state["rng"])
        ts = state["trainer_state"]
        self.step_num = ts["step"]
        self.sampler.load_state(ts["sampler"])
        self.eval_history = ts["eval_history"]
        self.skipped_steps = ts.get("skipped_steps", 0)
        # metrics lines past the checkpoint (a crash after the save) would be duplicated: drop them
        lines = self.logger.path.read_text().splitlines()
        keep = [json.dumps(r) for r in _read_rows(self.logger.path) if r.get("step", 0) <= self.step_num]
        if len(keep) != len(lines):
            self.logger._f.close()
            self.logger.path.write_text("".join(ln + "\n" for ln in keep))
            self.logger._f = open(self.logger.path, "a", buffering=1)

    # ---- evaluation -------------------------------------------------------------------------
    def evaluate(self) -> dict[str, Any]:
        """greedy_pass@1 on every eval probe; results in eval/step_N[_probe].json and the history."""
        summary: dict[str, Any] = {"step": self.step_num}
        (self.run_dir / "eval").mkdir(exist_ok=True)
        for probe in self.cfg.eval_probes:
            res = greedy_eval(self.engine, self.tok, self.task, self.task.eval_set(probe),
                              max_new_tokens=self.cfg.max_new_tokens, batch_size=self.cfg.eval_batch_size,
                              dataset=probe)
            suffix = "" if probe == "heldout" else f"_{probe}"
            write_json(self.run_dir / "eval" / f"step_{self.step_num}{suffix}.json", res)
            summary[f"eval/{probe}/greedy_pass@1"] = res["greedy_pass@1"]
            summary[f"eval/{probe}/mean_length"] = res["mean_length"]
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
        return dict(prompt_ids=ro.prompt_ids[idx], prompt_mask=ro.prompt_mask[idx],
                    completion_ids=ro.completion_ids[idx], completion_mask=ro.completion_mask[idx])

    def _logprobs(self, model, rows, *, with_entropy: bool, entropy_grad: bool = False):
        with autocast(self.amp):
            return completion_logprobs(model, **rows, temperature=self.cfg.temperature,
                                       chunk_size=self.cfg.logprob_chunk_size, with_entropy=with_entropy,
                                       entropy_grad=entropy_grad)

    def step(self) -> dict[str, Any]:
        cfg, G = self.cfg, self.cfg.n_samples_per_prompt
        timing: dict[str, float] = {}
        t_step = t = time.time()
        indices = self.sampler.next(cfg.rollout_batch_size)
        examples = [self.task.train[i] for i in indices]
        ro = self.engine.generate(format_prompts(self.tok, examples, self.task.system_prompt), group_size=G,
                                  max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p)
        timing["generate"] = time.time() - t
        N = ro.num_rows

        t = time.time()
        rewards, diags = [], []
        for i, text in enumerate(ro.texts):
            r, d = self.task.reward(text, examples[i // G], bool(ro.truncated[i]))
            rewards.append(float(r))
            diags.append(d)
        rewards_t = torch.tensor(rewards)  # (N,)
        if hasattr(self.sampler, "update"):  # a curriculum moves on the measured solve rate
            correct = [float(d.get("correctness", r)) for d, r in zip(diags, rewards)]
            self.sampler.update([i for i in indices for _ in range(G)], correct)
        advantages = compute_advantages(cfg.advantage_estimator, rewards_t, G, cfg.adv_eps)  # (N,)
        timing["reward"] = time.time() - t

        mb = cfg.micro_batch_size
        micro = [torch.arange(s, min(s + mb, N)) for s in range(0, N, mb)]
        t = time.time()
        ref_lp = old_lp = None
        self.model.eval()  # reference and old logprobs without dropout, or the ratio is noise before any update
        with torch.no_grad():
            if cfg.beta > 0:
                with self.ref.active() as ref_model:
                    ref_lp = torch.cat([self._logprobs(ref_model, self._rows(ro, ix), with_entropy=False)[0]
                                        for ix in micro])  # (N, T)
            if not self.on_policy:
                old_lp = torch.cat([self._logprobs(self.model, self._rows(ro, ix), with_entropy=False)[0]
                                    for ix in micro])  # (N, T)
        timing["reference"] = time.time() - t

        t = time.time()
        upd = self._update(ro, advantages, ref_lp, old_lp)
        timing["update"] = time.time() - t
        self.step_num += 1
        timing["step"] = time.time() - t_step

        row = self._metrics(ro, rewards_t, diags, advantages, upd, timing)
        if hasattr(self.sampler, "metrics"):
            row.update(self.sampler.metrics())
        if not math.isfinite(upd["grad_norm_max"]) or upd["grad_norm_max"] > cfg.spike_grad_norm:
            self.logger.spike({"step": self.step_num, "grad_norm": upd["grad_norm_max"],
                               "prompt_hashes": [hashlib.md5(e.prompt.encode()).hexdigest() for e in examples],
                               **{k: row[k] for k in row if k.startswith(("log_ratio", "ratio_"))}})
        if cfg.save_steps and self.step_num % cfg.save_steps == 0:
            self.logger.samples(self.step_num, [
                {"prompt": examples[i // G].prompt, "answer": examples[i // G].answer, "completion": ro.texts[i],
                 "reward": rewards[i], "advantage": float(advantages[i]), "truncated": bool(ro.truncated[i])}
                for i in range(min(cfg.log_samples, N))])
        return row

    def _update(self, ro, advantages, ref_lp, old_lp) -> dict[str, Any]:
        """The micro-batched, gradient-accumulated update; returns what the metrics need."""
        cfg, G, N = self.cfg, self.cfg.n_samples_per_prompt, ro.num_rows
        tb_rows = cfg.train_prompts * G
        mb = cfg.micro_batch_size
        clip_high = cfg.eps_clip_high if cfg.eps_clip_high is not None else cfg.eps_clip
        norm_const = cfg.loss_norm_const if cfg.loss_norm_const is not None else float(cfg.max_new_tokens)
        acc: dict[str, list] = {"tok": [], "metrics": [], "entropy": [], "grad_norm": [], "loss": [], "lr": [],
                                "gns": [], "behaviour_diff": []}
        self.model.train()
        for epoch in range(cfg.num_updates_per_rollout):
            for b0 in range(0, N, tb_rows):
                batch = torch.arange(b0, min(b0 + tb_rows, N))
                num_tokens = ro.completion_mask[batch].sum().clamp(min=1.0)
                loss_total = 0.0
                gns = cfg.gns_probe and len(batch) > mb
                prev, micro_sq = None, []
                for m0 in range(0, len(batch), mb):
                    ix = batch[m0:m0 + mb]
                    rows = self._rows(ro, ix)
                    bonus = cfg.entropy_coef != 0
                    logp, ent = self._logprobs(self.model, rows, with_entropy=epoch == 0 or bonus,
                                               entropy_grad=bonus)  # (n, T) each
                    old = logp.detach() if old_lp is None else old_lp[ix]
                    loss, m = grpo_loss(
                        logp, old, advantages[ix], rows["completion_mask"],
                        ref_logprobs=None if ref_lp is None else ref_lp[ix], beta=cfg.beta,
                        kl_estimator=cfg.kl_estimator, policy_loss=cfg.policy_loss, aggregation=cfg.loss_agg_mode,
                        num_seqs=float(len(batch)), num_tokens=num_tokens, norm_const=norm_const,
                        clip_low=cfg.eps_clip, clip_high=clip_high, dual_clip=cfg.dual_clip,
                        log_ratio_clamp=cfg.log_ratio_clamp, entropy=ent, entropy_coef=cfg.entropy_coef)
                    loss.backward()
                    loss_total += float(loss.detach())
                    m["importance_ess"] = importance_ess(logp.detach() - old, rows["completion_mask"])
                    if gns:  # this micro-batch's own gradient, rescaled to its mean gradient
                        flat = torch.cat([p.grad.reshape(-1) for p in self.params if p.grad is not None])
                        g = flat if prev is None else flat - prev
                        micro_sq.append((g * (len(batch) / len(ix))).pow(2).sum())
                        prev = flat.clone()
                    if epoch == 0:
                        valid = rows["completion_mask"] > 0
                        acc["entropy"].append(ent.detach()[valid])
                        # the engine's sampling logprobs against the trainer's (0 up to float noise for
                        # HF generate; a vLLM engine's numerics show up here)
                        acc["behaviour_diff"].append((logp.detach() - ro.behaviour_logprobs[ix]).abs()[valid])
                    acc["tok"].append(float(rows["completion_mask"].sum()))
                    acc["metrics"].append({k: float(v) for k, v in m.items()})
                if gns and prev is not None:
                    acc["gns"].append(simple_noise_scale(torch.stack(micro_sq), prev.pow(2).sum(), mb, len(batch)))
                grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, cfg.max_grad_norm))
                if not (math.isfinite(loss_total) and math.isfinite(grad_norm)):
                    # a non-finite loss would poison the weights and every later checkpoint: skip the step
                    self.optimizer.zero_grad(set_to_none=True)
                    self.skipped_steps += 1
                    warnings.warn(f"step {self.step_num + 1}: non-finite loss ({loss_total}) or grad_norm "
                                  f"({grad_norm}); optimizer step skipped, weights unchanged "
                                  f"(total skipped: {self.skipped_steps})")
                else:
                    acc["lr"].append(self.optimizer.param_groups[0]["lr"])
                    self.optimizer.step()
                    self.scheduler.step()
                    self.optimizer.zero_grad(set_to_none=True)
                acc["grad_norm"].append(grad_norm)
                acc["loss"].append(loss_total)
        gmax = max(acc["grad_norm"], key=lambda g: math.inf if not math.isfinite(g) else g)  # NaN counts as a spike
        return {**acc, "grad_norm_max": gmax, "clip": (cfg.eps_clip, clip_high)}

    def _metrics(self, ro, rewards, diags, advantages, upd, timing) -> dict[str, Any]:
        cfg = self.cfg
        row: dict[str, Any] = {"step": self.step_num}
        row.update(reward_mean=float(rewards.mean()), reward_std=float(rewards.std(correction=0)),
                   reward_min=float(rewards.min()), reward_max=float(rewards.max()), reward_p90=_q(rewards, 0.9))
        for k in sorted({k for d in diags for k in d}):
            row[k] = float(np.mean([d.get(k, 0.0) for d in diags]))
        row.update({k: float(v) for k, v in advantage_stats(advantages).items()})
        # per-micro-batch metrics: token-weighted means, extremes of extremes; the p99 is the
        # largest micro-batch p99 (an upper bound on the batch p99)
        for k in upd["metrics"][0]:
            have = [i for i, m in enumerate(upd["metrics"]) if k in m]  # entropy is only taken in epoch 0
            vals = torch.tensor([upd["metrics"][i][k] for i in have])
            w = torch.tensor([upd["tok"][i] for i in have])
            if k.endswith(("_max", "_p99")):
                row[k] = float(vals.max())
            elif k.endswith("_min"):
                row[k] = float(vals.min())
            elif k == "policy_loss":  # aggregated with batch totals: sums per optimizer step
                row[k] = float(vals.sum()) / len(upd["loss"])
            else:
                row[k] = float((vals * w).sum() / w.sum().clamp(min=1))
        row["loss"] = float(np.mean(upd["loss"]))
        ent = torch.cat(upd["entropy"]) if upd["entropy"] else torch.zeros(0)
        row.update(entropy_mean=float(ent.mean()) if ent.numel() else 0.0, entropy_p10=_q(ent, 0.1),
                   entropy_p90=_q(ent, 0.9))
        row.update(grad_norm=float(np.mean(upd["grad_norm"])), grad_norm_max=upd["grad_norm_max"])
        diff = torch.cat(upd["behaviour_diff"]) if upd["behaviour_diff"] else torch.zeros(0)
        row["behaviour_logprob_diff_max"] = float(diff.max()) if diff.numel() else 0.0
        lengths = ro.lengths()
        row.update(response_length_mean=float(lengths.mean()), response_length_max=float(lengths.max()),
                   truncated=float(ro.truncated.float().mean()))
        row["lr"] = float(np.mean(upd["lr"])) if upd["lr"] else 0.0  # the LR the step(s) used
        row["eps_clip_low"], row["eps_clip_high"] = upd["clip"]  # what the loss was called with
        if upd["gns"]:  # single-step estimates: average gns_grad_sq and gns_trace over steps to read B_simple
            for k in upd["gns"][0]:
                row[k] = float(np.mean([float(g[k]) for g in upd["gns"]]))
        row["skipped_steps"] = self.skipped_steps
        row.update({f"timing/{k}": v for k, v in timing.items()})
        return row

    # ---- the loop -------------------------------------------------------------------------------
    def train(self) -> dict[str, Any]:
        """Run to num_steps (or stop_after_steps more); eval at 0, every eval_steps and at the end.

        Stops early when the early-stop probe drops at ``early_stop_patience`` consecutive evals,
        or, with ``health_abort``, when a health verdict fails; either way it checkpoints first
        and records why in summary.json.
        """
        from rftlib.monitor.health import check_health

        cfg = self.cfg
        start = self.step_num
        end = cfg.num_steps if cfg.stop_after_steps is None else min(cfg.num_steps, start + cfg.stop_after_steps)
        if self.step_num == 0 and not self.eval_history:
            self._emit(self.evaluate())
        bar = None
        if self.progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=cfg.num_steps, initial=start, desc=self.run_dir.name, unit="step")
        rows = [r for r in _read_rows(self.logger.path)]
        health_cfg = {"max_grad_norm": cfg.max_grad_norm}
        if cfg.early_stop_probe:
            health_cfg["ood_metric"] = f"eval/{cfg.early_stop_probe}/greedy_pass@1"
        from rftlib.monitor.health import RULES

        rules = [r for r in RULES.names() if r not in self.task.health_skip]
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
            verdicts = check_health(rows, rules=rules, **health_cfg)
            write_json(self.run_dir / "logs" / "health.json", [v.__dict__ for v in verdicts])
            for v in verdicts:
                if v.status in ("warn", "fail") and (v.name, v.status) not in seen_bad:
                    seen_bad.add((v.name, v.status))
                    print(f"[health step {self.step_num}] {v.status.upper()} {v.name}: {v.message} -> {v.action}")
                    if v.status == "fail" and cfg.health_abort and self.stop_reason is None:
                        self.stop_reason = f"health verdict {v.name} failed: {v.message}"
            stop = self.stop_reason is not None
            if final or stop or self.step_num == end or (cfg.save_steps and self.step_num % cfg.save_steps == 0) \
                    or (is_eval and cfg.early_stop_probe):
                self.save()
            if bar is not None:
                bar.update(1)
                bar.set_postfix(reward=f"{row['reward_mean']:.2f}", len=f"{row['response_length_mean']:.0f}",
                                s=f"{row['timing/step']:.0f}")
            if stop:
                print(f"[early stop at step {self.step_num}] {self.stop_reason}")
                break
        if bar is not None:
            bar.close()
        return self.summary()

    def _emit(self, row: dict[str, Any]) -> None:
        self.logger.log(row)
        for cb in self.callbacks:
            cb(row)

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
               "eval_n": len(self.task.eval)}
        write_json(self.run_dir / "summary.json", out)
        return out

    def close(self) -> None:
        self.logger.close()


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
