"""A process killed mid-checkpoint loses nothing: step_latest keeps pointing at a whole checkpoint."""

import os

import pytest
import torch

from rftlib.train import checkpoint as ckpt
from rftlib.train.loop import Trainer


def test_crash_mid_save_keeps_previous_checkpoint_and_resume_works(tiny_cfg, monkeypatch):
    cfg = tiny_cfg(num_steps=3, save_steps=0)
    tr = Trainer(cfg, progress=False)
    tr.step()
    tr.save()  # step_1, whole
    tr.step()
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

    resumed = Trainer(cfg, tr.run_dir, resume=True, progress=False)
    assert resumed.step_num == 1
    resumed.train()  # runs steps 2 and 3, saves, and sweeps the dead temp dir
    resumed.close()
    assert os.readlink(root / "step_latest") == "step_3"
    assert not [p for p in root.glob(".tmp_step_*")]
    state = ckpt.load_checkpoint(ckpt.latest_dir(tr.run_dir))
    assert state["trainer_state"]["step"] == 3
