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


def _write_step(tmp: Path, trainable, optimizer, scheduler, trainer_state, adapter_saver) -> None:
    torch.save(trainable, tmp / "trainable.pt")
    torch.save(optimizer, tmp / "optimizer.pt")
    torch.save(scheduler, tmp / "scheduler.pt")
    torch.save(rng_state(), tmp / "rng.pt")
    (tmp / "trainer_state.json").write_text(json.dumps(trainer_state, indent=1))
    if adapter_saver is not None:
        adapter_saver(tmp / "adapter")  # a peft adapter directory others can load
    for p in tmp.rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())


def save_checkpoint(run_dir: str | Path, step: int, *, trainable: dict[str, torch.Tensor], optimizer: dict,
                    scheduler: dict, trainer_state: dict[str, Any], max_keep: int, adapter_saver=None) -> Path:
    """Write training_state/step_{step}/ atomically, repoint step_latest, prune to max_keep."""
    root = Path(run_dir) / STATE
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step}"
    tmp = root / f".tmp_step_{step}_{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        _write_step(tmp, trainable, optimizer, scheduler, trainer_state, adapter_saver)
    except BaseException:  # an error or an interrupt mid-save: drop the partial write, keep the old ones
        shutil.rmtree(tmp, ignore_errors=True)
        raise
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
    return final


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
    d = Path(step_dir)
    return {
        "trainable": torch.load(d / "trainable.pt", weights_only=True),
        "optimizer": torch.load(d / "optimizer.pt", weights_only=False),
        "scheduler": torch.load(d / "scheduler.pt", weights_only=False),
        "rng": torch.load(d / "rng.pt", weights_only=False),
        "trainer_state": json.loads((d / "trainer_state.json").read_text()),
    }
