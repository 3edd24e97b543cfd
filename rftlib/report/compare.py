"""A/B comparison of attempts (seed 003's a28a eps_clip 0.2 vs a28b 0.1): overlaid curves, the
config diff, and eval differences with paired bootstrap confidence intervals.

Paired bootstrap: both attempts are evaluated on the same held-out problems, so the per-problem
difference ``d_i = correct_B(i) - correct_A(i)`` is resampled (problems drawn with replacement,
``n_boot`` times, fixed seed) and the 2.5/97.5 percentiles of the resampled mean give the 95% CI
of the accuracy difference. Pairing removes the between-problem variance that dominates small
eval sets (18 AIME problems: one problem = 5.6 points). Problems are matched by id; evals of
different modes are refused (seed 003: never compare across modes).

A comparison between attempts that both learned nothing (every advantage 0 at every step: every
group had equal rewards, so no update moved the policy) is void: their eval difference is sampling
noise of two unchanged models, and the table says so instead of reporting "no significant difference".
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from rftlib.report.attempt import Attempt, key_differences, load_attempt
from rftlib.report.html import Html, esc, join, pct, status_badge, table


@dataclass(frozen=True)
class BootstrapCI:
    mean: float  # observed mean of the per-problem differences
    lo: float  # 2.5th percentile of the resampled means
    hi: float  # 97.5th percentile
    p_le_0: float  # fraction of resampled means <= 0 (one-sided: "B is no better than A")
    n: int  # paired problems

    def __str__(self) -> str:
        return f"{100 * self.mean:+.1f} points [95% CI {100 * self.lo:+.1f}, {100 * self.hi:+.1f}] over {self.n} problems"


def paired_bootstrap(a: Sequence[float], b: Sequence[float], *, n_boot: int = 10_000, seed: int = 0,
                     level: float = 0.95) -> BootstrapCI:
    """CI of mean(b - a) by resampling paired items. ``a[i]`` and ``b[i]`` are the same problem."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.shape != y.shape or x.ndim != 1 or len(x) == 0:
        raise ValueError(f"paired_bootstrap needs two equal-length, non-empty 1-D sequences, got {x.shape} and {y.shape}")
    d = y - x  # (n,)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(d), size=(n_boot, len(d)))  # (n_boot, n) problems drawn with replacement
    means = d[idx].mean(axis=1)  # (n_boot,)
    tail = (1 - level) / 2
    return BootstrapCI(float(d.mean()), float(np.quantile(means, tail)), float(np.quantile(means, 1 - tail)),
                       float((means <= 0).mean()), len(d))


def per_problem(doc: dict[str, Any]) -> dict[str, float]:
    """{problem id: correct (0/1)} of one eval file."""
    return {str(r["id"]): float(r.get("correct", r.get("reward", 0.0))) for r in doc.get("results", [])}


def _pick_eval(a: Attempt, step: int | str) -> tuple[int, dict[str, Any]] | None:
    """The eval file at ``step``: an int, "final" (last), "best" (best in-training) or "baseline" (0)."""
    evals = {**a.evals, **{s: d for s, d in a.ckpt_evals.items() if s not in a.evals}}
    if not evals:
        return None
    if step == "final":
        s = max(evals)
    elif step == "baseline":
        s = 0
    elif step == "best":
        s = max(evals, key=lambda k: (per_acc(evals[k]), -k))
    else:
        s = int(step)
    return (s, evals[s]) if s in evals else None


def per_acc(doc: dict[str, Any]) -> float:
    r = per_problem(doc)
    return sum(r.values()) / len(r) if r else 0.0


def paired_eval_diff(a: Attempt, b: Attempt, step: int | str = "final", **kw) -> tuple[BootstrapCI | None, str]:
    """(CI of B - A accuracy on their common problems at ``step``, explanation)."""
    ea, eb = _pick_eval(a, step), _pick_eval(b, step)
    if ea is None or eb is None:
        return None, f"no eval at {step} in {'both' if ea is None and eb is None else (a if ea is None else b).attempt_id}"
    (sa, da), (sb, db) = ea, eb
    if da.get("mode") != db.get("mode"):
        return None, f"eval modes differ ({da.get('mode')} vs {db.get('mode')}): not comparable (seed 003)"
    pa, pb = per_problem(da), per_problem(db)
    common = sorted(set(pa) & set(pb))
    if not common:
        return None, "no held-out problem in common (different eval sets)"
    ci = paired_bootstrap([pa[i] for i in common], [pb[i] for i in common], **kw)
    extra = f" (A step {sa}, B step {sb})" if sa != sb else f" (step {sa})"
    note = f"{len(common)} paired problems" + extra
    if len(common) < max(len(pa), len(pb)):
        note += f"; {max(len(pa), len(pb)) - len(common)} unpaired problems left out"
    return ci, note


def gain_ci(a: Attempt, **kw) -> tuple[BootstrapCI | None, str]:
    """CI of an attempt's own final - baseline accuracy (paired over its problems)."""
    e0, e1 = _pick_eval(a, "baseline"), _pick_eval(a, "final")
    if e0 is None or e1 is None or e0[0] == e1[0]:
        return None, "needs a step-0 and a later eval"
    p0, p1 = per_problem(e0[1]), per_problem(e1[1])
    common = sorted(set(p0) & set(p1))
    if not common:
        return None, "no common problems"
    return paired_bootstrap([p0[i] for i in common], [p1[i] for i in common], **kw), f"step 0 -> {e1[0]}"


def learned_nothing(a: Attempt) -> str:
    """Why an attempt cannot have learned anything ("" when it could have): every advantage was 0 at
    every training step (no group with mixed rewards), so the policy gradient was 0 throughout."""
    adv = [r.get("advantage_std") for r in a.train_rows if isinstance(r.get("advantage_std"), (int, float))]
    if adv and all(abs(v) < 1e-8 for v in adv):
        rew = [r.get("reward_mean") for r in a.train_rows if isinstance(r.get("reward_mean"), (int, float))]
        level = f", reward_mean {min(rew):.3g}..{max(rew):.3g}" if rew else ""
        return f"every advantage was 0 at all {len(adv)} steps (every group had equal rewards{level})"
    return ""


def eval_precisions(a: Attempt) -> set[str]:
    """The precisions an attempt's evals were computed in (rftlib.eval: each eval file's ``precision``). An
    eval written before precision was recorded is labelled by the autocast its config ran under."""
    docs = [*a.evals.values(), *a.ckpt_evals.values()]
    old = f"unrecorded (autocast {a.config.get('autocast', 'auto')}, dtype {a.config.get('dtype', 'auto')})"
    return {str(d.get("precision", old)) for d in docs}


def precision_warning(attempts: Sequence[Attempt]) -> str:
    """A warning when the attempts' evals were computed in different precisions ("" when they agree): the
    same checkpoint scored 0.40 under bf16 autocast and 0.47 in float32 here, more than most A/B effects."""
    seen = {a.attempt_id: eval_precisions(a) for a in attempts}
    if len(set().union(*seen.values())) <= 1:
        return ""
    each = "; ".join(f"{k}: {', '.join(sorted(v)) or 'no evals'}" for k, v in seen.items())
    return (f"WARNING: the attempts were evaluated in different precisions ({each}); their accuracy difference "
            "mixes numerics with the config difference. Re-evaluate them in one precision: "
            "`rft eval RUN` uses each attempt's eval_dtype (auto: its weights' dtype)")


def void_reason(a: Attempt, b: Attempt) -> str:
    """Why the A/B of ``a`` and ``b`` is void ("" when it is not): both learned nothing."""
    ra, rb = learned_nothing(a), learned_nothing(b)
    if ra and rb:
        return (f"comparison void: neither attempt learned anything ({a.attempt_id}: {ra}; {b.attempt_id}: {rb}); "
                "any eval difference is sampling noise, not an effect of the config difference")
    return ""


def _ci_cell(ci: BootstrapCI | None, note: str, better: str = "B better", worse: str = "B worse") -> str:
    if ci is None:
        return f"<i>{esc(note)}</i>"
    if ci.lo > 0:
        mark = status_badge("pass", better)
    elif ci.hi < 0:
        mark = status_badge("fail", worse)
    else:
        mark = status_badge("n/a", "no significant difference")
    return (f"{esc(f'{100 * ci.mean:+.1f}')} [{esc(f'{100 * ci.lo:+.1f}')}, {esc(f'{100 * ci.hi:+.1f}')}] "
            f"{mark}<br><small>{esc(note)}; P(&Delta;&le;0) = {ci.p_le_0:.2f}</small>")


def difference_table(attempts: Sequence[Attempt], *, n_boot: int = 10_000, seed: int = 0) -> Html:
    """Each attempt against the first (A): eval numbers, paired-bootstrap CIs, health, key config."""
    ref = attempts[0]
    rows, status = [], []
    for b in attempts:
        base, best, final = b.baseline_best_final()
        g, gnote = gain_ci(b, n_boot=n_boot, seed=seed)
        void = "" if b is ref else void_reason(ref, b)
        if b is ref:
            d_final, d_best = "(reference A)", ""
        elif void:
            d_final = d_best = f"{status_badge('n/a', 'void')}<br><small>{esc(void)}</small>"
        else:
            ci_f, nf = paired_eval_diff(ref, b, "final", n_boot=n_boot, seed=seed)
            ci_b, nb = paired_eval_diff(ref, b, "best", n_boot=n_boot, seed=seed)
            d_final, d_best = _ci_cell(ci_f, nf), _ci_cell(ci_b, nb)
        counts = b.verdict_counts()
        worst = "fail" if counts["fail"] else "warn" if counts["warn"] else "pass"
        diffs = key_differences(b.config, ref.config)
        rows.append((f"<b>{esc(b.attempt_id)}</b>", esc(pct(base)), esc(pct(final)),
                     esc("\u2014" if best is None else f"{pct(best[1])} @ {best[0]}"),
                     (f"{status_badge('n/a', 'learned nothing')}<br><small>{esc(nothing)}</small>"
                      if (nothing := learned_nothing(b)) else _ci_cell(g, gnote, "improved", "regressed")),
                     d_final, d_best,
                     f"{status_badge(worst)} {counts['fail']} fail, {counts['warn']} warn",
                     "<br>".join(esc(f"{k}: {x} \u2192 {y}") for k, (x, y) in diffs.items()) or "\u2014"))
        status.append(worst)
    body = table(["attempt", "baseline", "final", "best", "own gain (final - step 0), 95% CI",
                  "final: B - A, 95% CI", "best: B - A, 95% CI", "health", f"config vs {ref.attempt_id}"],
                 rows, raw=tuple(range(9)), cls="rft-compare")
    if len(attempts) > 1 and all(learned_nothing(a) for a in attempts):
        why = "; ".join(f"{a.attempt_id}: {learned_nothing(a)}" for a in attempts)
        return join('<p class="rft-void" style="color:#7f1d1d;border-left:4px solid #b91c1c;padding:4px 8px">'
                    "<b>This comparison is void: none of the attempts learned anything</b> (" + esc(why) + "). "
                    "Their differences below are noise between unchanged models; fix the learning signal "
                    "(health: learning_signal) before comparing configs.</p>", body)
    return body


def config_diff_table(attempts: Sequence[Attempt]) -> Html:
    """Every config field that is not the same in all attempts, side by side."""
    keys: set[str] = set()
    for b in attempts[1:]:
        keys |= set(key_differences(b.config, attempts[0].config))
    if not keys:
        return Html("<p>The attempts have the same config (bookkeeping fields aside).</p>")
    return table(["parameter", *[a.attempt_id for a in attempts]],
                 [(k, *[a.config.get(k) for a in attempts]) for k in sorted(keys)], cls="rft-compare-config")


def header(attempts: Sequence[Attempt]) -> Html:
    rows = [(esc(a.attempt_id), esc(a.status), esc(a.created), f"<code>{esc(a.sha)}</code>",
             esc(a.eval_label()), esc(a.config.get("notes") or "")) for a in attempts]
    labels = {a.eval_label() for a in attempts}
    warn = ("" if len(labels) <= 1 else
            '<p style="color:#7f1d1d"><b>Eval modes or sets differ between attempts: the accuracy columns are '
            "not comparable.</b></p>")
    if precision := precision_warning(attempts):
        warn = join(warn, f'<p class="rft-precision" style="color:#7f1d1d"><b>{esc(precision)}</b></p>')
    return join(f"<h2>Comparison: {esc(' vs '.join(a.attempt_id for a in attempts))}</h2>",
                table(["attempt", "status", "created", "git", "eval", "notes"], rows, raw=(0, 1, 2, 3, 4, 5)), warn)


def load_all(run_dirs: Sequence[str | Path]) -> list[Attempt]:
    if len(run_dirs) < 2:
        raise ValueError(f"compare needs two or more attempts, got {len(run_dirs)}")
    return [load_attempt(p) for p in run_dirs]


def compare_name(run_dirs: Sequence[str | Path]) -> str:
    """The report's file stem: compare-<id A>-vs-<id B>[...]."""
    return "compare-" + "-vs-".join(Path(p).name for p in run_dirs)


def summary_text(attempts: Sequence[Attempt], **kw) -> str:
    """One line per attempt B against A, for the CLI (after a precision warning when the evals differ)."""
    lines = [w] if (w := precision_warning(attempts)) else []
    for b in attempts[1:]:
        if void := void_reason(attempts[0], b):
            lines.append(f"{b.attempt_id} - {attempts[0].attempt_id}: {void}")
            continue
        ci, note = paired_eval_diff(attempts[0], b, "final", **kw)
        lines.append(f"{b.attempt_id} - {attempts[0].attempt_id}: " + (str(ci) if ci else note))
    return "\n".join(lines)



def verdicts_side_by_side(attempts: Sequence[Attempt]) -> Html:
    """Each health check's status in each attempt (rows: checks; columns: attempts)."""
    names = [v.name for v in attempts[0].verdicts]
    by = [{v.name: v for v in a.verdicts} for a in attempts]
    rows = []
    for n in names:
        cells = []
        for d in by:
            v = d.get(n)
            cells.append("" if v is None else f"{status_badge(v.status)}<br><small>{esc(v.message)}</small>")
        rows.append((esc(n), *cells))
    return table(["check", *[a.attempt_id for a in attempts]], rows, raw=tuple(range(len(attempts) + 1)),
                 cls="rft-compare-health")
