"""A/B of algorithm variants in one command: the same preset and seed, one field varied.

    rft ab -p default --vary policy_loss=ppo_clip,gspo,cispo --set num_steps=4

trains one attempt per value (in order, through notebooks/train.ipynb like ``rft train``), then writes
the compare notebook's HTML report over all of them (A = the first value: put the baseline first).
Several ``--vary`` flags take the cross product. Every variant's config is resolved and validated
*before* anything trains, so a typo in the third value fails in a second, not after two runs; a
variant that crashes mid-way leaves the attempts already trained, and the report is written over
those that finished (at least two).

Why a verb and not a loop in a notebook: seed 003's researchers ran "a26 vs a27" by hand-editing
two launch scripts and diffing the logs; here the config diff, the paired-bootstrap eval difference
and the health checks come out of one command, and each attempt's notes say which variant it was.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from rftlib.config import ConfigError, RunConfig, config_fields, make_config, value_from_text
from rftlib.eval import eval_dtypes
from rftlib.notebooks import NOTEBOOK_PARAMS
from rftlib.train.steps import aggregation


@dataclass
class Variant:
    """One arm of the A/B: its label (``policy_loss=gspo``), overrides and resolved config."""

    label: str
    overrides: dict[str, Any]
    config: RunConfig = field(repr=False)


def parse_vary(items: list[str]) -> list[tuple[str, list[Any]]]:
    """``["policy_loss=ppo_clip,gspo"]`` -> ``[("policy_loss", ["ppo_clip", "gspo"])]``.

    A clear error names the flag when the field is unknown, a value list is empty or has one value,
    or a field is varied twice.
    """
    known = config_fields()
    out: list[tuple[str, list[Any]]] = []
    for it in items:
        if "=" not in it:
            raise ConfigError(f"--vary expects NAME=V1,V2[,...], got {it!r}")
        name, values = (s.strip() for s in it.split("=", 1))
        if name not in known:
            raise ConfigError(f"--vary {it!r}: {name!r} is not a RunConfig field (see params/default.yaml)")
        if any(name == n for n, _ in out):
            raise ConfigError(f"--vary {it!r}: {name} is varied twice; give all its values in one --vary")
        vals = [v.strip() for v in values.split(",") if v.strip()]
        if len(vals) < 2:
            raise ConfigError(f"--vary {it!r}: an A/B needs two or more values, comma-separated")
        out.append((name, [value_from_text(name, v) for v in vals]))
    if not out:
        raise ConfigError("rft ab needs at least one --vary NAME=V1,V2")
    return out


def plan_variants(preset: str, base: dict[str, Any], vary: list[tuple[str, list[Any]]]) -> list[Variant]:
    """Every combination of the varied values over ``preset`` + ``base``, each config validated now.

    A varied field also given in ``base`` is refused (which one would win is a guess). The notes of each
    attempt name its variant, so the index and the compare report say which arm it was.
    """
    clash = sorted(set(base) & {n for n, _ in vary})
    if clash:
        raise ConfigError(f"{', '.join(clash)} is both --set and --vary; drop it from --set")
    names = [n for n, _ in vary]
    variants = []
    for combo in itertools.product(*(vals for _, vals in vary)):
        over = dict(zip(names, combo))
        label = ", ".join(f"{n}={v}" for n, v in over.items())
        notes = (f"{base['notes']} | " if base.get("notes") else "") + f"A/B: {label}"
        try:  # train.ipynb's own parameters (skip_preflight, ...) in base go to the notebook, not the config
            cfg = make_config(preset, {k: v for k, v in {**base, **over, "notes": notes}.items()
                                       if k not in NOTEBOOK_PARAMS})
        except ConfigError as e:
            raise ConfigError(f"variant {label}: {e}") from None
        variants.append(Variant(label, {**over, "notes": notes}, cfg))
    return variants


# Fields that act only through the importance ratio pi/pi_old (its clip, its form): on-policy they do nothing.
RATIO_ONLY = {"policy_loss", "eps_clip", "eps_clip_high", "dual_clip", "log_ratio_clamp", "gspo_eps_clip",
              "gspo_eps_clip_high", "cispo_eps_clip", "cispo_eps_clip_high", "gmpo_eps_clip"}


def on_policy_warning(variants: list[Variant]) -> str:
    """Why an A/B of policy losses on fully on-policy updates cannot show a difference, or "".

    With one optimizer step per rollout, pi_old = pi at the update, every ratio is exactly 1 and no clip
    binds. Then GRPO's token ratio r_t A, GSPO's sequence ratio s A (s = exp(mean_t log r_t) = 1, grad
    s * mean_t grad log pi), CISPO's sg(clip(r_t)) A log pi and GMPO's geometric mean all give the
    gradient A * grad log pi, aggregated per sequence and token as the loss mode says: under one
    mode they are the same gradient, and the arms differ by float noise only (measured: three
    default-preset arms gave the same answer on each of 100 held-out problems). Arms whose
    aggregations differ (loss_agg_mode auto gives cispo token-mean) are a real A/B.
    """
    varied = {k for v in variants for k in v.overrides if k != "notes"}
    if not varied or not varied <= RATIO_ONLY or any(v.config.optimizer_steps_per_rollout > 1 for v in variants):
        return ""
    if len({aggregation(v.config) for v in variants}) > 1:  # loss_agg_mode auto: cispo's own is token-mean
        return ""
    return (f"WARNING: every arm updates fully on-policy (one optimizer step per rollout), so the importance ratio "
            f"is exactly 1 and {', '.join(sorted(varied))} cannot change the gradient: GRPO, GSPO, CISPO and GMPO "
            "all reduce to A * grad log pi there, and the arms will differ by floating-point noise only. For a real "
            "A/B make later updates off-policy: --set train_batch_size=<rollout_batch_size / 2> (two optimizer "
            "steps per rollout) or --set num_updates_per_rollout=2.")


def planned_precision(cfg: RunConfig) -> str:
    """The precision an arm's evals will compute in, from its config alone, by the one rule of every eval
    (rftlib.eval.eval_dtypes) on the device the arm will run on; a dtype that device refuses (float16 off
    CUDA) is named as it is (the arm itself will say why it cannot run)."""
    on_gpu = str(cfg.device).startswith("cuda") or (cfg.device == "auto" and torch.cuda.is_available())
    try:
        return eval_dtypes(cfg.dtype, cfg.eval_dtype, torch.device("cuda" if on_gpu else "cpu"))[1]
    except ValueError:
        return cfg.eval_dtype if cfg.eval_dtype != "auto" else cfg.dtype


def precision_plan_warning(variants: list[Variant]) -> str:
    """A warning, before anything trains, when the arms' evals will compute in different precisions (a
    varied dtype or eval_dtype): their accuracy difference would mix numerics with the varied field."""
    each = {v.label: planned_precision(v.config) for v in variants}
    if len(set(each.values())) <= 1:
        return ""
    return ("WARNING: the arms will be evaluated in different precisions (" +
            "; ".join(f"{k}: {p}" for k, p in each.items()) + "): set one eval_dtype for all of them "
            "(--set eval_dtype=float32) so the held-out difference is the varied field's, not rounding's")


def run_ab(preset: str, base: dict[str, Any], vary: list[tuple[str, list[Any]]], *,
           train: Callable[[dict[str, Any]], Any], compare: Callable[[list], Any],
           write: Callable[[str], None] = print) -> tuple[list, Any, list[str]]:
    """Train every variant with ``train(params)`` (returns a run dir), then ``compare(run_dirs)``.

    ``train`` and ``compare`` are injected (the CLI passes the papermill train notebook and
    ``publish.write_compare``), so the planning and failure handling are tested without training.
    Returns (run dirs, compare result or None when fewer than two attempts finished, failed labels).
    """
    variants = plan_variants(preset, base, vary)
    write(f"[rft ab] {len(variants)} variants of preset {preset!r}: " + " | ".join(v.label for v in variants))
    for warning in (on_policy_warning(variants), precision_plan_warning(variants)):
        if warning:
            write(f"[rft ab] {warning}")
    run_dirs, failed = [], []
    for i, v in enumerate(variants, 1):
        write(f"[rft ab] {i}/{len(variants)}: {v.label}")
        try:
            run_dirs.append(train({"preset": preset, **base, **v.overrides}))
        except Exception as e:  # keep what trained; the report covers the finished arms
            failed.append(v.label)
            write(f"[rft ab] {v.label} failed: {type(e).__name__}: {e}")
    if failed:
        write(f"[rft ab] failed: {'; '.join(failed)}")
    if len(run_dirs) < 2:
        write(f"[rft ab] {len(run_dirs)} attempt(s) finished: no comparison written")
        return run_dirs, None, failed
    return run_dirs, compare(run_dirs), failed
