"""Recording a step's whole batch for ``rft replay`` and the token inspector (issue 33).

At the steps ``record_batches`` names (every eval step by default), and at a step whose grad norm spikes
(``record_on_spike``), the Trainer hands this module what its update used, and rank 0 writes
``records/step_N/`` (rftlib.monitor.records: atomic, size-capped):

- before the update, the trainable state the update starts from (the "snapshot": LoRA on the default preset is
  7.4 MB; with several optimizer steps per rollout the optimizer and LR schedule too, in the backend's own
  checkpoint files), and the torch RNG state (dropout);
- during the update, an :class:`UpdateTrace`: each micro-batch's rows, loss, and the logprobs and entropy the
  update's own forward computed; each optimizer step's rows, global totals, loss, grad norm and LR;
- after it, the rollout rows and masks, advantages, loss mask, behaviour / old / reference logprobs, rewards and
  texts of every rank, gathered to rank 0 in rank order (``r{rank}/<name>`` keys: each rank's rows as its update
  saw them, so a replay on the same number of ranks runs the same micro-batches).

The figures that a replay must reproduce (each micro-batch's loss, each optimizer step's loss and grad norm)
are written as ``float.hex`` strings: equality is bit for bit. Recording reads the update, never changes it:
a recorded step's metrics row equals the unrecorded one's (tests/test_train_record.py).
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from rftlib.config import to_dict
from rftlib.monitor import records
from rftlib.settings import record_steps

SNAPSHOT_MAX_BYTES = 256 << 20
"""the largest trainable state copied every step for a record made only because the step spiked (LoRA adapters
are megabytes; a full fine-tune's spike record then replays from a checkpoint of the step before, if any)"""


@dataclass
class UpdateTrace:
    """What one update did, as rftlib.train.loop.Trainer.update reports it (``Trainer.trace``).

    ``micro``: per micro-batch run {k (optimizer step), epoch, rows (this rank's row indices), loss (the float the
    update summed), logprobs (n, T') and entropy (n, T') or None, host float32}. ``opt``: per optimizer step
    {k, epoch, rows, num_seqs, num_tokens, norm_const, loss (global), grad_norm, stepped, lr}."""

    micro: list[dict[str, Any]] = field(default_factory=list)
    opt: list[dict[str, Any]] = field(default_factory=list)

    def micro_batch(self, *, epoch: int, rows: torch.Tensor, loss: float, logprobs: torch.Tensor,
                    entropy: torch.Tensor | None, tokens: float = 0.0, metrics: dict | None = None) -> None:
        self.micro.append({"k": len(self.opt), "epoch": epoch, "rows": [int(i) for i in rows], "loss": loss,
                           "logprobs": logprobs.detach().float().cpu(),
                           "entropy": None if entropy is None else entropy.detach().float().cpu(),
                           "tokens": tokens, "metrics": {k: float(v) for k, v in (metrics or {}).items()}})

    def before_step(self, trainer, batch, advantages, *, epoch: int, rows: torch.Tensor, micro: list,
                    totals: dict[str, Any], loss_kw: dict[str, Any], loss: float) -> None:
        """Called by the update after an optimizer batch's backwards, before the optimizer step: the gradient of
        the batch is in the parameters (rftlib.train.replay computes its counterfactuals here)."""
        self.opt.append({"k": len(self.opt), "epoch": epoch, "rows": [int(i) for i in rows],
                         "num_seqs": float(totals["num_seqs"]), "num_tokens": float(totals["num_tokens"]),
                         "norm_const": float(totals["norm_const"]), "loss": loss, "micro_batches": len(micro)})

    def optimizer_step(self, *, grad_norm: float, stepped: bool, lr: float) -> None:
        self.opt[-1].update(grad_norm=grad_norm, stepped=bool(stepped), lr=lr)


def hexf(x: float) -> str:
    """A float as Python's exact hex form (nan and inf as their names)."""
    return float(x).hex() if math.isfinite(x) else repr(float(x))


def unhex(s: str) -> float:
    return float(s) if s in ("nan", "inf", "-inf") else float.fromhex(s)


def environment(trainer) -> dict[str, Any]:
    """What decides whether a replay can equal the recorded numbers bit for bit: torch build, device, the autocast
    dtype, the CPU kernels torch dispatches to, intra-op threads, deterministic flags."""
    cap = ""
    try:
        cap = torch.backends.cpu.get_cpu_capability()
    except Exception:  # older torch: the capability is not exposed
        pass
    return {"torch": torch.__version__, "device": trainer.dist.device.type,
            "amp": None if trainer.amp is None else str(trainer.amp).replace("torch.", ""),
            "cpu_capability": cap, "aten_cpu_capability": os.environ.get("ATEN_CPU_CAPABILITY", ""),
            "threads": torch.get_num_threads(), "deterministic": torch.are_deterministic_algorithms_enabled(),
            "torch_config_sha": hashlib.sha256(torch.__config__.show().encode()).hexdigest()[:16]}


class Recorder:
    """Decides which steps are recorded, keeps the snapshot and trace of the step in progress, and writes the
    record. One per Trainer; every rank runs it (the gather and, under ZeRO-3, the snapshot are collectives)."""

    def __init__(self, trainer):
        self.tr = trainer
        cfg = trainer.cfg
        self.schedule = record_steps(cfg.record_batches)
        self.on_spike = bool(cfg.record_on_spike) and self.schedule != "off"
        params = trainer.backend.params
        # the whole (unpartitioned: ZeRO-3 keeps ds_numel) trainable state, the same figure on every rank
        numel = [getattr(p, "ds_numel", p.numel()) for p in params]
        self.state_bytes = sum(n * p.element_size() for n, p in zip(numel, params))
        if trainer.opt_steps_per_rollout > 1:  # a scheduled record then holds AdamW's two float32 moments too
            self.state_bytes += 8 * sum(numel)
        # a start state over the cap would make every scheduled record too large to keep (seed 000's 1.5B full
        # fine-tune on an H200: 6.2 GB copied off the GPU and written at each eval step, then dropped): such
        # records hold the batch alone, and rft replay starts them from the checkpoint of the step before
        self.snapshot_fits = self.state_bytes <= cfg.record_max_bytes
        # a spike candidate's state is copied every step: only when small, and never when a record could not keep
        # it (a spike record then holds the batch alone, as a scheduled one does, instead of being dropped whole)
        self.small = (not trainer.backend.partitions_params and self.state_bytes <= SNAPSHOT_MAX_BYTES
                      and self.snapshot_fits)
        # several optimizer steps per rollout: the steps after the first need AdamW's moments and the LR schedule
        # as they were, so the start state is the backend's own checkpoint files, a spike candidate's too
        self.several = trainer.opt_steps_per_rollout > 1 and trainer.backend.name in ("single", "ddp")
        self._said_no_snapshot = False
        self._reset()

    def _reset(self) -> None:
        self.reason: str | None = None
        self.tmp = None  # rank 0's records/.tmp_step_N_<pid> for a scheduled step
        self.snapshot: dict[str, torch.Tensor] | None = None  # a spike candidate's pre-update state (rank 0)
        self.rng: torch.Tensor | None = None
        self.seconds = 0.0

    def scheduled(self, step: int) -> str | None:
        """Why step ``step`` is recorded whatever happens in it ("eval", "all", "listed"), or None."""
        cfg, s = self.tr.cfg, self.schedule
        if s == "off":
            return None
        if s == "all":
            return "all"
        if s == "eval":
            return "eval" if step == cfg.num_steps or (cfg.eval_steps and step % cfg.eval_steps == 0) else None
        return "listed" if step in s else None

    def begin(self, step: int) -> None:
        """Before step ``step``'s update: take the snapshot and start the trace if the step may be recorded."""
        t = time.time()
        self._reset()
        self.reason = self.scheduled(step)
        if self.reason is None and not self.on_spike:
            return
        tr, D = self.tr, self.tr.dist
        self.rng = torch.get_rng_state()
        if self.reason is not None and not self.snapshot_fits:
            if D.is_main:
                self.tmp = records.begin(tr.run_dir, step)
                if not self._said_no_snapshot:
                    print(f"[rft] records hold no weights: the start state ({self.state_bytes / 2**30:.2f} GiB) is "
                          f"over record_max_bytes ({tr.cfg.record_max_bytes / 2**30:.2f} GiB); rft replay starts "
                          f"step N from the checkpoint of step N-1 (save_steps)", flush=True)
                    self._said_no_snapshot = True
        elif self.reason is not None or self.small:
            if self.several:  # the backend's files (single, ddp: rank 0 writes them, a spike candidate's too)
                if D.is_main:
                    self.tmp = records.begin(tr.run_dir, step)
                    tr.backend.save(self.tmp / "start")
            else:
                state = tr.backend.trainable_state() if (tr.backend.partitions_params or D.is_main) else None
                if D.is_main and self.reason is not None:
                    self.tmp = records.begin(tr.run_dir, step)
                    torch.save(state, self.tmp / "start" / "trainable.pt")
                elif D.is_main:
                    self.snapshot = state
        tr.trace = UpdateTrace()
        self.seconds += time.time() - t

    def finish(self, step: int, adv, upd, versions: list[int]) -> dict[str, Any]:
        """After step ``step``'s update: write the record when the step is scheduled or spiked. Returns {} when the
        step was not traced, else {"seconds": the snapshot, trace and write time (the row's timing/record), and
        "path": the record relative to the run directory when one was kept (rank 0; the spike log links it)}."""
        tr, D, cfg = self.tr, self.tr.dist, self.tr.cfg
        trace, tr.trace = tr.trace, None
        if trace is None:
            return {}
        t = time.time()
        g = upd.grad_norm_max
        spiked = not math.isfinite(g) or g > cfg.spike_grad_norm
        reason = self.reason or ("spike" if self.on_spike and spiked else None)
        if reason is None:
            records.abandon(self.tmp)  # a spike candidate's start files: the step did not spike
            self.seconds += time.time() - t
            out = {"seconds": self.seconds}
            self._reset()
            return out
        local = self._local(adv, trace, versions)
        parts = D.gather_to_main(local)
        row: dict[str, Any] = {}
        if D.is_main:
            tmp = self.tmp
            if tmp is None:  # a spike: the snapshot was kept in memory (or not taken: a large trainable state)
                tmp = records.begin(tr.run_dir, step)
                if self.snapshot is not None:
                    torch.save(self.snapshot, tmp / "start" / "trainable.pt")
            tensors = {f"r{r}/{k}": v for r, p in enumerate(parts) for k, v in p["tensors"].items()}
            texts = {"ranks": [p["texts"] for p in parts]}
            manifest = self._manifest(step, reason, trace, parts, versions)
            written = records.commit(tmp, tr.run_dir, step, tensors=tensors, manifest=manifest, texts=texts,
                                     max_bytes=cfg.record_max_bytes)
            if written.get("kept"):
                row["path"] = f"{records.RECORDS}/step_{step}"
            else:
                print(f"[rft] step {step}'s record was not kept: {written.get('why')}", flush=True)
        self.seconds += time.time() - t
        row["seconds"] = self.seconds
        self._reset()
        return row

    def _local(self, adv, trace: UpdateTrace, versions: list[int]) -> dict[str, Any]:
        """This rank's share of the record: its rows' tensors (host) and texts, and its micro-batch plan."""
        tr, ro = self.tr, adv.rollout
        N, T = ro.num_rows, ro.completion_ids.shape[1]
        E = tr.cfg.num_updates_per_rollout
        logp = torch.full((E, N, T), float("nan"))  # the update's own logprobs per pass; NaN: the row was not run
        ent = torch.full((N, T), float("nan"))
        for mb in trace.micro:
            rows, lp = torch.tensor(mb["rows"], dtype=torch.long), mb["logprobs"]
            logp[mb["epoch"], rows, :lp.shape[1]] = lp
            if mb["entropy"] is not None and mb["epoch"] == 0:
                ent[rows, :lp.shape[1]] = mb["entropy"]
        t = {"prompt_ids": ro.prompt_ids, "prompt_mask": ro.prompt_mask, "completion_ids": ro.completion_ids,
             "completion_mask": ro.completion_mask, "behaviour_logprobs": ro.behaviour_logprobs,
             "truncated": ro.truncated.to(torch.uint8), "advantages": adv.advantages, "loss_mask": adv.loss_mask,
             "rewards": torch.tensor(adv.rewards, dtype=torch.float32), "trainer_logprobs": logp, "entropy": ent,
             "versions": torch.tensor(versions, dtype=torch.int64)}
        if not torch.equal(ro.model_mask, ro.completion_mask):  # a multi-turn batch: environment tokens (mask 0)
            t["model_mask"] = ro.model_mask  # single-turn records stay as they were (replay defaults it)
        if adv.ref_logprobs is not None:
            t["ref_logprobs"] = adv.ref_logprobs
        if adv.old_logprobs is not None:
            t["old_logprobs"] = adv.old_logprobs
        if self.rng is not None:
            t["rng_torch"] = self.rng
        tensors = {k: v.detach().to("cpu").contiguous() for k, v in t.items()}
        G = tr.cfg.n_samples_per_prompt
        texts = {"completions": list(ro.texts), "diags": [dict(d) for d in adv.diags],
                 "examples": [{"prompt": e.prompt, "answer": e.answer, "id": getattr(e, "id", None)}
                              for e in adv.examples],
                 "indices": [int(i) for i in adv.indices], "group_size": G}
        micro = [{"k": m["k"], "epoch": m["epoch"], "rows": m["rows"], "loss": hexf(m["loss"]), "tokens": m["tokens"],
                  "metrics": m["metrics"]} for m in trace.micro]
        return {"tensors": tensors, "texts": texts, "micro": micro, "threads": torch.get_num_threads(),
                "opt_rows": [o["rows"] for o in trace.opt]}

    def _manifest(self, step: int, reason: str, trace: UpdateTrace, parts: list[dict], versions: list[int]):
        tr = self.tr
        opt = [{**{k: v for k, v in o.items() if k not in ("loss", "grad_norm", "lr")},
                "loss": hexf(o["loss"]), "grad_norm": hexf(o["grad_norm"]), "lr": hexf(o["lr"])} for o in trace.opt]
        return {"attempt": tr.run_dir.name, "reason": reason, "config": to_dict(tr.cfg),
                "world_size": tr.dist.world_size, "backend": tr.cfg.backend,
                "engine_shares_trainer_module": bool(tr.engine.shares_trainer_module), "on_policy": tr.on_policy,
                "policy_version": int(versions[0]) if versions else step - 1, "trainer_version": step - 1,
                "env": {**environment(tr), "threads_per_rank": [p["threads"] for p in parts]},
                "start_state_bytes": self.state_bytes, "snapshot_fits": self.snapshot_fits,
                "opt_steps": opt, "micro": [p["micro"] for p in parts], "opt_rows": [p["opt_rows"] for p in parts],
                "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
