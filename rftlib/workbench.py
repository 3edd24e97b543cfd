"""What the notebooks call: parameters -> config -> attempt -> train -> results.

Notebooks stay thin (a ``parameters`` cell and calls into this module) so that every behaviour
is reachable from pytest. Papermill only *warns* about an unknown parameter; :func:`collect`
refuses it, listing the near matches.

The parameters cell gives every RunConfig field the value ``None``, meaning "the preset's value,
else the RunConfig default": papermill injects what the user passes after that cell, so only the
names the user set are non-None, and a preset is never silently overridden by a default.
"""

from __future__ import annotations

import difflib
import json
import os
import sys
import time
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from IPython import get_ipython
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from rftlib.attempts import create_attempt, read_attempt, run_dir_path, write_json
from rftlib.config import ConfigError, RunConfig, config_fields, diff, make_config, to_dict
from rftlib.monitor.metrics import read_metrics
from rftlib.monitor.quiet import quiet_libraries
from rftlib.preflight.lr import lr_preflight_for_steps
from rftlib.report.live import LiveView, TextView
from rftlib.report.plots import Plot, honest_axis
from rftlib.notebooks import NOTEBOOK_PARAMS, parameters_cell, preset_overrides  # noqa: F401  (re-exported: train.ipynb's cell)
from rftlib.train.checkpoint import latest_dir, load_checkpoint
from rftlib.train.torchrun import run_ranks
from rftlib.train.loop import EVAL_KEY, Trainer, resume_config

_IPY_NAMES = {"In", "Out", "get_ipython", "exit", "quit", "open"}


def collect(ns: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split a notebook's globals into (notebook params, config overrides); refuse unknown names."""
    known = set(NOTEBOOK_PARAMS) | set(config_fields())
    unknown = [k for k, v in ns.items() if not k.startswith("_") and k not in known and k not in _IPY_NAMES
               and not isinstance(v, (types.ModuleType, types.FunctionType, type))]
    if unknown:
        msgs = []
        for k in unknown:
            near = difflib.get_close_matches(k, sorted(known), n=3, cutoff=0.5)
            msgs.append(f"'{k}'" + (f" (did you mean {', '.join(near)}?)" if near else ""))
        raise ConfigError(f"unknown notebook parameter {', '.join(msgs)}; valid names: {', '.join(sorted(known))}")
    nb = {k: ns.get(k, v) for k, (v, _) in NOTEBOOK_PARAMS.items()}
    # the notebooks' one convention (rftlib.notebooks): the overrides dict as given, then each named field not None
    overrides = preset_overrides(nb["overrides"], **{k: ns.get(k) for k in config_fields()})
    return nb, overrides


@dataclass
class Run:
    cfg: RunConfig
    run_dir: Path
    resume: bool
    nb: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] | None = None
    changed: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    """a resume's changes to the attempt's config: {field: (before, now)}"""


def start(ns: dict[str, Any]) -> Run:
    """Resolve the config from the notebook's parameters and create (or reopen) the attempt."""
    nb, overrides = collect(ns)
    if nb["resume"]:
        run_dir = run_dir_path(nb["resume"])

        saved = read_attempt(run_dir)["config"]
        if nb["additional_steps"]:
            done = load_checkpoint(latest_dir(run_dir))["trainer_state"]["step"]
            overrides["num_steps"] = done + int(nb["additional_steps"])
        overrides.setdefault("stop_after_steps", None)
        cfg = resume_config(run_dir, **{k: v for k, v in overrides.items() if saved.get(k) != v or k == "num_steps"})
        now = to_dict(cfg)
        changed = {k: (saved.get(k), now[k]) for k in overrides if k in now and saved.get(k) != now[k]}
        if changed:
            # the attempt's record follows the resume: config.yaml holds what the steps from here run with (a later
            # resume without overrides keeps it: a k = 3 attempt resumed at k = 1 stays at 1), and ``resumes`` says
            # from which step what changed, so the report and the log tell both halves apart
            doc = read_attempt(run_dir)
            entry: dict[str, Any] = {"at_step": _checkpoint_step(run_dir),
                                     "changed": {k: [a, b] for k, (a, b) in changed.items()}}
            if "num_steps" in changed:
                entry.update(from_num_steps=saved.get("num_steps"), to_num_steps=cfg.num_steps)
            doc.setdefault("resumes", []).append(entry)
            doc["config"].update({k: b for k, (_, b) in changed.items()})
            (run_dir / "config.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
        return Run(cfg, run_dir, True, nb, changed=changed)
    cfg = make_config(nb["preset"], overrides)
    pre = lr_preflight(cfg)
    if pre.verdict == "refuse" and not nb["skip_preflight"]:
        raise ConfigError(f"LR preflight refused the launch: {pre.message}\n{pre.table()}\n"
                          "To launch anyway, set skip_preflight=True: the notebook parameter skip_preflight = True, "
                          "`rft train ... --set skip_preflight=True` (rft ab too), or `papermill ... -p skip_preflight "
                          "True`")
    run_dir = create_attempt(cfg, nb["attempt_id"])
    return Run(cfg, run_dir, False, nb)


def lr_preflight(cfg: RunConfig):
    """Seed 003's LR preflight on the schedule this config will actually run (optimizer steps)."""
    return lr_preflight_for_steps(cfg.total_optimizer_steps, cfg.warmup_ratio, cfg.lr,
                                  min_lr_ratio=cfg.min_lr_ratio, steps_per_rollout=cfg.optimizer_steps_per_rollout)


def _checkpoint_step(run_dir: Path) -> int | None:
    """The step of the attempt's latest checkpoint (its trainer_state.json), None where it cannot be read."""
    try:
        return int(json.loads((latest_dir(run_dir) / "trainer_state.json").read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def describe(run: Run) -> str:
    """The attempt's id and how its config differs from the defaults."""
    d = diff(RunConfig(), run.cfg)
    rows = [f"attempt {run.run_dir.name}" + (" (resumed)" if run.resume else ""), f"run dir: {run.run_dir}"]
    rows += [f"  {k}: {a!r} -> {b!r}" for k, (a, b) in d.items()] or ["  (all defaults)"]
    if run.changed:
        rows.append("changed at this resume (the attempt's earlier steps ran with the first value):")
        rows += [f"  {k}: {a!r} -> {b!r}" for k, (a, b) in run.changed.items()]
    rows.append(f"LR preflight: {lr_preflight(run.cfg).message}")
    return "\n".join(rows)


def train(run: Run) -> dict[str, Any]:
    """Train the attempt to its end: a live view with a Stop button in JupyterLab, else one text line
    per step (papermill, rft, a console). Library chatter (transformers' warnings, weight-loading
    bars) goes to ``logs/library_warnings.log`` instead of the output."""
    if int(run.nb.get("nproc") or 1) > 1:
        return _train_ranks(run, int(run.nb["nproc"]))
    callbacks = []
    live = None
    in_kernel = "ipykernel" in sys.modules
    if run.nb.get("live_view") and in_kernel and not headless_kernel():
        live = LiveView(run.cfg, run_dir=run.run_dir)
        callbacks.append(live.update)
    elif in_kernel:  # headless kernel (papermill): one line per step in the executed notebook
        callbacks.append(TextView(run.cfg, every=1, write=print, health=False, run_dir=run.run_dir).update)
    t0 = time.time()
    with quiet_libraries(run.run_dir / "logs" / "library_warnings.log"):
        trainer = Trainer(run.cfg, run.run_dir, resume=run.resume, progress=not callbacks, callbacks=callbacks)
        if live is not None:
            live.use_task(trainer.task)
        t1 = time.time()
        try:
            summary = trainer.train()
        finally:
            trainer.close()
            if live is not None:
                live.finish()
    summary.update(load_seconds=round(t1 - t0, 1), train_seconds=round(time.time() - t1, 1))
    write_json(run.run_dir / "summary.json", summary)
    run.summary = summary
    return summary


def _train_ranks(run: Run, nproc: int) -> dict[str, Any]:
    """The attempt on ``nproc`` ranks under torchrun (rank 0 writes the run dir); their lines stream here."""
    code = run_ranks(run.run_dir, nproc, resume=run.resume)
    if code != 0:
        raise RuntimeError(f"the {nproc} ranks of {run.run_dir.name} exited with code {code} (lines above); "
                           "the last checkpoint is intact for a resume")
    run.summary = json.loads((run.run_dir / "summary.json").read_text())
    return run.summary


def headless_kernel() -> bool:
    """True when no notebook frontend is watching this kernel, so widgets would never render.

    papermill does not import itself into the kernel, so the kernel cannot look for it in its
    modules. It tells from, in order: ``RFTLIB_HEADLESS=1`` (set by ``rft`` and rftlib's report
    runner before papermill starts the kernel); papermill's injected-parameters cell in the history
    (its first line is exactly ``# Parameters``); the current execute_request carrying no ``cellId``
    (JupyterLab, Notebook 7 and VS Code send one with every cell; nbclient, papermill's executor,
    sends none). Not in a Jupyter kernel at all (a console, pytest): True.
    """
    if os.environ.get("RFTLIB_HEADLESS", "").strip() in ("1", "true", "yes"):
        return True
    ip = get_ipython()
    if ip is None or ip.__class__.__name__ != "ZMQInteractiveShell":
        return True
    history = ip.user_ns.get("In") or []
    if any(isinstance(src, str) and src.split("\n", 1)[0].strip() == "# Parameters" for src in history):
        return True
    parent = {}
    kernel = getattr(ip, "kernel", None)
    if kernel is not None and hasattr(kernel, "get_parent"):
        parent = kernel.get_parent() or {}
    return "cellId" not in (parent.get("metadata") or {})


def result_text(summary: dict[str, Any], goal_points: float | None = None,
                goal_minutes: float | None = None) -> str:
    """Before/after held-out accuracy in words, and against a goal (the demo's: +15 points within 10
    minutes of training). A goal is MET only when every part of it is; what was missed is named.

    The points goal is judged on counts of problems, not on a float difference: 0.42 -> 0.57 on 100
    problems is 57 - 42 = 15 problems = +15 points, where 100 * (0.57 - 0.42) = 14.999999999999996.
    Accuracies are fractions of ``eval_n`` problems, so ``round(acc * eval_n)`` is the exact count;
    without ``eval_n`` the gain in points is rounded to 1e-9 before comparing.
    """
    b, f = summary.get("baseline"), summary.get("final")
    label = f"held-out {summary.get('eval_mode')} ({summary.get('eval_precision') or 'precision unrecorded'})"
    if b is None and f is None:
        return "no held-out eval recorded"
    if b is None or f is None:  # a run cut between evals: the missing number is said, never filled in
        minutes = summary.get("train_seconds", 0) / 60
        return (f"{label} on {summary.get('eval_n')} problems: before {'-' if b is None else f'{b:.2f}'}, after "
                f"{'-' if f is None else f'{f:.2f}'} ({summary.get('final_note') or 'not evaluated'}) over "
                f"{summary.get('steps')} steps in {minutes:.1f} min of training"
                + (f"; stopped: {summary['stop_reason']}" if summary.get("stop_reason") else "")
                + ("" if goal_points is None and goal_minutes is None else "; goal: NOT MET (no final eval)"))
    n = summary.get("eval_n")
    if isinstance(n, int) and n > 0:
        gained = round(f * n) - round(b * n)  # problems solved after minus before
        gain = 100 * gained / n
        reached = goal_points is None or gained * 100 >= goal_points * n  # exact for integer goals
    else:
        gain = round(100 * (f - b), 9)
        reached = goal_points is None or gain >= goal_points
    minutes = summary.get("train_seconds", 0) / 60
    best = summary.get("best")
    s = (f"{label} on {summary.get('eval_n')} problems: before {b:.2f}, after {f:.2f} "
         f"({gain:+.0f} points) over {summary.get('steps')} steps in {minutes:.1f} min of training"
         + (f" (best {best:.2f} at step {summary.get('best_step')})" if best is not None else "")
         + (f"; stopped: {summary['stop_reason']}" if summary.get("stop_reason") else ""))
    if goal_points is None and goal_minutes is None:
        return s
    parts, missed = [], []
    if goal_points is not None:
        parts.append(f"+{goal_points:.0f} points")
        if not reached:
            missed.append(f"gain {gain:+.1f} points < +{goal_points:.0f}")
    if goal_minutes is not None:
        parts.append(f"within {goal_minutes:g} min of training")
        if minutes > goal_minutes:
            missed.append(f"training took {minutes:.1f} min > {goal_minutes:g}")
    verdict = "MET" if not missed else "NOT MET (" + "; ".join(missed) + ")"
    return s + f"; goal {' '.join(parts)}: {verdict}"


def plot_run(run_dir: str | Path):
    """Reward, response length and held-out accuracy against step.

    Returns a :class:`rftlib.report.plots.Plot` (a ``matplotlib.figure.Figure`` with ``_repr_png_``):
    the notebook cell that ends with it shows the PNG, in JupyterLab and in papermill's output
    alike. No pyplot and no backend switch: the kernel's own matplotlib backend is left alone.
    """
    rows = read_metrics(run_dir)
    tr = [r for r in rows if "reward_mean" in r]
    ev = [r for r in rows if EVAL_KEY in r]
    fig = Figure(figsize=(13, 3.4), layout="constrained")
    ax = [fig.add_subplot(1, 3, i + 1) for i in range(3)]
    ax[0].plot([r["step"] for r in tr], [r["reward_mean"] for r in tr], marker=".")
    ax[0].set(title="training reward_mean", xlabel="step")
    ax[1].plot([r["step"] for r in tr], [r["response_length_mean"] for r in tr], marker=".", label="mean")
    ax[1].plot([r["step"] for r in tr], [100 * r["truncated"] for r in tr], marker=".", label="truncated %")
    ax[1].set(title="response length (tokens)", xlabel="step")
    ax[1].legend()
    ax[2].plot([r["step"] for r in ev], [r[EVAL_KEY] for r in ev], marker="o")
    if ev:
        ax[2].axhline(ev[0][EVAL_KEY], ls="--", c="gray", label="step-0 baseline")
        ax[2].legend()
    ax[2].set(title="held-out greedy_pass@1", xlabel="step", ylim=(0, 1))
    for a in ax:
        a.xaxis.set_major_locator(MaxNLocator(integer=True))
    for a in ax[:2]:
        honest_axis(a)
    return Plot(fig, "run", f"{Path(run_dir).name}: reward, response length and held-out accuracy by step")
