"""Watching a run: an ipywidgets panel in JupyterLab, concise log lines headless.

Both are trainer callbacks (``Trainer(..., callbacks=[view.update])``) fed each metrics row as it is
logged (the step-0 baseline eval first, then one row per step). Both show the run's health
verdicts (:func:`rftlib.monitor.health.run_verdicts`, the same list the report shows), so a failing
smoke test (seed 003 section 12) is seen at the step it fails, not after the run.

- :class:`LiveView`: progress bar, a Stop button (checkpoint, then stop: :func:`rftlib.attempts.request_stop`),
  the status line (latest numbers, time remaining, peak memory), reward / loss / held-out curves
  (one PNG redrawn per update), one whole group of samples of the latest step (the G completions
  of one prompt with reward and advantage) and the verdicts that are not ``pass``.
- :class:`TextView`: one line every ``every`` steps (and at the last), plus a line whenever a
  verdict changes status. Meant to sit beside tqdm's bar (it writes through ``tqdm.write``).

Rows may carry ``_group`` (the trainer's contract: ``{"prompt", "answer", "completions": [{"text",
"reward", "advantage", "truncated"}, ...]}``, never written to metrics.jsonl); without it the view
reads the step's ``logs/samples/samples_step<N>.jsonl`` when there is one.
"""

from __future__ import annotations

import json
import math
import re
import threading
from pathlib import Path
from typing import Any, Callable, Iterable

import ipywidgets as w
from IPython import get_ipython
from IPython.display import display
from matplotlib.figure import Figure
from tqdm.auto import tqdm

from rftlib.attempts import request_stop
from rftlib.config import RunConfig
from rftlib.monitor.health import display_order, run_verdicts
from rftlib.monitor.timeline import read_timeline
from rftlib.report.html import esc, status_badge
from rftlib.report.plots import Plot, honest_axis, timeline_strip

EVAL_KEY = "eval/heldout/greedy_pass@1"


def latest_verdicts(rows: list[dict[str, Any]], cfg: RunConfig, skip: Iterable[str] = ()):
    """The run's verdicts over the rows so far (rftlib.monitor.health.run_verdicts: the report's list)."""
    return run_verdicts(rows, cfg, skip)


def _num(row: dict[str, Any], key: str, f: str = ".3g") -> str:
    v = row.get(key)
    return format(v, f) if isinstance(v, (int, float)) and math.isfinite(v) else "-"


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def time_left(rows: list[dict[str, Any]], cfg: RunConfig, window: int = 3) -> float | None:
    """Seconds to num_steps at the mean ``timing/step`` of the last ``window`` steps (None before a step),
    at most what is left of max_train_minutes after the steps of ``rows`` (this session's: the budget
    is per session; evals are not counted, so it may end a little sooner)."""
    all_times = [r["timing/step"] for r in rows if isinstance(r.get("timing/step"), (int, float))]
    times = all_times[-window:]
    if not times or not rows:
        return None
    done = max(int(r.get("step", 0)) for r in rows)
    left = max(0, cfg.num_steps - done) * sum(times) / len(times)
    if cfg.max_train_minutes is not None:
        left = min(left, max(0.0, 60 * cfg.max_train_minutes - sum(all_times)))
    return left


def planned_steps(rows: list[dict[str, Any]], cfg: RunConfig) -> int:
    """The step the run is expected to end at: num_steps, or under a time budget (max_train_minutes)
    the step its time runs out at, at the recent speed (the progress bar's end and the curves' x range)."""
    left = time_left(rows, cfg) if cfg.max_train_minutes is not None else None
    times = [r["timing/step"] for r in rows if isinstance(r.get("timing/step"), (int, float))][-3:]
    if left is None or not times or sum(times) <= 0:
        return cfg.num_steps
    done = max(int(r.get("step", 0)) for r in rows)
    return min(cfg.num_steps, max(done + 1, done + math.ceil(left * len(times) / sum(times))))


def memory_text(row: dict[str, Any]) -> str:
    """Peak memory of the run so far: process RSS here (and the RSS the step left, rftlib.train.step_memory), and
    on a GPU the CUDA peak beside the preflight's estimate (``memory/*`` keys of the row; empty when none
    were logged)."""
    parts = []
    if isinstance(row.get("memory/cuda_peak_gib"), (int, float)):
        est = row.get("memory/preflight_gib")
        parts.append(f"GPU peak {row['memory/cuda_peak_gib']:.1f} GiB"
                     + (f" (preflight {est:.1f})" if isinstance(est, (int, float)) else ""))
    if isinstance(row.get("memory/peak_rss_gib"), (int, float)):
        now = row.get("memory/rss_gib")  # after the step: what a leak would raise; the peak only ever rises
        parts.append(f"RSS peak {row['memory/peak_rss_gib']:.2f} GiB"
                     + (f" ({now:.2f} after the step)" if isinstance(now, (int, float)) else ""))
    return ", ".join(parts)


def status_line(row: dict[str, Any], cfg: RunConfig, last_eval: float | None = None,
                rows: list[dict[str, Any]] | None = None) -> str:
    """The latest step in one line: reward, loss, kl, grad_norm, clip ratio, length, eval, speed,
    time remaining (from ``rows``, the run so far) and peak memory."""
    parts = [f"step {row.get('step', 0)}/{cfg.num_steps}", f"reward {_num(row, 'reward_mean', '.3f')}",
             f"loss {_num(row, 'loss', '.4f')}"]
    if "kl" in row:
        parts.append(f"kl {_num(row, 'kl')}")
    parts += [f"grad {_num(row, 'grad_norm')}", f"clip {_num(row, 'ppo_clip_ratio', '.2f')}",
              f"len {_num(row, 'response_length_mean', '.0f')}", f"trunc {_num(row, 'truncated', '.2f')}"]
    if isinstance(row.get("turns"), (int, float)):  # a multi-turn environment (rftlib.rollout.multi_turn)
        parts.append(f"turns {row['turns']:.1f}")
        calls = row.get("tool_calls")
        if isinstance(calls, (int, float)):  # means over rows: calls per trajectory, and the share that ran
            ok = row.get("tool_ok")
            parts.append(f"tools {calls:.2f}/traj" + (f" ({ok / calls:.0%} ran)" if calls > 0 and isinstance(
                ok, (int, float)) else ""))
    if last_eval is not None:
        parts.append(f"held-out {last_eval:.3f}")
    if isinstance(row.get("timing/step"), (int, float)):
        parts.append(f"{row['timing/step']:.0f}s/step")
    left = time_left(rows if rows is not None else [row], cfg)
    if left is not None:
        parts.append(f"{_duration(left)} left")
    if mem := memory_text(row):
        parts.append(mem)
    return "  ".join(parts)


def verdict_line(verdicts) -> str:
    bad = [v for v in verdicts if v.status in ("fail", "warn") and not v.caused_by]
    if not bad:
        return "health: ok" if any(v.status == "pass" for v in verdicts) else "health: (not enough steps yet)"
    return "health: " + "; ".join(f"{v.status.upper()} {v.name} ({v.message})" for v in bad)


# ---- samples ------------------------------------------------------------------------------------
_BYTE_TOKENS = re.compile(r"(?:<0x[0-9A-Fa-f]{2}>)+")  # byte-fallback tokens a decoder left as text
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def clean_text(text: str) -> str:
    """A completion as a person can read it: byte-fallback tokens (``<0xE2><0x82><0xAC>``) decoded
    as UTF-8, undecodable bytes (U+FFFD runs) shown once as ``\u27e8?\u27e9``, control characters as
    ``\\xNN`` escapes; newlines and tabs kept."""
    text = _BYTE_TOKENS.sub(lambda m: bytes(int(h, 16) for h in re.findall(r"<0x([0-9A-Fa-f]{2})>", m.group(0)))
                            .decode("utf-8", errors="replace"), str(text))
    text = re.sub("\ufffd+", "\u27e8?\u27e9", text)
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group(0)):02x}", text)


def group_from_samples(run_dir: Path | None, step: int) -> dict[str, Any] | None:
    """The first whole prompt group of ``logs/samples/samples_step<step>.jsonl`` in the ``_group`` shape."""
    if run_dir is None:
        return None
    path = Path(run_dir) / "logs" / "samples" / f"samples_step{step}.jsonl"
    if not path.exists():
        return None
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    if not rows:
        return None
    first = [r for r in rows if r.get("prompt") == rows[0].get("prompt")]
    return {"prompt": first[0].get("prompt", ""), "answer": first[0].get("answer", ""),
            "completions": [{"text": r.get("completion", ""), "reward": r.get("reward"),
                             "advantage": r.get("advantage"), "truncated": r.get("truncated", False)} for r in first]}


def group_html(group: dict[str, Any], step: int, max_chars: int = 400) -> str:
    """One prompt and its G completions, each with reward and advantage (and whether it was cut off)."""
    comps = group.get("completions") or []
    rows = []
    for i, c in enumerate(comps):
        t = clean_text(c.get("text", ""))
        t = t if len(t) <= max_chars else t[:max_chars] + " \u2026"
        rew, adv = c.get("reward"), c.get("advantage")
        color = "#dcfce7" if isinstance(adv, (int, float)) and adv > 0 else \
            "#fee2e2" if isinstance(adv, (int, float)) and adv < 0 else "#f3f4f6"
        rows.append(f"<tr style='background:{color}'><td>{i + 1}</td><td>{_fmt(rew)}</td><td>{_fmt(adv, '+.3f')}</td>"
                    f"<td>{'cut' if c.get('truncated') else ''}</td><td><pre style='margin:0;white-space:pre-wrap;"
                    f"font-size:11px'>{esc(t)}</pre></td></tr>")
    head = (f"<div class='rft-group'><b>Samples of step {step}</b>: one prompt, its {len(comps)} completions "
            f"(advantage &gt; 0 green, &lt; 0 red)<br><pre style='margin:2px 0;white-space:pre-wrap;font-size:11px'>"
            f"{esc(clean_text(group.get('prompt', '')))}</pre><small>answer: <code>{esc(group.get('answer', ''))}</code>"
            "</small>")
    return (head + "<table style='border-collapse:collapse;font-size:12px' class='rft-group-table'><tr><th>#</th>"
            "<th>reward</th><th>advantage</th><th></th><th style='text-align:left'>completion</th></tr>"
            + "".join(rows) + "</table></div>")


def _fmt(v: Any, f: str = ".3g") -> str:
    return format(v, f) if isinstance(v, (int, float)) and math.isfinite(v) else "-"


class TextView:
    """Headless progress: concise log lines and verdict changes (beside tqdm's bar)."""

    @property
    def shows_verdicts(self) -> bool:
        """Whether this view prints verdict changes itself (the trainer then prints none)."""
        return self.health

    def __init__(self, cfg: RunConfig, every: int | None = None, write: Callable[[str], None] | None = None,
                 health: bool = True, run_dir: Path | None = None):
        self.cfg = cfg
        self.run_dir = run_dir
        self.rows: list[dict[str, Any]] = []
        self.every = every or max(1, cfg.num_steps // 10)
        self.health = health  # False where the trainer already prints verdict changes
        self.skip: tuple[str, ...] = ()
        self._status: dict[str, str] = {}
        if write is None:
            write = tqdm.write
        self.write = write

    def update(self, row: dict[str, Any]) -> None:
        row = {k: v for k, v in row.items() if k != "_group"}
        self.rows.append(row)
        ev = [r[EVAL_KEY] for r in self.rows if EVAL_KEY in r]
        step = int(row.get("step", 0))
        if "reward_mean" not in row:  # the step-0 baseline
            if ev:
                self.write(f"[rft] step 0 baseline: held-out greedy_pass@1 {ev[-1]:.3f}")
            return
        if step % self.every == 0 or step == self.cfg.num_steps or EVAL_KEY in row:
            self.write("[rft] " + status_line(row, self.cfg, ev[-1] if ev else None, self.rows))
        if not self.health:
            return
        changed = []
        for v in latest_verdicts(self.rows, self.cfg, self.skip):
            if v.status in ("warn", "fail") and self._status.get(v.name) != v.status:
                changed.append(f"{v.status.upper()} {v.name}: {v.message}" + (f" -> {v.action}" if v.action else ""))
            elif v.status == "pass" and self._status.get(v.name) in ("warn", "fail"):
                changed.append(f"ok again: {v.name}")
            self._status[v.name] = v.status
        for c in changed:
            self.write(f"[rft] step {step} health: {c}")


def _route_clicks_to_subshell(widget) -> bool:
    """Let ``widget``'s frontend messages (a button click) be handled while the kernel is busy
    running the training cell. ipykernel 7 routes a comm's incoming messages to the subshell
    ``_reply_subshell_id`` names (kernel subshells, JEP 91); this makes one for the widget. Returns
    False where the kernel cannot (older ipykernel): the click then waits until the cell ends, and
    Kernel > Interrupt is the way to stop (see the README)."""
    try:
        kernel = get_ipython().kernel
        if not getattr(kernel, "_supports_kernel_subshells", False):
            return False
        thread = kernel.shell_channel_thread
        box: dict[str, str] = {}
        done = threading.Event()

        def make() -> None:
            try:
                box["id"] = thread.manager._create_subshell()
            finally:
                done.set()

        thread.io_loop.add_callback(make)
        if not done.wait(5) or "id" not in box:
            return False
        widget.comm._reply_subshell_id = box["id"]
        return True
    except Exception:  # any kernel without that machinery: the button still works once the cell ends
        return False


class LiveView:
    """The JupyterLab panel: progress, Stop button, status, curves, a group of samples and the latest
    verdicts, updated every step."""

    shows_verdicts = True  # the panel lists the verdicts: the trainer prints no ``[health step N]`` lines under it

    def __init__(self, cfg: RunConfig, *, run_dir: str | Path | None = None, display_now: bool = True):
        self.cfg = cfg
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.rows: list[dict[str, Any]] = []
        self.skip: tuple[str, ...] = ()
        self.bar = w.IntProgress(value=0, min=0, max=cfg.num_steps, description="step")
        self.stop = w.Button(description="Stop (checkpoint first)", button_style="danger", icon="stop",
                             tooltip="checkpoint after the current step, then stop the attempt",
                             layout=w.Layout(width="190px"), disabled=self.run_dir is None)
        self.stop.on_click(self._on_stop)
        self.text = w.HTML()
        self.image = w.Image(format="png")
        self.samples = w.HTML("<i>samples of the latest step appear after the first step</i>")
        self.health = w.HTML("<i>health verdicts appear after the first steps</i>")
        self.panel = w.VBox([w.HBox([self.bar, self.stop]), self.text, self.image, self.health, self.samples])
        self.subshell = False
        if display_now:
            display(self.panel)
            self.subshell = _route_clicks_to_subshell(self.stop)

    def use_task(self, task) -> None:
        """The task's opted-out rules (Task.health_skip), so the panel shows the trainer's rule set."""
        self.skip = tuple(getattr(task, "health_skip", ()) or ())

    def _on_stop(self, _button=None) -> None:
        if self.run_dir is None:
            return
        request_stop(self.run_dir)
        self.stop.disabled = True
        self.stop.description = "Stopping after this step"

    def finish(self) -> None:
        """After the run: the button has nothing left to stop (and says where a Stop took effect)."""
        self.stop.disabled = True
        step = max((int(r.get("step", 0)) for r in self.rows), default=0)
        self.stop.description = "Run finished" if self.stop.description.startswith("Stop (") else \
            f"Stopped at step {step}"

    def update(self, row: dict[str, Any]) -> None:
        group = row.get("_group")
        row = {k: v for k, v in row.items() if k != "_group"}
        self.rows.append(row)
        self.bar.max = planned_steps(self.rows, self.cfg)
        self.bar.value = min(int(row.get("step", 0)), self.bar.max)
        ev = [r[EVAL_KEY] for r in self.rows if EVAL_KEY in r]
        self.text.value = "&nbsp; ".join(status_line(row, self.cfg, ev[-1] if ev else None, self.rows).split("  "))
        tr = [r for r in self.rows if "reward_mean" in r]
        if not tr:
            return
        self.image.value = self._curves(tr)
        self.health.value = self._verdicts_html()
        step = int(row.get("step", 0))
        group = group or group_from_samples(self.run_dir, step)
        if group:
            self.samples.value = group_html(group, step)

    def _curves(self, tr: list[dict[str, Any]]) -> bytes:
        # an asynchronous attempt (max_staleness > 0) adds where the last steps' time went: which side waits
        items = read_timeline(self.run_dir) if self.run_dir is not None and self.cfg.max_staleness > 0 else []
        n = 4 if items else 3
        fig = Figure(figsize=(11 + 3.5 * (n - 3), 2.6), layout="constrained")
        ax = [fig.add_subplot(1, n, i + 1) for i in range(n)]
        if items:
            timeline_strip(ax.pop(), items)
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
            a.set_xlim(0, self.bar.max)
            a.tick_params(labelsize=8)
        for a in ax[:2]:
            honest_axis(a)  # plain labels; 1e-8 of loss noise is drawn flat, not as a trend
        return Plot(fig).png(dpi=80)

    def _verdicts_html(self) -> str:
        vs = display_order(latest_verdicts(self.rows, self.cfg, self.skip))
        bad = [v for v in vs if v.status in ("fail", "warn")]
        ok = sum(v.status == "pass" for v in vs)
        if not bad:
            return f"{status_badge('pass')} {ok} health checks pass ({sum(v.status == 'n/a' for v in vs)} need more steps)"
        items = "".join((f"<li style='margin-left:18px;color:#6b7280'>\u21b3 " if v.caused_by else "<li>")
                        + f"{status_badge(v.status)} <b>{esc(v.name)}</b>: {esc(v.message)}"
                        f"<br><small>{esc(v.action)}</small></li>" for v in bad)
        return f"<ul style='margin:2px 0'>{items}</ul><small>{ok} other checks pass</small>"
