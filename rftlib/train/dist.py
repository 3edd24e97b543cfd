"""Which process am I, which device do I use, and how do ranks agree: the dozen lines nanoGPT keeps
at the top of train.py, in one place.

A run is one process (``backend: single``) or one of ``WORLD_SIZE`` ranks started by torchrun
(``backend: ddp | deepspeed``; torchrun sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT, and
its own rendezvous spans nodes). Communication is torch.distributed's: gloo on CPU, NCCL on GPU.
Nothing here is home-made collective code; the helpers only say what each metric reduction means.

CPU threads: two torch pools on the same cores run 5-10x slower than one (measured here: HF
generate 75 -> 6.6 tokens/s), so ranks sharing a machine's CPU split its cores between them.
"""

from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as tdist

from rftlib.models.loading import resolve_dtype  # noqa: F401  (its home is below the layers that call it)
from rftlib.backends import backend_class


@dataclass
class Dist:
    """This process's place in the run: rank, world size, device, and whether it writes files."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        """Rank 0 alone writes metrics, samples, reports and checkpoint metadata."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    # ---- collectives (no-ops in one process) --------------------------------------------------
    def barrier(self) -> None:
        if self.distributed:
            tdist.barrier()

    def all_sum(self, x: torch.Tensor) -> torch.Tensor:
        """Sum of a tensor over ranks (a new tensor; the input is untouched)."""
        if not self.distributed:
            return x
        y = x.detach().clone().to(self.device)
        tdist.all_reduce(y, op=tdist.ReduceOp.SUM)
        return y.to(x.device)

    def all_max(self, x: torch.Tensor) -> torch.Tensor:
        if not self.distributed:
            return x
        y = x.detach().clone().to(self.device)
        tdist.all_reduce(y, op=tdist.ReduceOp.MAX)
        return y.to(x.device)

    def gather_objects(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` in rank order (small, picklable: metrics inputs, eval results)."""
        if not self.distributed:
            return [obj]
        out: list[Any] = [None] * self.world_size
        tdist.all_gather_object(out, obj)
        return out

    def gather_to_main(self, obj: Any) -> list[Any] | None:
        """Every rank's ``obj`` in rank order on rank 0 (None on the others): a recorded batch goes to the one writer
        without a copy on every rank (gather_objects is an all-gather)."""
        if not self.distributed:
            return [obj]
        out: list[Any] | None = [None] * self.world_size if self.is_main else None
        tdist.gather_object(obj, out, dst=0)
        return out

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank (e.g. the attempt directory rank 0 created)."""
        if not self.distributed:
            return obj
        box = [obj]
        tdist.broadcast_object_list(box, src=0)
        return box[0]


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """``auto``: cuda:LOCAL_RANK when CUDA is available, else cpu. An explicit cuda without CUDA is an error."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise RuntimeError(f"device='{name}' but torch sees no CUDA device (torch {torch.__version__}, "
                               f"built with CUDA {torch.version.cuda}); use device: auto or cpu")
        return torch.device(name if ":" in name else f"cuda:{local_rank}")
    return torch.device(name)


def env_world() -> tuple[int, int, int, int]:
    """(rank, world_size, local_rank, local_world_size) from torchrun's environment (0, 1, 0, 1 without it)."""
    g = os.environ.get
    return int(g("RANK", 0)), int(g("WORLD_SIZE", 1)), int(g("LOCAL_RANK", 0)), int(g("LOCAL_WORLD_SIZE", 1))


def cpu_threads_per_rank(local_world_size: int, requested: int = 0) -> int:
    """Threads for one rank's torch pool: the request, else the cores split evenly between local ranks."""
    if requested:
        return requested
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, local_world_size))


def init_dist(cfg) -> Dist:
    """Set up this process for ``cfg.backend``: join the process group (torchrun's env), pick the
    device, split CPU threads between ranks. One process without torchrun needs no process group, except
    under a backend that declares it needs one alone (``needs_group_alone``: DeepSpeed's initialize), which
    gets a world of 1; the backend joins the group its own way (``Backend.join_group``)."""
    rank, world, local_rank, local_world = env_world()
    backend = backend_class(cfg.backend)
    if world > 1 and backend.single_process:
        raise RuntimeError(f"started as rank {rank} of {world} (torchrun) but backend '{cfg.backend}' runs one "
                           "process: choose a backend that runs ranks (ddp, or ZeRO's), or start one process")
    device = resolve_device(cfg.device, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    threads = cpu_threads_per_rank(local_world, cfg.torch_threads)
    if device.type == "cpu" and (cfg.torch_threads or local_world > 1):
        torch.set_num_threads(threads)
    needs_group = world > 1 or backend.needs_group_alone
    if needs_group and world == 1:
        # a one-rank group on a free port, without torchrun. Set even when a group is already up: a process that
        # ran a one-rank DeepSpeed attempt before (a notebook kernel's second attempt, a test worker) keeps its
        # group, but its environment may have lost these (without_group_env), and ZeRO-3's partitioned loading
        # (deepspeed.zero.Init) reads LOCAL_RANK from it: KeyError 'LOCAL_RANK' in an xdist worker of the suite
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        if tdist.is_initialized():
            os.environ.setdefault("MASTER_PORT", str(_free_port()))
        else:  # a port of our own: one inherited from a parent that ran a one-rank group (a test suite's process,
            # a kernel) may still be held by that parent's store -- EADDRINUSE (the GPU check's CPU form in CI,
            # 2026-11-27); a one-rank group meets no one at it
            os.environ["MASTER_PORT"] = str(_free_port())
        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
        os.environ.setdefault("LOCAL_RANK", "0")
        os.environ[ONE_RANK_ENV] = "1"  # these are ours, not a launcher's: this process is no torchrun rank
    if needs_group and not tdist.is_initialized():
        pg_backend = "nccl" if device.type == "cuda" else "gloo"
        backend.join_group(pg_backend, device)
    return Dist(rank=rank, world_size=world, local_rank=local_rank, local_world_size=local_world, device=device)


ONE_RANK_ENV = "RFTLIB_ONE_RANK_GROUP"
"""Set by init_dist beside the rendezvous variables it sets for a one-rank group without torchrun. They stay in the
process's environment after the attempt (ZeRO-3's partitioned loading reads LOCAL_RANK), so without this mark a
later ``rft train`` in the same process (a notebook kernel, a test worker) read LOCAL_RANK + WORLD_SIZE as "a
torchrun rank" and ended the process with exit_rank's os._exit (an xdist worker of the suite died so)."""

DIST_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", ONE_RANK_ENV)
"""torch.distributed's rendezvous variables (init_dist sets them for a one-rank group without torchrun), and its mark"""


def started_as_a_rank(env=None) -> bool:
    """This process is one rank of a launched job (torchrun; or a launcher that sets LOCAL_RANK and WORLD_SIZE), not
    a process where init_dist set those itself for a one-rank group (:data:`ONE_RANK_ENV`)."""
    env = os.environ if env is None else env
    if "TORCHELASTIC_RUN_ID" in env:
        return True
    return "LOCAL_RANK" in env and "WORLD_SIZE" in env and ONE_RANK_ENV not in env


def without_group_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` less torch.distributed's rendezvous variables: what a child process (torchrun, a rank, a smoke
    line) must start from. A one-rank DeepSpeed group set up earlier in this process (a notebook kernel's
    ZeRO-3 attempt, a test) leaves RANK/WORLD_SIZE/MASTER_PORT here, with the port still held by its store:
    a child that inherits them joins the wrong group or fails with EADDRINUSE."""
    return {k: v for k, v in env.items() if k not in DIST_ENV}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shutdown_dist() -> None:
    """Leave together, then tear the process group down.

    The barrier keeps a rank from destroying its group while a peer is still inside a collective
    (or DeepSpeed's gather of the final weights) on the same group.
    """
    if tdist.is_initialized():
        try:
            tdist.barrier()
        finally:
            tdist.destroy_process_group()


def exit_rank(code: int = 0) -> None:
    """End a torchrun rank process now that everything is written: flush, then ``os._exit``.

    A 2-rank ZeRO-3 run on gloo once finished training, wrote its results and then died at
    interpreter exit with "terminate called without an active exception" (SIGABRT: a C++ thread
    object destroyed while joinable during static destruction), so torchrun reported a failed run
    and killed the other rank. ``os._exit`` skips that teardown; call it only after every file is
    written and the process group is destroyed. Never call it in a process that is not a rank.
    """
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a closed stream must not turn a clean exit into an error
            pass
    os._exit(code)
