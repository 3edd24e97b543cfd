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

One trainer per attempt: the live trainer holds ``<run_dir>/control/trainer.lock`` (:func:`lock_attempt`,
an flock the kernel drops when the holder dies, ``kill -9`` included), so a second one -- a resume
started while a killed run's kernel still finishes its checkpoint -- is refused with the holder's pid.
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import difflib
import json
import os
import platform
import re
import socket
import subprocess
import time
from importlib import metadata
from pathlib import Path
from typing import IO, Any

import yaml

from rftlib.config import RunConfig, to_dict

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_RUNS = "runs"  # RunConfig.runs_root's default: "not set", so $RFTLIB_RUNS may replace it
RUNS_ENV, REPORTS_ENV = "RFTLIB_RUNS", "RFTLIB_REPORTS"
STOP_FILE = Path("control") / "stop"  # <run_dir>/control/stop: the trainer stops after the step it is in
LOCK_FILE = Path("control") / "trainer.lock"  # flock-held by the attempt's live trainer; "<pid> <host> <since>" inside
PACKAGES = ["torch", "transformers", "peft", "accelerate", "papermill", "tokenizers", "numpy", "vllm", "deepspeed"]


def project_root() -> Path:
    """The directory holding rftlib/, params/ and notebooks/ (the checkout rftlib was imported from)."""
    return REPO_ROOT


def runs_root(value: str | Path | None = None) -> Path:
    """The absolute runs root for a ``runs_root`` setting (see the module doc for the rule)."""
    if value is None or str(value) == DEFAULT_RUNS:
        env = os.environ.get(RUNS_ENV)
        if env:
            return Path(env).expanduser().resolve()
        value = DEFAULT_RUNS
    p = Path(value).expanduser()
    return (p if p.is_absolute() else project_root() / p).resolve()


def reports_root(runs: str | Path | None = None) -> Path:
    """Where reports go: ``$RFTLIB_REPORTS`` when set, else ``reports/`` beside the runs root."""
    env = os.environ.get(REPORTS_ENV)
    if env:
        return Path(env).expanduser().resolve()
    return runs_root(runs).parent / "reports"


def run_dir_path(path: str | Path) -> Path:
    """An attempt directory named on a command line or in a notebook: as given when it exists from the
    working directory (or is absolute), else under the project root (so ``runs/attempt-01-x`` works
    from a kernel in notebooks/ too), else a bare name under the runs root (``$RFTLIB_RUNS``, else
    <project>/runs: ``rft replay attempt-01-x``). Nothing found: the project-root path (the caller says so,
    or :func:`existing_attempt` does)."""
    p = Path(path).expanduser()
    if p.is_absolute() or p.exists():
        return p.resolve()
    if (project_root() / p).exists() or len(p.parts) != 1:
        return (project_root() / p).resolve()
    under = runs_root() / p
    return under.resolve() if under.exists() else (project_root() / p).resolve()


def existing_attempt(path: str | Path) -> Path:
    """:func:`run_dir_path`, which must be an attempt (a directory with config.yaml): else FileNotFoundError
    naming where it looked and the nearest attempt names under the runs root."""
    d = run_dir_path(path)
    if (d / "config.yaml").is_file():
        return d
    root = runs_root()
    names = sorted(x.name for x in root.iterdir() if (x / "config.yaml").is_file()) if root.is_dir() else []
    near = difflib.get_close_matches(Path(path).name, names, n=3)
    raise FileNotFoundError(f"{path}: no attempt there (looked in the working directory, {project_root()} and the "
                            f"runs root {root})" + (f"; nearest: {', '.join(near)}" if near else ""))


def request_stop(run_dir: str | Path, reason: str = "stopped by user") -> Path:
    """Ask a running attempt to stop: the trainer checkpoints after its current step and returns."""
    path = Path(run_dir) / STOP_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(reason + "\n")
    return path


def stop_requested(run_dir: str | Path) -> bool:
    return (Path(run_dir) / STOP_FILE).exists()


class AttemptLockedError(RuntimeError):
    """Another live trainer holds the attempt (its ``control/trainer.lock``); ``pid`` is that process's."""

    def __init__(self, run_dir: str | Path, pid: int | None, host: str | None = None):
        self.run_dir, self.pid, self.host = Path(run_dir), pid, host
        who = f"pid {pid}" if pid else "a process whose pid is not written yet"
        if host and host != socket.gethostname():
            who += f" on host {host}"
        elif pid == os.getpid():
            who += " (this process: close() the Trainer that holds it first)"
        super().__init__(f"{self.run_dir.name} is being trained by {who}: a second trainer would write the same "
                         f"checkpoints and metrics. Wait for it to end or stop it (its Stop button, `rft stop "
                         f"{self.run_dir}`, or `kill {pid or 'PID'}`), then resume ({self.run_dir / LOCK_FILE})")

    def __reduce__(self):  # picklable with its fields (a rank or a worker may pass it on)
        return type(self), (self.run_dir, self.pid, self.host)


def _holder(path: Path, wait: float = 1.0) -> tuple[int | None, str | None]:
    """(pid, host) written in a held lock file; a holder writes them just after it takes the lock,
    so an empty file is read again for up to ``wait`` seconds."""
    deadline = time.time() + wait
    while True:
        parts = path.read_text().split() if path.exists() else []
        if parts and parts[0].isdigit():
            return int(parts[0]), (parts[1] if len(parts) > 1 else None)
        if time.time() >= deadline:
            return None, None
        time.sleep(0.05)


def lock_attempt(run_dir: str | Path, wait: float = 0.5) -> IO[str]:
    """Hold the attempt's trainer lock until the returned file is closed, or this process dies (the
    kernel drops an flock with its last descriptor: SIGKILL included, no stale lock to clean up).
    Raises :class:`AttemptLockedError` naming the holder's pid when a live process holds it.

    ``flock``, not ``lockf``: an flock belongs to the open file, so a second trainer in the same
    process is refused too, and no other descriptor of the file can drop it. The descriptor is not
    inherited by exec'd children (PEP 446). A held lock is tried again for ``wait`` seconds (an
    :func:`ensure_unlocked` probe holds it for microseconds). Plain ``fcntl.flock`` rather than
    the ``filelock`` package: the refusal names the holder, and a FileLock keeps no owner to name."""
    path = Path(run_dir) / LOCK_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    f = open(path, "a+")
    deadline = time.time() + wait
    while True:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.time() >= deadline:
                f.close()
                raise AttemptLockedError(run_dir, *_holder(path)) from None
            time.sleep(0.05)
    f.truncate(0)
    f.write(f"{os.getpid()} {socket.gethostname()} {_dt.datetime.now().isoformat(timespec='seconds')}\n")
    f.flush()
    return f


def ensure_unlocked(run_dir: str | Path) -> None:
    """Refuse an attempt a live trainer holds (:class:`AttemptLockedError`, naming its pid), for a command
    about to start one (``rft resume``, ``rft launch --resume``) to say so before it starts anything.
    Checked by taking a shared lock for an instant: the pid in the file may be a dead holder's."""
    path = Path(run_dir) / LOCK_FILE
    if not path.exists():
        return
    with open(path) as f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise AttemptLockedError(run_dir, *_holder(path)) from None


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-")[:48] or "run"


def next_attempt_id(root: str | Path, name: str) -> str:
    """The next ``attempt-NN-<name>`` under ``root`` (resolved by :func:`runs_root`). Only a guess of the
    number: two processes may get the same one; :func:`claim_attempt_dir` makes it theirs alone."""
    root = runs_root(root)
    nums = [int(m.group(1)) for p in root.glob("attempt-*") if (m := re.match(r"attempt-(\d+)", p.name))]
    return f"attempt-{(max(nums) + 1 if nums else 1):02d}-{slug(name)}"


CLAIM_TRIES = 1000  # attempt numbers tried past a collision before giving up (a runs root under a storm)


def claim_attempt_dir(root: str | Path, name: str) -> Path:
    """Make the next ``attempt-NN-<name>`` directory under ``root`` and return it: the number is this
    caller's alone. ``mkdir`` without ``exist_ok`` is atomic (one caller wins, the other gets
    FileExistsError), so two launches at once never share a directory; the loser takes the next
    number. Two ``create_attempt`` calls once both got ``attempt-01-arm`` and one config.yaml held the
    other's lr (issue 30 item 12)."""
    root = runs_root(root)
    root.mkdir(parents=True, exist_ok=True)
    for _ in range(CLAIM_TRIES):
        run_dir = root / next_attempt_id(root, name)
        try:
            run_dir.mkdir()
        except FileExistsError:
            continue  # another process claimed this number between our listing and our mkdir
        return run_dir
    raise RuntimeError(f"could not claim an attempt directory under {root} after {CLAIM_TRIES} tries")


def _git(*args: str) -> str | None:
    try:
        return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=20,
                              check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def provenance() -> dict[str, Any]:
    import torch  # the machine's threads and GPU, when an attempt is created (reading one needs no torch)

    sha = (_git("rev-parse", "HEAD") or "").strip() or None
    status = _git("status", "--porcelain", "--untracked-files=no")
    versions = {}
    for p in PACKAGES:
        try:
            versions[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            pass

    machine = {"platform": platform.platform(), "python": platform.python_version(),
               "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
               "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
    return {"git_sha": sha, "git_dirty": bool(status and status.strip()), "packages": versions, "machine": machine,
            "created": _dt.datetime.now().isoformat(timespec="seconds")}


def create_attempt(cfg: RunConfig, attempt_id: str | None = None, *, tag: bool = False) -> Path:
    """Make the run directory, write config.yaml (config + provenance) and the dirty diff if any.

    Without ``attempt_id`` the next number is claimed atomically (:func:`claim_attempt_dir`). With one, the
    directory may exist empty (a caller claimed it, and papermill's output notebook goes there), and
    config.yaml is created exclusively: of two callers naming the same attempt, one is refused."""
    root = runs_root(cfg.runs_root)
    root.mkdir(parents=True, exist_ok=True)
    if attempt_id:
        run_dir = root / attempt_id
        run_dir.mkdir(parents=False, exist_ok=True)
    else:
        run_dir = claim_attempt_dir(root, cfg.name)
        attempt_id = run_dir.name
    prov = provenance()
    doc = {"attempt_id": attempt_id, "config": to_dict(cfg), "provenance": prov}
    try:
        with open(run_dir / "config.yaml", "x") as f:  # exclusive: never over another caller's config
            f.write(yaml.safe_dump(doc, sort_keys=False))
    except FileExistsError:
        raise FileExistsError(f"{run_dir} already holds an attempt: continue it with resume={str(run_dir)!r} "
                              f"(`rft resume {run_dir} --additional-steps K`), or leave attempt_id empty for a new "
                              "one") from None
    if prov["git_dirty"]:
        (run_dir / "git.diff").write_text(_git("diff", "HEAD") or "")
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


SFT_ROWS = "sft_rows.jsonl"
"""<run_dir>/sft_rows.jsonl of an SFT attempt: one line per row it trained on ({"input", "prompt", "problem_key",
"source"}, rftlib.sft.record_sft_rows), read by an RL attempt started from its adapter (rftlib.train.build)"""


def attempt_holding(path: str | Path) -> Path | None:
    """The run directory ``path`` lies in (an SFT attempt's ``adapter/``, a checkpoint's
    ``training_state/step_N/adapter``): the path itself or one of its three parents holding a config.yaml;
    None outside any attempt."""
    d = Path(path).expanduser().resolve()
    return next((c for c in (d, *d.parents[:3]) if (c / "config.yaml").exists()), None)
