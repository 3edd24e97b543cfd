"""Recorded batches on disk (issue 33): ``<attempt>/records/step_N/``, written atomically, size-capped.

A record is everything one training step's update used, so that ``rft replay`` can run that update again on
the weights it started from and the inspector can show every token of it:

    records/step_N/
        manifest.json        step, config, world size, environment, the update's plan and figures (floats as
                             float.hex, so a replay compares bit for bit), tensor sha256s, bytes
        batch.safetensors    per rank r, keys ``r{r}/<name>``: the rollout rows and masks, advantages, loss mask,
                             behaviour / old / reference logprobs, the update's own logprobs and entropy
        texts.json           prompts, answers, completions, reward diagnostics per row
        start/               the trainable state the update started from (trainable.pt; with several
                             optimizer steps per rollout also optimizer.pt and scheduler.pt: the backend's
                             own checkpoint files)
        replays/             what ``rft replay`` wrote (one JSON per set of counterfactuals)
    records/index.json       [{step, bytes, reason, weights}] oldest first

Written like a checkpoint (rftlib.train.checkpoint): the record is built under ``records/.tmp_step_N_<pid>``,
every file fsynced, then renamed into place; a process killed mid-write leaves no ``step_N`` and the next write
removes its temporary. The cap (``record_max_bytes``) drops the oldest records first and never the one just
written; a record larger than the cap on its own is not kept, and the index says why.

I/O only: no model, no trainer. rftlib.train.record fills a record; rftlib.train.replay reads one.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from rftlib.monitor.files import chmod_as_umask

RECORDS = "records"
INDEX = "index.json"


def records_root(run_dir: str | Path) -> Path:
    return Path(run_dir) / RECORDS


def record_dir(run_dir: str | Path, step: int) -> Path:
    return records_root(run_dir) / f"step_{step}"


def _fsync_path(p: Path) -> None:
    try:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def clean_temporaries(run_dir: str | Path) -> None:
    """Remove ``.tmp_step_*`` directories: what a process killed mid-write left. Only the trainer that holds the
    attempt's lock (rftlib.attempts.lock_attempt) writes records, so a temporary found here is a dead writer's or
    this process's own abandoned one."""
    root = records_root(run_dir)
    if not root.exists():
        return
    for p in root.glob(".tmp_step_*"):
        shutil.rmtree(p, ignore_errors=True)


def begin(run_dir: str | Path, step: int) -> Path:
    """A fresh temporary directory for step ``step``'s record (the snapshot goes in before the update)."""
    root = records_root(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    clean_temporaries(run_dir)
    tmp = root / f".tmp_step_{step}_{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "start").mkdir(parents=True)
    return tmp


def abandon(tmp: Path | None) -> None:
    """Drop a record that was begun but is not kept (the step was not recorded after all)."""
    if tmp is not None:
        shutil.rmtree(tmp, ignore_errors=True)


def sha256_tensor(t: torch.Tensor) -> str:
    """sha256 of a tensor's dtype, shape and bytes (host, contiguous): equal hashes, equal tensors."""
    t = t.detach().to("cpu").contiguous()
    h = hashlib.sha256(f"{t.dtype}|{tuple(t.shape)}|".encode())
    h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def _dir_bytes(d: Path) -> int:
    return sum(p.stat().st_size for p in d.rglob("*") if p.is_file())


def read_index(run_dir: str | Path) -> list[dict[str, Any]]:
    """records/index.json's rows; a missing index over records on disk is rebuilt from them (:func:`rebuild_index`)."""
    p = records_root(run_dir) / INDEX
    if not p.exists():
        return rebuild_index(run_dir) if list_records(run_dir) else []
    try:
        return json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}: not valid JSON ({e}); delete it: the next read rebuilds it from the records on disk "
                         f"(the rows of records already dropped are lost)") from e


def rebuild_index(run_dir: str | Path) -> list[dict[str, Any]]:
    """records/index.json written again from the records on disk (their manifests): one kept row each. What it
    cannot know is gone with the old index: the rows of records dropped or not kept."""
    rows = []
    for step in list_records(run_dir):
        d = record_dir(run_dir, step)
        try:
            m = json.loads((d / "manifest.json").read_text())
        except (OSError, json.JSONDecodeError):
            continue  # not a complete record: no row (read_record says why)
        rows.append({"step": step, "bytes": _dir_bytes(d), "reason": m.get("reason", ""),
                     "weights": "snapshot" if m.get("snapshot") else "none", "kept": True})
    _write_index(run_dir, rows)
    return rows


def _write_index(run_dir: str | Path, rows: list[dict[str, Any]]) -> None:
    root = records_root(run_dir)
    tmp = root / f".{INDEX}.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(rows, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, root / INDEX)
    _fsync_path(root)


def commit(tmp: Path, run_dir: str | Path, step: int, *, tensors: dict[str, torch.Tensor], manifest: dict[str, Any],
           texts: dict[str, Any], max_bytes: int) -> dict[str, Any]:
    """Write the batch, texts and manifest into ``tmp`` (which holds the snapshot), fsync, rename it to
    ``records/step_{step}``, then enforce the cap. Returns the index row ({step, bytes, reason, weights, kept})."""
    tensors = {k: v.detach().to("cpu").clone().contiguous() for k, v in tensors.items()}  # loss_mask may BE completion_mask
    save_file(tensors, str(tmp / "batch.safetensors"))
    chmod_as_umask(tmp / "batch.safetensors")  # safetensors writes it 0600: others could not read a shared record
    (tmp / "texts.json").write_text(json.dumps(texts))
    snap = sorted(p.name for p in (tmp / "start").iterdir()) if (tmp / "start").exists() else []
    manifest = {**manifest, "schema": 1, "step": step, "snapshot": snap,
                "sha256": {k: sha256_tensor(v) for k, v in tensors.items()}}
    manifest["bytes"] = _dir_bytes(tmp) + len(json.dumps(manifest, indent=1)) + 16
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1))
    for p in tmp.rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
    for d in [tmp, *(p for p in tmp.rglob("*") if p.is_dir())]:
        _fsync_path(d)
    size = _dir_bytes(tmp)
    row = {"step": step, "bytes": size, "reason": manifest.get("reason", ""),
           "weights": "snapshot" if snap else "none"}
    rows = [r for r in read_index(run_dir) if r["step"] != step]
    if size > max_bytes:
        abandon(tmp)
        row["kept"] = False
        row["why"] = (f"{size} bytes alone exceed record_max_bytes={max_bytes}: not kept (raise the cap, or record "
                      f"fewer steps)")
        _write_index(run_dir, rows + [row])
        return row
    final = record_dir(run_dir, step)
    if final.exists():  # a resumed attempt records a step again: the new one replaces the old
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync_path(final.parent)
    row["kept"] = True
    rows.append(row)
    rows = _enforce_cap(run_dir, rows, max_bytes, keep=step)
    _write_index(run_dir, rows)
    return row


def _enforce_cap(run_dir: str | Path, rows: list[dict[str, Any]], max_bytes: int, *, keep: int) -> list[dict[str, Any]]:
    """Drop the oldest kept records (never ``keep``) until the kept ones total at most ``max_bytes``."""
    kept = [r for r in rows if r.get("kept")]
    total = sum(r["bytes"] for r in kept)
    for r in sorted(kept, key=lambda r: r["step"]):
        if total <= max_bytes:
            break
        if r["step"] == keep:
            continue
        shutil.rmtree(record_dir(run_dir, r["step"]), ignore_errors=True)
        total -= r["bytes"]
        r["kept"] = False
        r["why"] = f"dropped by the cap record_max_bytes={max_bytes} (oldest first)"
    return rows


def truncate_after(run_dir: str | Path, step: int) -> None:
    """A resume from step ``step`` re-runs the steps after it: their records go (the new run records them again)."""
    rows = read_index(run_dir)
    for r in rows:
        if r["step"] > step:
            shutil.rmtree(record_dir(run_dir, r["step"]), ignore_errors=True)
    if rows:
        _write_index(run_dir, [r for r in rows if r["step"] <= step])
    clean_temporaries(run_dir)


def list_records(run_dir: str | Path) -> list[int]:
    """Steps with a record on disk, ascending."""
    root = records_root(run_dir)
    if not root.exists():
        return []
    return sorted(int(p.name[5:]) for p in root.iterdir()
                  if p.is_dir() and p.name.startswith("step_") and p.name[5:].isdigit())


@dataclass
class Record:
    """One recorded step as read back: its directory, manifest, tensors (``r{rank}/<name>``) and texts."""

    dir: Path
    manifest: dict[str, Any]
    tensors: dict[str, torch.Tensor]
    texts: dict[str, Any]

    @property
    def step(self) -> int:
        return int(self.manifest["step"])

    @property
    def world_size(self) -> int:
        return int(self.manifest["world_size"])

    def rank(self, r: int) -> dict[str, torch.Tensor]:
        """Rank ``r``'s tensors without the prefix."""
        pre = f"r{r}/"
        return {k[len(pre):]: v for k, v in self.tensors.items() if k.startswith(pre)}


def read_record(run_dir: str | Path, step: int, *, verify: bool = True) -> Record:
    """Read ``records/step_{step}``; ``verify`` checks every tensor's sha256 against the manifest."""
    d = record_dir(run_dir, step)
    if not d.is_dir():
        have = list_records(run_dir)
        dropped = [r for r in read_index(run_dir) if r["step"] == step and not r.get("kept")]
        why = f" ({dropped[0].get('why')})" if dropped else ""
        raise FileNotFoundError(
            f"{d}: step {step} was not recorded{why}; recorded steps of this attempt: {have or 'none'} "
            f"(record_batches sets which steps are recorded)")
    manifest_p = d / "manifest.json"
    try:
        manifest = json.loads(manifest_p.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{manifest_p}: unreadable record manifest ({e})") from e
    tensors = load_file(str(d / "batch.safetensors"))
    if verify:
        for k, h in manifest.get("sha256", {}).items():
            if k not in tensors or sha256_tensor(tensors[k]) != h:
                raise ValueError(f"{d / 'batch.safetensors'}: tensor {k!r} does not match the manifest's sha256 "
                                 f"(the record is damaged)")
    texts = json.loads((d / "texts.json").read_text())
    return Record(d, manifest, tensors, texts)
