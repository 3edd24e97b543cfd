"""Screenshots of notebooks/launch.ipynb in a real JupyterLab (issue 11): the dry-run GPU map and
commands of the seed-003 a28b preset, and the attach view of a detached 2-rank CPU attempt of the
tiny preset streaming its steps; the attempt is then stopped with ``rft stop``.

    python scripts/lab_launch_screenshots.py [--out /tmp/rft_artefacts] [--playwright DIR] [--steps 20]

Same needs as scripts/lab_screenshots.py (Debian's /usr/bin/chromium, npm playwright-core in DIR,
driven by scripts/lab_screenshots.mjs in its ``runall`` mode). Everything happens in a scratch
directory: JupyterLab's root holds parameterised copies of launch.ipynb and RFTLIB_RUNS points at
its runs/ (the kernel's working directory is that root, so the notebook's status cell lists the
same attempts). Writes launch_dry_run.png, launch_attach.png (and launch_attach_mid.png while the
steps stream). Prints what it checked; exit 1 if a check failed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lab_screenshots import REPO, VENV_BIN, prepare_playwright, start_lab  # noqa: E402


def _launch_notebook(dst: Path, **params) -> None:
    """notebooks/launch.ipynb with the given values set in its parameters cell (comments kept)."""
    nb = nbformat.read(REPO / "notebooks" / "launch.ipynb", as_version=4)
    for c in nb.cells:
        if "parameters" in c.metadata.get("tags", []):
            for k, v in params.items():
                c.source, n = re.subn(rf"^{k} = [^#\n]*?( *#|$)", lambda m: f"{k} = {v!r}{m.group(1)}", c.source,
                                      count=1, flags=re.M)
                if n != 1:
                    raise KeyError(f"notebooks/launch.ipynb: no parameter {k!r} in its parameters cell")
    nbformat.write(nb, dst)


def _metric_steps(run_dir: Path) -> int:
    p = run_dir / "logs" / "metrics.jsonl"
    if not p.exists():
        return 0
    return sum(1 for line in p.read_text().splitlines() if '"reward_mean"' in line)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/rft_artefacts")
    ap.add_argument("--playwright", default=os.environ.get("RFT_PLAYWRIGHT_DIR", "/tmp/rft_pw"))
    ap.add_argument("--steps", type=int, default=400)  # the attempt must still run while attach watches
    ap.add_argument("--watch", type=float, default=30.0)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pw = prepare_playwright(Path(args.playwright))
    if pw is None:
        return 2
    root = Path(tempfile.mkdtemp(prefix="rft_lab_launch_"))
    runs = root / "runs"
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{os.environ.get('PYTHONPATH', '')}", "RFTLIB_RUNS": str(runs),
           "OMP_NUM_THREADS": "1"}
    env.pop("RFTLIB_HEADLESS", None)
    checks: list[tuple[str, bool]] = []
    _launch_notebook(root / "launch_dry_run.ipynb", preset="seed003-gpt-oss-20b-a28b", dry_run=True)

    lab, base, token = start_lab(root, env, out / "jupyterlab_launch.log")
    run_dir = None
    try:
        node = lambda *a: subprocess.run(["node", "lab_screenshots.mjs", *a], cwd=pw, env=env, timeout=900)
        # 1) dry run of seed 003's a28b layout: the GPU map and the commands, then the status cell
        node("runall", f"{base}/lab/workspaces/dry/tree/launch_dry_run.ipynb?reset&token={token}", str(out),
             "launch_dry_run", "health / reason")
        checks.append(("dry run started nothing", not runs.exists() or not any(runs.iterdir())))

        # 2) a detached 2-rank CPU attempt of the tiny preset, from a shell (it outlives everything here)
        subprocess.run([str(VENV_BIN / "rft"), "launch", "-p", "tiny", "--set", "backend=ddp", "--set", "train_ranks=2",
                        "--set", f"num_steps={args.steps}"], env=env, cwd=root, check=True)
        (run_dir,) = [d for d in runs.iterdir() if (d / "config.yaml").exists()]
        t = time.time()
        while _metric_steps(run_dir) < 1 and time.time() - t < 600:  # past torchrun's start-up
            time.sleep(3)
        print(f"[lab_launch_screenshots] {run_dir.name}: first step after {time.time() - t:.0f} s")
        _launch_notebook(root / "launch_attach.ipynb", preset="tiny", attach=str(run_dir),
                         watch_seconds=args.watch)
        before = _metric_steps(run_dir)
        node("runall", f"{base}/lab/workspaces/attach/tree/launch_attach.ipynb?reset&token={token}", str(out),
             "launch_attach", "health / reason", "launch_attach_mid")
        after = _metric_steps(run_dir)
        checks.append((f"the attempt stepped while the notebook watched it (steps {before} -> {after} of "
                       f"{args.steps})", before < after < args.steps))
    finally:
        if run_dir is not None:
            subprocess.run([str(VENV_BIN / "rft"), "stop", str(run_dir)], env=env, cwd=root, timeout=600)
            st = json.loads((run_dir / "control" / "status.json").read_text())
            checks.append((f"rft stop: state {st.get('state')!r}, reason {st.get('reason')!r}",
                           st.get("state") == "stopped"))
        lab.terminate()
        lab.wait(30)
    for name in ("launch_dry_run.png", "launch_attach_mid.png", "launch_attach.png"):
        checks.append((f"{out / name} written", (out / name).exists()))
    for what, ok in checks:
        print(f"[lab_launch_screenshots] {'ok ' if ok else 'FAIL'} {what}")
    print(f"[lab_launch_screenshots] scratch root: {root}")
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
