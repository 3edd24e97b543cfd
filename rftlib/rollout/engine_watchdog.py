"""Stops a trainer's own engine processes when the trainer dies without stopping them (issue 43 item 10).

A trainer that starts ``vllm serve`` itself (rftlib.rollout.vllm_server._Server) starts each engine in a session
of its own, so that closing it can stop the whole process group (the API server and the engine core and workers
it spawns). Nothing in that group learns that the trainer died: after a ``kill -9`` of the trainer the engines
kept their cores or GPUs while the resume started a second set. So with each engine the trainer starts this
watchdog, its own child in another session (a signal to the trainer's group does not reach it), which polls its
parent: once the trainer is gone, it sends the engine's group SIGTERM, then SIGKILL after ``grace`` seconds.
When the engine's group is gone first (the trainer closed it), the watchdog exits.

Run by path, not as a module (``python engine_watchdog.py TRAINER_PID PGID [GRACE_S]``): it imports nothing of
rftlib (whose packages would import torch), so it starts in milliseconds and holds a few MB.
"""

from __future__ import annotations

import os
import signal
import sys
import time

POLL_S = 0.5  # how often the parent and the group are checked (the delay between a trainer's death and the stop)


def group_alive(pgid: int) -> bool:
    """Whether any process of group ``pgid`` is left (a zombie counts until it is reaped)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a member of the group we may not signal: still there
        return True
    return True


def stop_group(pgid: int, grace: float) -> None:
    """SIGTERM to the group, then SIGKILL to what is left after ``grace`` seconds."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    end = time.monotonic() + grace
    while time.monotonic() < end:
        if not group_alive(pgid):
            return
        time.sleep(0.1)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def watch(trainer_pid: int, pgid: int, grace: float) -> None:
    """Until the trainer (``trainer_pid``, this process's parent) is gone or the group ``pgid`` has ended; the
    group is stopped in the first case. A parent that died before this started is seen at once (the parent pid
    is compared with the trainer's, not read here)."""
    while os.getppid() == trainer_pid:
        if not group_alive(pgid):
            return
        time.sleep(POLL_S)
    stop_group(pgid, grace)


def main(argv: list[str]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's: it stops its engines itself
    trainer_pid, pgid = int(argv[0]), int(argv[1])
    watch(trainer_pid, pgid, float(argv[2]) if len(argv) > 2 else 20.0)


if __name__ == "__main__":
    main(sys.argv[1:])
