"""Attempt ids, run directories and provenance (what replaces the hand-kept branch + tag + log).

An attempt is one run directory ``<runs_root>/attempt-NN-<name>/`` holding the resolved config,
the git SHA and dirty diff it ran from, package versions and the machine: enough to redo it.

Where attempts go, the same from every entry point (a JupyterLab kernel whose working directory is
notebooks/, papermill started from any directory, ``rft``): :func:`runs_root` resolves
``RunConfig.runs_root``. Left at its default (``"runs"``) it is ``$RFTLIB_RUNS`` when set, else
``<project root>/runs``; a relative path is taken from the project root, never from the working
directory; an absolute path is used as it is. Reports go to ``reports/`` beside the runs root
(``$RFTLIB_REPORTS`` overrides it). So there is one attempt numbering and one index.

Stopping: :func:`request_stop` writes ``<run_dir>/control/stop``; the trainer checks for it after
every step, checkpoints, records ``stop_reason`` "stopped by user" and returns.
"""

from __future__ import annotations

import datetime as _dt
import json
import platform
import re
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from rftlib.config import RunConfig, to_dict

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_RUNS = "runs"  # RunConfig.runs_root's default: "not set", so $RFTLIB_RUNS may replace it
RUNS_ENV, REPORTS_ENV = "RFTLIB_RUNS", "RFTLIB_REPORTS"
STOP_FILE = Path("control") / "stop"  # <run_dir>/control/stop: the trainer stops after the step it is in
PACKAGES = ["torch", "transformers", "peft", "accelerate", "papermill", "tokenizers", "numpy", "vllm", "deepspeed"]


def project_root() -> Path:
    """The directory holding rftlib/, params/ and notebooks/ (the checkout rftlib was imported from)."""
    return REPO_ROOT


def runs_root(value: str | Path | None = None) -> Path:
    """The absolute runs root for a ``runs_root`` setting (see the module doc for the rule)."""
    import os

    if value is None or str(value) == DEFAULT_RUNS:
        env = os.environ.get(RUNS_ENV)
        if env:
            return Path(env).expanduser().resolve()
        value = DEFAULT_RUNS
    p = Path(value).expanduser()
    return (p if p.is_absolute() else project_root() / p).resolve()


def reports_root(runs: str | Path | None = None) -> Path:
    """Where reports go: ``$RFTLIB_REPORTS`` when set, else ``reports/`` beside the runs root."""
    import os

    env = os.environ.get(REPORTS_ENV)
    if env:
        return Path(env).expanduser().resolve()
    return runs_root(runs).parent / "reports"


def run_dir_path(path: str | Path) -> Path:
    """An attempt directory named on a command line or in a notebook: as given when it exists from the
    working directory (or is absolute), else under the project root (so ``runs/attempt-01-x`` works
    from a kernel in notebooks/ too)."""
    p = Path(path).expanduser()
    if p.is_absolute() or p.exists():
        return p.resolve()
    return (project_root() / p).resolve()


def request_stop(run_dir: str | Path, reason: str = "stopped by user") -> Path:
    """Ask a running attempt to stop: the trainer checkpoints after its current step and returns."""
    path = Path(run_dir) / STOP_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(reason + "\n")
    return path


def stop_requested(run_dir: str | Path) -> bool:
    return (Path(run_dir) / STOP_FILE).exists()


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-")[:48] or "run"


def next_attempt_id(root: str | Path, name: str) -> str:
    """The next ``attempt-NN-<name>`` under ``root`` (resolved by :func:`runs_root`)."""
    root = runs_root(root)
    nums = [int(m.group(1)) for p in root.glob("attempt-*") if (m := re.match(r"attempt-(\d+)", p.name))]
    return f"attempt-{(max(nums) + 1 if nums else 1):02d}-{slug(name)}"


def _git(*args: str) -> str | None:
    try:
        return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=20,
                              check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def provenance() -> dict[str, Any]:
    sha = (_git("rev-parse", "HEAD") or "").strip() or None
    status = _git("status", "--porcelain", "--untracked-files=no")
    versions = {}
    for p in PACKAGES:
        try:
            versions[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            pass
    import torch

    machine = {"platform": platform.platform(), "python": platform.python_version(),
               "cpu_count": __import__("os").cpu_count(), "torch_threads": torch.get_num_threads(),
               "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
    return {"git_sha": sha, "git_dirty": bool(status and status.strip()), "packages": versions, "machine": machine,
            "created": _dt.datetime.now().isoformat(timespec="seconds")}


def create_attempt(cfg: RunConfig, attempt_id: str | None = None, *, tag: bool = False) -> Path:
    """Make the run directory, write config.yaml (config + provenance) and the dirty diff if any."""
    root = runs_root(cfg.runs_root)
    root.mkdir(parents=True, exist_ok=True)
    attempt_id = attempt_id or next_attempt_id(root, cfg.name)
    run_dir = root / attempt_id
    if (run_dir / "config.yaml").exists():
        raise FileExistsError(f"{run_dir} already holds an attempt; pass resume= to continue it")
    run_dir.mkdir(parents=False, exist_ok=True)  # may exist empty: papermill's output notebook goes there
    prov = provenance()
    if prov["git_dirty"]:
        (run_dir / "git.diff").write_text(_git("diff", "HEAD") or "")
    doc = {"attempt_id": attempt_id, "config": to_dict(cfg), "provenance": prov}
    (run_dir / "config.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    if tag and prov["git_sha"]:
        m = re.match(r"(attempt-\d+)", attempt_id)
        _git("tag", f"{m.group(1)}-start", prov["git_sha"])  # seed 003's attempt-NN-start tag
    return run_dir


def read_attempt(run_dir: str | Path) -> dict[str, Any]:
    return yaml.safe_load((Path(run_dir) / "config.yaml").read_text())


def write_json(path: Path, obj: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1))
    tmp.replace(path)
