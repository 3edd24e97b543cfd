"""Recorded batches and their replay (issue 33): recording changes nothing, a record holds what the update used,
and replaying the recorded configuration on the recorded weights reproduces every recorded logprob, loss and grad
norm bit for bit (the proof that the replay is the update, and a check on the trainer itself); a wrong checkpoint
is caught by the logprobs, and a replay with no weights close enough is refused.

The tiny model on a reward that varies within groups (non-zero advantages: the steps train), float32, autocast off
(the equality is claimed for the recorded environment; these tests replay in the process that recorded)."""

import json
import math
import shutil
from pathlib import Path
from dataclasses import replace

import pytest
import torch

from rftlib.monitor import records
from rftlib.train.build import build_task
from rftlib.train.loop import Trainer
from rftlib.train.replay import ReplayError, ReplayMismatch, counterfactual_config, label, replay, replay_config
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
    # two optimizer steps per rollout: the second needs AdamW's moments, which a spike record now keeps too
    tr = _attempt(tiny_cfg, task_with, record_batches=[1], spike_grad_norm=0.0, name="spike2", train_batch_size=2)
    assert records.list_records(tr.run_dir) == [1, 2, 3]  # step 1 listed; 2 and 3 spiked (every norm > 0)
    spikes = [json.loads(x) for x in (tr.run_dir / "logs" / "spike_log.jsonl").read_text().splitlines()]
    assert [s["record"] for s in spikes] == ["records/step_1", "records/step_2", "records/step_3"]
    rec = records.read_record(tr.run_dir, 2)
    assert rec.manifest["reason"] == "spike" and len(rec.manifest["opt_steps"]) == 2
    assert (rec.dir / "start" / "optimizer.pt").exists()
    res = replay(tr.run_dir, 2, save=False)  # the per-step snapshot made the spike replayable
    assert res.weights.startswith("record snapshot") and res.faithful, res.first_mismatch
    assert not list((tr.run_dir / "records").glob(".tmp_step_*"))


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
    its eval step, then dropped the record for being over the cap) is not snapshotted, a spike's neither: the record
    keeps the batch, and the replay starts from the checkpoint of the step before, bit for bit."""
    full = _attempt(tiny_cfg, task_with, record_batches=[2], record_on_spike=False, name="fits")
    state = full.recorder.state_bytes  # the trainable bytes the snapshot copies
    assert records.list_records(full.run_dir) == [2]
    rec_bytes = records.read_index(full.run_dir)[0]["bytes"]
    batch_bytes = rec_bytes - sum(p.stat().st_size for p in (full.run_dir / "records/step_2/start").rglob("*"))
    assert batch_bytes < state - 1 < rec_bytes  # a cap between the batch alone and the record with its snapshot
    # every step spikes (spike_grad_norm 0): steps 1 and 3 are spike records, and with a start state over the cap
    # they keep the batch alone, as the scheduled step 2 does (before, a spike record was dropped whole)
    tr = _attempt(tiny_cfg, task_with, record_batches=[2], spike_grad_norm=0.0, name="over",
                  record_max_bytes=state - 1)
    idx = {r["step"]: r for r in records.read_index(tr.run_dir)}
    assert idx[2]["weights"] == idx[3]["weights"] == "none" and idx[3]["reason"] == "spike"
    assert idx[3]["kept"]  # the newest record is kept unless it alone exceeds the cap
    res = replay(tr.run_dir, 3, save=False)
    assert res.weights == "checkpoint training_state/step_2"
    assert res.faithful, res.first_mismatch
    # without that checkpoint the refusal says why the record holds no weights and what would keep them (before,
    # it advised naming the step in record_batches, which changes nothing here)
    shutil.rmtree(tr.run_dir / "training_state" / "step_2")
    with pytest.raises(ReplayError, match="over record_max_bytes .*a larger record_max_bytes keeps it") as e:
        replay(tr.run_dir, 3, save=False)
    assert "record_batches" not in str(e.value)


# ---- another environment: the control (issue 43) ------------------------------------------------------------
OTHER_THREADS = 999  # a thread count no process of the suite runs with


@pytest.fixture
def other_env(recorded, tmp_path):
    """The recorded attempt as another environment recorded it: a copy whose records say the ranks ran
    OTHER_THREADS intra-op threads. The replay compares the manifest's environment with its own, so this is a
    differing environment whatever the suite left this process at (setting torch's thread count here failed in
    the whole suite twice: something set it back before the replay looked)."""
    run = tmp_path / recorded.name
    shutil.copytree(recorded, run, symlinks=True)
    for m in (run / "records").glob("step_*/manifest.json"):
        doc = json.loads(m.read_text())
        doc["env"]["threads_per_rank"] = [OTHER_THREADS] * len(doc["env"]["threads_per_rank"])
        m.write_text(json.dumps(doc, indent=1))
    return run


def test_in_another_environment_the_control_accepts_the_right_weights(other_env):
    """Another thread count: the recorded config on the snapshot runs first as the control; its logprobs are within
    this precision's measured noise of the record, and every counterfactual row is its difference from the control."""
    res = replay(other_env, 3, [{"eps_clip": 0.05}], save=False)
    assert [d for d in res.environment_differences if d.startswith(f"threads on rank 0: recorded {OTHER_THREADS}")]
    assert res.faithful is None and res.verdict.startswith("CONTROLLED")
    c = res.control
    # float32 against float64 on the tiny model: rounding of O(10) logits, 2^-24 relative per operation, over
    # some tens of operations: far below 1e-4, and not 0 (the measurement ran)
    assert 0 < c["noise"] < 1e-4 and c["threshold"] == 4 * c["noise"]
    assert c["max_abs_dlogp"] <= c["threshold"]
    rows = {(r["opt_step"], r["config"]): r for r in res.table}
    assert {cfg for _, cfg in rows} == {"control", "eps_clip=0.05"}
    replayed = {ch["what"]: ch for ch in res.checks}
    for k in (0, 1):
        ctl, cf = rows[(k, "control")], rows[(k, "eps_clip=0.05")]
        for f in ("loss", "grad_norm", "clip_low_frac", "clip_high_frac"):
            assert cf[f"d_{f}"] == cf[f] - ctl[f]
        # the environment's noise: the control's figures minus the record's
        o = c["opt_steps"][k]
        for f in ("loss", "grad_norm"):
            ch = replayed[f"optimizer step {k}: {f}"]
            assert o[f"d_{f}"] == ch["replayed"] - ch["recorded"]
    assert rows[(1, "eps_clip=0.05")]["d_clip_low_frac"] + rows[(1, "eps_clip=0.05")]["d_clip_high_frac"] > 0


def test_in_another_environment_a_wrong_checkpoint_is_refused(other_env):
    """The state after step 2 offered as step 2's start: the control's logprobs are an update away, far over
    the noise, so the replay refuses it here too (before, another environment checked nothing)."""
    with pytest.raises(ReplayMismatch, match=r"max \|dlogp\| = .* over .*not the weights step 2 started from"):
        replay(other_env, 2, weights="ckpt:2", save=False)


# ---- what a replay shows, and what it refuses (issue 43, defects 2-8) ----------------------------------------
def _copy(recorded, tmp_path):
    run = tmp_path / recorded.name
    shutil.copytree(recorded, run, symlinks=True)
    return run


def test_a_snapshot_without_the_optimizer_replays_from_the_checkpoint_before(recorded, tmp_path):
    """A record of several optimizer steps whose snapshot holds the trainable tensors alone (a spike record written
    before issue 43): optimizer step 1 needs AdamW's moments, so auto takes the complete checkpoint of step N-1.
    Before, auto took the snapshot and optimizer step 1 came out a false NOT REPRODUCED."""
    run = _copy(recorded, tmp_path)
    for f in ("optimizer.pt", "scheduler.pt"):
        (run / "records" / "step_2" / "start" / f).unlink()
    res = replay(run, 2, save=False)
    assert res.weights == "checkpoint training_state/step_1"
    assert res.faithful, res.first_mismatch
    shutil.rmtree(run / "training_state" / "step_1")
    with pytest.raises(ReplayError, match="trainable tensors alone .* no checkpoint step_1"):
        replay(run, 2, save=False)


def _const_reward(text, ex, truncated):
    return 1.0, {"correctness": 1.0}


def test_a_step_that_ran_no_micro_batch_is_not_called_faithful(tiny_cfg, task_with):
    """Every advantage 0: the update ran no forward, so nothing depends on the weights; a replay from the wrong
    checkpoint (the state after the step) was FAITHFUL before."""
    cfg = tiny_cfg(**{**BASE, "num_steps": 1, "record_batches": [1], "record_on_spike": False, "name": "flat"})
    tr = Trainer(cfg, progress=False, task=task_with(cfg, _const_reward))
    tr.train()
    tr.close()
    res = replay(tr.run_dir, 1, weights="ckpt:1", save=False)
    assert res.faithful is None
    assert res.verdict.startswith("NOT CHECKED (no micro-batch ran")


def test_a_one_process_deepspeed_record_replays_under_deepspeed(recorded):
    """replay_config ran every one-process record under single: a DeepSpeed record's engine step was replaced and
    its counterfactual guard bypassed."""
    from rftlib.train.replay import replay_rank
    rec = records.read_record(recorded, 2)
    ds = replace(rec, manifest={**rec.manifest, "backend": "deepspeed",
                                "config": {**rec.manifest["config"], "backend": "deepspeed"}})
    assert replay_config(ds.manifest, world_size=1).backend == "deepspeed"
    assert replay_config(rec.manifest, world_size=1).backend == "single"
    with pytest.raises(ReplayError, match="ran under deepspeed, which partitions them"):
        replay_rank(recorded, 2, counterfactuals=[{"eps_clip": 0.1}], rec=ds)


def test_a_crash_of_the_replay_ranks_is_not_a_refusal(recorded, monkeypatch, capsys):
    """torchrun's ranks stop without a result: ReplayCrash with the whole output in a log (exit 1 from the CLI);
    before, the last 30 lines only, as a refusal (exit 2). A refusal on the ranks stays a refusal."""
    import subprocess
    from argparse import Namespace

    from rftlib.cli import replay as cli
    from rftlib.train import replay as R
    lines = [f"rank output line {i}" for i in range(60)]
    monkeypatch.setattr(R.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(
        a[0], 1, stdout="\n".join(lines), stderr=""))
    with pytest.raises(R.ReplayCrash, match="exit 1") as e:
        R._replay_ranks(recorded, 2, 2, weights="auto", counterfactuals=[])
    log = str(e.value).split("whole output: ")[1].split("\n")[0]
    assert open(log).read().splitlines() == lines  # all 60, not the last 30
    monkeypatch.setattr(cli, "replay_and_refresh",
                        lambda *a, **k: R._replay_ranks(recorded, 2, 2, weights="auto", counterfactuals=[]))
    args = Namespace(run_dir=str(recorded), step=2, set=[], vary=[], weights="auto", nproc=2, json=False,
                     rank_worker=None, cf_json=[])
    assert cli.run(args) == 1

    def refused(cmd, **k):
        out = cmd[cmd.index("--rank-worker") + 1]
        open(out, "w").write(json.dumps({"refused": "no such checkpoint", "mismatch": False}))
        return subprocess.CompletedProcess(cmd, 0, stdout="", stderr="")
    monkeypatch.setattr(R.subprocess, "run", refused)
    with pytest.raises(ReplayError, match="no such checkpoint"):
        R._replay_ranks(recorded, 2, 2, weights="auto", counterfactuals=[])


def test_settings_whose_effect_a_replay_cannot_show_are_refused_and_typos_get_a_near_match(recorded):
    rec = records.read_record(recorded, 2)
    cfg = replay_config(rec.manifest, world_size=1)
    with pytest.raises(ReplayError, match="before the optimizer's clip"):
        counterfactual_config(cfg, {"max_grad_norm": 0.1})
    kl_reward = replace(cfg, beta=0.01, kl_in_reward=True)
    for field in ("beta", "kl_estimator"):
        with pytest.raises(ReplayError, match="kl_in_reward"):
            counterfactual_config(kl_reward, {field: 0.05 if field == "beta" else "k1"})
    with pytest.raises(ReplayError, match=r"'eps_clipp': no such setting \(did you mean eps_clip\?\)"):
        counterfactual_config(cfg, {"eps_clipp": 0.1})


def test_kl_and_entropy_counterfactuals_are_the_trainers_own_loss(tiny_cfg, task_with):
    """A counterfactual with a KL term on a beta-0 record (no reference logprobs recorded) or an entropy bonus
    (a gradient on zero-advantage rows, which the recorded plan left out) gives the loss the trainer computes on
    the same weights and batch: its update, run here with that config (the same micro-batches, forwards and sums,
    so the same float). Half the prompts score a constant (toy_rewards.half_constant_reward): zero advantages."""
    from rftlib.train.replay import advantaged, build_trainer, close_trainer, load_weights
    from toy_rewards import half_constant_reward
    cfg = tiny_cfg(**{**BASE, "num_steps": 1, "record_batches": [1], "record_on_spike": False, "name": "half"})
    tr0 = Trainer(cfg, progress=False, task=task_with(cfg, half_constant_reward))
    tr0.train()
    tr0.close()
    rec = records.read_record(tr0.run_dir, 1)
    m, t = rec.manifest, rec.rank(0)
    ran = {r for mb in m["micro"][0] for r in mb["rows"]}
    assert set(m["opt_rows"][0][0]) - ran, "the batch needs a zero-advantage row the recorded plan skipped"
    assert "ref_logprobs" not in t
    cfs = [{"entropy_coef": 0.05}, {"beta": 0.1}]
    res = replay(tr0.run_dir, 1, cfs, save=False)
    rows = {(r["opt_step"], r["config"]): r for r in res.table}
    for o in cfs:
        tr = build_trainer(counterfactual_config(replay_config(m, world_size=1), o), m)
        try:
            load_weights(tr, rec.dir / "start")
            batch = advantaged(rec, 0, tr.dist.device)
            batch.ref_logprobs, _ = tr.reference_and_old_logprobs(batch.rollout)  # as the advantages phase does
            tr.step_num = 0
            upd = tr.update(batch)
        finally:
            close_trainer(tr)
        assert rows[(0, label(o))]["loss"] == upd.loss[0], o


def test_a_dr_grpo_record_replays_gspo_under_its_own_aggregation(recorded, tmp_path):
    """GSPO is defined under seq-mean-token-mean only: on a Dr-GRPO attempt (seq-mean-token-sum-norm) README's
    --vary policy_loss=gspo,cispo stopped the whole replay; now GSPO's rows run under its own aggregation, said so."""
    run = _copy(recorded, tmp_path)
    mp = run / "records" / "step_2" / "manifest.json"
    m = json.loads(mp.read_text())
    m["config"]["loss_agg_mode"] = "seq-mean-token-sum-norm"
    mp.write_text(json.dumps(m))
    res = replay(run, 2, [{"policy_loss": "gspo"}, {"policy_loss": "cispo"}], save=False)
    assert {r["config"] for r in res.table} == {"recorded", "policy_loss=gspo,loss_agg_mode=auto",
                                                "policy_loss=cispo"}
    assert any("policy_loss=gspo is not defined under this attempt's loss_agg_mode" in n for n in res.notes)


def test_a_deleted_index_is_rebuilt_from_the_records(recorded, tmp_path):
    run = _copy(recorded, tmp_path)
    idx = run / "records" / "index.json"
    idx.write_text("{not json")
    with pytest.raises(ValueError, match="delete it: the next read rebuilds it"):
        records.read_index(run)
    idx.unlink()
    rows = records.read_index(run)
    assert [(r["step"], r["kept"], r["weights"]) for r in rows] == [(1, True, "snapshot"), (2, True, "snapshot"),
                                                                    (3, True, "snapshot")]
    assert idx.exists()


def test_records_and_inspector_pages_are_readable_by_others(recorded, tmp_path):
    """mkstemp and safetensors write 0600: a shared reports directory's links broke for everyone but the writer."""
    import os

    from rftlib.report.record_view import build_view
    from rftlib.report.inspect import write_page
    mask = os.umask(0)
    os.umask(mask)
    want = 0o666 & ~mask
    assert (records.record_dir(recorded, 2) / "batch.safetensors").stat().st_mode & 0o777 == want
    page = write_page(build_view(recorded, 2), tmp_path / "step-2.html")
    assert page.stat().st_mode & 0o777 == want



def test_replay_and_eval_take_an_attempt_by_its_name_under_the_runs_root(recorded, tmp_path, monkeypatch, capsys):
    """`rft replay <name>` and `rft eval <name>` look the name up under the runs root ($RFTLIB_RUNS), from any
    working directory; a name that is no attempt is said so, with the nearest names, and leaves nothing behind
    (eval made <project>/<name>/logs/, then failed with a bare Errno 2)."""
    from rftlib.attempts import project_root
    from rftlib.cli import main
    run = _copy(recorded, tmp_path / "runs")  # the CLI writes its replay into the record
    monkeypatch.setenv("RFTLIB_RUNS", str(run.parent))
    monkeypatch.chdir(tmp_path)
    typo = recorded.name + "x"
    try:
        assert main(["eval", typo]) == 2
        err = capsys.readouterr().err
        assert "no attempt there" in err and f"nearest: {recorded.name}" in err
        assert not (project_root() / typo).exists()
    finally:
        shutil.rmtree(project_root() / typo, ignore_errors=True)
    assert main(["replay", recorded.name, "--step", "1"]) == 0
    assert "FAITHFUL" in capsys.readouterr().out


def test_a_relative_init_adapter_is_resolved_once_where_the_attempt_starts(tiny_cfg, tmp_path, monkeypatch):
    """config.yaml (and a record's config) named the adapter as typed: a resume or replay from another working
    directory loaded another one, or none."""
    from rftlib.attempts import project_root
    from rftlib.train.build import resolve_init_adapter
    (tmp_path / "sft" / "adapter").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert resolve_init_adapter(tiny_cfg(init_adapter="sft/adapter")).init_adapter == str(tmp_path / "sft/adapter")
    monkeypatch.chdir(tmp_path / "sft")  # a notebook kernel's directory: the project root's path is meant
    assert resolve_init_adapter(tiny_cfg(init_adapter="params")).init_adapter == str(project_root() / "params")


def test_a_replay_refreshes_the_inspector_pages_and_the_report(recorded, tmp_path, monkeypatch):
    """The report's records table and the inspector show a step's latest replay: they stayed stale until
    `rft report` ran again. The report itself is re-executed (papermill): counted here, not run."""
    from rftlib.report import publish
    from rftlib.report.replay_views import replay_and_refresh
    run = _copy(recorded, tmp_path / "runs")
    reports = tmp_path / "reports"
    monkeypatch.setenv("RFTLIB_REPORTS", str(reports))
    page = reports / run.name / "step-2.html"
    page.parent.mkdir(parents=True)
    page.write_text("stale")
    (reports / f"{run.name}.html").write_text("stale")
    calls = []
    monkeypatch.setattr(publish, "write_report", lambda *a, **k: calls.append(a) or reports / f"{run.name}.html")
    replay_and_refresh(run, 2, [{"eps_clip": 0.05}])  # what rft replay and replay.ipynb run
    assert "eps_clip=0.05" in page.read_text() and "FAITHFUL" in page.read_text()
    assert calls and Path(calls[0][0]) == run
