"""Health verdicts over a run's per-step metrics (seed 003 §12 smoke tests, §7 Tier 2/3 warnings).

Input: the rows of ``logs/metrics.jsonl`` (one dict per step, the names the trainer writes:
``reward_mean``, ``has_boxed``, ``grad_norm``, ``truncated``, ``eval/ood/greedy_pass@1``, ...).
Output: one :class:`Verdict` per rule, with the seed's recommended action in words. Rules are
small functions registered by name in ``RULES``; ``check_health(metrics, **settings)`` runs them all.

Status is one of ``pass``, ``warn``, ``fail`` or ``n/a``. A rule without enough data (the metric
was never logged, or fewer steps than it needs) says ``n/a`` and how much it needs: a smoke test
that has not run yet should not read as healthy.

Thresholds are the seed's; every one can be overridden by keyword (``HEALTH_DEFAULTS`` lists them
with their sources). An unknown keyword is an error, so a typo cannot silently disable a check.

Verdicts know their dependencies (``DEPENDS``): when every advantage is 0 (every group had equal
rewards), the policy gradient is 0 by construction, so "grad_norm = 0", "advantage_std = 0" and
"reward stuck at 0/1" are consequences, not causes. ``check_health`` then names the root cause
first (``learning_signal``) and folds the dependent verdicts under it (``caused_by``), rewording
them so that nobody goes looking for frozen weights or an advantage bug.

:func:`run_verdicts` is the one verdict list of a run (its config picks the rules, the eval the
divergence rules read, the clip norm and spike threshold): the live panel, the printed lines and
the report all show it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import fmean, median
from typing import Callable, Iterable

from rftlib.algo.registry import Registry

STATUSES = ("pass", "warn", "fail", "n/a")

HEALTH_DEFAULTS: dict[str, object] = {
    "max_grad_norm": 1.0,  # the trainer's gradient clip norm (grad_norm is logged before clipping)
    "window": 3,  # steps averaged for "the current value" of a noisy metric
    "smoke_steps": 6,  # seed 003 §12: check within the first 2-3 episodes (~6 steps)
    "reward_floor": 0.0,  # reward stuck at this = data/reward bug (seed 003 §12)
    "reward_ceiling": 1.0,  # reward stuck at this = problems too easy (seed 003 §12)
    "boxed_fail": 0.5,  # seed 003 §12: has_boxed healthy > 50%
    "boxed_warn": 0.9,  # seed 003 §7 Tier 1: should stay > 90%
    "boxed_drop": 0.10,  # "dropping": early mean minus current mean, absolute
    "grad_norm_factor": 100.0,  # seed 003 §7 Tier 2 / §12: > 100 x max_grad_norm
    "truncation_warn": 0.5,  # seed 003 §12: truncated healthy < 50%
    "truncation_fail": 0.7,  # seed 003 §6: increase generate_max_len if > 70%
    "truncation_severe": 0.8,  # seed 003 §7 Tier 3: > 80% sustained = model rambling
    "clip_ratio_max": 0.4,  # seed 003 §7 Tier 2 / §12: ppo_clip_ratio > 40%
    "entropy_floor": 1.0,  # seed 003 §7 Tier 2: entropy_mean below 1.0 = diversity collapse
    "length_warn_drop": 0.3,  # length collapse: current mean length 30% below its earlier peak
    "length_fail_drop": 0.5,  # ... 50% below
    "ratio_max_warn": 10.0,  # seed 003 §7 Tier 2: ratio_max > 10
    "log_ratio_raw_warn": 5.0,  # seed 003 §7 Tier 2: log_ratio_raw_max > 5
    "spike_threshold": 50.0,  # seed 003 §7: the spike log records grad_norm > 50
    "decade": 10,  # steps per "decade" for escalating spikes (seed 003 §12: max per decade)
    "ood_metric": "eval/ood/greedy_pass@1",  # seed 003 §7/§9: the primary generalisation signal
    "train_window": 5,  # rolling window for training correctness (seed 003 §12: "rolling average")
    "divergence_train_gain": 0.02,  # training correctness must have risen this much to call divergence
    "eval_tol": 0.01,  # OOD changes smaller than this are "flat"
}


@dataclass(frozen=True)
class Verdict:
    """One health check's result."""

    name: str  # the rule's registered name
    status: str  # "pass" | "warn" | "fail" | "n/a"
    value: float | None  # the number the rule judged (None when n/a)
    message: str  # what was seen, in words
    action: str = ""  # what seed 003 recommends doing about it
    caused_by: str = ""  # the failing verdict this one follows from (folded under it when shown)

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")

    def __str__(self) -> str:
        tail = f" -> {self.action}" if self.action and self.status in ("warn", "fail") else ""
        indent = "    " if self.caused_by else ""
        return f"{indent}[{self.status.upper():4}] {self.name}: {self.message}{tail}"


Rule = Callable[[list[dict], dict], Verdict]
RULES = Registry("health rule")


def _series(metrics: list[dict], key: str) -> list[tuple[int, float]]:
    """(step, value) for every row that has a finite number under ``key``, in step order."""
    out = []
    for i, row in enumerate(metrics):
        v = row.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            out.append((int(row.get("step", i)), float(v)))
    return sorted(out)


def _na(name: str, key: str, have: int, need: int) -> Verdict:
    return Verdict(name, "n/a", None, f"needs {need} steps with '{key}', has {have}")


def _rolling(values: list[float], w: int) -> list[float]:
    """Trailing means: r[i] = mean(values[max(0, i-w+1) : i+1])."""
    return [fmean(values[max(0, i - w + 1): i + 1]) for i in range(len(values))]


NO_SIGNAL = ("every group has equal rewards: no learning signal; the task is too hard or too easy for this "
             "model")


@RULES.register("learning_signal")
def learning_signal(metrics: list[dict], c: dict) -> Verdict:
    """Root cause: every advantage 0 (advantage_std 0) at every step of the last smoke window, i.e.
    every group of G completions had equal rewards, so the policy gradient is 0 whatever the code."""
    name, s = "learning_signal", _series(metrics, "advantage_std")
    if len(s) < 2:
        return _na(name, "advantage_std", len(s), 2)
    last = [v for _, v in s[-c["smoke_steps"]:]]
    if all(abs(v) < 1e-8 for v in last):
        rewards = [v for _, v in _series(metrics, "reward_mean")[-len(last):]]
        level = (f" (reward_mean {min(rewards):.3g}..{max(rewards):.3g}: "
                 + ("too hard" if max(rewards) <= 0.5 else "too easy") + ")") if rewards else ""
        return Verdict(name, "fail", 0.0, f"{NO_SIGNAL}; advantage_std = 0 at all of the last {len(last)} steps"
                       + level, "use problems this model solves sometimes (easier if reward is ~0, harder if ~1), "
                                "a stronger model, or more samples per prompt (n_samples_per_prompt) so that "
                                "groups mix successes and failures (seed 003 §12)")
    mixed = sum(v > 1e-8 for v in last)
    return Verdict(name, "pass", last[-1], f"advantage_std > 0 at {mixed} of the last {len(last)} steps")


@RULES.register("reward_stuck")
def reward_stuck(metrics: list[dict], c: dict) -> Verdict:
    """reward_mean identical to the floor (0) or the ceiling (1) at every step of the last smoke window."""
    name, s = "reward_stuck", _series(metrics, "reward_mean")
    n = min(len(s), c["smoke_steps"])
    if len(s) < 3:
        return _na(name, "reward_mean", len(s), 3)
    last = [v for _, v in s[-n:]]
    if all(abs(v - c["reward_floor"]) < 1e-9 for v in last):
        return Verdict(name, "fail", last[-1], f"reward_mean = {c['reward_floor']:g} at all of the last {n} steps",
                       "data or reward bug: check answer extraction and ground truth (seed 003 §12)")
    if all(abs(v - c["reward_ceiling"]) < 1e-9 for v in last):
        return Verdict(name, "fail", last[-1], f"reward_mean = {c['reward_ceiling']:g} at all of the last {n} steps",
                       "problems too easy: no learning signal; use harder problems (seed 003 §12)")
    return Verdict(name, "pass", last[-1], f"reward_mean varies ({min(last):.3g}..{max(last):.3g} over {n} steps)")


@RULES.register("has_boxed")
def has_boxed(metrics: list[dict], c: dict) -> Verdict:
    """has_boxed below 50% (fail), below 90% or dropping by 0.1 from the first window (warn)."""
    name, s, w = "has_boxed", _series(metrics, "has_boxed"), c["window"]
    if not s:
        return _na(name, "has_boxed", 0, 1)
    vals = [v for _, v in s]
    now, early = fmean(vals[-w:]), fmean(vals[:w])
    action = "format compliance is slipping: consider a small SFT phase (seed 003 §12)"
    if now < c["boxed_fail"]:
        return Verdict(name, "fail", now, f"has_boxed {now:.0%} (mean of last {min(w, len(vals))}) < "
                                          f"{c['boxed_fail']:.0%}", action)
    if len(vals) >= 2 * w and early - now >= c["boxed_drop"]:
        return Verdict(name, "warn", now, f"has_boxed dropping: {early:.0%} -> {now:.0%}", action)
    if now < c["boxed_warn"]:
        return Verdict(name, "warn", now, f"has_boxed {now:.0%} < {c['boxed_warn']:.0%}", action)
    return Verdict(name, "pass", now, f"has_boxed {now:.0%}")


@RULES.register("grad_norm")
def grad_norm(metrics: list[dict], c: dict) -> Verdict:
    """grad_norm zero at every step (fail), median > 100 x max_grad_norm (fail), a single step above (warn)."""
    name, s = "grad_norm", _series(metrics, "grad_norm")
    if len(s) < 2:
        return _na(name, "grad_norm", len(s), 2)
    vals = [v for _, v in s[-c["smoke_steps"]:]]
    limit = c["grad_norm_factor"] * c["max_grad_norm"]
    spike_action = ("seed 003 §6: 100-400x spikes come from extreme log-probability ratios, not advantage "
                    "outliers: tighten eps_clip (0.2 -> 0.1), clamp log-ratios, or lower the LR. (§12 also reads "
                    "a grad_norm that stays > 100x max_norm as heavily clipped, barely-updating steps.)")
    if all(v == 0 for v in vals):
        return Verdict(name, "fail", 0.0, f"grad_norm = 0 at all of the last {len(vals)} steps",
                       "frozen weights: check requires_grad / the LoRA adapter is trainable (seed 003 §12)")
    med = median(vals)
    if med > limit:
        return Verdict(name, "fail", med, f"median grad_norm {med:.3g} > {c['grad_norm_factor']:g} x max_grad_norm "
                                          f"({limit:g})", "LR too high (seed 003 §12); " + spike_action)
    top = max(vals)
    if top > limit:
        return Verdict(name, "warn", top, f"grad_norm spike {top:.3g} > {limit:g} (median {med:.3g})", spike_action)
    return Verdict(name, "pass", med, f"median grad_norm {med:.3g} (max {top:.3g}, limit {limit:g})")


@RULES.register("advantage_std")
def advantage_std(metrics: list[dict], c: dict) -> Verdict:
    """advantage_std still 0 at every step after the first."""
    name, s = "advantage_std", _series(metrics, "advantage_std")
    if len(s) < 3:
        return _na(name, "advantage_std", len(s), 3)
    later = [v for _, v in s[1:]]
    if all(abs(v) < 1e-8 for v in later):
        rs = [v for _, v in _series(metrics, "reward_std")[1:]]
        hint = (f"; reward_std was > 0 (up to {max(rs):.3g}) so rewards did vary" if rs and max(rs) > 0 else
                "; reward_std is 0 too: every group may have had identical rewards")
        return Verdict(name, "fail", later[-1], f"advantage_std = 0 at all {len(later)} steps after step 1" + hint,
                       "advantage computation bug, or no group with mixed rewards (seed 003 §12)")
    return Verdict(name, "pass", later[-1], f"advantage_std {later[-1]:.3g}")


@RULES.register("truncation")
def truncation(metrics: list[dict], c: dict) -> Verdict:
    """truncated rate: mean of the window > 50% (warn); every step of the window > 70% (fail)."""
    name, s, w = "truncation", _series(metrics, "truncated"), c["window"]
    if not s:
        return _na(name, "truncated", 0, 1)
    last = [v for _, v in s[-w:]]
    now = fmean(last)
    action = "increase max_new_tokens (seed 003's --generate_max_len: the model may be solving but not reaching " \
             "the answer), or add a length penalty (seed 003 §6, §12)"
    if len(last) >= w and min(last) > c["truncation_fail"]:
        severe = min(last) > c["truncation_severe"]
        what = "model rambling (seed 003 §7 Tier 3)" if severe else "sustained high truncation"
        return Verdict(name, "fail", now, f"truncated > {c['truncation_severe' if severe else 'truncation_fail']:.0%} "
                                          f"at each of the last {w} steps (mean {now:.0%}): {what}", action)
    if now > c["truncation_warn"]:
        return Verdict(name, "warn", now, f"truncated {now:.0%} > {c['truncation_warn']:.0%}", action)
    return Verdict(name, "pass", now, f"truncated {now:.0%}")


@RULES.register("ppo_clip_ratio")
def ppo_clip_ratio(metrics: list[dict], c: dict) -> Verdict:
    """ppo_clip_ratio > 40%: warn; above it at every step from the start (smoke window): fail."""
    name, s, w = "ppo_clip_ratio", _series(metrics, "ppo_clip_ratio"), c["window"]
    if not s:
        return _na(name, "ppo_clip_ratio", 0, 1)
    vals = [v for _, v in s]
    now, lim = fmean(vals[-w:]), c["clip_ratio_max"]
    first = vals[: c["smoke_steps"]]
    action = "updates too aggressive: LR too high; lower it or tighten eps_clip (seed 003 §7, §12)"
    if len(first) >= w and min(first) > lim:
        return Verdict(name, "fail", now, f"ppo_clip_ratio > {lim:.0%} from the start ({len(first)} steps)", action)
    if now > lim:
        return Verdict(name, "warn", now, f"ppo_clip_ratio {now:.0%} > {lim:.0%}", action)
    return Verdict(name, "pass", now, f"ppo_clip_ratio {now:.0%}")


@RULES.register("entropy_collapse")
def entropy_collapse(metrics: list[dict], c: dict) -> Verdict:
    """entropy_mean (mean of the window) below 1.0 nats."""
    name, s, w = "entropy_collapse", _series(metrics, "entropy_mean"), c["window"]
    if not s:
        return _na(name, "entropy_mean", 0, 1)
    vals = [v for _, v in s]
    now = fmean(vals[-w:])
    if now < c["entropy_floor"]:
        since = " (already at the start)" if vals[0] < c["entropy_floor"] else f" (from {vals[0]:.3g})"
        return Verdict(name, "warn", now, f"entropy_mean {now:.3g} < {c['entropy_floor']:g}{since}",
                       "diversity collapse: lower the LR, raise the KL coefficient (seed 003 §6 instability row)")
    return Verdict(name, "pass", now, f"entropy_mean {now:.3g}")


@RULES.register("length_collapse")
def length_collapse(metrics: list[dict], c: dict) -> Verdict:
    """Length collapse, precisely: the mean of response_length_mean over the last ``window`` steps,
    compared with the highest such ``window``-step mean before them. Down >= 50%: fail; >= 30%: warn.
    Needs 2 x window steps.
    """
    name, s, w = "length_collapse", _series(metrics, "response_length_mean"), c["window"]
    if len(s) < 2 * w:
        return _na(name, "response_length_mean", len(s), 2 * w)
    vals = [v for _, v in s]
    roll = _rolling(vals, w)
    now, peak = roll[-1], max(roll[w - 1: len(vals) - w] or [roll[w - 1]])
    drop = 1 - now / peak if peak > 0 else 0.0
    msg = f"mean response length {now:.0f} vs earlier peak {peak:.0f} ({drop:+.0%} drop)"
    action = "add a length penalty, check entropy, add/raise the KL constraint (seed 003 §6)"
    if drop >= c["length_fail_drop"]:
        return Verdict(name, "fail", drop, msg, action)
    if drop >= c["length_warn_drop"]:
        return Verdict(name, "warn", drop, msg, action)
    return Verdict(name, "pass", drop, msg)


@RULES.register("train_eval_divergence")
def train_eval_divergence(metrics: list[dict], c: dict) -> Verdict:
    """Training correctness (rolling mean) up since the best eval of ``ood_metric`` while it is flat or
    down (the OOD probe in seed 003; the message names whichever eval it read).

    Span: from the step of the best OOD eval before the latest one, to the latest eval. Train gain:
    rolling correctness at the latest eval minus at the peak's step. Warn if the gain is >= 0.02 and
    OOD is within ``eval_tol`` of the peak (flat); fail if OOD is below the peak by more than that.
    """
    name, key = "train_eval_divergence", c["ood_metric"]
    ev, tr = _series(metrics, key), _series(metrics, "correctness")
    if len(ev) < 2 or len(tr) < 2:
        return Verdict(name, "n/a", None, f"needs 2 evals of '{key}' and training correctness; "
                                          f"has {len(ev)} evals, {len(tr)} steps")
    steps, roll = [s for s, _ in tr], _rolling([v for _, v in tr], c["train_window"])

    def train_at(step: int) -> float:  # rolling correctness at the last training step <= step
        idx = max([i for i, s in enumerate(steps) if s <= step] or [0])
        return roll[idx]

    peak_step, peak = max(ev[:-1], key=lambda p: (p[1], -p[0]))
    last_step, last = ev[-1]
    gain, change = train_at(last_step) - train_at(peak_step), last - peak
    label = eval_label(key)  # "OOD" only when the OOD probe is what ran (defect 9)
    msg = (f"since the best {label} eval (step {peak_step}: {peak:.3g}) training correctness {gain:+.3g}, "
           f"{label} {change:+.3g} (step {last_step}: {last:.3g})")
    action = ("train/eval divergence, the primary signal to stop (seed 003 §12): keep the checkpoint of step "
              f"{peak_step}; if the run continues, check reward hacking and lower the LR")
    if gain >= c["divergence_train_gain"] and change < -c["eval_tol"]:
        return Verdict(name, "fail", change, msg, action)
    if gain >= c["divergence_train_gain"] and change <= c["eval_tol"]:
        return Verdict(name, "warn", change, msg + " (flat)", action)
    return Verdict(name, "pass", change, msg)


@RULES.register("ood_early_stop")
def ood_early_stop(metrics: list[dict], c: dict) -> Verdict:
    """OOD greedy_pass@1 dropped at 2 consecutive evals (seed 003 §7 early stopping)."""
    name, key = "ood_early_stop", c["ood_metric"]
    ev = _series(metrics, key)
    if len(ev) < 3:
        return _na(name, key, len(ev), 3)
    (_, a), (_, b), (s, v) = ev[-3:]
    best_step, best = max(ev, key=lambda p: (p[1], -p[0]))
    if a > b > v:
        return Verdict(name, "fail", v, f"{key} dropped at 2 consecutive evals: {a:.3g} -> {b:.3g} -> {v:.3g}",
                       f"stop training; the best checkpoint is step {best_step} ({best:.3g}) (seed 003 §7, §12)")
    return Verdict(name, "pass", v, f"{key} {v:.3g} at step {s} (best {best:.3g} at step {best_step})")


@RULES.register("ratio_max")
def ratio_max(metrics: list[dict], c: dict) -> Verdict:
    """Latest ratio_max > 10 or log_ratio_raw_max > 5 (seed 003 §7 Tier 2)."""
    name = "ratio_max"
    r, lr = _series(metrics, "ratio_max"), _series(metrics, "log_ratio_raw_max")
    if not r and not lr:
        return Verdict(name, "n/a", None, "needs 'ratio_max' or 'log_ratio_raw_max', has neither")
    seen, bad = [], []
    if r:
        seen.append(f"ratio_max {r[-1][1]:.3g}")
        if r[-1][1] > c["ratio_max_warn"]:
            bad.append(f"ratio_max {r[-1][1]:.3g} > {c['ratio_max_warn']:g}")
    if lr:
        seen.append(f"log_ratio_raw_max {lr[-1][1]:.3g}")
        if lr[-1][1] > c["log_ratio_raw_warn"]:
            bad.append(f"log_ratio_raw_max {lr[-1][1]:.3g} > {c['log_ratio_raw_warn']:g}")
    value = r[-1][1] if r else lr[-1][1]
    if bad:
        return Verdict(name, "warn", value, "; ".join(bad) + ": tokens where the policy moved far from the "
                                                               "reference", "tighten eps_clip, clamp log-ratios, "
                                                                            "or lower the LR (seed 003 §6)")
    return Verdict(name, "pass", value, ", ".join(seen))


@RULES.register("grad_spikes_escalating")
def grad_spikes_escalating(metrics: list[dict], c: dict) -> Verdict:
    """Max grad_norm per decade (blocks of 10 steps from the first logged step) strictly rising over the
    last 3 decades, the latest above 50 (the spike-log threshold). The current, unfinished decade
    counts once its max already exceeds the previous decade's.
    """
    name, s, d = "grad_spikes_escalating", _series(metrics, "grad_norm"), c["decade"]
    if len(s) < 2 * d + 1:
        return _na(name, "grad_norm", len(s), 2 * d + 1)
    decades: dict[int, list[float]] = {}
    for step, v in s:
        decades.setdefault((step - s[0][0]) // d, []).append(v)  # blocks of d steps from the first logged step
    maxima = [max(decades[k]) for k in sorted(decades)]
    if len(decades[max(decades)]) < d and maxima[-1] <= maxima[-2]:
        maxima.pop()  # an unfinished decade counts only once it already exceeds the previous one
    maxima = maxima[-3:]
    if len(maxima) < 3:
        return _na(name, "grad_norm decades", len(maxima), 3)
    text = " -> ".join(f"{m:.3g}" for m in maxima)
    if maxima[0] < maxima[1] < maxima[2] and maxima[2] > c["spike_threshold"]:
        return Verdict(name, "warn", maxima[2], f"max grad_norm per {d} steps escalating: {text}",
                       "policy drifting into unstable regions (seed 003 §12): check spike_log.jsonl, tighten "
                       "eps_clip, lower the LR")
    return Verdict(name, "pass", maxima[-1], f"max grad_norm per {d} steps: {text}")


# dependent rule -> (root rule, does this verdict follow from a failing root?)
DEPENDS: dict[str, tuple[str, Callable[[Verdict], bool]]] = {
    "advantage_std": ("learning_signal", lambda v: True),  # all advantages 0 is exactly what the root says
    "grad_norm": ("learning_signal", lambda v: v.value == 0.0),  # zero gradient, not a spike: A = 0 -> loss 0
    "reward_stuck": ("learning_signal", lambda v: True),  # reward 0 (or 1) everywhere: the root's "why"
}


def _fold(verdicts: list[Verdict]) -> list[Verdict]:
    """Mark the verdicts that follow from a failing root (caused_by) and put each root first,
    its consequences right after it; the rest keep their order."""
    by = {v.name: v for v in verdicts}
    out: dict[str, Verdict] = {}
    for v in verdicts:
        dep = DEPENDS.get(v.name)
        root = by.get(dep[0]) if dep else None
        if root is not None and root.status == "fail" and v.status in ("warn", "fail") and dep[1](v):
            v = Verdict(v.name, v.status, v.value, f"{v.message}: follows from {root.name} (no learning signal)",
                        f"nothing to fix here; see {root.name}", caused_by=root.name)
        out[v.name] = v
    roots = [v for v in out.values() if not v.caused_by and any(d.caused_by == v.name for d in out.values())]
    ordered = []
    for r in roots:
        ordered += [r] + [d for d in out.values() if d.caused_by == r.name]
    return ordered + [v for v in out.values() if v not in ordered]


def check_health(metrics: Iterable[dict], rules: Iterable[str] | None = None, **settings) -> list[Verdict]:
    """Run the named rules (all of ``RULES`` by default) over metrics rows; returns one Verdict each,
    a failing root cause first with the verdicts that follow from it folded under it (``DEPENDS``).

    ``settings`` overrides ``HEALTH_DEFAULTS`` (e.g. ``max_grad_norm=1.0`` from the run config); an
    unknown key raises ValueError naming the valid ones.
    """
    bad = sorted(set(settings) - set(HEALTH_DEFAULTS))
    if bad:
        raise ValueError(f"unknown health setting(s) {bad}; valid: {', '.join(HEALTH_DEFAULTS)}")
    c = {**HEALTH_DEFAULTS, **settings}
    rows = list(metrics)
    return _fold([RULES.get(name)(rows, c) for name in (rules if rules is not None else RULES.names())])


def eval_metric_for(config: dict, metrics: list[dict]) -> str:
    """The eval the early-stop / divergence rules read: the early-stop probe, else the OOD probe when
    one was logged (seed 003's primary signal), else the held-out set."""
    probe = config.get("early_stop_probe")
    if probe:
        return f"eval/{probe}/greedy_pass@1"
    if any("eval/ood/greedy_pass@1" in r for r in metrics):
        return "eval/ood/greedy_pass@1"
    return HELDOUT_KEY


HELDOUT_KEY = "eval/heldout/greedy_pass@1"


def run_verdicts(metrics: list[dict], config, skip: Iterable[str] = ()) -> list[Verdict]:
    """A run's verdicts: ``config`` (a RunConfig or its dict) gives the clip norm, the spike
    threshold and the eval to read; ``skip`` the rules its task opts out of (``Task.health_skip``)."""
    c = config if isinstance(config, dict) else {k: getattr(config, k) for k in
                                                 ("max_grad_norm", "spike_grad_norm", "early_stop_probe")}
    rows = list(metrics)
    return check_health(rows, rules=[r for r in RULES.names() if r not in set(skip)],
                        max_grad_norm=float(c.get("max_grad_norm") or 1.0),
                        spike_threshold=float(c.get("spike_grad_norm") or 50.0),
                        ood_metric=eval_metric_for(c, rows))


def display_order(verdicts: list[Verdict], order: tuple[str, ...] = ("fail", "warn", "n/a", "pass")) -> list[Verdict]:
    """The order every view shows verdicts in: each root cause first with its consequences right
    under it, then the others by status (``order``)."""
    folded = [v for v in verdicts if v.caused_by]
    roots = {v.caused_by for v in folded}
    head: list[Verdict] = []
    for r in [v for v in verdicts if v.name in roots]:
        head += [r] + [v for v in folded if v.caused_by == r.name]
    rank = {s: i for i, s in enumerate(order)}
    return head + sorted((v for v in verdicts if v not in head), key=lambda v: rank[v.status])


def summarize(verdicts: list[Verdict]) -> str:
    """One line per verdict in :func:`display_order` (consequences indented under their root)."""
    return "\n".join(str(v) for v in display_order(verdicts))


def eval_label(key: str) -> str:
    """How a verdict names an eval key: 'OOD' only for the OOD probe (eval/ood/...), 'held-out' for
    the held-out set, else the probe's name."""
    probe = key.split("/")[1] if key.startswith("eval/") and key.count("/") >= 2 else key
    return {"ood": "OOD", "heldout": "held-out"}.get(probe, f"'{probe}' probe")
