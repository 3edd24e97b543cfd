"""Atomic checkpoints in seed 001's layout: training_state/step_N/ and a step_latest link.

A step directory is written under a temporary name and renamed into place, and step_latest is
swapped with an atomic rename, so a process killed mid-save leaves the previous checkpoint whole
and step_latest never points at a half-written directory.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rftlib.models.loading import is_peft
from rftlib.backends import checkpoint_format_of
from rftlib.backends.scheduler import restart_schedule
from rftlib.train.pipeline import truncate_trained
from rftlib.train.state import TrainerState

STATE = "training_state"


def rng_state() -> dict[str, Any]:
    s = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():  # sampling on a GPU draws from the CUDA generators
        s["cuda"] = torch.cuda.get_rng_state_all()
    return s


def set_rng_state(s: dict[str, Any]) -> None:
    random.setstate(s["python"])
    np.random.set_state(s["numpy"])
    torch.set_rng_state(s["torch"])
    if "cuda" in s and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])


def _fsync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    except OSError:
        pass


def list_steps(run_dir: str | Path) -> list[int]:
    root = Path(run_dir) / STATE
    if not root.exists():
        return []
    return sorted(int(p.name[5:]) for p in root.iterdir()
                  if p.is_dir() and not p.is_symlink() and p.name.startswith("step_") and p.name[5:].isdigit())


def prune(root: Path, max_keep: int) -> None:
    steps = list_steps(root.parent)
    for s in steps[:-max_keep] if max_keep > 0 else []:
        shutil.rmtree(root / f"step_{s}", ignore_errors=True)
    for p in root.glob(".tmp_step_*"):  # leftovers of a killed save
        if not p.name.endswith(f"_{os.getpid()}"):
            shutil.rmtree(p, ignore_errors=True)


def latest_dir(run_dir: str | Path) -> Path:
    root = Path(run_dir) / STATE
    link = root / "step_latest"
    if link.exists():
        return link.resolve()
    steps = list_steps(run_dir)
    if not steps:
        raise FileNotFoundError(f"no checkpoint under {root}: nothing to resume")
    return root / f"step_{steps[-1]}"


def load_checkpoint(step_dir: str | Path) -> dict[str, Any]:
    """Rank 0's view of a checkpoint (a DeepSpeed one keeps optimizer and scheduler in deepspeed/: None here)."""
    d = Path(step_dir)

    def opt(name: str):
        return torch.load(d / name, weights_only=False) if (d / name).exists() else None

    return {
        "trainable": torch.load(d / "trainable.pt", weights_only=True),
        "optimizer": opt("optimizer.pt"),
        "scheduler": opt("scheduler.pt"),
        "rng": load_rng(d, 0),
        "trainer_state": json.loads((d / "trainer_state.json").read_text()),
    }


def _fsync_files(tmp: Path) -> None:
    """fsync every file under ``tmp`` that is there when this rank looks. The ranks write into one directory
    side by side, and a writer may put a file in place through a temporary of its own (safetensors writes
    ``adapter/.tmpXXXXXX`` and renames it): a file that vanishes between the listing and the open is another
    rank's temporary, renamed into place by its owner, who fsyncs the final file in its own walk (each rank
    walks after its own writes are done). Failing on it would fail the whole checkpoint (seen under DDP: rank
    1 walked while rank 0 saved the adapter, and the attempt crashed at a save)."""
    for p in tmp.rglob("*"):
        try:
            if p.is_file():
                with open(p, "rb") as f:
                    os.fsync(f.fileno())
        except FileNotFoundError:
            continue


def _write_synced(path: Path, text: str) -> None:
    """Write ``path`` and fsync it before returning: a file written just before a rename into place must be on
    disk before the rename is, or a power loss can leave the renamed directory holding an empty file."""
    with open(path, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _fsync_tree_dirs(top: Path) -> None:
    """fsync ``top`` and every directory below it: their entries (the names of the files just written)."""
    for d in [top, *(p for p in top.rglob("*") if p.is_dir())]:
        _fsync_dir(d)


def save_step(run_dir: str | Path, step: int, *, dist, write, trainer_state: dict[str, Any], max_keep: int) -> Path:
    """Write training_state/step_{step}/ from every rank at once, atomically.

    Rank 0 makes the temporary directory; every rank then calls ``write(tmp)`` for its share (its
    optimizer partition under ZeRO, nothing under DDP but rank 0) and saves its own RNG state
    (ranks sample differently); rank 0 adds trainer_state.json and renames the directory into
    place only if every rank succeeded, so step_latest always names a whole checkpoint.
    """
    root = Path(run_dir) / STATE
    final = root / f"step_{step}"
    tmp = root / f".tmp_step_{step}"
    if dist.is_main:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    dist.barrier()
    err: BaseException | None = None
    try:
        write(tmp)
        torch.save(rng_state(), tmp / f"rng_rank{dist.rank}.pt")
        _fsync_files(tmp)
    except BaseException as e:  # an error or an interrupt mid-save: no rank keeps a partial write
        err = e
    ok = int(dist.all_sum(torch.tensor([0 if err else 1])).item()) == dist.world_size
    if dist.is_main:
        if ok:
            # the last file of the step, fsynced like every other (the walk above ran before it existed), and the
            # directories' entries, all before the rename publishes the step: a resume never reads an empty file
            _write_synced(tmp / "trainer_state.json", json.dumps(trainer_state, indent=1))
            _fsync_tree_dirs(tmp)
            if final.exists():
                shutil.rmtree(final)
            os.rename(tmp, final)
            link_tmp = root / f".tmp_latest_{os.getpid()}"
            if link_tmp.is_symlink() or link_tmp.exists():
                link_tmp.unlink()
            os.symlink(final.name, link_tmp)
            os.replace(link_tmp, root / "step_latest")
            _fsync_dir(root)
            prune(root, max_keep)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    dist.barrier()
    if err is not None:
        raise err
    if not ok:
        raise RuntimeError(f"another rank failed to write its part of checkpoint step {step}; the previous "
                           "checkpoint is intact")
    return final


def load_rng(step_dir: str | Path, rank: int) -> dict[str, Any]:
    """This rank's saved RNG state (rng_rank{r}.pt; rng.pt from single-process checkpoints of before)."""
    d = Path(step_dir)
    path = d / f"rng_rank{rank}.pt"
    return torch.load(path if path.exists() else d / "rng.pt", weights_only=False)


# ---- a Trainer's checkpoint (rftlib.train.loop) -------------------------------------------------------------

def trainer_state(tr) -> dict[str, Any]:
    """What a resume needs beside the backend's weights and optimizer: the step, sampler cursor, evals."""
    return {**tr.state.saved(), "sampler": tr.sampler.state(), "num_steps": tr.cfg.num_steps,
            "world_size": tr.dist.world_size, "backend": tr.cfg.backend,
            # max_staleness > 0: batches permitted (their prompts drawn, the sampler's cursor past them) but not
            # trained; a resume regenerates them first, so none is skipped and none trained twice (issue 32)
            "pipeline": {"max_staleness": tr.cfg.max_staleness, "version": tr.state.step,
                         "pending": tr.source.pending() if getattr(tr, "source", None) is not None else []},
            # the sync probe's recent noise measurements (rftlib.rollout.sync_probe.noise_level): a resume's first
            # sync is judged against the level the attempt measured, not against one fresh measurement (rank 0's;
            # every rank probes the same engine weights on the same prompts)
            "sync_probe": {"noises": [float(x) for x in getattr(tr.engine, "probe_noises", ())]}}


def save_trainer(tr) -> Path:
    """Checkpoint a Trainer at its step (every rank takes part: the adapter is gathered under ZeRO-3)."""
    def write(tmp: Path) -> None:
        tr.backend.save(tmp)
        if is_peft(tr.model):  # a peft adapter directory others can load
            state = tr.backend.adapter_state()  # gathered under ZeRO-3 (every rank takes part)
            if tr.dist.is_main:
                tr.model.save_pretrained(tmp / "adapter", **({"state_dict": state} if state else {}))

    return save_step(tr.run_dir, tr.state.step, dist=tr.dist, write=write, trainer_state=trainer_state(tr),
                     max_keep=tr.cfg.max_ckpt_num)


def resume_trainer(tr) -> None:
    """Continue a Trainer from ``training_state/step_latest``: the backend's weights and optimizer, this config's
    lr/betas/weight decay on the saved LR schedule, RNG, sampler cursor, eval history, metrics lines."""
    d = latest_dir(tr.run_dir)
    ts = json.loads((d / "trainer_state.json").read_text())
    saved_world, saved_backend = ts.get("world_size", 1), ts.get("backend", "single")
    same_format = checkpoint_format_of(saved_backend) == checkpoint_format_of(tr.cfg.backend)
    if saved_world != tr.dist.world_size or not same_format:
        raise RuntimeError(
            f"{d} was saved by {saved_world} rank(s) with backend {saved_backend}; resuming with "
            f"{tr.dist.world_size} rank(s) and backend {tr.cfg.backend} would not continue the same run "
            f"(per-rank sampling streams{'' if same_format else ' and checkpoint partitions'} differ). Resume "
            f"with {saved_world} rank(s) and backend {saved_backend}, or start a new attempt from its weights "
            f"with init_adapter={d / 'adapter'}")
    tr.backend.load(d)
    cfg = tr.cfg
    restart_schedule(tr.optimizer, tr.scheduler, lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2),
                     weight_decay=cfg.weight_decay)
    set_rng_state(load_rng(d, tr.dist.rank))
    tr.state = TrainerState.from_saved(ts)  # its pending batches: the source generates them first
    tr.sampler.load_state(ts["sampler"])
    noises = ts.get("sync_probe", {}).get("noises", [])
    if noises and hasattr(tr.engine, "probe_noises"):  # before the resume's first sync, which reads them
        tr.engine.probe_noises.extend(noises)
    if tr.logger is not None:
        tr.logger.truncate_after(tr.state.step)
    if tr.dist.is_main:
        truncate_trained(tr.run_dir, tr.state.step)
