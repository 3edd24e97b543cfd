"""Find the processes a job started by a token in their environment (Linux /proc): light on purpose (os only),
so a supervisor, the smoke test's line runner and scripts/gpu_check.py's stage runner can scan without importing
torch (rftlib.smoke, where it lived, imports the trainer: ~10 s before a stage's leftovers could be counted)."""

from __future__ import annotations

import os


def processes_with_token(token: str, var: str) -> list[int]:
    """The pids whose environment carries ``var=token`` ([] where there is no /proc): a job and everything it
    started, in whatever session or process group, reparented orphans included (the way Jenkins'
    ProcessTreeKiller finds a build's processes)."""
    needle = f"{var}={token}".encode()
    pids = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return pids
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    pids.append(int(name))
        except OSError:  # gone, or another user's
            continue
    return pids
