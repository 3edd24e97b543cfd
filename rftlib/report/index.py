"""reports/index.html: every attempt in a runs root, rebuilt from the run directories alone.

It replaces the hand-kept research log (seed 003 ``rl_grpo_research.md``): one row per attempt
with its date, git SHA, the key config differences from a baseline attempt, the held-out eval
(step-0 baseline vs best, with the mode), the health verdicts, the hypothesis set at launch beside the conclusions written after (``rft note``), the SFT parent
it started from, and a link to its report.
Nothing is stored between builds, so deleting or adding a run directory and rebuilding is all it
takes to keep it true (``rft index --runs runs --out reports``).
"""

from __future__ import annotations

import datetime as _dt
import re
from pathlib import Path
from typing import Sequence

from rftlib.attempts import reports_root, runs_root as resolve_runs
from rftlib.report.attempt import Attempt, key_differences, list_attempts, load_attempt
from rftlib.report.html import Html, esc, pct, status_badge, table

PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>
body {{ font-family: -apple-system, "Segoe UI", "DejaVu Sans", Arial, sans-serif; margin: 18px 24px; color: #111827; }}
h1 {{ font-size: 22px; margin: 0 0 4px 0; }}
p.meta {{ color: #4b5563; margin: 0 0 12px 0; font-size: 13px; }}
table.rft-index td small {{ color: #4b5563; }}
a {{ color: #1d4ed8; }}
</style></head>
<body>
<h1>{title}</h1>
<p class="meta">{meta}</p>
{body}
</body></html>
"""


def _eval_cell(a: Attempt) -> str:
    base, best, final = a.baseline_best_final()
    if best is None:
        return "<i>no eval</i>"
    gain = "" if base is None else f" ({100 * (best[1] - base):+.1f})"
    fin = pct(final) if final is not None else f"not evaluated at step {a.steps_done}"
    return (f"{esc(pct(base))} &rarr; <b>{esc(pct(best[1]))}</b>{esc(gain)} @ {best[0]}"
            f"<br><small>final {esc(fin)}; {esc(a.eval_label())}</small>")


def _verdict_cell(a: Attempt) -> str:
    c = a.verdict_counts()
    bad = [v for v in a.verdicts if v.status in ("fail", "warn") and not v.caused_by]  # root causes, not echoes
    head = " ".join(f"{status_badge(s)}&nbsp;{n}" for s in ("fail", "warn", "pass") if (n := c[s]))
    names = "<br>".join(f"<small>{esc(v.status)}: {esc(v.name)}</small>" for v in bad[:4])
    return head + ("<br>" + names if names else "")


def _diff_cell(a: Attempt, baseline: Attempt | None) -> str:
    if baseline is None or a is baseline:
        return "<i>(baseline)</i>" if a is baseline else ""
    d = key_differences(a.config, baseline.config)
    if not d:
        return "<i>same config</i>"
    items = [f"{esc(k)}: {esc(x)} &rarr; <b>{esc(y)}</b>" for k, (x, y) in list(d.items())[:8]]
    if len(d) > 8:
        items.append(f"<small>+{len(d) - 8} more</small>")
    return "<br>".join(items)


def research_log_html(a: Attempt, *, width: str = "none") -> str:
    """The hypothesis set at launch and the dated conclusions written after (``rft note``), side by side
    in one block: what the index's and the report's notes show."""
    style = f"white-space:pre-wrap;max-width:{width}"
    hyp = (f'<div style="{style}"><b>Hypothesis.</b> {esc(a.hypothesis)}</div>' if a.hypothesis else
           f'<div style="{style};color:#6b7280"><i>No hypothesis: set <code>notes</code> at launch.</i></div>')
    concl = "".join(f'<div class="rft-conclusion" style="{style};margin-top:4px"><b>Conclusion '
                    f'{esc(n.get("date", "")[:16].replace("T", " "))}.</b> {esc(n.get("text", ""))}</div>'
                    for n in a.conclusions)
    if not concl:
        concl = (f'<div style="{style};color:#6b7280;margin-top:4px"><i>No conclusion yet: '
                 f'rft note {esc(a.run_dir.name)} "what you learned; next step"</i></div>')
    return hyp + concl


def trackers_html(a: Attempt) -> str:
    """Each tracker's run (URL, else local path) and any failure warning, for the report header."""
    rows = []
    for name, t in a.trackers.items():
        where = t.get("url") or t.get("path") or t.get("tracking_uri") or ""
        link = f'<a href="{esc(where)}">{esc(where)}</a>' if str(where).startswith("http") else f"<code>{esc(where)}</code>"
        run = f" run <code>{esc(t['run_id'])}</code>" if t.get("run_id") else ""
        warn = "".join(f'<br><span style="color:#b91c1c">&#9888; {esc(w.get("message", ""))}</span>'
                       for w in t.get("warnings", []))
        if t.get("error"):
            warn += f'<br><span style="color:#b91c1c">&#9888; the run crashed: {esc(t["error"])}</span>'
        segs = t.get("segments") or []
        if len(segs) > 1:  # wandb offline: one directory per resume, the last holds the whole history
            warn += (f"<br>{len(segs)} offline segments (sync the last, it replays the rows before it): "
                     + ", ".join(f"<code>{esc(x)}</code>" for x in segs))
        if t.get("superseded"):  # MLflow: runs replaced at a resume (their history ran past the checkpoint)
            warn += "<br>replaced runs (deleted): " + ", ".join(f"<code>{esc(x)}</code>" for x in t["superseded"])
        rows.append(f"<b>{esc(name)}</b> ({esc(t.get('status', '?'))}){run}: {link}{warn}")
    return "<br>".join(rows) or "<i>none</i>"


def format_html(a: Attempt) -> str:
    """The \\boxed{} rate at the first and the last held-out eval (seed 003 section 12's 95% bar)."""
    pts = a.format_points()
    if not pts:
        return "<i>no held-out eval with has_boxed</i>"
    (s0, f0), (s1, f1) = pts[0], pts[-1]
    return f"{esc(pct(f0))} at step {s0} &rarr; <b>{esc(pct(f1))}</b> at step {s1} (seed 003: SFT first below 95%)"


def parent_html(a: Attempt) -> str:
    """The attempt this one started from (its SFT parent), linked to the parent's report, with the
    parent's own before/after numbers; "" when it started from the base model."""
    parent = a.parent
    if parent is None:
        ad = a.config.get("init_adapter")
        return f"adapter <code>{esc(ad)}</code> (not an attempt directory)" if ad else ""
    p = load_attempt(parent)
    s = p.summary or {}
    extra = ""
    if "format_after" in s:
        mine, theirs = a.eval_precision(), p.eval_precision()
        differ = (f' <b style="color:#b91c1c">(a different precision from this attempt\'s {esc(mine)}: the numbers '
                  "are not comparable)</b>") if mine != theirs and "unrecorded" not in (mine, theirs) else ""
        extra = (f" &mdash; {esc(p.config.get('task'))}: format compliance {esc(pct(s.get('format_before')))} &rarr; "
                 f"{esc(pct(s.get('format_after')))}, held-out {esc(pct(s.get('baseline')))} &rarr; {esc(pct(s.get('final')))}"
                 f" ({esc(theirs)}){differ}")
    return f'<a href="{esc(p.attempt_id)}.html">{esc(p.attempt_id)}</a>{extra}'


def build_index(runs_root: str | Path, out_dir: str | Path, *, baseline: str | None = None,
                title: str = "rftlib attempts") -> Html:
    """The index page's HTML. ``baseline``: the attempt id the config differences are taken
    against (default: the first attempt). Report links point to ``<out_dir>/<attempt-id>.html``."""
    out_dir = Path(out_dir)
    runs_root = resolve_runs(runs_root)
    attempts = list_attempts(runs_root)
    base = None
    if attempts:
        byid = {a.attempt_id: a for a in attempts}
        if baseline is not None and baseline not in byid:
            raise ValueError(f"baseline attempt {baseline!r} is not in {runs_root} (have: {', '.join(byid)})")
        base = byid[baseline] if baseline else attempts[0]
    rows = []
    for a in attempts:
        rep = out_dir / f"{a.attempt_id}.html"
        link = (f'<a href="{esc(rep.name)}">{esc(a.attempt_id)}</a>' if rep.exists() else
                f"{esc(a.attempt_id)}<br><small>no report: rft report {esc(a.run_dir)}</small>")
        rows.append((link, esc(a.created.replace("T", " ")), f"<code>{esc(a.sha)}</code>", esc(a.status),
                     _diff_cell(a, base), _eval_cell(a), _verdict_cell(a),
                     research_log_html(a, width="320px") + (f"<br><small>from {parent_html(a)}</small>"
                                                             if a.config.get("init_adapter") else "")))
    body = table(["attempt", "date", "git", "status", f"key config vs {base.attempt_id if base else '-'}",
                  "held-out: step 0 \u2192 best", "health", "hypothesis and conclusions"], rows, raw=tuple(range(8)), cls="rft-index")
    comps = sorted(out_dir.glob("compare-*.html")) if out_dir.is_dir() else []
    if comps:
        body += "<h2>Comparisons</h2><ul>" + "".join(f'<li><a href="{esc(p.name)}">{esc(p.stem)}</a></li>' for p in comps) + "</ul>"
    meta = (f"{len(attempts)} attempt(s) in <code>{esc(Path(runs_root).resolve())}</code>; rebuilt from the run "
            f"directories at {_dt.datetime.now().isoformat(timespec='seconds')} (<code>rft index</code>).")
    return Html(PAGE.format(title=esc(title), meta=meta, body=body))


def write_index(runs_root: str | Path, out_dir: str | Path | None = None, **kw) -> Path:
    """Write ``<out_dir>/index.html`` (default out_dir: ``reports`` next to the runs root)."""
    out = Path(out_dir) if out_dir is not None else reports_dir_for(runs_root)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "index.html"
    tmp = path.with_suffix(".html.tmp")
    tmp.write_text(build_index(runs_root, out, **kw))
    tmp.replace(path)
    return path


def reports_dir_for(runs_root: str | Path | None = None) -> Path:
    """Where reports go by default: ``reports/`` beside the runs root (runs/ -> reports/), or
    ``$RFTLIB_REPORTS`` (rftlib.attempts.reports_root)."""
    return reports_root(runs_root)


def index_ids(html: str) -> Sequence[str]:
    """The attempt ids listed in an index page (for tests and scripts)."""
    return re.findall(r'<td style="[^"]*">(?:<a href="[^"]*">)?(attempt-[A-Za-z0-9.\-]+)', html)
