"""Report figures: seed 003 section 7's three tiers of training metrics, the held-out eval curve
against the step-0 baseline, and A/B overlays.

Figures are built with ``matplotlib.figure.Figure`` (no pyplot state, no GUI backend) and wrapped
in :class:`Plot`, which Jupyter displays as a PNG, so executed notebooks embed every figure and
the HTML reports need no server. Panels whose metric an attempt never logged say so instead of
drawing an empty axis.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any, Sequence

from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from rftlib.monitor.timeline import eval_windows, shares
from rftlib.report.attempt import EVAL_KEY, Attempt, key_differences

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"]
# per attempt in overlays: a curve drawn exactly on top of another still shows (hollow marker of
# another shape, another dash pattern)
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]
LINESTYLES = ["-", "--", ":", "-."]


def style(i: int) -> dict[str, Any]:
    """Line style of the i-th attempt in an overlay: colour, marker shape, dash pattern; markers of
    later attempts hollow and larger so that identical curves stay visible one over the other."""
    return {"color": COLORS[i % len(COLORS)], "marker": MARKERS[i % len(MARKERS)], "ls": LINESTYLES[i % len(LINESTYLES)],
            "markersize": 4 + 2 * min(i, 3), "markerfacecolor": COLORS[i % len(COLORS)] if i == 0 else "none",
            "lw": 1.4, "alpha": 0.9}


def honest_axis(ax, min_rel_span: float = 0.02, min_abs_span: float = 1e-3) -> None:
    """Plain tick labels (no "+5.877" offset, no scientific multiplier) and a y-range (once
    everything is drawn) of at least ``min_rel_span`` x |level|, or ``min_abs_span`` near 0: noise of
    1e-4 on a value of 5.88 is drawn flat, not stretched over the whole axis to look like a trend."""
    ax.ticklabel_format(axis="y", useOffset=False, style="plain")
    lo, hi = ax.get_ylim()
    mid = (lo + hi) / 2
    need = max(min_rel_span * abs(mid), min_abs_span)
    if hi - lo < need:
        ax.set_ylim(mid - need / 2, mid + need / 2)


@dataclass
class Plot:
    """A rendered figure: Jupyter shows it as PNG (``_repr_png_``); ``png()`` gives the bytes."""

    fig: Figure
    title: str = ""
    alt: str = ""  # a one-line description for the HTML img tag

    def png(self, dpi: int = 90) -> bytes:
        buf = io.BytesIO()
        self.fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
        return buf.getvalue()

    def _repr_png_(self) -> tuple[bytes, dict[str, str]]:
        return self.png(), {"alt": self.alt or self.title}  # (data, metadata): the alt text reaches the HTML

    def __repr__(self) -> str:
        return f"<Plot {self.title!r}: {len(self.fig.axes)} panels>"


def _series(rows: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for r in rows:
        v = r.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            xs.append(int(r.get("step", 0)))
            ys.append(float(v))
    return xs, ys


def _grid(n: int, cols: int = 3, height: float = 2.7) -> tuple[Figure, list]:
    rows = (n + cols - 1) // cols
    fig = Figure(figsize=(4.3 * cols, height * rows), layout="constrained")
    axes = [fig.add_subplot(rows, cols, i + 1) for i in range(n)]
    return fig, axes


def _missing(ax, key: str) -> None:
    ax.text(0.5, 0.5, f"'{key}' not logged", ha="center", va="center", transform=ax.transAxes, color="gray")
    ax.set_xticks([])
    ax.set_yticks([])


def _panel(ax, rows, key: str, title: str, *, refs: Sequence[tuple[float, str]] = (), band: tuple[str, str] | None = None,
           percent: bool = False, extra: Sequence[tuple[str, str]] = ()) -> None:
    xs, ys = _series(rows, key)
    ax.set_title(title, fontsize=10)
    if not xs:
        _missing(ax, key)
        return
    k = 100.0 if percent else 1.0
    ax.plot(xs, [k * y for y in ys], marker=".", color=COLORS[0], label=key)
    if band:
        bx, lo = _series(rows, band[0])
        _, hi = _series(rows, band[1])
        if bx and len(lo) == len(hi):
            ax.fill_between(bx, lo, hi, alpha=0.2, color=COLORS[0], label=f"{band[0].split('_')[-1]}..{band[1].split('_')[-1]}")
    for j, (ek, label) in enumerate(extra):
        ex, ey = _series(rows, ek)
        if ex:
            ax.plot(ex, [k * y for y in ey], marker=".", color=COLORS[j + 1], label=label)
    for y, label in refs:
        ax.axhline(k * y, ls="--", lw=1, color="gray")
        ax.annotate(label, (0.01, k * y), xycoords=("axes fraction", "data"), fontsize=7, color="gray", va="bottom")
    ax.set_xlabel("step", fontsize=8)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.tick_params(labelsize=8)
    honest_axis(ax)
    if extra or band:
        ax.legend(fontsize=7)


def tier1(a: Attempt) -> Plot:
    """Tier 1, ground truth: reward_mean, correctness, has_boxed (math) or pass_frac (code)."""
    rows = a.train_rows
    fmt_key = "has_boxed" if any("has_boxed" in r for r in rows) or not any("pass_frac" in r for r in rows) else "pass_frac"
    fig, ax = _grid(3)
    _panel(ax[0], rows, "reward_mean", "reward_mean", extra=[("reward_p90", "p90")])
    _panel(ax[1], rows, "correctness", "correctness (%)", percent=True)
    if fmt_key == "has_boxed":
        _panel(ax[2], rows, "has_boxed", "has_boxed (%)", percent=True, refs=[(0.9, "90% (Tier 1)"), (0.5, "50% (smoke)")])
    else:
        _panel(ax[2], rows, "pass_frac", "tests passed (%)", percent=True)
    fig.suptitle(f"{a.attempt_id}: Tier 1, ground truth (training rollouts)", fontsize=11)
    return Plot(fig, "tier1", f"{a.attempt_id} Tier 1: reward_mean, correctness, {fmt_key} by step")


def tier2(a: Attempt) -> Plot:
    """Tier 2, stability: grad_norm, KL, clip ratio, advantage std, entropy, ratio tails."""
    rows, c = a.train_rows, a.config
    mgn = float(c.get("max_grad_norm", 1.0))
    fig, ax = _grid(6)
    _panel(ax[0], rows, "grad_norm", "grad_norm (before clip)", refs=[(mgn, f"max_grad_norm {mgn:g}")],
           extra=[("grad_norm_max", "max")])
    if float(c.get("beta", 0.0)) > 0 or any("kl" in r for r in rows):
        _panel(ax[1], rows, "kl", f"KL to reference ({c.get('kl_estimator', 'k3')})")
    else:
        ax[1].set_title("KL to reference", fontsize=10)
        ax[1].text(0.5, 0.5, "beta = 0: no reference, no KL", ha="center", va="center",
                   transform=ax[1].transAxes, color="gray")
        ax[1].set_xticks([])
        ax[1].set_yticks([])
    _panel(ax[2], rows, "ppo_clip_ratio", "ppo_clip_ratio (%)", percent=True, refs=[(0.4, "40% warn")])
    _panel(ax[3], rows, "advantage_std", "advantage mean / std", extra=[("advantage_mean", "mean")])
    _panel(ax[4], rows, "entropy_mean", "entropy (nats/token)", band=("entropy_p10", "entropy_p90"),
           refs=[(1.0, "1.0 collapse")])
    _panel(ax[5], rows, "ratio_max", "ratio tails", refs=[(10.0, "ratio 10")],
           extra=[("log_ratio_raw_max", "log_ratio_raw_max"), ("log_ratio_abs_p99", "|log_ratio| p99")])
    fig.suptitle(f"{a.attempt_id}: Tier 2, stability", fontsize=11)
    return Plot(fig, "tier2", f"{a.attempt_id} Tier 2: grad_norm, KL, clip ratio, advantages, entropy, ratio tails by step")


def tier3(a: Attempt) -> Plot:
    """Tier 3, collapse: response length, truncation; and the LR the steps used."""
    rows, c = a.train_rows, a.config
    fig, ax = _grid(3)
    _panel(ax[0], rows, "response_length_mean", "response length (tokens)",
           refs=[(float(c.get("max_new_tokens", 0)), "max_new_tokens")], extra=[("response_length_max", "max")])
    _panel(ax[1], rows, "truncated", "truncated (%)", percent=True, refs=[(0.5, "50% warn"), (0.8, "80% rambling")])
    _panel(ax[2], rows, "lr", "learning rate")
    fig.suptitle(f"{a.attempt_id}: Tier 3, collapse detection", fontsize=11)
    return Plot(fig, "tier3", f"{a.attempt_id} Tier 3: response length, truncation, learning rate by step")


PHASE_COLORS = {"generate": "#1f77b4", "reward": "#ff7f0e", "update": "#d62728", "advantages": "#e377c2",
                "sync": "#9467bd", "eval": "#7f7f7f", "save": "#8c564b", "rollout": "#aec7e8", "wait": "white"}


def timeline(a: Attempt, steps: int | None = None) -> Plot:
    """Where the attempt's time went (logs/timeline.jsonl, issue 32): one lane per engine, the producer (reward
    scoring) and the trainer, each phase a bar coloured by phase (an eval's generation on the engines too),
    generate bars labelled b<batch>·v<version>, a line at each step's end; the title says how busy each side was
    and which one the other waited for, over the training time (evals left out: neither side's step work). The
    rollout side is busy while a batch is generated or scored (a batch is ready only after both). Below, per step,
    the share of rows at each lag (staleness/frac_lag*) and the behaviour-proximal KL (tis/mismatch_kl).
    ``steps``: the last N steps only (the live view)."""
    items = a.timeline
    fig = Figure(figsize=(12, 4.6), layout="constrained")
    top, bottom = fig.add_subplot(3, 1, (1, 2)), fig.add_subplot(3, 1, 3)
    if not items:
        _missing(top, "timeline (attempts before issue 32 recorded none)")
        fig.suptitle(f"{a.attempt_id}: timeline", fontsize=11)
        return Plot(fig, "timeline", f"{a.attempt_id}: no timeline recorded")
    ends = {}
    for it in items:
        if it["lane"] == "trainer" and it["phase"] in ("sync",):
            ends[it["step"]] = it["t1"]
    if steps is not None and ends:
        first = sorted(ends)[-steps] if len(ends) >= steps else min(ends)
        lo = min(it["t0"] for it in items if it.get("step", 0) >= first)
        items = [it for it in items if it["t1"] >= lo]
    engines = sorted({it.get("engine", 0) for it in items if it["lane"] == "engine"})
    lanes = [("engine", e) for e in engines] + [("producer", None), ("trainer", None)]
    ylab = {("engine", e): f"engine {e}" for e in engines} | {("producer", None): "producer", ("trainer", None): "trainer"}
    for y, lane in enumerate(lanes):
        for it in items:
            if (it["lane"], it.get("engine") if it["lane"] == "engine" else None) != lane:
                continue
            w = it["t1"] - it["t0"]
            colour = PHASE_COLORS.get(it["phase"], "#bcbd22")
            top.broken_barh([(it["t0"], w)], (y - 0.38, 0.76), facecolors=colour, edgecolor="black", linewidth=0.3,
                            hatch="//" if it["phase"] == "wait" else None)
            if it["phase"] == "generate" and "batch" in it:
                top.annotate(f"b{it['batch']}·v{it.get('version', '?')}", (it["t0"] + w / 2, y), ha="center",
                             va="center", fontsize=6, color="white", clip_on=True)
    for s, t in ends.items():
        if not items or t >= items[0]["t0"]:
            top.axvline(t, color="black", lw=0.6, ls=":")
    top.set_yticks(range(len(lanes)), [ylab[ln] for ln in lanes], fontsize=8)
    top.set_xlabel("seconds since the attempt started", fontsize=8)
    top.tick_params(labelsize=8)
    order = list(PHASE_COLORS)
    used = sorted({it["phase"] for it in items}, key=lambda p: order.index(p) if p in order else len(order))
    top.legend(handles=[Patch(facecolor=PHASE_COLORS.get(p, "#bcbd22"), edgecolor="black", hatch="//" if p == "wait" else None,
                              label=p) for p in used], fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5),
               frameon=False)
    lo, hi = min(it["t0"] for it in items), max(it["t1"] for it in items)
    evals = eval_windows(items)
    sh = shares(items, lo, hi, exclude=evals)
    train_s = max((hi - lo) - sum(min(b, hi) - max(a, lo) for a, b in evals if b > lo and a < hi), 1e-9)
    trainer_idle, rollout_idle = 1 - sh["trainer_busy"], 1 - sh["rollout_busy"]
    side = "rollouts (the trainer waits)" if trainer_idle > rollout_idle else "training (the rollouts wait)"
    top.set_title(f"trainer busy {100 * sh['trainer_busy']:.0f}% · rollouts {100 * sh['rollout_busy']:.0f}% "
                  f"(generate {100 * sh['engine_busy']:.0f}%, score {100 * sh['reward_busy']:.0f}%) · both "
                  f"{100 * sh['overlap'] / train_s:.0f}% · bottleneck: {side}"
                  + (" · evals left out" if evals else ""), fontsize=10)
    rows = [r for r in a.train_rows if "staleness/max" in r]
    if steps is not None:
        rows = rows[-steps:]
    if rows:
        lags = sorted({int(k.rsplit("lag", 1)[1]) for r in rows for k in r if k.startswith("staleness/frac_lag")})
        xs = [r["step"] for r in rows]
        base = [0.0] * len(rows)
        for d in lags:
            ys = [r.get(f"staleness/frac_lag{d}", 0.0) for r in rows]
            bottom.bar(xs, ys, bottom=base, color=COLORS[d % len(COLORS)], label=f"lag {d}")
            base = [b + y for b, y in zip(base, ys)]
        bottom.set_ylabel("rows", fontsize=8)
        bottom.set_xlabel("step", fontsize=8)
        bottom.xaxis.set_major_locator(MaxNLocator(integer=True))
        bottom.tick_params(labelsize=8)
        bottom.legend(fontsize=7, loc="upper left")
        kx, ky = _series(rows, "tis/mismatch_kl")
        if kx:
            twin = bottom.twinx()
            twin.plot(kx, ky, color="black", marker=".", lw=1)
            twin.set_ylabel("mismatch KL", fontsize=8)
            twin.tick_params(labelsize=8)
        bottom.set_title("staleness: share of trained rows per lag (versions behind the trainer); "
                         "line: KL(engine || trainer) on the sampled tokens", fontsize=9)
    else:
        _missing(bottom, "staleness/frac_lag*")
    fig.suptitle(f"{a.attempt_id}: timeline (max_staleness {a.config.get('max_staleness', 0)})", fontsize=11)
    return Plot(fig, "timeline", f"{a.attempt_id} timeline: engines, producer and trainer busy per phase; "
                                 f"trainer busy {100 * sh['trainer_busy']:.0f}%, rollouts (generate + score) "
                                 f"{100 * sh['rollout_busy']:.0f}%, evals left out")


def timeline_strip(ax, items: list[dict[str, Any]], steps: int = 5) -> None:
    """The live view's small timeline: engine and trainer lanes over the last ``steps`` steps, busy shares in
    the title (the same intervals and colours as :func:`timeline`)."""
    syncs = sorted(it["t1"] for it in items if it["lane"] == "trainer" and it["phase"] == "sync")
    ax.set_title("timeline (last steps)", fontsize=10)
    if not syncs:
        _missing(ax, "timeline")
        return
    lo = syncs[-steps - 1] if len(syncs) > steps else min(it["t0"] for it in items)
    hi = max(it["t1"] for it in items)
    for y, lane in enumerate(("engine", "trainer")):
        for it in items:
            if it["lane"] == lane and it["t1"] >= lo and it["phase"] != "reward":
                ax.broken_barh([(it["t0"], it["t1"] - it["t0"])], (y - 0.38, 0.76),
                               facecolors=PHASE_COLORS.get(it["phase"], "#bcbd22"), edgecolor="black", linewidth=0.2,
                               hatch="//" if it["phase"] == "wait" else None)
    sh = shares(items, lo, hi, exclude=eval_windows(items))
    ax.set_xlim(lo, hi)
    ax.set_yticks([0, 1], ["engines", "trainer"], fontsize=8)
    ax.set_title(f"last steps: trainer {100 * sh['trainer_busy']:.0f}% · engines {100 * sh['engine_busy']:.0f}% busy",
                 fontsize=9)


def eval_curve(a: Attempt) -> Plot:
    """Held-out accuracy against step, the step-0 baseline as a line, the mode in the title."""
    fig = Figure(figsize=(8, 3.2), layout="constrained")
    ax = fig.add_subplot(1, 1, 1)
    pts = a.eval_points()
    if pts:
        ax.plot([s for s, _ in pts], [100 * v for _, v in pts], marker="o", color=COLORS[0], label="held-out (in training)")
    for j, key in enumerate(k for k in a.probe_keys() if k != EVAL_KEY):  # ID / OOD probes (seed 003)
        xs, ys = _series(a.metrics, key)
        ax.plot(xs, [100 * y for y in ys], marker="^", color=COLORS[2 + j], label=f"{key.split('/')[1]} probe")
    ck = [(s, float(d.get(d.get("mode", "greedy_pass@1"), 0.0))) for s, d in a.ckpt_evals.items()]
    if ck:
        ax.plot([s for s, _ in ck], [100 * v for _, v in ck], marker="s", ls=":", color=COLORS[1],
                label="checkpoint eval")
    base, best, _ = a.baseline_best_final()
    if base is not None:
        ax.axhline(100 * base, ls="--", color="gray", label=f"step-0 baseline {100 * base:.1f}%")
    if best is not None:
        ax.annotate(f"best {100 * best[1]:.1f}% @ {best[0]}", (best[0], 100 * best[1]), fontsize=8,
                    textcoords="offset points", xytext=(4, 4))
    if not pts and not ck:
        _missing(ax, EVAL_KEY)
    else:
        ax.legend(fontsize=8)
    ax.set_ylim(-2, 102)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(xlabel="step", ylabel="accuracy (%)")
    ax.set_title(f"held-out {a.eval_label()}", fontsize=10)
    return Plot(fig, "eval", f"{a.attempt_id} held-out {a.eval_label()} by step, step-0 baseline dashed")


# ---- A/B overlays -------------------------------------------------------------------------------
COMPARE_PANELS: list[tuple[str, str, bool]] = [  # (metric, title, percent)
    ("reward_mean", "reward_mean", False),
    ("correctness", "correctness (%)", True),
    ("grad_norm", "grad_norm", False),
    ("ppo_clip_ratio", "ppo_clip_ratio (%)", True),
    ("kl", "KL to reference", False),
    ("entropy_mean", "entropy_mean", False),
    ("ratio_max", "ratio_max", False),
    ("response_length_mean", "response length", False),
    ("truncated", "truncated (%)", True),
]


def _short(a: Attempt, others: Sequence[Attempt]) -> str:
    """A legend label: the attempt id, plus the config values that differ across the attempts."""
    keys = set()
    for o in others:
        keys |= set(key_differences(o.config, a.config))
    shown = ", ".join(f"{k}={a.config.get(k)}" for k in sorted(keys)[:3])
    return f"{a.attempt_id}" + (f" ({shown})" if shown else "")


def overlay(attempts: Sequence[Attempt]) -> Plot:
    """Training metrics of several attempts on shared axes."""
    fig, ax = _grid(len(COMPARE_PANELS))
    labels = [_short(a, attempts) for a in attempts]
    for (key, title, percent), axis in zip(COMPARE_PANELS, ax):
        axis.set_title(title, fontsize=10)
        drawn = False
        for i, a in enumerate(attempts):
            xs, ys = _series(a.train_rows, key)
            if xs:
                k = 100.0 if percent else 1.0
                axis.plot(xs, [k * y for y in ys], label=labels[i], **style(i))
                drawn = True
        if drawn:
            honest_axis(axis)
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.tick_params(labelsize=8)
        if not drawn:
            _missing(axis, key)
    ax[0].legend(fontsize=7)
    fig.suptitle("training metrics, overlaid", fontsize=11)
    return Plot(fig, "overlay", "training metrics of " + ", ".join(a.attempt_id for a in attempts))


def overlay_eval(attempts: Sequence[Attempt]) -> Plot:
    """Held-out eval curves of several attempts, each with its step-0 baseline."""
    fig = Figure(figsize=(8, 3.2), layout="constrained")
    ax = fig.add_subplot(1, 1, 1)
    labels = set()
    for i, a in enumerate(attempts):
        pts = a.eval_points()
        col = COLORS[i % len(COLORS)]
        if pts:
            ax.plot([s for s, _ in pts], [100 * v for _, v in pts], label=_short(a, attempts), **style(i))
            if pts[0][0] == 0:
                ax.axhline(100 * pts[0][1], ls="--", lw=1, color=col)
        labels.add(a.eval_label())
    ax.set_ylim(-2, 102)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(xlabel="step", ylabel="accuracy (%)")
    ax.set_title("held-out " + (" | ".join(sorted(labels)) if len(labels) > 1 else next(iter(labels), "")) +
                 ("  (MODES DIFFER: not comparable)" if len(labels) > 1 else ""), fontsize=9)
    ax.legend(fontsize=7)
    return Plot(fig, "overlay_eval", "held-out eval of " + ", ".join(a.attempt_id for a in attempts))
