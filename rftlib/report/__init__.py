"""Reports: what an attempt did, from its run directory alone.

    attempt     load_attempt(run_dir): config, provenance, metrics, evals, samples, verdicts
    analysis    the sections of one attempt's report (notebooks/analysis.ipynb)
    plots       seed 003's Tier 1/2/3 metric figures, eval curves, A/B overlays
    compare     A/B tables with paired-bootstrap CIs (notebooks/compare.ipynb)
    index       reports/index.html, rebuilt from the run directories
    publish     papermill + nbconvert: reports/<attempt-id>.html, reports/compare-*.html
    live        the JupyterLab panel and the headless log lines
    inspect     one recorded step's tokens as a self-contained page (and a sandboxed iframe in Lab)

Beside it, a layer up: rftlib.eval_checkpoints evaluates every training_state/step_N, rftlib.validate
runs seed 002's loop validation, rftlib.notebooks builds notebooks/*.ipynb.
"""

from __future__ import annotations

from rftlib.data.tasks import registered_tasks


def register_tasks() -> list[str]:
    """Every built-in task name (the registry imports its builder modules on first use)."""
    return list(registered_tasks().names())
