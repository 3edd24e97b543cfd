"""The sections of one attempt's report (notebooks/analysis.ipynb calls these, one per cell).

Each returns :class:`~rftlib.report.html.Html` or a :class:`~rftlib.report.plots.Plot`, so the
notebook holds no logic and every section is testable without a kernel.
"""

from __future__ import annotations

import json

from pathlib import Path
from typing import Any

from rftlib.config import field_docs
from rftlib.monitor.health import display_order
from rftlib.report import plots
from rftlib.report.attempt import Attempt, key_differences, load_attempt
from rftlib.report.html import Html, esc, fmt, join, kv_table, pct, pre, section, status_badge, table
from rftlib.report.index import format_html, parent_html, research_log_html, trackers_html


def header(a: Attempt) -> Html:
    """Attempt id, status, date, SHA, the eval result in words with its mode, and the notes."""
    base, best, final = a.baseline_best_final()
    if base is not None and best is not None and final is not None:
        result = (f"baseline {pct(base)} &rarr; final {pct(final)} ({100 * (final - base):+.1f} points); "
                  f"best {pct(best[1])} at step {best[0]}")
    elif base is not None and best is not None:
        result = (f"baseline {pct(base)} &rarr; final: not evaluated at step {a.steps_done} (the last eval is step "
                  f"{a.eval_points()[-1][0]}'s; <code>rft eval</code> scores the last checkpoint); "
                  f"best {pct(best[1])} at step {best[0]}")
    else:
        result = "no held-out eval recorded"
    counts = a.verdict_counts()
    health = " ".join(f"{status_badge(s)}&nbsp;{n}" for s, n in counts.items() if n)
    notes = a.config.get("notes") or ""
    rows = [("attempt", esc(a.attempt_id)), ("status", esc(a.status)), ("created", esc(a.created)),
            ("git", f"<code>{esc(a.sha)}</code>"), ("model / task", esc(f"{a.config.get('model')} / {a.config.get('task')}")),
            ("held-out eval", f"{result}<br><small>{esc(a.eval_label())}</small>"), ("health", health),
            ("run directory", f"<code>{esc(a.run_dir)}</code>"), ("trackers", trackers_html(a))]
    if a.config.get("init_adapter") or a.config.get("sft_data"):  # a stage of an SFT -> RL chain
        rows.append(("format compliance", format_html(a)))
    if a.config.get("init_adapter"):
        rows.append(("started from", parent_html(a)))
    changes = [r for r in a.resumes if r.get("changed")]
    if changes:  # the config shown is the last resume's: what the earlier steps ran with is here
        rows.append(("resumed with changes", "<br>".join(
            esc(f"from step {r.get('at_step', '?')}: " + ", ".join(f"{k} {v[0]!r} \u2192 {v[1]!r}"
                                                                  for k, v in r["changed"].items()))
            for r in changes)))
    if a.summary and a.summary.get("precision"):  # what trainer and engines computed in; why, when not the GPU's
        p = a.summary["precision"]
        rows.append(("precision", esc(f"trainer: {p.get('trainer')}; rollouts: {p.get('engine')}") +
                     (f"<br><small><b>{esc(p['note'])}</b></small>" if p.get("note") else "")))
    if a.summary and a.summary.get("train_seconds") is not None:
        t = float(a.summary["train_seconds"])
        rows.insert(5, ("train time", esc((f"{t / 60:.1f} min" if t >= 60 else f"{t:.0f} s") +
                                          f" for {a.summary.get('steps')} steps")))
    out = [f"<h2>{esc(a.attempt_id)}</h2>", kv_table(rows, raw_values=True)]
    out.append(notes_block(notes) if not a.conclusions else research_log_html(a))
    return join(*out)


def notes_block(notes: str) -> str:
    if not notes:
        return '<p style="color:#6b7280"><i>No notes. Set the <code>notes</code> parameter to record the hypothesis.</i></p>'
    return ('<div class="rft-notes" style="border-left:4px solid #2563eb;background:#eff6ff;padding:6px 10px;'
            f'margin:6px 0;white-space:pre-wrap"><b>Notes.</b> {esc(notes)}</div>')


def verdict_table(a: Attempt) -> Html:
    """check_health's verdicts, one coloured row each, failures first, with the seed's action."""
    vs = display_order(a.verdicts, ("fail", "warn", "pass", "n/a"))
    rows = [(status_badge(v.status), ("&nbsp;&nbsp;&#8627; " if v.caused_by else "") + esc(v.name), esc(fmt(v.value)),
             esc(v.message), esc(v.action if v.status in ("warn", "fail") else "")) for v in vs]
    return table(["status", "check", "value", "what was seen", "action (seed 003)"], rows,
                 row_status=[v.status for v in vs], raw=(0, 1, 2, 3, 4), cls="rft-verdicts")


ENV_STYLE = "background:#f3f4f6;color:#6b7280;font-style:italic"  # environment tokens: greyed, as the inspector does


def completion_cell(row: dict[str, Any], max_chars: int) -> str:
    """A completion as HTML: a multi-turn row's transcript (its ``transcript`` runs: the model's words as written,
    the environment's greyed and labelled, cut at ``max_chars`` characters in all), else the text as it is."""
    spans = row.get("transcript")
    if not spans:
        return pre(str(row.get("completion", "")), max_chars)
    parts, left = [], max_chars
    for sp in spans:
        text = str(sp.get("text", ""))
        cut = len(text) > left
        text = text[:max(left, 0)] + ("\u2026" if cut else "")
        left -= len(text)
        if sp.get("who") == "env":
            parts.append(f'<span style="{ENV_STYLE}" title="environment tokens (mask 0: not in the loss)">{esc(text)}'
                         "</span>")
        else:
            parts.append(f'<span title="model tokens">{esc(text)}</span>')
        if cut:
            rest = sum(len(str(s.get("text", ""))) for s in spans) - max_chars
            parts.append(f" [{rest} more chars]")
            break
    turns = sum(sp.get("who") == "model" for sp in spans)
    return (f'<div style="font-size:11px;color:#6b7280">{turns} model turn{"s" if turns != 1 else ""}; '
            f'<span style="{ENV_STYLE}">environment</span></div>'
            '<pre style="white-space:pre-wrap;margin:0;max-width:640px;font-size:12px">' + "".join(parts) + "</pre>")


def samples_table(a: Attempt, n: int = 4, max_chars: int = 600) -> Html:
    """The latest logged training completions (logs/samples) with reward and advantage."""
    step, rows = a.samples()
    if not rows:
        return Html("<p><i>No samples logged (samples are written every save_steps).</i></p>")
    body = [(esc(r.get("prompt", "")), esc(r.get("answer", "")), completion_cell(r, max_chars),
             esc(fmt(r.get("reward"))), esc(fmt(r.get("advantage"))), esc(r.get("truncated", "")))
            for r in rows[:n]]
    return join(f"<p>Training rollouts at step {step} (first {min(n, len(rows))} of {len(rows)} logged).</p>",
                table(["prompt", "answer", "completion", "reward", "advantage", "truncated"], body,
                      raw=(0, 1, 2, 3, 4, 5), cls="rft-samples"))


def eval_samples_table(a: Attempt, n: int = 4, max_chars: int = 400) -> Html:
    """Held-out completions of the last eval, correct and wrong ones both shown when there are."""
    if not a.evals:
        return Html("<p><i>No eval files.</i></p>")
    step, doc = list(a.evals.items())[-1]
    res = doc.get("results", [])
    right = [r for r in res if r.get("correct")]
    wrong = [r for r in res if not r.get("correct")]
    pick = (right[: n // 2] + wrong)[:n] if right else wrong[:n]
    body = [(esc(r.get("id")), esc(r.get("prompt", ""))[:300], esc(r.get("answer", ""))[:200],
             completion_cell(r, max_chars),
             status_badge("pass", "yes") if r.get("correct") else status_badge("fail", "no"))
            for r in pick]
    return join(f"<p>Held-out completions at step {step} ({doc.get('mode')}, {len(right)}/{len(res)} correct).</p>",
                table(["id", "prompt", "answer", "completion", "correct"], body, raw=(0, 1, 2, 3, 4), cls="rft-eval-samples"))


def inspector_href(a: Attempt, step: int) -> str:
    """The inspector page of recorded step ``step``, relative to the attempt's report (<reports>/<id>.html):
    <id>/step-N.html, which rftlib.report.publish.write_report writes beside the report."""
    return f"{a.attempt_id}/step-{step}.html"


def _batch_cell(a: Attempt, step: int, recorded: bool) -> str:
    if not recorded:
        return esc("not recorded")
    return f'<a href="{esc(inspector_href(a, step))}">step {step}</a>'


def spike_table(a: Attempt, n: int = 10) -> Html:
    sp = a.spikes()
    if not sp:
        thr = a.config.get("spike_grad_norm", 50)
        return Html(f"<p>No gradient spikes (no step with grad_norm &gt; {esc(fmt(thr))}).</p>")
    keys = ["step", "grad_norm", "ratio_max", "log_ratio_raw_max", "log_ratio_abs_p99"]
    kept = set(recorded_steps(a))
    rows = [[s.get(k) for k in keys] + [len(s.get("prompt_hashes", [])),
                                       _batch_cell(a, s["step"], bool(s.get("record")) and s["step"] in kept)]
            for s in sp[-n:]]
    return table(keys + ["prompts", "batch"], rows, raw=(len(keys) + 1,),
                 caption=f"spike_log.jsonl (last {min(n, len(sp))} of {len(sp)}); batch: the step's recorded batch "
                         f"in the token inspector (record_on_spike)")


def recorded_steps(a: Attempt) -> list[int]:
    """Steps whose whole batch is on disk (records/step_N: record_batches, record_on_spike)."""
    root = a.run_dir / "records"
    if not root.is_dir():
        return []
    return sorted(int(p.name[5:]) for p in root.iterdir() if p.is_dir() and p.name[5:].isdigit()
                  and p.name.startswith("step_"))


def records_table(a: Attempt) -> Html:
    """The recorded batches: step, why, size, where replay takes the weights from, the latest replay's verdict, and
    a link to the step's token inspector (``rft replay RUN --step N`` adds counterfactual columns to it)."""
    idx_p = a.run_dir / "records" / "index.json"
    idx = json.loads(idx_p.read_text()) if idx_p.exists() else []
    if not idx:
        return Html("<p>No recorded batches (record_batches: [] for this attempt, or no step reached one).</p>")
    kept = set(recorded_steps(a))
    rows = []
    for r in idx:
        step = r["step"]
        verdict = ""
        rdir = a.run_dir / "records" / f"step_{step}" / "replays"
        if rdir.is_dir():
            files = sorted(rdir.glob("*.json"), key=lambda p: p.stat().st_mtime)
            if files:
                verdict = json.loads(files[-1].read_text()).get("verdict", "")[:80]
        rows.append([step, r.get("reason", ""), f"{r['bytes'] / 1e6:.2f} MB", r.get("weights", ""),
                     verdict or ("not replayed" if step in kept else r.get("why", "dropped")),
                     _batch_cell(a, step, step in kept)])
    return table(["step", "recorded because", "size", "weights", "replay", "inspector"], rows, raw=(5,),
                 caption="records/ (rft replay RUN --step N --vary policy_loss=gspo,cispo adds counterfactuals)")


def metrics_table(a: Attempt, keys: tuple[str, ...] = ("reward_mean", "correctness", "policy_loss", "kl", "grad_norm",
                                                       "ppo_clip_ratio", "entropy_mean", "response_length_mean",
                                                       "truncated", "timing/reward_share", "sandbox/executions_per_s",
                                                       "sandbox/timeouts", "sandbox/crashes"), max_rows: int = 30) -> Html:
    """Per-step metrics, as the research log tabulated them (seed 003 section 7, post-training); a code
    run adds the sandbox under the training load (keys a run did not log are left out)."""
    rows = a.train_rows
    keys = tuple(k for k in keys if any(k in r for r in rows))
    if len(rows) > max_rows:  # keep the first and last steps
        rows = rows[: max_rows // 2] + rows[-max_rows // 2:]
    evals = {int(r["step"]): r for r in a.eval_rows}
    return table(["step", *keys, "eval"], [[r.get("step"), *[r.get(k) for k in keys],
                                            evals.get(int(r.get("step", -1)), {}).get("eval/heldout/greedy_pass@1")]
                                           for r in rows], cls="rft-metrics")


def config_table(a: Attempt) -> Html:
    """Every config value with its one-line doc (rftlib/settings.py)."""
    docs = field_docs()
    return table(["parameter", "value", "meaning"], [(k, v, docs.get(k, "")) for k, v in a.config.items()],
                 cls="rft-config")


def config_diff(a: Attempt, baseline: str | Path | None = None) -> Html:
    """How this attempt's config differs from a baseline attempt's (or from the defaults)."""
    if baseline:
        b = load_attempt(baseline)
        against, bconf = b.attempt_id, b.config
    else:
        against, bconf = "RunConfig defaults", None
    d = key_differences(a.config, bconf)
    if not d:
        return Html(f"<p>Same config as {esc(against)} (bookkeeping fields aside).</p>")
    return join(f"<p>Differences from <b>{esc(against)}</b>:</p>",
                table(["parameter", esc(against), a.attempt_id], [(k, x, y) for k, (x, y) in d.items()],
                      cls="rft-config-diff"))


def provenance_table(a: Attempt) -> Html:
    p = a.provenance
    rows: list[tuple[str, Any]] = [("git sha", p.get("git_sha")), ("dirty", p.get("git_dirty")),
                                   ("created", p.get("created"))]
    rows += [(f"machine.{k}", v) for k, v in (p.get("machine") or {}).items()]
    rows += [(f"package {k}", v) for k, v in (p.get("packages") or {}).items()]
    if (a.run_dir / "git.diff").exists():
        rows.append(("uncommitted diff", f"{(a.run_dir / 'git.diff').stat().st_size} bytes in git.diff"))
    return kv_table(rows)


def checkpoint_table(a: Attempt) -> Html:
    """Checkpoint evals (eval/ckpt_step_N.json), against the step-0 baseline."""
    if not a.ckpt_evals:
        return Html("<p><i>No checkpoint evals yet: <code>rft eval RUN_DIR</code> evaluates every "
                    "training_state/step_N.</i></p>")
    base, _, _ = a.baseline_best_final()
    rows = []
    for s, d in a.ckpt_evals.items():
        acc = float(d.get(d.get("mode", "greedy_pass@1"), 0.0))
        rows.append((f"step {s}" + (" (final)" if d.get("final") else ""), d.get("mode"), d.get("n_problems"), pct(acc),
                     d.get("precision", "unrecorded"), "\u2014" if base is None else f"{100 * (acc - base):+.1f}",
                     d.get("source", "")))
    return table(["checkpoint", "mode", "problems", "accuracy", "precision", "vs step-0 (points)", "source"], rows,
                 cls="rft-ckpt")


def report_sections(run_dir: str | Path, baseline: str | Path | None = None) -> list[Any]:
    """All sections in report order (what the analysis notebook shows), for tests and scripts."""
    a = load_attempt(run_dir)
    return [header(a), section("Health verdicts", verdict_table(a)), plots.tier1(a), plots.eval_curve(a),
            checkpoint_table(a), plots.tier2(a), plots.tier3(a), plots.timeline(a), metrics_table(a), samples_table(a),
            eval_samples_table(a), spike_table(a), config_diff(a, baseline), config_table(a), provenance_table(a)]
