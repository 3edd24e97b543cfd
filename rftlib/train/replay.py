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
   autocast: ``environment_differences``), equality is bit for bit and anything else is NOT REPRODUCED; where it
   differs, the gaps are reported and no equality is claimed;
4. **runs each counterfactual** (a set of loss settings: ``policy_loss=gspo``, ``eps_clip=0.1``, ...) at every
   optimizer step, on the same weights and rows, just before the optimizer step: the recorded gradient is set
   aside, the batch's backward runs again under the counterfactual's loss (rftlib.train.loop.Trainer.backward_batch,
   the update's own micro-batch pass), and the table gets its loss, gradient norm, the cosine with the recorded
   gradient, and the loss's own metrics; then the recorded gradient is put back and the optimizer steps as
   recorded. Counterfactuals are *local*: each is evaluated at the recorded weights of each optimizer step.

Only settings that change the loss of the same batch can be varied (:data:`REPLAYABLE`); anything that would change
the batch (sampling, the model, the advantages) is refused with the field named.
"""

from __future__ import annotations

import dataclasses
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

from rftlib.algo.loss_spec import loss_settings_owners
from rftlib.algo.token_view import token_view
from rftlib.config import ConfigError, RunConfig, make_config, to_dict
from rftlib.models.loading import load_trainable_state
from rftlib.monitor import records
from rftlib.rollout.base import Rollout
from rftlib.settings import CISPOSettings, GMPOSettings, GSPOSettings, LossSettings, PPOClipSettings
from rftlib.train import steps
from rftlib.train.build import build
from rftlib.train.checkpoint import STATE, list_steps
from rftlib.train.dist import exit_rank, init_dist, shutdown_dist
from rftlib.train.loop import Trainer
from rftlib.train.phases import Advantaged
from rftlib.train.record import UpdateTrace, environment, hexf, unhex
from rftlib.train.torchrun import rank_env, torchrun_command

REPLAYABLE = (
    {"policy_loss", "tis_cap", "tis_level", "max_grad_norm"}
    | {f.name for s in (LossSettings, PPOClipSettings, GSPOSettings, CISPOSettings, GMPOSettings)
       for f in dataclasses.fields(s)}
) - {"scale_rewards"}
"""the settings a counterfactual may change: the policy loss and its clip ranges, the aggregation and its
normalisers, the KL term, the entropy bonus, the TIS cap, the gradient clip (a registered loss's own settings too).
scale_rewards changes the advantages: a different batch, refused."""


class ReplayError(Exception):
    """A replay that cannot run as asked (no record, no weights close enough, a setting that changes the batch)."""


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

    @property
    def verdict(self) -> str:
        """One line: FAITHFUL, NOT REPRODUCED (with the first mismatch), or NOT CHECKED (environment differs)."""
        if self.faithful is None:
            return "NOT CHECKED (the environment differs from the recorded one: " + "; ".join(
                self.environment_differences) + ")"
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
    bad = [k for k in overrides if k not in REPLAYABLE and k not in own]
    if bad:
        raise ReplayError(f"counterfactual setting(s) {bad}: a replay varies the loss of the recorded batch only "
                          f"({', '.join(sorted(REPLAYABLE))}, and a registered loss's own settings); "
                          f"{bad[0]} would change the batch itself: train an attempt with it (rft ab)")
    try:
        return make_config(None, {**to_dict(cfg), **overrides})
    except ConfigError as e:
        raise ReplayError(f"counterfactual {overrides}: {e}") from e


def label(overrides: dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in overrides.items()) or "recorded"


# ---- weights --------------------------------------------------------------------------------------------------
def choose_weights(run_dir: str | Path, rec: records.Record, weights: str = "auto") -> tuple[str, Path]:
    """(description, directory holding trainable.pt [+ optimizer.pt, scheduler.pt]) of the weights step N's update
    started from. ``auto``: the record's snapshot, else training_state/step_{N-1}; ``snapshot``; ``ckpt:M``."""
    N = rec.step
    if weights in ("auto", "snapshot"):
        if (rec.dir / "start" / "trainable.pt").exists():
            return f"record snapshot {rec.dir.name}/start", rec.dir / "start"
        if weights == "snapshot":
            raise ReplayError(f"{rec.dir}: the record has no snapshot of the weights (a spike of a trainable state "
                              f"over 256 MiB, or a start state over record_max_bytes); use --weights auto or "
                              f"ckpt:{N - 1}")
        have = list_steps(run_dir)
        if N - 1 in have:
            return f"checkpoint {STATE}/step_{N - 1}", Path(run_dir) / STATE / f"step_{N - 1}"
        near = min(have, key=lambda s: abs(s - (N - 1))) if have else None
        where = (f"the nearest checkpoint is step_{near}, {abs(near - (N - 1))} update(s) away" if near is not None
                 else "the attempt has no checkpoint")
        raise ReplayError(f"step {N}'s update started from the weights after step {N - 1}; the record has no snapshot "
                          f"and {where}. Record with a snapshot (record_batches names the step), or save every step "
                          f"(save_steps: 1)")
    if weights.startswith("ckpt:"):
        m = weights[5:]
        d = Path(run_dir) / STATE / f"step_{m}"
        if not (d / "trainable.pt").exists():
            raise ReplayError(f"{d}: no such checkpoint (checkpoints of this attempt: {list_steps(run_dir)})")
        return f"checkpoint {STATE}/step_{m}", d
    raise ReplayError(f"weights={weights!r}: expected auto, snapshot or ckpt:M")


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
    ranks (the backend of one process when one runs)."""
    d = dict(manifest["config"])
    d.update(record_batches=[], max_staleness=0, report_to=[])
    if world_size == 1:
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
    """The update's starting state from ``d``: the trainable tensors, and the optimizer and LR schedule when the
    directory holds them (several optimizer steps per rollout: the steps after the first need them)."""
    if (d / "optimizer.pt").exists():
        tr.backend.load(d)
    else:
        load_trainable_state(tr.model, torch.load(d / "trainable.pt", weights_only=True,
                                                  map_location=tr.dist.device))


def advantaged(rec: records.Record, rank: int, device: torch.device):
    """Rank ``rank``'s recorded batch as the update takes it (rftlib.train.phases.Advantaged)."""
    t = rec.rank(rank)
    texts = rec.texts["ranks"][rank]
    ro = Rollout(prompt_ids=t["prompt_ids"], prompt_mask=t["prompt_mask"], completion_ids=t["completion_ids"],
                 completion_mask=t["completion_mask"], behaviour_logprobs=t["behaviour_logprobs"],
                 truncated=t["truncated"].bool(), texts=texts["completions"], group_size=texts["group_size"]).to(device)
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


# ---- one rank's replay ----------------------------------------------------------------------------------------
class ReplayTrace(UpdateTrace):
    """The replay's trace: what the update computes, plus at each optimizer step (before it steps) the
    counterfactuals on the same weights and rows."""

    def __init__(self, counterfactuals: list[tuple[str, RunConfig]]):
        super().__init__()
        self.counterfactuals = counterfactuals
        self.rows: list[dict[str, Any]] = []  # the table rows, per optimizer step and config

    def before_step(self, trainer, batch, advantages, *, epoch, rows, micro, totals, loss_kw, loss) -> None:
        super().before_step(trainer, batch, advantages, epoch=epoch, rows=rows, micro=micro, totals=totals,
                            loss_kw=loss_kw, loss=loss)
        k = len(self.opt) - 1
        params = trainer.backend.params
        recorded = [None if p.grad is None else p.grad.detach().clone() for p in params]
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

                def after(ix, fwd, l, m, old, kw=kw, sides=sides, mets=mets):
                    mask = fwd.rows["completion_mask"]  # (n, T')
                    mets.append((float(mask.sum()), {a: float(b) for a, b in m.items()}))
                    sides.add(fwd.logprobs.detach().float().cpu(), old.detach().float().cpu(),
                              advantages[ix].float().cpu(), batch.loss_mask[ix, :mask.shape[1]].float().cpu(), kw)
                ns, nt = steps.loss_totals(cf, batch.loss_mask[rows], trainer.dist.all_sum)
                tot = dict(num_seqs=ns, num_tokens=nt, norm_const=(cf.loss_norm_const if cf.loss_norm_const
                                                                    is not None else float(cf.max_new_tokens)))
                local = trainer.backward_batch(batch, advantages, micro, epoch=epoch, totals=tot, loss_kw=kw,
                                               after=after)
                if not micro:
                    trainer._zero_backward()
                cf_loss = float(trainer.dist.all_sum(torch.tensor([local], device=trainer.dist.device))[0])
            finally:
                trainer.cfg = cfg0
            g_cf = _flat([p.grad for p in params], params)
            self.rows.append(_table_row(k, name, cf_loss, g_cf, g_rec, _all_ranks(D, sides, mets)))
        for p, g in zip(params, recorded):
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
    tr = build_trainer(cfg, m, dist)
    try:
        load_weights(tr, wdir)
        D = tr.dist
        t = rec.rank(D.rank)
        if "rng_torch" in t:
            torch.set_rng_state(t["rng_torch"])
        tr.step_num = step - 1  # the update's row order is drawn from (seed, step, rank)
        batch = advantaged(rec, D.rank, D.device)
        trace = ReplayTrace(cfs)
        tr.trace = trace
        try:
            upd = tr.update(batch)
        finally:
            tr.trace = None
        env_now = environment(tr)
    finally:
        close_trainer(tr)
    diffs = environment_differences(m["env"], env_now)
    threads = m["env"].get("threads_per_rank", [])
    if D.rank < len(threads) and threads[D.rank] != env_now["threads"]:
        diffs.append(f"threads on rank {D.rank}: recorded {threads[D.rank]}, now {env_now['threads']} (set "
                     f"torch_threads, or OMP_NUM_THREADS)")
    checks = _micro_checks(rec, D.rank, trace)
    out = {"rank": D.rank, "checks": checks, "env_differences": diffs, "weights": desc}
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
    cfs = [parse_overrides(c) for c in (counterfactuals or [])]
    if W == 1:
        parts = [replay_rank(run_dir, step, weights=weights, counterfactuals=cfs, rec=rec)]
    else:
        parts = _replay_ranks(run_dir, step, W, weights=weights, counterfactuals=cfs)
    return _result(run_dir, rec, parts, cfs, save=save)


def _replay_ranks(run_dir: Path, step: int, nproc: int, *, weights: str, counterfactuals) -> list[dict[str, Any]]:
    """Run :func:`replay_rank` on ``nproc`` ranks (torchrun, rftlib.cli replay --rank-worker); their dicts."""
    out = Path(tempfile.mkdtemp(prefix="rft-replay-ranks-")) / "ranks.json"
    args = ["replay", str(run_dir), "--step", str(step), "--weights", weights, "--rank-worker", str(out)]
    for c in counterfactuals:
        args += ["--cf-json", json.dumps(c)]
    p = subprocess.run(torchrun_command(nproc, args), env=rank_env(), capture_output=True, text=True)
    if p.returncode != 0 or not out.exists():
        tail = "\n".join((p.stdout + p.stderr).splitlines()[-30:])
        if "ReplayMismatch" in tail:
            raise ReplayMismatch(tail)
        raise ReplayError(f"the {nproc} replay ranks failed (exit {p.returncode}):\n{tail}")
    parts = json.loads(out.read_text())
    shutil.rmtree(out.parent, ignore_errors=True)
    return parts


def rank_worker(run_dir: str, step: int, weights: str, counterfactuals: list[dict[str, Any]], out: str) -> None:
    """One torchrun rank of a multi-rank replay: rank 0 writes every rank's dict to ``out``."""
    rec = records.read_record(run_dir, step)
    dist = init_dist(make_config(None, {**rec.manifest["config"], "record_batches": []}))
    part = replay_rank(run_dir, step, weights=weights, counterfactuals=counterfactuals, dist=dist, rec=rec)
    parts = dist.gather_objects(part)
    if dist.is_main:
        tmp = out + ".tmp"
        Path(tmp).write_text(json.dumps(parts))
        os.replace(tmp, out)
    shutdown_dist()
    exit_rank(0)  # gloo's threads can abort at interpreter exit once all is written (rftlib.train.dist.exit_rank)


def _result(run_dir: Path, rec: records.Record, parts: list[dict[str, Any]], cfs, *, save: bool) -> ReplayResult:
    main = parts[0]
    checks = [c for p in parts for c in p["checks"]] + main["opt_checks"]
    diffs = sorted({d for p in parts for d in p["env_differences"]})
    lp = [c for c in checks if "logprobs" in c["what"]]
    if lp and not lp[0]["equal"] and not diffs:
        raise ReplayMismatch(
            f"{lp[0]['what']}: the replayed forward differs from the recorded one by max |dlogp| = "
            f"{lp[0]['max_abs_gap']:.3g} (bit-for-bit expected in this environment): these are not the weights step "
            f"{rec.step} started from ({main['weights']})")
    bad = [c for c in checks if not c["equal"]]
    faithful = None if diffs else not bad
    notes = []
    if rec.manifest.get("on_policy"):
        notes.append("on-policy step (one optimizer step, the trainer's own module sampled): every ratio is exactly "
                     "1, so no token is clipped under any clip range; losses differ only by their aggregation")
    if len(rec.manifest["opt_steps"]) > 1:
        notes.append("several optimizer steps: each counterfactual is evaluated at the recorded weights of each "
                     "optimizer step (local), not along its own trajectory")
    res = ReplayResult(run_dir=str(run_dir), step=rec.step, weights=main["weights"], environment_differences=diffs,
                       faithful=faithful, checks=checks, table=main["table"], counterfactuals=cfs, notes=notes,
                       first_mismatch=None if not bad else _describe(bad[0]))
    if save:
        res.path = str(save_result(rec, res))
    return res


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
