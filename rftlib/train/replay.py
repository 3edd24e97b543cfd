"""Replay a recorded step's update, as it ran and under other losses (issue 33: ``rft replay``, replay.ipynb).

A record (rftlib.train.record) holds a step's whole batch, the weights its update started from (the snapshot), and
what the update computed: each micro-batch's loss and logprobs, each optimizer step's loss and grad norm, as exact
floats. A replay

1. **chooses the weights**: the record's snapshot, else the checkpoint of the step before
   (``training_state/step_{N-1}``: the state after N-1 updates is the one step N's update started from); any other
   checkpoint is refused unless asked for by name (``weights="ckpt:M"``), and then checked like the others;
2. **builds the trainer's own parts** for the recorded config (policy, backend, no engine: the batch is recorded)
   and runs **the trainer's own update** (rftlib.train.loop.Trainer.update) on the recorded rows, on as many ranks
   as recorded (``rft replay --nproc``: torchrun, like ``rft train``), with the recorded torch RNG state;
3. **checks it**: every micro-batch's logprobs against the recorded ones (the weights' fingerprint: a wrong
   checkpoint shows here first, as :class:`ReplayMismatch`), then each micro-batch's loss and each optimizer step's
   loss and grad norm. Where the environment is the recorded one (CPU, same torch build, CPU kernels, threads,
   autocast: ``environment_differences``), equality is bit for bit and anything else is NOT REPRODUCED. Where it
   differs, the recorded configuration's run is the **control**: its first micro-batch's logprobs are judged
   against this precision's measured noise as the sync probe judges an engine (:func:`precision_noise`,
   rftlib.rollout.sync_probe.sync_threshold), and a gap above it refuses the replay (wrong weights are caught in
   any environment); the control's own gap to the record (loss, grad norm, clip fractions) is reported as the
   environment's noise, and the verdict is CONTROLLED, no equality claimed;
4. **runs each counterfactual** (a set of loss settings: ``policy_loss=gspo``, ``eps_clip=0.1``, ...) at every
   optimizer step, on the same weights and rows, just before the optimizer step: the recorded gradient is set
   aside, the batch's backward runs again under the counterfactual's loss (rftlib.train.loop.Trainer.backward_batch,
   the update's own micro-batch pass), and the table gets its loss, gradient norm, the cosine with the recorded
   gradient, and the loss's own metrics, and its difference from the control (``d_loss``, ``d_grad_norm``, clip
   fractions: the recorded configuration as replayed here, never the record itself); then the recorded gradient
   is put back and the optimizer steps as recorded. Counterfactuals are *local*: each is evaluated at the recorded weights of each optimizer step.

Only settings that change the loss of the same batch can be varied (:data:`REPLAYABLE`); anything that would change
the batch (sampling, the model, the advantages) is refused with the field named.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import hashlib
import json
import math
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml

from rftlib.algo.loss_spec import AUTO, loss_settings_owners, loss_spec
from rftlib.algo.token_view import token_view
from rftlib.config import ConfigError, RunConfig, make_config, to_dict
from rftlib.models.forward import completion_logprobs
from rftlib.models.loading import Reference, is_peft
from rftlib.models.precision import float32_compute
from rftlib.monitor import records
from rftlib.rollout.base import Rollout
from rftlib.rollout.sync_probe import MARGIN, sync_threshold
from rftlib.settings import CISPOSettings, GMPOSettings, GSPOSettings, LossSettings, PPOClipSettings
from rftlib.train import steps
from rftlib.train.build import build
from rftlib.train.checkpoint import STATE, list_steps
from rftlib.train.dist import exit_rank, init_dist, shutdown_dist
from rftlib.train.loop import Trainer
from rftlib.train.phases import Advantaged
from rftlib.train.record import SNAPSHOT_MAX_BYTES, UpdateTrace, environment, hexf, unhex
from rftlib.train.torchrun import rank_env, torchrun_command
from rftlib.train.update_parts import rows_of

REPLAYABLE = (
    {"policy_loss", "tis_cap", "tis_level"}
    | {f.name for s in (LossSettings, PPOClipSettings, GSPOSettings, CISPOSettings, GMPOSettings)
       for f in dataclasses.fields(s)}
) - {"scale_rewards"}
"""the settings a counterfactual may change: the policy loss and its clip ranges, the aggregation and its
normalisers, the KL term, the entropy bonus, the TIS cap (a registered loss's own settings too).
scale_rewards changes the advantages: a different batch, refused."""

NOT_SHOWN = {
    "max_grad_norm": "the table gives each gradient before the optimizer's clip, and a counterfactual's gradient is "
                     "never stepped on: the clip would only scale it by min(1, max_grad_norm / grad_norm), which "
                     "the grad_norm column already tells",
}
"""settings a replay could accept but whose effect its table cannot show, refused with the reason"""


class ReplayError(Exception):
    """A replay that cannot run as asked (no record, no weights close enough, a setting that changes the batch)."""


class ReplayCrash(Exception):
    """The replay's ranks stopped without a result or a refusal (a crash): not a refusal, and named apart."""


class ReplayMismatch(ReplayError):
    """The replayed forward is not the recorded one: the weights are not the ones the update started from."""


@dataclass
class ReplayResult:
    """What a replay found. ``checks``: each compared figure {what, recorded, replayed, equal}; ``faithful``: every
    check equal bit for bit in the recorded environment (None when the environment differs: not claimed);
    ``table``: one row per config (the recorded one first) per optimizer step; ``notes``: what the reader must know."""

    run_dir: str
    step: int
    weights: str
    environment_differences: list[str]
    faithful: bool | None
    checks: list[dict[str, Any]]
    table: list[dict[str, Any]]
    counterfactuals: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)
    first_mismatch: str | None = None
    path: str | None = None
    control: dict[str, Any] | None = None
    """in another environment, the control's gap to the record: {max_abs_dlogp (first micro-batch of each rank),
    noise (this precision's, measured), threshold, opt_steps: [{opt_step, d_loss, d_grad_norm, d_clip_low_frac,
    d_clip_high_frac}] (control - record: the environment's own noise on the table's figures)}"""

    @property
    def verdict(self) -> str:
        """One line: FAITHFUL, NOT REPRODUCED (with the first mismatch), CONTROLLED (another environment: the
        control passed, rows are differences from it), or NOT CHECKED (nothing the weights could be checked on)."""
        if self.faithful is None and self.control is not None:
            c = self.control
            return (f"CONTROLLED: the environment differs ({'; '.join(self.environment_differences)}); the control "
                    f"(recorded config, weights {self.weights}, this environment) is {c['max_abs_dlogp']:.3g} from the "
                    f"recorded logprobs, within {c['threshold']:.3g} ({MARGIN:g} x this precision's noise "
                    f"{c['noise']:.3g}); every counterfactual row is read as its difference from the control")
        if self.faithful is None:
            why = "; ".join(self.environment_differences) or "; ".join(self.notes[:1])
            return f"NOT CHECKED ({why})"
        if self.faithful:
            n = sum(1 for c in self.checks)
            return f"FAITHFUL: {n} recorded figures reproduced bit for bit (weights: {self.weights})"
        return f"NOT REPRODUCED: {self.first_mismatch}"

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"verdict": self.verdict}


# ---- settings -------------------------------------------------------------------------------------------------
def parse_overrides(items: list[str] | dict[str, Any]) -> dict[str, Any]:
    """``["policy_loss=gspo", "eps_clip=0.1"]`` (or a dict) -> {name: value}, each value read as YAML."""
    if isinstance(items, dict):
        return dict(items)
    out = {}
    for it in items:
        if "=" not in it:
            raise ReplayError(f"counterfactual setting {it!r}: expected NAME=VALUE, e.g. policy_loss=gspo")
        k, v = it.split("=", 1)
        out[k.strip()] = yaml.safe_load(v)
    return out


def counterfactual_config(cfg: RunConfig, overrides: dict[str, Any]) -> RunConfig:
    """The recorded config with ``overrides``, checked by the config's own rules; a setting outside
    :data:`REPLAYABLE` (it would change the batch, not its loss) is refused by name."""
    own = set(loss_settings_owners())
    known = set(to_dict(cfg))
    for k in overrides:
        if k not in known and k not in own:
            near = difflib.get_close_matches(k, sorted(REPLAYABLE | own), n=1) or difflib.get_close_matches(
                k, sorted(known), n=1)
            raise ReplayError(f"counterfactual setting {k!r}: no such setting"
                              + (f" (did you mean {near[0]}?)" if near else ""))
        if k in NOT_SHOWN:
            raise ReplayError(f"counterfactual setting {k}: {NOT_SHOWN[k]}")
    if cfg.kl_in_reward and {"beta", "kl_estimator"} & set(overrides):
        raise ReplayError(f"counterfactual setting(s) {sorted({'beta', 'kl_estimator'} & set(overrides))}: this "
                          f"attempt subtracts the KL from the rewards before the advantages (kl_in_reward), so beta "
                          f"and kl_estimator change the advantages, the batch itself: train an attempt with them "
                          f"(rft ab)")
    bad = [k for k in overrides if k not in REPLAYABLE and k not in own]
    if bad:
        raise ReplayError(f"counterfactual setting(s) {bad}: a replay varies the loss of the recorded batch only "
                          f"({', '.join(sorted(REPLAYABLE))}, and a registered loss's own settings); "
                          f"{bad[0]} would change the batch itself: train an attempt with it (rft ab)")
    try:
        return make_config(None, {**to_dict(cfg), **overrides})
    except ConfigError as e:
        raise ReplayError(f"counterfactual {overrides}: {e}") from e


def own_aggregation(cfg: RunConfig, overrides: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """A policy loss asked for on an attempt whose aggregation it is not defined under (GSPO on Dr-GRPO's
    seq-mean-token-sum-norm) runs under its own (loss_agg_mode auto, in its label) instead of stopping the whole
    replay: (the overrides, a note saying so) or (the overrides as given, None)."""
    name, mode = overrides.get("policy_loss"), cfg.loss_agg_mode
    if name is None or "loss_agg_mode" in overrides or mode == AUTO:
        return overrides, None
    try:
        spec = loss_spec(name)
    except (KeyError, ValueError):
        return overrides, None  # an unknown loss: the config's check names the choices
    if spec.aggregations is None or mode in spec.aggregations:
        return overrides, None
    return {**overrides, "loss_agg_mode": AUTO}, (
        f"policy_loss={name} is not defined under this attempt's loss_agg_mode {mode} ({spec.why}): its rows run "
        f"under its own aggregation, {spec.default_aggregation} (loss_agg_mode=auto)")


def label(overrides: dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in overrides.items()) or "recorded"


# ---- weights --------------------------------------------------------------------------------------------------
def choose_weights(run_dir: str | Path, rec: records.Record, weights: str = "auto") -> tuple[str, Path]:
    """(description, directory holding trainable.pt [+ optimizer.pt, scheduler.pt]) of the weights step N's update
    started from. ``auto``: the record's snapshot, else training_state/step_{N-1}; ``snapshot``; ``ckpt:M``."""
    N = rec.step
    have = list_steps(run_dir)
    snap = rec.dir / "start"
    several = len(rec.manifest["opt_steps"]) > 1 and rec.manifest.get("backend", "single") in ("single", "ddp")
    if weights in ("auto", "snapshot") and (snap / "trainable.pt").exists():
        if not several or (snap / "optimizer.pt").exists() or weights == "snapshot":
            return f"record snapshot {rec.dir.name}/start", snap
        # the trainable tensors alone (a spike record written before issue 43): optimizer steps after the first
        # need AdamW's moments and the LR schedule, which the checkpoint of the step before holds
        if N - 1 in have:
            return f"checkpoint {STATE}/step_{N - 1}", Path(run_dir) / STATE / f"step_{N - 1}"
        raise ReplayError(f"step {N} ran {len(rec.manifest['opt_steps'])} optimizer steps; the record's snapshot holds "
                          f"the trainable tensors alone (no optimizer moments, no LR schedule), so only its first "
                          f"optimizer step could be reproduced, and the attempt has no checkpoint step_{N - 1}: "
                          f"--weights snapshot replays it anyway (steps after the first will differ)")
    if weights in ("auto", "snapshot"):
        if weights == "snapshot":
            raise ReplayError(f"{rec.dir}: the record has no snapshot of the weights (a spike of a trainable state "
                              f"over 256 MiB, or a start state over record_max_bytes); use --weights auto or "
                              f"ckpt:{N - 1}")
        if N - 1 in have:
            return f"checkpoint {STATE}/step_{N - 1}", Path(run_dir) / STATE / f"step_{N - 1}"
        near = min(have, key=lambda s: abs(s - (N - 1))) if have else None
        where = (f"the nearest checkpoint is step_{near}, {abs(near - (N - 1))} update(s) away" if near is not None
                 else "the attempt has no checkpoint")
        raise ReplayError(f"step {N}'s update started from the weights after step {N - 1}; the record has no snapshot "
                          f"({why_no_snapshot(rec.manifest)}) and {where}. To replay such a step, checkpoint the step "
                          f"before it and keep that checkpoint (save_steps dividing {N - 1}, max_ckpt_num large "
                          f"enough), or let records hold the weights (see why above)")
    if weights.startswith("ckpt:"):
        m = weights[5:]
        d = Path(run_dir) / STATE / f"step_{m}"
        if not (d / "trainable.pt").exists():
            raise ReplayError(f"{d}: no such checkpoint (checkpoints of this attempt: {list_steps(run_dir)})")
        return f"checkpoint {STATE}/step_{m}", d
    raise ReplayError(f"weights={weights!r}: expected auto, snapshot or ckpt:M")


def why_no_snapshot(m: dict[str, Any]) -> str:
    """Why a record holds no weights, and what would have kept them (from its manifest)."""
    size = m.get("start_state_bytes")
    gib = "" if size is None else f" ({size / 2**30:.3g} GiB)"
    if m.get("snapshot_fits") is False:
        return (f"the start state{gib} is over record_max_bytes ({m['config'].get('record_max_bytes')}): a larger "
                f"record_max_bytes keeps it")
    if m.get("reason") == "spike":
        return (f"a spike record copies the start state{gib} only when it is at most "
                f"{SNAPSHOT_MAX_BYTES >> 20} MiB and not partitioned (ZeRO-3): name the step in record_batches "
                f"before the step runs")
    return "removed after it was written"


# ---- the trainer without an engine ----------------------------------------------------------------------------
class RecordedEngine:
    """The rollout engine of a replay: the batch is recorded, so nothing generates. It answers what the update asks
    of an engine (whether it shares the trainer's module: on-policy old logprobs, TIS weights)."""

    shared_across_ranks = False
    adapter = None

    def __init__(self):
        self.shares_trainer_module = True  # while the Trainer is built: no first sync to make (set after)

    def generate(self, *a, **k):
        raise RuntimeError("a replay does not generate: the batch is the recorded one")

    def sync_weights(self, *a, **k) -> dict:
        return {"seconds": 0.0, "bytes": 0, "probe_max_diff": 0.0}

    def close(self) -> None:
        pass


def replay_config(manifest: dict[str, Any], *, world_size: int) -> RunConfig:
    """The recorded config as a replay runs it: nothing recorded again, synchronous, on the recorded number of
    ranks, under the recorded backend (ddp on one process runs as single, the same torch update; a one-process
    DeepSpeed record stays DeepSpeed: its engine's step is what the record holds, and its counterfactual guard
    applies)."""
    d = dict(manifest["config"])
    d.update(record_batches=[], max_staleness=0, report_to=[])
    if world_size == 1 and d.get("backend") == "ddp":
        d["backend"] = "single"
    try:
        return make_config(None, d)
    except ConfigError as e:
        raise ReplayError(f"the recorded config no longer loads: {e}") from e


def build_trainer(cfg: RunConfig, manifest: dict[str, Any], dist=None):
    """A Trainer over the recorded config's parts in a scratch directory (removed by :func:`close_trainer`), with
    :class:`RecordedEngine` standing in for the engine the attempt sampled with."""
    scratch = Path(tempfile.mkdtemp(prefix="rft-replay-"))
    engine = RecordedEngine()
    parts = build(cfg, scratch, dist=dist, engine=engine)
    tr = Trainer(cfg, scratch, parts=parts, progress=False)
    engine.shares_trainer_module = bool(manifest["engine_shares_trainer_module"])
    tr.on_policy = bool(manifest["on_policy"])
    return tr


def close_trainer(tr) -> None:
    scratch = tr.run_dir
    try:
        tr.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def load_weights(tr, d: Path) -> None:
    """The update's starting state from ``d``, through the backend (under ZeRO-3 the parameters are partitioned: a
    whole tensor goes in gathered): the whole checkpoint when the directory holds the optimizer (several optimizer
    steps per rollout: the steps after the first need it; a DeepSpeed checkpoint), else the trainable tensors."""
    if tr.backend.checkpoint_holds_optimizer(d):
        tr.backend.load(d)
    else:
        tr.backend.load_trainable(torch.load(d / "trainable.pt", weights_only=True, map_location="cpu"))


def advantaged(rec: records.Record, rank: int, device: torch.device):
    """Rank ``rank``'s recorded batch as the update takes it (rftlib.train.phases.Advantaged)."""
    t = rec.rank(rank)
    texts = rec.texts["ranks"][rank]
    ro = Rollout(prompt_ids=t["prompt_ids"], prompt_mask=t["prompt_mask"], completion_ids=t["completion_ids"],
                 completion_mask=t["completion_mask"], behaviour_logprobs=t["behaviour_logprobs"],
                 truncated=t["truncated"].bool(), texts=texts["completions"], group_size=texts["group_size"],
                 model_mask=t.get("model_mask")).to(device)  # absent: a single-turn record (= completion_mask)
    return Advantaged(rollout=ro, examples=[], indices=texts["indices"], rewards=t["rewards"].tolist(),
                      diags=texts["diags"], advantages=t["advantages"], loss_mask=t["loss_mask"].to(device),
                      ref_logprobs=t["ref_logprobs"].to(device) if "ref_logprobs" in t else None,
                      old_logprobs=t["old_logprobs"].to(device) if "old_logprobs" in t else None)


def environment_differences(recorded: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """What differs between the recorded environment and this one among the things that decide bit-for-bit
    equality (an empty list: equality is expected)."""
    out = []
    for k in ("torch", "device", "amp", "cpu_capability", "aten_cpu_capability", "torch_config_sha", "deterministic"):
        if recorded.get(k) != now.get(k):
            out.append(f"{k}: recorded {recorded.get(k)!r}, now {now.get(k)!r}")
    if recorded.get("device") != "cpu" or now.get("device") != "cpu":
        out.append("not a CPU: GPU kernels are not bitwise reproducible across runs")
    return out


# ---- the control (another environment) ------------------------------------------------------------------------
@torch.no_grad()
def precision_noise(tr, batch, rows: list[int], recorded_amp: str | None) -> float:
    """This precision's own noise on the rows of a micro-batch, measured as the sync probe measures it
    (rftlib.rollout.sync_probe): max |logp in the compute precision - logp in a finer one| over the rows' completion
    tokens, in eval mode, on the weights as loaded. The compute precisions are this environment's and the record's
    (another autocast dtype is itself a difference): each one's forward under autocast is measured against the
    float32 forward (rftlib.models.precision.float32_compute); float32 itself against float64 (the model's weights
    converted for one forward and back: float32 -> float64 -> float32 is exact; partitioned ZeRO-3 weights are
    not converted, and their float32 gets the sync probe's float32 floor, vllm_sync_probe_tol / MARGIN). Two
    honest forwards in one precision through other kernels (another thread count, ISA, device) are each about
    this far from the finer result, so their gap is at most about twice it; the control accepts ``MARGIN`` times
    it (sync_threshold)."""
    r = rows_of(batch.rollout, torch.tensor(rows, dtype=torch.long))
    mask = r["completion_mask"] > 0  # (n, T')
    kw = dict(temperature=tr.cfg.temperature, chunk_size=tr.logprob_chunk_size, with_entropy=False,
              checkpoint_chunks=False)
    dev = tr.dist.device.type
    amps = {tr.amp, None if recorded_amp in (None, "None") else getattr(torch, recorded_amp)}
    model, noise = tr.model, 0.0
    half_weights = next(model.parameters()).dtype in (torch.bfloat16, torch.float16)
    tr.backend.train(False)
    try:
        for amp in amps:
            with torch.autocast(dev, dtype=amp) if amp is not None else contextlib.nullcontext():
                here = completion_logprobs(model, **r, **kw)[0].double()  # (n, T') in this compute precision
            if amp is not None or half_weights:
                with float32_compute(dev, model):
                    ref = completion_logprobs(model, **r, **kw)[0].double()  # (n, T') every operation in float32
            elif tr.backend.partitions_params:  # no float64 copy of partitioned weights: the sync probe's floor
                noise = max(noise, tr.cfg.vllm_sync_probe_tol / MARGIN)
                continue
            else:
                model.double()
                try:
                    ref = completion_logprobs(model, **r, **kw)[0]  # (n, T') float64
                finally:
                    model.float()
            noise = max(noise, float((here - ref).abs()[mask].max()) if mask.any() else 0.0)
    finally:
        tr.backend.train(True)
    return noise


@torch.no_grad()
def reference_logprobs(tr, batch) -> torch.Tensor:
    """(N, T) the KL reference's logprobs of the recorded rows, for a counterfactual with a KL term on a record
    that kept none (trained with beta 0): as the trainer's advantages phase computes them
    (Trainer.reference_and_old_logprobs: the adapter disabled under LoRA, else the weights as first built), in
    eval mode, no grad."""
    tr.backend.train(False)
    try:
        with tr.ref.active() as ref_model:
            return tr.no_grad_logprobs(batch.rollout, None if ref_model is tr.model else ref_model)  # (N, T)
    finally:
        tr.backend.train(True)


def control_gap(rec: records.Record, rank: int, trace: UpdateTrace) -> float | None:
    """max |control - recorded| logprob over the completion tokens of this rank's first micro-batch (None when
    no micro-batch ran, or its rows are not the recorded ones)."""
    plan = rec.manifest["micro"][rank]
    if not plan or not trace.micro or plan[0]["rows"] != trace.micro[0]["rows"]:
        return None
    t = rec.rank(rank)
    ix = torch.tensor(plan[0]["rows"], dtype=torch.long)
    lp = trace.micro[0]["logprobs"]  # (n, T')
    want = t["trainer_logprobs"][plan[0]["epoch"], ix, :lp.shape[1]]  # (n, T')
    mask = t["completion_mask"][ix, :lp.shape[1]] > 0
    return float((lp - want).abs()[mask].max()) if mask.any() else 0.0


def recorded_clip_fractions(rec: records.Record, k: int, loss_kw: dict[str, Any]) -> dict[str, float]:
    """The record's own clip fractions at optimizer step ``k`` (every rank's tokens): its update's logprobs, old
    logprobs, advantages and loss mask through the loss's own view, as :class:`ClipSides` counts the replay's."""
    sides = ClipSides()
    for r in range(rec.world_size):
        t = rec.rank(r)
        for p in rec.manifest["micro"][r]:
            if p["k"] != k:
                continue
            ix = torch.tensor(p["rows"], dtype=torch.long)
            mask = t["loss_mask"][ix].float()  # (n, T)
            lp = torch.nan_to_num(t["trainer_logprobs"][p["epoch"], ix].float()) * (mask > 0)  # (n, T)
            old = lp if "old_logprobs" not in t else t["old_logprobs"][ix].float() * (mask > 0)
            sides.add(lp, old, t["advantages"][ix].float(), mask, loss_kw)
    return sides.result()


# ---- one rank's replay ----------------------------------------------------------------------------------------
class ReplayTrace(UpdateTrace):
    """The replay's trace: what the update computes, plus at each optimizer step (before it steps) the
    counterfactuals on the same weights and rows."""

    def __init__(self, counterfactuals: list[tuple[str, RunConfig]], ref_logprobs: torch.Tensor | None = None):
        super().__init__()
        self.counterfactuals = counterfactuals
        self.ref_logprobs = ref_logprobs  # (N, T) computed by the replay when a counterfactual's KL needs them
        self.rows: list[dict[str, Any]] = []  # the table rows, per optimizer step and config

    def before_step(self, trainer, batch, advantages, *, epoch, rows, micro, totals, loss_kw, loss) -> None:
        super().before_step(trainer, batch, advantages, epoch=epoch, rows=rows, micro=micro, totals=totals,
                            loss_kw=loss_kw, loss=loss)
        k = len(self.opt) - 1
        params = trainer.backend.params
        saved = [p.grad for p in params]  # what the step goes on with, put back after the counterfactuals
        recorded = [None if g is None else g.detach().clone() for g in trainer.backend.full_grads()]
        g_rec = _flat(recorded, params)  # (P,) this optimizer batch's gradient (all ranks': DDP reduced it)
        sides = ClipSides()
        for mb in (m for m in self.micro if m["k"] == k):
            ix = torch.tensor(mb["rows"], dtype=torch.long)
            lp = mb["logprobs"]  # (n, T') host
            t1 = lp.shape[1]
            old = lp if batch.old_logprobs is None else batch.old_logprobs[ix, :t1].float().cpu()
            sides.add(lp, old, advantages[ix].float().cpu(), batch.loss_mask[ix, :t1].float().cpu(), loss_kw)
        D = trainer.dist
        mine = [(m["tokens"], m["metrics"]) for m in self.micro if m["k"] == k]
        self.rows.append(_table_row(k, "recorded", loss, g_rec, g_rec, _all_ranks(D, sides, mine)))
        cfg0 = trainer.cfg
        for name, cf in self.counterfactuals:
            for p in params:
                p.grad = None
            mets: list[tuple[float, dict[str, float]]] = []
            sides = ClipSides()
            trainer.cfg = cf  # the micro-batch pass reads the TIS cap and entropy bonus off the trainer's config
            try:
                kw = steps.loss_kwargs(cf)
                # the rows the trainer would run under this loss: the recorded plan left out zero-advantage rows,
                # which a KL term or an entropy bonus still gives a gradient (Trainer.skips_rows)
                cf_micro = trainer.micro_batches(batch.rollout, rows, advantages, batch.loss_mask,
                                                 trainer.skips_rows())
                cf_batch = batch
                if cf.kl_in_loss and batch.ref_logprobs is None:
                    cf_batch = dataclasses.replace(batch, ref_logprobs=self.ref_logprobs)

                def after(ix, fwd, l, m, old, kw=kw, sides=sides, mets=mets):
                    mask = fwd.rows["completion_mask"]  # (n, T')
                    mets.append((float(mask.sum()), {a: float(b) for a, b in m.items()}))
                    sides.add(fwd.logprobs.detach().float().cpu(), old.detach().float().cpu(),
                              advantages[ix].float().cpu(), batch.loss_mask[ix, :mask.shape[1]].float().cpu(), kw)
                ns, nt = steps.loss_totals(cf, batch.loss_mask[rows], trainer.dist.all_sum)
                tot = dict(num_seqs=ns, num_tokens=nt, norm_const=(cf.loss_norm_const if cf.loss_norm_const
                                                                    is not None else float(cf.max_new_tokens)))
                local = trainer.backward_batch(cf_batch, advantages, cf_micro, epoch=epoch, totals=tot, loss_kw=kw,
                                               after=after)
                if not cf_micro:
                    trainer.zero_backward()
                cf_loss = float(trainer.dist.all_sum(torch.tensor([local], device=trainer.dist.device))[0])
            finally:
                trainer.cfg = cfg0
            g_cf = _flat([p.grad for p in params], params)
            self.rows.append(_table_row(k, name, cf_loss, g_cf, g_rec, _all_ranks(D, sides, mets)))
        for p, g in zip(params, saved):  # the recorded gradient as the backend holds it (DeepSpeed: in its partitions)
            p.grad = g



def _all_ranks(dist, sides: "ClipSides", mets: list[tuple[float, dict[str, float]]]) -> dict[str, float]:
    """The table's loss metrics over every rank's tokens of one optimizer batch: each rank's clip-side counts and
    (tokens, metrics) pairs are gathered (small: a few floats per micro-batch; every rank calls this at the same
    optimizer step, as DDP's reduction already makes them) and combined as on one rank."""
    parts = dist.gather_objects(((sides.low, sides.high, sides.tokens), mets))
    total = ClipSides()
    for (low, high, tokens), _ in parts:
        total.low, total.high, total.tokens = total.low + low, total.high + high, total.tokens + tokens
    return {**_weighted([m for _, ms in parts for m in ms]), **total.result()}


class ClipSides:
    """Which side each token of an optimizer batch was clipped on, as the loss itself decides it
    (rftlib.algo.token_view.token_view: the loss's own view), counted over this rank's valid tokens (the table sums
    the ranks' counts: :func:`_all_ranks`)."""

    def __init__(self):
        self.low = self.high = self.tokens = 0.0

    def add(self, logp, old, adv, mask, loss_kw) -> None:
        """One micro-batch: logp, old, mask (n, T') host; adv (n,)."""
        v = token_view(logp, old, adv, mask, loss_kwargs=loss_kw)
        valid = mask > 0
        self.low += float((v["clip"][valid] < 0).sum())
        self.high += float((v["clip"][valid] > 0).sum())
        self.tokens += float(valid.sum())

    def result(self) -> dict[str, float]:
        n = max(self.tokens, 1.0)
        return {"clip_low_frac": self.low / n, "clip_high_frac": self.high / n}


def _flat(grads, params) -> torch.Tensor:
    return torch.cat([(torch.zeros_like(p) if g is None else g).reshape(-1).double() for g, p in zip(grads, params)])


def _weighted(mets: list[tuple[float, dict[str, float]]]) -> dict[str, float]:
    """Token-weighted means of the loss's per-micro-batch metrics (max for *_max)."""
    if not mets:
        return {}
    keys = sorted({k for _, m in mets for k in m})
    tot = sum(w for w, _ in mets) or 1.0
    out = {}
    for k in keys:
        vals = [(w, m[k]) for w, m in mets if k in m]
        out[k] = max(v for _, v in vals) if k.endswith("_max") else sum(w * v for w, v in vals) / tot
    return out


def table_metric(key: str) -> bool:
    """The loss metrics a replay table shows, token-weighted over every rank's micro-batches: clip fractions, ratio maxima, the KL to the old and reference policy, entropy (every built-in
    loss names its own clip metric: ppo_clip_ratio, seq_clip_frac, ...). Not the per-micro-batch policy_loss: it is
    a share of a sum normalised by the batch's totals, so its mean means nothing (the table's loss is the sum)."""
    return key.endswith(("clip_frac", "clip_ratio", "ratio_max")) or key in (
        "clip_low_frac", "clip_high_frac", "approx_kl_old", "kl", "entropy_mean")


def _table_row(k: int, name: str, loss: float, g: torch.Tensor, g_rec: torch.Tensor, mets: dict[str, float]):
    mets = {key: v for key, v in mets.items() if table_metric(key)}
    norm = float(g.norm())
    den = norm * float(g_rec.norm())
    cos = float(g @ g_rec) / den if den > 0 else float("nan")
    return {"opt_step": k, "config": name, "loss": loss, "grad_norm": norm, "cos_rec": cos, **mets}


def replay_rank(run_dir: str | Path, step: int, *, weights: str = "auto", counterfactuals=(), dist=None,
                rec: records.Record | None = None) -> dict[str, Any]:
    """This process's part of a replay (one rank of the recorded world size): runs the update, compares its own
    micro-batches, and returns the figures (rank 0's dict also holds the optimizer steps' and the table)."""
    rec = rec or records.read_record(run_dir, step)
    m = rec.manifest
    W = dist.world_size if dist is not None else 1
    if W != rec.world_size:
        raise ReplayError(f"step {step} was recorded on {rec.world_size} rank(s); this replay runs {W}: run it with "
                          f"--nproc {rec.world_size} (the same rows per rank are what make it equal)")
    cfg = replay_config(m, world_size=W)
    cfs = [(label(o), counterfactual_config(cfg, o)) for o in counterfactuals]
    if cfs and cfg.backend not in ("single", "ddp"):
        raise ReplayError(f"counterfactual gradients need whole gradients in the parameters (backends single, ddp); "
                          f"step {step} ran under {cfg.backend}, which partitions them: replay it without "
                          f"counterfactuals (the faithfulness check), or record an attempt under ddp")
    desc, wdir = choose_weights(run_dir, rec, weights)
    needs_ref = any(cf.kl_in_loss for _, cf in cfs) and "ref_logprobs" not in rec.rank(0)
    tr = build_trainer(cfg, m, dist)
    try:
        if needs_ref and not is_peft(tr.model):  # the reference of a full fine-tune: the weights as built, kept
            tr.ref = Reference(tr.model, needed=True)  # before the chosen weights are loaded
        load_weights(tr, wdir)
        D = tr.dist
        t = rec.rank(D.rank)
        batch = advantaged(rec, D.rank, D.device)
        env_now = environment(tr)
        diffs = environment_differences(m["env"], env_now)
        threads = m["env"].get("threads_per_rank", [])
        if D.rank < len(threads) and threads[D.rank] != env_now["threads"]:
            diffs.append(f"threads on rank {D.rank}: recorded {threads[D.rank]}, now {env_now['threads']} (set "
                         f"torch_threads, or OMP_NUM_THREADS)")
        plan = m["micro"][D.rank]
        noise = None  # in another environment: the precision's noise, measured before the update moves the weights
        if diffs and plan:
            noise = precision_noise(tr, batch, plan[0]["rows"], m["env"].get("amp"))
        ref = reference_logprobs(tr, batch) if needs_ref else None
        if "rng_torch" in t:
            torch.set_rng_state(t["rng_torch"])
        tr.step_num = step - 1  # the update's row order is drawn from (seed, step, rank)
        trace = ReplayTrace(cfs, ref)
        tr.trace = trace
        try:
            upd = tr.update(batch)
        finally:
            tr.trace = None
    finally:
        close_trainer(tr)
    checks = _micro_checks(rec, D.rank, trace)
    out = {"rank": D.rank, "checks": checks, "env_differences": diffs, "weights": desc,
           "control": None if noise is None else {"gap": control_gap(rec, D.rank, trace), "noise": noise}}
    if D.is_main:
        out["opt_checks"] = [c for k, o in enumerate(m["opt_steps"]) for c in (
            _check(f"optimizer step {k}: loss", unhex(o["loss"]), upd.loss[k] if k < len(upd.loss) else None),
            _check(f"optimizer step {k}: grad_norm", unhex(o["grad_norm"]),
                   upd.grad_norm[k] if k < len(upd.grad_norm) else None))]
        out["table"] = trace.rows
    return out


def _check(what: str, recorded: float, replayed: float | None, gap: float | None = None) -> dict[str, Any]:
    eq = replayed is not None and (recorded == replayed or (math.isnan(recorded) and math.isnan(replayed)))
    return {"what": what, "recorded": recorded, "replayed": replayed, "equal": bool(eq),
            "recorded_hex": hexf(recorded), "replayed_hex": None if replayed is None else hexf(replayed),
            **({"max_abs_gap": gap} if gap is not None else {})}


def _micro_checks(rec: records.Record, rank: int, trace: UpdateTrace) -> list[dict[str, Any]]:
    """Each of this rank's micro-batches: rows as recorded, logprobs bit for bit (the weights' fingerprint), loss."""
    plan = rec.manifest["micro"][rank]
    t = rec.rank(rank)
    rec_lp = t["trainer_logprobs"]  # (E, N, T)
    out = []
    if len(plan) != len(trace.micro):
        out.append({"what": f"rank {rank}: micro-batches", "recorded": len(plan), "replayed": len(trace.micro),
                    "equal": False})
        return out
    for j, (p, mb) in enumerate(zip(plan, trace.micro)):
        where = f"rank {rank} optimizer step {p['k']} micro-batch {j}"
        if p["rows"] != mb["rows"]:
            out.append({"what": f"{where}: rows", "recorded": p["rows"], "replayed": mb["rows"], "equal": False})
            continue
        lp = mb["logprobs"]  # (n, T')
        want = rec_lp[p["epoch"], torch.tensor(p["rows"]), :lp.shape[1]]
        gap = float((lp - want).abs().max()) if lp.numel() else 0.0
        out.append({"what": f"{where}: logprobs ({lp.numel()} values)", "recorded": 0.0, "replayed": gap,
                    "equal": bool(torch.equal(lp, want)), "max_abs_gap": gap})
        out.append(_check(f"{where}: loss", unhex(p["loss"]), mb["loss"]))
    return out


# ---- the whole replay -----------------------------------------------------------------------------------------
def replay(run_dir: str | Path, step: int, counterfactuals: list[dict[str, Any]] | None = None, *,
           weights: str = "auto", save: bool = True, nproc: int | None = None) -> ReplayResult:
    """Replay step ``step`` of the attempt at ``run_dir`` (see the module docstring); ``counterfactuals``: a list of
    override dicts ({"policy_loss": "gspo"}, ...). A record of several ranks runs them under torchrun (``nproc``
    defaults to the recorded world size). Raises ReplayMismatch when the weights are not the ones the update
    started from; ReplayError when it cannot run. ``save`` writes the result into the record's replays/."""
    run_dir = Path(run_dir)
    rec = records.read_record(run_dir, step)
    W = nproc or rec.world_size
    cfg = replay_config(rec.manifest, world_size=rec.world_size)
    cfs, notes = [], []
    for c in counterfactuals or []:
        o, note = own_aggregation(cfg, parse_overrides(c))
        cfs.append(o)
        notes += [note] if note else []
    if W == 1:
        parts = [replay_rank(run_dir, step, weights=weights, counterfactuals=cfs, rec=rec)]
    else:
        parts = _replay_ranks(run_dir, step, W, weights=weights, counterfactuals=cfs)
    return _result(run_dir, rec, parts, cfs, save=save, notes=notes)


def _replay_ranks(run_dir: Path, step: int, nproc: int, *, weights: str, counterfactuals) -> list[dict[str, Any]]:
    """Run :func:`replay_rank` on ``nproc`` ranks (torchrun, rftlib.cli replay --rank-worker); their dicts. A
    refusal on the ranks (ReplayError, written by rank 0) is raised as such; anything else that stops them is a
    :class:`ReplayCrash` naming the ranks' whole output, kept in a log file."""
    tmp = Path(tempfile.mkdtemp(prefix="rft-replay-ranks-"))
    out = tmp / "ranks.json"
    args = ["replay", str(run_dir), "--step", str(step), "--weights", weights, "--rank-worker", str(out)]
    for c in counterfactuals:
        args += ["--cf-json", json.dumps(c)]
    p = subprocess.run(torchrun_command(nproc, args), env=rank_env(), capture_output=True, text=True)
    got = json.loads(out.read_text()) if out.exists() else None
    if isinstance(got, dict) and "refused" in got:  # a ReplayError on the ranks: a refusal, not a crash
        shutil.rmtree(tmp, ignore_errors=True)
        raise (ReplayMismatch if got.get("mismatch") else ReplayError)(got["refused"])
    if p.returncode != 0 or got is None:
        log = tmp / "ranks.log"
        log.write_text(p.stdout + p.stderr)
        tail = "\n".join((p.stdout + p.stderr).splitlines()[-30:])
        raise ReplayCrash(f"the {nproc} replay ranks stopped (exit {p.returncode}) without a result; the ranks' whole "
                          f"output: {log}\nits last lines:\n{tail}")
    shutil.rmtree(tmp, ignore_errors=True)
    return got


def rank_worker(run_dir: str, step: int, weights: str, counterfactuals: list[dict[str, Any]], out: str) -> None:
    """One torchrun rank of a multi-rank replay: rank 0 writes every rank's dict to ``out`` (or, when the replay is
    refused on the ranks, {"refused": the reason, "mismatch": whether the weights were wrong})."""
    rec = records.read_record(run_dir, step)
    dist = init_dist(make_config(None, {**rec.manifest["config"], "record_batches": []}))
    try:
        part = replay_rank(run_dir, step, weights=weights, counterfactuals=counterfactuals, dist=dist, rec=rec)
        parts = dist.gather_objects(part)
    except ReplayError as e:  # every rank refuses alike (the same record, weights and settings)
        parts = {"refused": str(e), "mismatch": isinstance(e, ReplayMismatch)}
    if dist.is_main:
        tmp = out + ".tmp"
        Path(tmp).write_text(json.dumps(parts))
        os.replace(tmp, out)
    shutdown_dist()
    exit_rank(0)  # gloo's threads can abort at interpreter exit once all is written (rftlib.train.dist.exit_rank)


def _result(run_dir: Path, rec: records.Record, parts: list[dict[str, Any]], cfs, *, save: bool,
            notes: list[str] = ()) -> ReplayResult:
    """Every rank's figures -> the verdict. In the recorded environment the first micro-batch's logprobs must equal
    the record's bit for bit (else :class:`ReplayMismatch`) and the verdict is FAITHFUL or NOT REPRODUCED; in
    another, the recorded configuration's run is the control (:func:`_control`): refused above this precision's
    noise, else every counterfactual row is read as its difference from it (``d_*`` columns)."""
    main = parts[0]
    checks = [c for p in parts for c in p["checks"]] + main["opt_checks"]
    diffs = sorted({d for p in parts for d in p["env_differences"]})
    lp = [c for c in checks if "logprobs" in c["what"]]
    notes = list(notes)
    if not lp:  # first: the NOT CHECKED verdict names it
        notes.insert(0, "no micro-batch ran (every row's advantage 0 or its loss mask empty): the update computed no "
                     "logprob, so nothing here depends on the weights and nothing checks them; the optimizer step "
                     "saw a zero gradient")
    if lp and not lp[0]["equal"] and not diffs:
        raise ReplayMismatch(
            f"{lp[0]['what']}: the replayed forward differs from the recorded one by max |dlogp| = "
            f"{lp[0]['max_abs_gap']:.3g} (bit-for-bit expected in this environment): these are not the weights step "
            f"{rec.step} started from ({main['weights']})")
    bad = [c for c in checks if not c["equal"]]
    control = _control(rec, parts, main, diffs) if diffs and lp else None
    faithful = None if (diffs or not lp) else not bad
    if rec.manifest.get("on_policy"):
        notes.append("on-policy step (one optimizer step, the trainer's own module sampled): every ratio is exactly "
                     "1, so no token is clipped under any clip range; losses differ only by their aggregation")
    if len(rec.manifest["opt_steps"]) > 1:
        notes.append("several optimizer steps: each counterfactual is evaluated at the recorded weights of each "
                     "optimizer step (local), not along its own trajectory")
    table = differences_from_control(main["table"], "control" if control is not None else "recorded")
    res = ReplayResult(run_dir=str(run_dir), step=rec.step, weights=main["weights"], environment_differences=diffs,
                       faithful=faithful, checks=checks, table=table, counterfactuals=cfs, notes=notes,
                       first_mismatch=None if not bad else _describe(bad[0]), control=control)
    if save:
        res.path = str(save_result(rec, res))  # its views: rftlib.report.replay_views.refresh_after_replay
    return res


CONTROL_FIGURES = ("loss", "grad_norm", "clip_low_frac", "clip_high_frac")
"""the figures a counterfactual row is read against the control on (``d_*``), and the control against the record"""


def _control(rec: records.Record, parts: list[dict[str, Any]], main: dict[str, Any], diffs: list[str]):
    """The control of a replay in another environment: the recorded configuration on the chosen weights, here.
    Its first micro-batch's logprobs (each rank's) against the recorded ones, judged against this precision's
    measured noise (:func:`precision_noise`, times MARGIN: rftlib.rollout.sync_probe.sync_threshold): above it,
    :class:`ReplayMismatch`. Returns ReplayResult.control: the gap, noise, threshold and, per optimizer step, the
    control's own gap to the record on the table's figures (the environment's noise)."""
    ctl = [p["control"] for p in parts if p.get("control") is not None]
    gaps = [c["gap"] for c in ctl if c["gap"] is not None]
    noise = max((c["noise"] for c in ctl), default=0.0)
    limit = sync_threshold(noise)
    gap = max(gaps, default=0.0)
    if not gaps or gap > limit:
        raise ReplayMismatch(
            f"the control (the recorded config on {main['weights']}, in this environment: {'; '.join(diffs)}) "
            + ("ran no recorded micro-batch: its rows are not the recorded ones" if not gaps else
               f"differs from the recorded first micro-batch by max |dlogp| = {gap:.3g}, over {limit:.3g} "
               f"({MARGIN:g} x this precision's noise {noise:.3g})")
            + f": these are not the weights step {rec.step} started from")
    kw = steps.loss_kwargs(replay_config(rec.manifest, world_size=rec.world_size))
    replayed = {c["what"]: c["replayed"] for c in main["opt_checks"]}
    rows = {r["opt_step"]: r for r in main["table"] if r["config"] == "recorded"}
    per = []
    for k, o in enumerate(rec.manifest["opt_steps"]):
        clip = recorded_clip_fractions(rec, k, kw)
        loss, norm, row = replayed.get(f"optimizer step {k}: loss"), replayed.get(f"optimizer step {k}: grad_norm"), \
            rows.get(k, {})
        per.append({"opt_step": k,
                    "d_loss": None if loss is None else loss - unhex(o["loss"]),
                    "d_grad_norm": None if norm is None else norm - unhex(o["grad_norm"]),
                    **{f"d_{c}": row[c] - clip[c] for c in ("clip_low_frac", "clip_high_frac") if c in row}})
    return {"max_abs_dlogp": gap, "noise": noise, "threshold": limit, "opt_steps": per}


def differences_from_control(table: list[dict[str, Any]], control: str) -> list[dict[str, Any]]:
    """The table with the recorded configuration's rows named ``control`` (another environment) and every other
    row given ``d_<figure>``: its figure minus the control's at the same optimizer step (CONTROL_FIGURES). In the
    recorded environment the control is the record bit for bit, so the differences are from the record too."""
    ctl = {r["opt_step"]: r for r in table if r["config"] == "recorded"}
    out = []
    for r in table:
        r = dict(r)
        c = ctl.get(r["opt_step"])
        if r["config"] == "recorded":
            r["config"] = control
        elif c is not None:
            r.update({f"d_{f}": r[f] - c[f] for f in CONTROL_FIGURES if f in r and f in c})
        out.append(r)
    return out


def _describe(c: dict[str, Any]) -> str:
    if "max_abs_gap" in c:
        return f"{c['what']}: max |gap| {c['max_abs_gap']:.3g}"
    return f"{c['what']}: recorded {c['recorded']!r}, replayed {c['replayed']!r}"


def save_result(rec: records.Record, res: ReplayResult) -> Path:
    """records/step_N/replays/<hash of the counterfactuals>.json, written atomically."""
    key = hashlib.sha256(json.dumps(res.counterfactuals, sort_keys=True).encode()).hexdigest()[:12]
    d = rec.dir / "replays"
    d.mkdir(exist_ok=True)
    p = d / f"{key}.json"
    tmp = d / f".{key}.{os.getpid()}"
    tmp.write_text(json.dumps(res.to_json(), indent=1, default=str))
    os.replace(tmp, p)
    return p


def format_control(res: ReplayResult) -> str:
    """The control's own gap to the record, per optimizer step: the environment's noise on the table's figures
    (a counterfactual's d_* smaller than this is not a difference this environment can show). "" when none."""
    if res.control is None:
        return ""
    lines = [f"environment noise (control - record; first micro-batch max |dlogp| {res.control['max_abs_dlogp']:.3g}, "
             f"threshold {res.control['threshold']:.3g}):"]
    for o in res.control["opt_steps"]:
        lines.append(f"  optimizer step {o['opt_step']}: " + "  ".join(
            f"{k} {v:.3g}" for k, v in o.items() if k != "opt_step" and v is not None))
    return "\n".join(lines)


def format_table(res: ReplayResult) -> str:
    """The replay's table as text: one line per optimizer step and config."""
    cols = ["opt_step", "config", "loss", "grad_norm", "cos_rec"]
    cols += sorted({k for r in res.table for k in r} - set(cols))
    w = max(12, max((len(r["config"]) for r in res.table), default=8) + 1)

    def fmt(v):
        return f"{v:.6g}" if isinstance(v, float) else str(v)
    lines = ["  ".join(c.ljust(w if c == "config" else 12) for c in cols)]
    for r in res.table:
        lines.append("  ".join(fmt(r.get(c, "")).ljust(w if c == "config" else 12) for c in cols))
    return "\n".join(lines)
