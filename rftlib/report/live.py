"""Watching a run: an ipywidgets panel in JupyterLab, concise log lines headless.

Both are trainer callbacks (``Trainer(..., callbacks=[view.update])``) fed each metrics row as it is
logged (the step-0 baseline eval first, then one row per step). Both show the latest health
verdicts (:func:`rftlib.monitor.health.check_health` over the rows so far), so a failing smoke
test (seed 003 section 12) is seen at the step it fails, not after the run.

- :class:`LiveView`: progress bar, the latest numbers, reward / loss / held-out eval curves (one
  PNG redrawn per update) and the verdicts that are not ``pass``.
- :class:`TextView`: one line every ``every`` steps (and at the last), plus a line whenever a
  verdict changes status. Meant to sit beside tqdm's bar (it writes through ``tqdm.write``).
"""

from __future__ import annotations

import math
from typing import Any, Callable

from rftlib.config import RunConfig

EVAL_KEY = "eval/heldout/greedy_pass@1"


def latest_verdicts(rows: list[dict[str, Any]], cfg: RunConfig):
    """check_health over the rows so far, with the run's clip norm and spike threshold."""
    from rftlib.monitor.health import check_health

    return check_health(rows, max_grad_norm=cfg.max_grad_norm, spike_threshold=cfg.spike_grad_norm, ood_metric=EVAL_KEY)


def _num(row: dict[str, Any], key: str, f: str = ".3g") -> str:
    v = row.get(key)
    return format(v, f) if isinstance(v, (int, float)) and math.isfinite(v) else "-"


def status_line(row: dict[str, Any], cfg: RunConfig, last_eval: float | None = None) -> str:
    """The latest step in one line: reward, loss, kl, grad_norm, clip ratio, length, eval."""
    parts = [f"step {row.get('step', 0)}/{cfg.num_steps}", f"reward {_num(row, 'reward_mean', '.3f')}",
             f"loss {_num(row, 'loss', '.4f')}"]
    if "kl" in row:
        parts.append(f"kl {_num(row, 'kl')}")
    parts += [f"grad {_num(row, 'grad_norm')}", f"clip {_num(row, 'ppo_clip_ratio', '.2f')}",
              f"len {_num(row, 'response_length_mean', '.0f')}", f"trunc {_num(row, 'truncated', '.2f')}"]
    if last_eval is not None:
        parts.append(f"held-out {last_eval:.3f}")
    if "timing/step" in row:
        parts.append(f"{row['timing/step']:.0f}s/step")
    return "  ".join(parts)


def verdict_line(verdicts) -> str:
    bad = [v for v in verdicts if v.status in ("fail", "warn")]
    if not bad:
        return "health: ok" if any(v.status == "pass" for v in verdicts) else "health: (not enough steps yet)"
    return "health: " + "; ".join(f"{v.status.upper()} {v.name} ({v.message})" for v in bad)


class TextView:
    """Headless progress: concise log lines and verdict changes (beside tqdm's bar)."""

    def __init__(self, cfg: RunConfig, every: int | None = None, write: Callable[[str], None] | None = None,
                 health: bool = True):
        self.cfg = cfg
        self.rows: list[dict[str, Any]] = []
        self.every = every or max(1, cfg.num_steps // 10)
        self.health = health  # False where the trainer already prints verdict changes
        self._status: dict[str, str] = {}
        if write is None:
            try:
                from tqdm.auto import tqdm

                write = tqdm.write
            except ImportError:
                write = print
        self.write = write

    def update(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        ev = [r[EVAL_KEY] for r in self.rows if EVAL_KEY in r]
        step = int(row.get("step", 0))
        if "reward_mean" not in row:  # the step-0 baseline
            if ev:
                self.write(f"[rft] step 0 baseline: held-out greedy_pass@1 {ev[-1]:.3f}")
            return
        if step % self.every == 0 or step == self.cfg.num_steps or EVAL_KEY in row:
            self.write("[rft] " + status_line(row, self.cfg, ev[-1] if ev else None))
        if not self.health:
            return
        changed = []
        for v in latest_verdicts(self.rows, self.cfg):
            if v.status in ("warn", "fail") and self._status.get(v.name) != v.status:
                changed.append(f"{v.status.upper()} {v.name}: {v.message}" + (f" -> {v.action}" if v.action else ""))
            elif v.status == "pass" and self._status.get(v.name) in ("warn", "fail"):
                changed.append(f"ok again: {v.name}")
            self._status[v.name] = v.status
        for c in changed:
            self.write(f"[rft] step {step} health: {c}")


class LiveView:
    """The JupyterLab panel: progress, curves and the latest verdicts, updated every step."""

    def __init__(self, cfg: RunConfig, *, display_now: bool = True):
        import ipywidgets as w

        self.cfg = cfg
        self.rows: list[dict[str, Any]] = []
        self.bar = w.IntProgress(value=0, min=0, max=cfg.num_steps, description="step")
        self.text = w.HTML()
        self.image = w.Image(format="png")
        self.health = w.HTML("<i>health verdicts appear after the first steps</i>")
        self.panel = w.VBox([w.HBox([self.bar, self.text]), self.image, self.health])
        if display_now:
            from IPython.display import display

            display(self.panel)

    def update(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        self.bar.value = int(row.get("step", 0))
        ev = [r[EVAL_KEY] for r in self.rows if EVAL_KEY in r]
        self.text.value = "&nbsp; ".join(status_line(row, self.cfg, ev[-1] if ev else None).split("  "))
        tr = [r for r in self.rows if "reward_mean" in r]
        if not tr:
            return
        self.image.value = self._curves(tr)
        self.health.value = self._verdicts_html()

    def _curves(self, tr: list[dict[str, Any]]) -> bytes:
        from matplotlib.figure import Figure

        from rftlib.report.plots import Plot

        fig = Figure(figsize=(11, 2.6), layout="constrained")
        ax = [fig.add_subplot(1, 3, i + 1) for i in range(3)]
        steps = [r["step"] for r in tr]
        ax[0].plot(steps, [r["reward_mean"] for r in tr], marker=".")
        ax[0].set_title("reward_mean", fontsize=10)
        ax[1].plot(steps, [r.get("loss", float("nan")) for r in tr], marker=".", label="loss")
        if any("kl" in r for r in tr):
            ax[1].plot(steps, [r.get("kl", float("nan")) for r in tr], marker=".", label="kl")
            ax[1].legend(fontsize=7)
        ax[1].set_title("loss", fontsize=10)
        evs = [(r["step"], r[EVAL_KEY]) for r in self.rows if EVAL_KEY in r]
        if evs:
            ax[2].plot([s for s, _ in evs], [v for _, v in evs], marker="o")
            ax[2].axhline(evs[0][1], ls="--", color="gray")
        ax[2].set_title("held-out greedy_pass@1", fontsize=10)
        ax[2].set_ylim(-0.02, 1.02)
        for a in ax:
            a.set_xlim(0, self.cfg.num_steps)
            a.tick_params(labelsize=8)
        return Plot(fig).png(dpi=80)

    def _verdicts_html(self) -> str:
        from rftlib.report.html import esc, status_badge

        vs = latest_verdicts(self.rows, self.cfg)
        bad = [v for v in vs if v.status in ("fail", "warn")]
        ok = sum(v.status == "pass" for v in vs)
        if not bad:
            return f"{status_badge('pass')} {ok} health checks pass ({sum(v.status == 'n/a' for v in vs)} need more steps)"
        items = "".join(f"<li>{status_badge(v.status)} <b>{esc(v.name)}</b>: {esc(v.message)}"
                        f"<br><small>{esc(v.action)}</small></li>" for v in bad)
        return f"<ul style='margin:2px 0'>{items}</ul><small>{ok} other checks pass</small>"
