"""Recorded batches and their replay (issue 33): recording changes nothing, a record holds what the update used,
and replaying the recorded configuration on the recorded weights reproduces every recorded logprob, loss and grad
norm bit for bit (the proof that the replay is the update, and a check on the trainer itself); a wrong checkpoint
is caught by the logprobs, and a replay with no weights close enough is refused.

The tiny model on a reward that varies within groups (non-zero advantages: the steps train), float32, autocast off
(the equality is claimed for the recorded environment; these tests replay in the process that recorded)."""

import json
import math
import shutil
from dataclasses import replace

import pytest
import torch

from rftlib.monitor import records
from rftlib.train.build import build_task
from rftlib.train.loop import Trainer
from rftlib.train.replay import ReplayError, ReplayMismatch, counterfactual_config, replay, replay_config
from toy_rewards import isdigit_share

BASE = dict(num_steps=3, lr=3e-2, warmup_ratio=0.0, autocast="none", lora_dropout=0.0, save_steps=1)


def _attempt(tiny_cfg, task_with, **kw):
    cfg = tiny_cfg(**{**BASE, **kw})
    tr = Trainer(cfg, progress=False, task=task_with(cfg, isdigit_share))
    tr.train()
    tr.close()
    return tr


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, task_with):
    """Two optimizer steps per rollout (train_batch_size 2 of 4 prompts): the second is off-policy, ratios move."""
    from rftlib.config import make_config
    cfg = make_config("tiny", {**BASE, "runs_root": str(tmp_path_factory.mktemp("rec") / "runs"),
                               "record_batches": "all", "train_batch_size": 2})
    tr = Trainer(cfg, progress=False, task=task_with(cfg, isdigit_share))
    tr.train()
    tr.close()
    return tr.run_dir


def test_recording_changes_nothing(tiny_cfg, task_with):
    """The same attempt with every step recorded and with none: equal metrics rows and equal final weights."""
    def run(mode):
        tr = _attempt(tiny_cfg, task_with, record_batches=mode, record_on_spike=False, name=f"rec-{mode or 'none'}")
        from rftlib.monitor.metrics import read_metrics
        rows = [{k: v for k, v in r.items() if not k.startswith(("timing/", "memory/", "throughput/"))}
                for r in read_metrics(tr.run_dir)]
        return tr, rows, {k: v.detach().clone() for k, v in tr.model.named_parameters() if v.requires_grad}
    a, rows_a, w_a = run("all")
    b, rows_b, w_b = run([])
    assert records.list_records(a.run_dir) == [1, 2, 3] and records.list_records(b.run_dir) == []
    assert rows_a == rows_b
    assert all(torch.equal(w_a[k], w_b[k]) for k in w_a)


def test_a_record_holds_what_the_update_used(recorded):
    rec = records.read_record(recorded, 2)
    m, t = rec.manifest, rec.rank(0)
    assert m["world_size"] == 1 and len(m["opt_steps"]) == 2 and m["reason"] == "all"
    N, T = t["completion_ids"].shape
    assert t["advantages"].abs().sum() > 0  # the step trained
    # every row the update ran has the update's own logprobs where its mask is set, and only there
    ran = sorted({r for mb in m["micro"][0] for r in mb["rows"]})
    lp = t["trainer_logprobs"][0]  # (N, T) epoch 0
    mask = t["completion_mask"] > 0
    for r in range(N):
        got = ~torch.isnan(lp[r])
        if r in ran:
            assert got[mask[r]].all()
        else:
            assert not got.any()
    # the snapshot is the state after step 1: checkpoint step_1's trainable tensors, exactly
    snap = torch.load(rec.dir / "start" / "trainable.pt", weights_only=True)
    ck = torch.load(recorded / "training_state" / "step_1" / "trainable.pt", weights_only=True)
    assert snap.keys() == ck.keys() and all(torch.equal(snap[k], ck[k]) for k in snap)
    # the recorded figures are the metrics row's
    from rftlib.monitor.metrics import read_metrics
    row = [r for r in read_metrics(recorded) if r.get("step") == 2 and "loss" in r][0]
    assert max(float.fromhex(o["grad_norm"]) for o in m["opt_steps"]) == row["grad_norm_max"]


@pytest.mark.parametrize("step", [1, 3])
def test_replay_of_the_recorded_configuration_is_bitwise(recorded, step):
    res = replay(recorded, step, save=False)
    assert res.environment_differences == []
    assert res.faithful, res.first_mismatch
    opt = [c for c in res.checks if c["what"].startswith("optimizer step")]
    assert len(opt) == 4  # loss and grad norm of both optimizer steps
    assert all(c["recorded_hex"] == c["replayed_hex"] for c in res.checks if "recorded_hex" in c)
    assert all(c["replayed"] > 0 for c in opt if "grad_norm" in c["what"])  # not a vacuous 0 == 0


def test_replay_from_the_checkpoint_of_the_step_before(recorded, tmp_path):
    """No snapshot in the record: the checkpoint after step N-1 (weights, optimizer, LR schedule) is the start."""
    run = tmp_path / recorded.name
    shutil.copytree(recorded, run, symlinks=True)
    shutil.rmtree(run / "records" / "step_3" / "start")
    res = replay(run, 3, save=False)
    assert res.weights == "checkpoint training_state/step_2"
    assert res.faithful, res.first_mismatch


def test_a_wrong_checkpoint_is_caught_by_the_logprobs(recorded):
    with pytest.raises(ReplayMismatch, match=r"max \|dlogp\| = .*not the weights step 2 started from"):
        replay(recorded, 2, weights="ckpt:2", save=False)  # the state after step 2: one update too late


def test_no_weights_close_enough_is_refused(recorded, tmp_path):
    run = tmp_path / recorded.name
    shutil.copytree(recorded, run, symlinks=True)
    shutil.rmtree(run / "records" / "step_2" / "start")
    shutil.rmtree(run / "training_state" / "step_1")
    with pytest.raises(ReplayError, match=r"nearest checkpoint is step_2, 1 update\(s\) away"):
        replay(run, 2, save=False)


def test_counterfactuals_on_the_same_weights_and_rows(recorded):
    res = replay(recorded, 3, [{"policy_loss": "gspo"}, {"policy_loss": "cispo"}, {"eps_clip": 0.05}])
    assert res.faithful
    rows = {(r["opt_step"], r["config"]): r for r in res.table}
    # optimizer step 0 is on-policy (its old logprobs are its own forward's): every ratio 1, so each loss's
    # gradient is -A grad(logp) under the same aggregation, and GSPO, CISPO and a tighter clip all equal the
    # recorded gradient up to float32 rounding of the same sums in another order (relative ~1e-7 per element)
    rec0 = rows[(0, "recorded")]
    for name in ("policy_loss=gspo", "policy_loss=cispo", "eps_clip=0.05"):
        r = rows[(0, name)]
        assert r["cos_rec"] == pytest.approx(1.0, abs=1e-5)
        assert r["grad_norm"] == pytest.approx(rec0["grad_norm"], rel=1e-5)
    # optimizer step 1 runs on weights one step on: ratios move, the tighter clip clips more, and the gradients differ
    r1, tight = rows[(1, "recorded")], rows[(1, "eps_clip=0.05")]
    assert tight["ppo_clip_ratio"] > r1["ppo_clip_ratio"]
    # the clip sides come from the loss's own view (rftlib.algo.token_view): none on-policy, some one step off
    assert rec0["clip_low_frac"] == rec0["clip_high_frac"] == 0.0
    assert 0 < tight["clip_low_frac"] + tight["clip_high_frac"] <= 1
    assert rows[(1, "policy_loss=gspo")]["cos_rec"] < 0.999
    assert rec0["cos_rec"] == pytest.approx(1.0, abs=1e-12)  # g.g / (|g| |g|) in float64
    saved = json.loads(open(res.path).read())
    assert saved["verdict"].startswith("FAITHFUL") and len(saved["table"]) == 8


def test_settings_that_change_the_batch_are_refused(recorded):
    rec = records.read_record(recorded, 2)
    cfg = replay_config(rec.manifest, world_size=1)
    for field in ("temperature", "n_samples_per_prompt", "lr", "scale_rewards"):
        with pytest.raises(ReplayError, match=field):
            counterfactual_config(cfg, {field: 1})


def test_record_cap_drops_the_oldest_and_skips_a_record_alone_over_it(tiny_cfg, task_with):
    tr = _attempt(tiny_cfg, task_with, record_batches="all", record_on_spike=False, name="cap")
    sizes = {r["step"]: r["bytes"] for r in records.read_index(tr.run_dir)}
    assert set(sizes) == {1, 2, 3}
    cap = sizes[2] + sizes[3] + 1  # room for two records: step 1 goes when step 3 comes
    tr2 = _attempt(tiny_cfg, task_with, record_batches="all", record_on_spike=False, name="cap2",
                   record_max_bytes=cap)
    assert records.list_records(tr2.run_dir) == [2, 3]
    idx = {r["step"]: r for r in records.read_index(tr2.run_dir)}
    assert not idx[1]["kept"] and "oldest first" in idx[1]["why"]
    tr3 = _attempt(tiny_cfg, task_with, record_batches=[2], record_on_spike=False, name="cap3", record_max_bytes=1000)
    assert records.list_records(tr3.run_dir) == []
    assert "alone exceed record_max_bytes=1000" in records.read_index(tr3.run_dir)[0]["why"]
    assert not list((tr3.run_dir / "records").glob(".tmp_step_*"))


def test_a_spike_is_recorded_and_the_spike_log_links_it(tiny_cfg, task_with):
    tr = _attempt(tiny_cfg, task_with, record_batches=[], spike_grad_norm=0.0, name="spike")
    assert records.list_records(tr.run_dir) == []  # off is off, spikes included
    tr = _attempt(tiny_cfg, task_with, record_batches=[1], spike_grad_norm=0.0, name="spike2")
    assert records.list_records(tr.run_dir) == [1, 2, 3]  # step 1 listed; 2 and 3 spiked (every norm > 0)
    spikes = [json.loads(x) for x in (tr.run_dir / "logs" / "spike_log.jsonl").read_text().splitlines()]
    assert [s["record"] for s in spikes] == ["records/step_1", "records/step_2", "records/step_3"]
    assert records.read_record(tr.run_dir, 2).manifest["reason"] == "spike"
    assert replay(tr.run_dir, 2, save=False).faithful  # the per-step snapshot made the spike replayable


def test_a_write_killed_midway_leaves_no_record(tiny_cfg, task_with, monkeypatch):
    import os
    real = os.rename

    def dying(a, b):
        if "records" in str(b):
            raise KeyboardInterrupt("killed mid-write")
        return real(a, b)
    cfg = tiny_cfg(**{**BASE, "record_batches": [1], "record_on_spike": False, "num_steps": 1, "name": "kill"})
    tr = Trainer(cfg, progress=False, task=task_with(cfg, isdigit_share))
    monkeypatch.setattr(os, "rename", dying)
    with pytest.raises(KeyboardInterrupt):
        tr.step()
    monkeypatch.setattr(os, "rename", real)
    tr.close()
    assert records.list_records(tr.run_dir) == []
    left = list((tr.run_dir / "records").glob(".tmp_step_*"))
    assert left  # what a kill leaves ...
    records.clean_temporaries(tr.run_dir)  # ... this process's own temporary goes on the next write
    assert not list((tr.run_dir / "records").glob(".tmp_step_*"))


def test_resume_drops_the_records_of_the_steps_it_runs_again(recorded, tmp_path, task_with):
    run = tmp_path / recorded.name
    shutil.copytree(recorded, run, symlinks=True)
    (run / "training_state" / "step_latest").unlink()
    (run / "training_state" / "step_latest").symlink_to("step_1")
    from rftlib.train.loop import resume_config
    cfg = resume_config(run)
    tr = Trainer(cfg, run, resume=True, progress=False, task=task_with(cfg, isdigit_share))
    assert records.list_records(run) == [1]
    tr.close()


def test_a_start_state_over_the_cap_is_not_copied_and_replays_from_the_checkpoint(tiny_cfg, task_with):
    """A trainable state larger than record_max_bytes (a full fine-tune: seed 000's 1.5B on an H200 wrote 6.2 GB at
    its eval step, then dropped the record for being over the cap) is not snapshotted: the record keeps the batch,
    and the replay starts from the checkpoint of the step before, bit for bit."""
    full = _attempt(tiny_cfg, task_with, record_batches=[2], record_on_spike=False, name="fits")
    state = full.recorder.state_bytes  # the trainable bytes the snapshot copies
    assert records.list_records(full.run_dir) == [2]
    rec_bytes = records.read_index(full.run_dir)[0]["bytes"]
    batch_bytes = rec_bytes - sum(p.stat().st_size for p in (full.run_dir / "records/step_2/start").rglob("*"))
    assert batch_bytes < state - 1 < rec_bytes  # a cap between the batch alone and the record with its snapshot
    tr = _attempt(tiny_cfg, task_with, record_batches=[2], record_on_spike=False, name="over",
                  record_max_bytes=state - 1)
    assert records.list_records(tr.run_dir) == [2]
    row = records.read_index(tr.run_dir)[0]
    assert row["kept"] and row["weights"] == "none"
    res = replay(tr.run_dir, 2, save=False)
    assert res.weights == "checkpoint training_state/step_1"
    assert res.faithful, res.first_mismatch
