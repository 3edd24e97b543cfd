"""A process killed mid-checkpoint loses nothing: step_latest keeps pointing at a whole checkpoint."""

import os
import pathlib

import pytest
import torch

from rftlib.train import checkpoint as ckpt
from rftlib.train.loop import Trainer


def _digits(text, ex, trunc):
    """A reward the tiny model's completions vary in (fraction of digit characters), so steps train."""
    return sum(c in "0123456789" for c in text) / max(len(text), 1), {}


def _trainable(tr):
    return {k: v.detach().clone() for k, v in tr.model.named_parameters() if v.requires_grad}


def test_crash_mid_save_keeps_previous_checkpoint_and_resume_works(tiny_cfg, monkeypatch, task_with):
    cfg = tiny_cfg(num_steps=3, save_steps=0, lr=3e-2, warmup_ratio=0.0)
    tr = Trainer(cfg, progress=False, task=task_with(cfg, _digits))
    tr.step()
    tr.save()  # step_1, whole
    at1 = _trainable(tr)
    tr.step()
    at2 = _trainable(tr)
    assert any(not torch.equal(at1[k], at2[k]) for k in at1)  # step 2 trained: a resume from it would differ
    real_save = torch.save

    def dying_save(obj, path, *a, **kw):
        if str(path).endswith("optimizer.pt"):
            raise KeyboardInterrupt("killed mid-checkpoint")  # what a SIGINT / OOM kill looks like here
        return real_save(obj, path, *a, **kw)

    monkeypatch.setattr(torch, "save", dying_save)
    with pytest.raises(KeyboardInterrupt):
        tr.save()
    monkeypatch.setattr(torch, "save", real_save)
    root = tr.run_dir / "training_state"
    assert os.readlink(root / "step_latest") == "step_1"  # never points at the half-written step_2
    assert ckpt.list_steps(tr.run_dir) == [1]
    assert not list(root.glob(".tmp_step_*"))  # an interrupted save removes its own partial write
    tr.close()
    # a process killed outright (SIGKILL) cannot clean up: its partial write stays under a temp name
    dead = root / ".tmp_step_2_999999"
    dead.mkdir()
    (dead / "trainable.pt").write_bytes(b"half a file")

    resumed = Trainer(cfg, tr.run_dir, resume=True, progress=False, task=task_with(cfg, _digits))
    assert resumed.step_num == 1
    now = _trainable(resumed)
    assert all(torch.equal(now[k], at1[k]) for k in at1)  # the weights of the whole step_1, not step 2's
    resumed.train()  # runs steps 2 and 3, saves, and sweeps the dead temp dir
    resumed.close()
    assert os.readlink(root / "step_latest") == "step_3"
    assert not [p for p in root.glob(".tmp_step_*")]
    state = ckpt.load_checkpoint(ckpt.latest_dir(tr.run_dir))
    assert state["trainer_state"]["step"] == 3


class _OneRank:
    """The dist interface save_step uses, for one process."""

    rank, world_size, is_main = 0, 1, True

    def barrier(self):
        pass

    def all_sum(self, t):
        return t


def test_a_file_another_rank_renames_mid_walk_does_not_fail_the_checkpoint(tmp_path, monkeypatch):
    """Ranks write one checkpoint directory side by side; rank 0 saves the adapter through safetensors'
    temporaries (``adapter/.tmpXXXXXX``, renamed into place) while another rank fsyncs what it sees. Here the
    owner's rename lands right after this rank found the temporary and before it opens it (seen under DDP in
    the detached-launch test: the attempt crashed at a save with FileNotFoundError on adapter/.tmpc5FYCc).
    The save must succeed and keep every final file."""
    real_is_file = pathlib.Path.is_file

    def is_file(self):
        there = real_is_file(self)
        if there and self.name.startswith(".tmp"):  # the owner renames its temporary into place now
            self.rename(self.with_name(self.name[4:] + ".safetensors"))
        return there

    def write(tmp):
        (tmp / "adapter").mkdir()
        (tmp / "adapter" / ".tmpc5FYCc").write_bytes(b"weights")

    monkeypatch.setattr(pathlib.Path, "is_file", is_file)
    final = ckpt.save_step(tmp_path, 1, dist=_OneRank(), write=write, trainer_state={"step": 1}, max_keep=2)
    monkeypatch.undo()
    assert [p.name for p in (final / "adapter").iterdir()] == ["c5FYCc.safetensors"]
    assert (tmp_path / "training_state" / "step_latest").resolve() == final.resolve()


def test_every_file_of_a_step_is_fsynced_before_the_step_is_renamed_into_place(tmp_path, monkeypatch):
    """trainer_state.json is the last file of a step: it must reach the disk before the rename that
    publishes the step, as must the directory entries naming the files (issue 30 item 13: the fsync walk
    ran before trainer_state.json was written, so after a power loss a resume could read an empty file)."""
    events: list[tuple[str, str]] = []
    real_fsync, real_rename = os.fsync, os.rename

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def rename(src, dst):
        events.append(("rename", str(src)))
        return real_rename(src, dst)

    def write(tmp):
        (tmp / "adapter").mkdir()
        (tmp / "adapter" / "adapter_model.safetensors").write_bytes(b"weights")
        torch.save({"w": torch.zeros(2)}, tmp / "trainable.pt")

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "rename", rename)
    final = ckpt.save_step(tmp_path, 1, dist=_OneRank(), write=write, trainer_state={"step": 1}, max_keep=2)
    monkeypatch.undo()
    (at,) = [i for i, (kind, p) in enumerate(events) if kind == "rename" and p.endswith(".tmp_step_1")]
    synced = {p for kind, p in events[:at] if kind == "fsync"}
    tmp = str(tmp_path / "training_state" / ".tmp_step_1")
    for name in ("trainer_state.json", "trainable.pt", "rng_rank0.pt", "adapter/adapter_model.safetensors",
                 "adapter", ""):
        assert os.path.join(tmp, name).rstrip("/") in synced, f"{name or 'the step directory'} not fsynced before the rename"
    assert ckpt.load_checkpoint(final)["trainer_state"] == {"step": 1}
