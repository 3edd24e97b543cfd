"""Start the ranks of a multi-process attempt with torchrun, from a shell or a notebook.

``rft train --nproc N`` (and train.ipynb with ``nproc=N``) create the attempt directory here, then
run ``torchrun --nproc_per_node N -m rftlib.cli train --run-dir <attempt>``: every rank reads the
same resolved config.yaml, so no rank has to agree with another on names. Users who grow past
one machine run torchrun themselves (``--nnodes``, ``--node_rank``, ``--rdzv-endpoint``) with the
same ``-m rftlib.cli train ...`` arguments; :func:`torchrun_command` writes that line for them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import deque
from pathlib import Path
from typing import Callable

from rftlib.train.dist import without_group_env


def torchrun_command(nproc: int, rank_args: list[str], *, nnodes: int = 1, node_rank: int = 0,
                     rdzv_endpoint: str | None = None, python: str = sys.executable) -> list[str]:
    """The torchrun command line for ``nproc`` ranks per node running ``rftlib.cli <rank_args>``.

    One node: ``--standalone`` (a local rendezvous on a free port). Several: torchrun's c10d
    rendezvous at ``rdzv_endpoint`` (host:port of node 0), the same command on every node with its
    ``node_rank``.
    """
    if nproc < 1 or nnodes < 1:
        raise ValueError(f"nproc={nproc}, nnodes={nnodes}: both must be at least 1")
    cmd = [python, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}"]
    if nnodes == 1:
        cmd.append("--standalone")
    else:
        if not rdzv_endpoint:
            raise ValueError("a multi-node launch needs rdzv_endpoint=HOST:PORT of node 0 (torchrun --rdzv-endpoint)")
        cmd += [f"--nnodes={nnodes}", f"--node_rank={node_rank}", "--rdzv-backend=c10d",
                f"--rdzv-endpoint={rdzv_endpoint}", "--rdzv-id=rftlib"]
    return cmd + ["-m", "rftlib.cli", *rank_args]


def rank_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The ranks' environment: this one, with rftlib importable and torch's CPU threads left to
    rftlib (it splits the cores between local ranks; torchrun would pin every rank to 1 thread)."""
    env = without_group_env(dict(os.environ if base is None else base))  # torchrun picks its own rendezvous
    repo = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = repo + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def run_ranks(run_dir: str | Path, nproc: int, *, resume: bool = False,
              write: Callable[[str], None] = lambda s: print(s, end="", flush=True)) -> int:
    """Run an attempt's ranks to the end, streaming their output through ``write``; the exit code.

    A rank that fails stops the job (torchrun tears down the others); the last lines of output
    then name the failure, and the attempt's last checkpoint is intact for a resume.
    """
    args = ["train", "--run-dir", str(run_dir)] + (["--resume"] if resume else [])
    cmd = torchrun_command(nproc, args)
    Path(run_dir, "logs").mkdir(parents=True, exist_ok=True)
    Path(run_dir, "logs", "launch_command.txt").write_text(" ".join(cmd) + "\n")
    tail: deque[str] = deque(maxlen=40)
    with subprocess.Popen(cmd, env=rank_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          bufsize=1) as p:
        assert p.stdout is not None
        for line in p.stdout:
            tail.append(line)
            write(line)
        code = p.wait()
    if code != 0:
        write(f"[rft] the ranks exited with code {code}; last lines above. The last checkpoint of {run_dir} is "
              "intact: resume with `rft resume` once fixed.\n")
    return code
