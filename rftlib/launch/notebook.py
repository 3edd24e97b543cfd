"""notebooks/launch.ipynb: plan, start, watch, re-attach and stop a detached attempt from a notebook.

The notebook holds no job: it plans the attempt (``dry_run=True`` prints the GPU map and the
commands), or launches it detached and prints its id and how to attach, optionally streams its
progress for ``watch_seconds``, and exits; re-running it with ``attach="runs/<attempt>"`` follows a
running attempt again, ``stop=True`` with ``attach=...`` stops it (checkpoint first). Headless::

    papermill notebooks/launch.ipynb out.ipynb -p preset seed003-gpt-oss-20b-a28b -p dry_run True

``python -m rftlib.launch.notebook`` writes notebooks/launch.ipynb (outputs cleared); the lead
hooks :func:`launch_notebook` into rftlib.report.templates.write_all.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"

PARAMETERS = '''\
preset = "seed003-gpt-oss-20b-a28b"  # a preset in params/ (its launch layout: train_gpus, rollout_gpus, engines)
overrides = {}                       # RunConfig fields on top of the preset, e.g. {"num_steps": 50}
dry_run = True                       # True: print the GPU map and the commands, start nothing
machine_gpus = None                  # GPUs to assume on this machine (None: detect); for planning elsewhere
resume = ""                          # a run directory: relaunch that attempt from its step_latest
attach = ""                          # a run directory: re-attach to it (nothing is launched)
stop = False                         # with attach: stop that attempt cleanly (checkpoint first)
watch_seconds = 0.0                  # after a launch / with attach: stream progress this long, then detach
smoke = False                        # True: first `rft smoke` (one step per set-up on this machine, ~10 min)
'''

SMOKE = '''\
if smoke:  # the first thing to run on a new machine: one step per set-up and a pass/fail table (rftlib.smoke)
    from rftlib.smoke import run_smoke, table, verdict

    smoke_rows = run_smoke()
    print(table(smoke_rows))
    assert verdict(smoke_rows), "rft smoke failed: fix the failing line before launching (its log is named above)"
'''

RUN = '''\
from rftlib.launch.notebook import run

attempt = run(preset=preset, overrides=overrides, dry_run=dry_run, machine_gpus=machine_gpus, resume=resume,
              attach=attach, stop=stop, watch_seconds=watch_seconds)
'''

STATUS = '''\
from rftlib.launch.status import status_text

print(status_text(overrides.get("runs_root")))
'''


def run(preset: str = "default", overrides: dict[str, Any] | None = None, *, dry_run: bool = True,
        machine_gpus: int | None = None, resume: str = "", attach: str = "", stop: bool = False,
        watch_seconds: float = 0.0, write=print) -> str | None:
    """The notebook's one call: plan / launch / attach / stop; the attempt's run directory (None on a dry run)."""
    from rftlib.launch.status import attach as follow
    from rftlib.launch.supervise import launch
    from rftlib.launch.supervise import stop as stop_attempt

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


def launch_notebook() -> nbformat.NotebookNode:
    """launch.ipynb: a parameters cell, the launch/attach call, the status table."""
    params = new_code_cell(PARAMETERS)
    params.metadata["tags"] = ["parameters"]
    cells = [
        new_markdown_cell("# Launch an attempt (detached)\n\nPlans the attempt's processes from the preset's "
                          "launch layout (trainer ranks under torchrun, vLLM server engines), checks the plan "
                          "against this machine, and with `dry_run=False` starts them in their own session: "
                          "they outlive this kernel. Re-attach with `attach=\"runs/<attempt>\"` (or "
                          "`rft attach`), stop with `attach=... stop=True` (or `rft stop`)."),
        params,
        new_code_cell(SMOKE),
        new_code_cell(RUN),
        new_markdown_cell("## Attempts and GPUs"),
        new_code_cell(STATUS),
    ]
    for i, c in enumerate(cells):  # stable ids: regenerating gives the same file
        c["id"] = f"launch-{i:02d}"
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    return nb


def write(path: str | Path = NOTEBOOKS / "launch.ipynb") -> Path:
    path = Path(path)
    nbformat.write(launch_notebook(), str(path))
    return path


if __name__ == "__main__":
    print(write())
