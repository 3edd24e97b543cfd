"""Screenshots of the workbench in a real JupyterLab (issue 15): the live view of a tiny-preset
attempt with its Stop button and a group of samples, Stop clicked while it trains and the attempt
stopping with a checkpoint (issue 19 item 13), and the notebook papermill executed for another tiny
attempt, reopened in JupyterLab; with ``--replay-only``, replay.ipynb run on a recorded tiny attempt (issue 33).

The live attempt is given a step count it never reaches and a time budget (max_train_minutes): it
trains until the click on any machine, however fast or slow its steps, and the budget ends it if
the click never comes. Stop passes only if the trainer honoured it: summary.json says "stopped by
user" at a step before the end, that step's checkpoint exists and control/stop was consumed.

    python scripts/lab_screenshots.py [--out /tmp/rft_artefacts] [--playwright DIR]

Needs Debian's /usr/bin/chromium (scripts/setup_browser.sh) and the npm package playwright-core
in DIR/node_modules (``npm install playwright-core`` in DIR; no browser download: Chromium is
launched by path). Everything happens in a scratch directory: JupyterLab's root holds a copy of
notebooks/train.ipynb set to the tiny preset, and RFTLIB_RUNS points at its runs/ (so the
committed notebook and the project's runs/ are never touched). Prints what it checked; exit 1 if a
check failed.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
sys.path.insert(0, str(REPO))  # rftlib from this checkout, as the kernels get it through PYTHONPATH
from rftlib.train.checkpoint import list_steps  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


LIVE_STEPS = 100_000  # never reached: the live attempt trains until Stop (or its time budget)


def _tiny_notebook(dst: Path, minutes: float) -> None:
    nb = nbformat.read(REPO / "notebooks" / "train.ipynb", as_version=4)
    for c in nb.cells:
        if "parameters" in c.metadata.get("tags", []):
            c.source = c.source.replace("preset = 'default'", "preset = 'tiny'").replace(
                "\nnum_steps = None", f"\nnum_steps = {LIVE_STEPS}").replace(
                "\neval_steps = None", "\neval_steps = 50").replace(
                "\nmax_train_minutes = None", f"\nmax_train_minutes = {minutes}").replace(
                "\nwarmup_ratio = None", "\nwarmup_ratio = 0.0")  # 5% of LIVE_STEPS would be 5,000 steps at LR ~0
            assert f"max_train_minutes = {minutes}" in c.source and f"num_steps = {LIVE_STEPS}" in c.source \
                and "warmup_ratio = 0.0" in c.source
    nbformat.write(nb, dst)


def stop_checks(run_dir: Path, browser: dict) -> list[tuple[str, bool]]:
    """Whether the Stop click stopped the live attempt mid-run with a checkpoint, from its files and
    what the page saw (``browser``: lab_screenshots.mjs's live.json)."""
    s = run_dir / "summary.json"
    summary = json.loads(s.read_text()) if s.exists() else {}
    steps, ckpts = summary.get("steps"), list_steps(run_dir)
    return [
        (f"Stop clicked while the cell ran, after step {browser.get('step_at_click')}",
         bool(browser.get("clicked")) and (browser.get("step_at_click") or 0) >= 1),
        ("the button said it would stop after the step", bool(browser.get("acked"))),
        (f"trainer stop_reason {summary.get('stop_reason')!r} at step {steps} of {LIVE_STEPS}",
         summary.get("stop_reason") == "stopped by user" and isinstance(steps, int) and 1 <= steps < LIVE_STEPS),
        (f"checkpoint of the stop's step (checkpoints {ckpts})", bool(ckpts) and ckpts[-1] == steps),
        ("control/stop consumed (honoured, so a resume goes on)", not (run_dir / "control" / "stop").exists()),
        ("the cell ended by itself, no kernel interrupt", bool(browser.get("cell_ended")) and not browser.get("interrupted")),
        (f"the panel's button then read {browser.get('button_after')!r}", browser.get("button_after") == f"Stopped at step {steps}"),
        ("no [health step N] text lines under the live panel", browser.get("health_lines") == 0),
    ]


def start_lab(root: Path, env: dict, log: Path) -> tuple[subprocess.Popen, str, str]:
    """JupyterLab serving ``root`` on a free port with a fresh token, once its API answers: (process, base URL, token)."""
    port, token = _free_port(), secrets.token_hex(16)
    lab = subprocess.Popen([str(VENV_BIN / "jupyter"), "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
                            f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
                            "--allow-root", "--LabApp.expose_app_in_browser=True"], env=env, cwd=root,
                           stdout=open(log, "w"), stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    for _ in range(120):
        try:
            urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
            break
        except OSError:
            time.sleep(1)
    return lab, base, token


def _replay_notebook(dst: Path, run_dir: Path, step: int) -> None:
    """notebooks/replay.ipynb with its parameters set to ``run_dir`` and ``step`` (issue 33's Lab screenshot)."""
    nb = nbformat.read(REPO / "notebooks" / "replay.ipynb", as_version=4)
    for c in nb.cells:
        if "parameters" in c.metadata.get("tags", []):
            c.source = c.source.replace('run_dir: str = ""', f"run_dir: str = {str(run_dir)!r}").replace(
                "step = None", f"step = {step}")
            assert str(run_dir) in c.source and f"step = {step}" in c.source
    nbformat.write(nb, dst)


def replay_screenshots(out: Path, pw: Path) -> int:
    """Train a tiny attempt that records step 2 (two optimizer steps a rollout: the second is off-policy), then run
    replay.ipynb on it in a real JupyterLab: the verdict says FAITHFUL and the inspector's iframe shows its group
    cards. Screenshots replay_notebook.png and replay_notebook_inspector.png in ``out``."""
    root = Path(tempfile.mkdtemp(prefix="rft_lab_replay_"))
    (root / "notebooks").mkdir()
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{os.environ.get('PYTHONPATH', '')}", "RFTLIB_RUNS": str(root / "runs"),
           "OMP_NUM_THREADS": "1"}
    subprocess.run([str(VENV_BIN / "rft"), "train", "-p", "tiny", "--set", "num_steps=2", "--set", "name=recorded",
                    "--set", "record_batches=[2]", "--set", "train_batch_size=2", "--set", "autocast=none"],
                   env=env, cwd=root, check=True, stdout=subprocess.DEVNULL)
    (run,) = [p for p in (root / "runs").iterdir() if p.name.endswith("recorded")]
    _replay_notebook(root / "notebooks" / "replay_tiny.ipynb", run, 2)
    lab, base, token = start_lab(root, env, out / "jupyterlab_replay.log")
    try:
        subprocess.run(["node", "lab_screenshots.mjs", "replay",
                        f"{base}/lab/workspaces/replay/tree/notebooks/replay_tiny.ipynb?reset&token={token}", str(out),
                        "replay_notebook"], cwd=pw, env=env, timeout=900)
    finally:
        lab.terminate()
        lab.wait(30)
    seen = json.loads((out / "replay.json").read_text()) if (out / "replay.json").exists() else {}
    checks = [("FAITHFUL in the replay notebook's outputs", bool(seen.get("faithful"))),
              ("the inspector's iframe rendered in the output", bool(seen.get("iframe"))),
              (f"the iframe shows group cards ({seen.get('cards')})", (seen.get("cards") or 0) > 0),
              (f"{out / 'replay_notebook.png'} written", (out / "replay_notebook.png").exists()),
              (f"{out / 'replay_notebook_inspector.png'} written", (out / "replay_notebook_inspector.png").exists())]
    for what, ok in checks:
        print(f"[lab_screenshots] {'ok ' if ok else 'FAIL'} {what}")
    print(f"[lab_screenshots] scratch root: {root}")
    return 0 if all(ok for _, ok in checks) else 1


def prepare_playwright(pw: Path) -> Path | None:
    """The playwright-core install to drive Chromium from (the driver script copied in), or None, said why."""
    if not (pw / "node_modules" / "playwright-core").is_dir() or not shutil.which("node"):
        print(f"need node and {pw}/node_modules/playwright-core (npm install playwright-core)", file=sys.stderr)
        return None
    shutil.copy(REPO / "scripts" / "lab_screenshots.mjs", pw / "lab_screenshots.mjs")
    return pw


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/rft_artefacts")
    ap.add_argument("--playwright", default=os.environ.get("RFT_PLAYWRIGHT_DIR", "/tmp/rft_pw"))
    ap.add_argument("--live-only", action="store_true", help="skip the papermill attempt and its screenshots")
    ap.add_argument("--replay-only", action="store_true", help="only replay.ipynb on a recorded tiny attempt (issue 33)")
    ap.add_argument("--minutes", type=float, default=15.0,
                    help="the live attempt's time budget: it ends by itself this long after training starts")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pw = prepare_playwright(Path(args.playwright))
    if pw is None:
        return 2
    if args.replay_only:
        return replay_screenshots(out, pw)
    root = Path(tempfile.mkdtemp(prefix="rft_lab_"))
    (root / "notebooks").mkdir()
    _tiny_notebook(root / "notebooks" / "train_tiny.ipynb", args.minutes)
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{os.environ.get('PYTHONPATH', '')}", "RFTLIB_RUNS": str(root / "runs"),
           "OMP_NUM_THREADS": "1"}
    env.pop("RFTLIB_HEADLESS", None)
    checks: list[tuple[str, bool]] = []

    # 1) the headless attempt first (papermill through rft), reopened later in the browser
    t = time.time()
    if args.live_only:
        (root / "runs" / "attempt-01-papermill").mkdir(parents=True)
    else:
      subprocess.run([str(VENV_BIN / "rft"), "train", "-p", "tiny", "--set", "num_steps=3", "--set", "name=papermill"],
                   env=env, cwd=root, check=True, stdout=subprocess.DEVNULL)
    (pm_run,) = [p for p in (root / "runs").iterdir() if p.name.endswith("papermill")]
    print(f"[lab_screenshots] papermill attempt {pm_run.name} in {time.time() - t:.0f} s")

    lab, base, token = start_lab(root, env, out / "jupyterlab.log")
    try:
        node = lambda *a: subprocess.run(["node", "lab_screenshots.mjs", *a], cwd=pw, env=env, timeout=1500)
        # 2) the executed notebook, reopened
        rel = pm_run.relative_to(root) / "notebook.ipynb"
        if not args.live_only:
            node("view", f"{base}/lab/workspaces/view/tree/{rel}?reset&token={token}", str(out))
        # 3) the live view: run every cell of the tiny notebook, capture, click Stop
        node("live", f"{base}/lab/workspaces/live/tree/notebooks/train_tiny.ipynb?reset&token={token}", str(out))
    finally:
        lab.terminate()
        lab.wait(30)
    live = [p for p in (root / "runs").iterdir() if not p.name.endswith("papermill")]
    checks.append(("live attempt in RFTLIB_RUNS, none under notebooks/", len(live) == 1
                   and not (root / "notebooks" / "runs").exists() and not (root / "notebooks" / "reports").exists()))
    if live:
        seen = out / "live.json"
        checks += stop_checks(live[0], json.loads(seen.read_text()) if seen.exists() else {})
    nb = nbformat.read(pm_run / "notebook.ipynb", as_version=4) if not args.live_only else nbformat.v4.new_notebook()
    outs = [o for c in nb.cells for o in c.get("outputs", [])]
    checks.append(("executed notebook has per-step text lines", args.live_only or
                   any("[rft] step 1/3" in o.get("text", "") for o in outs)))
    checks.append(("executed notebook has a PNG", args.live_only or any("image/png" in o.get("data", {}) for o in outs)))
    for name in ("live_view.png", "live_view_panel.png", "live_view_stopping.png", "live_view_stopped.png",
                 *(() if args.live_only else ("executed_top.png", "executed_plot.png"))):
        checks.append((f"{out / name} written", (out / name).exists()))
    for what, ok in checks:
        print(f"[lab_screenshots] {'ok ' if ok else 'FAIL'} {what}")
    print(f"[lab_screenshots] scratch root: {root}")
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
