"""notebooks/launch.ipynb: plan, start, watch, re-attach and stop a detached attempt from a notebook.

The notebook holds no job: it plans the attempt (``dry_run=True`` prints the GPU map and the
commands), or launches it detached and prints its id and how to attach, optionally streams its
progress for ``watch_seconds``, and exits; re-running it with ``attach="runs/<attempt>"`` follows a
running attempt again, ``stop=True`` with ``attach=...`` stops it (checkpoint first). Headless::

    papermill notebooks/launch.ipynb out.ipynb -p preset seed003-gpt-oss-20b-a28b -p dry_run True

The notebook itself is built with the others by rftlib.notebooks (``launch_notebook``);
``python -m rftlib.notebooks`` writes it. This module holds the one call its cell makes.
"""

from __future__ import annotations

from typing import Any

from rftlib.launch.status import attach as follow
from rftlib.launch.supervise import launch
from rftlib.launch.supervise import stop as stop_attempt


def run(preset: str = "default", overrides: dict[str, Any] | None = None, *, dry_run: bool = True,
        machine_gpus: int | None = None, resume: str | None = None, attach: str | None = None, stop: bool = False,
        watch_seconds: float | None = None, write=print) -> str | None:
    """The notebook's one call: plan / launch / attach / stop; the attempt's run directory (None on a dry run).
    ``overrides`` are RunConfig fields over the preset, kept as given (rftlib.notebooks: one convention);
    None is "not given" for resume, attach and watch_seconds."""
    if attach:
        if stop:
            stop_attempt(attach, write=write)
        else:
            follow(attach, write=write, timeout=watch_seconds or None)
        return str(attach)
    run_dir = launch(preset, overrides or {}, resume=resume or None, dry_run=dry_run, machine_gpus=machine_gpus,
                     write=write)
    if run_dir is None:
        return None
    if watch_seconds:
        follow(run_dir, write=write, timeout=watch_seconds)
    write(f"[rft] the attempt runs on without this kernel. Re-attach: rft attach {run_dir}, or this notebook "
          f"with attach=\"{run_dir}\"")
    return str(run_dir)
