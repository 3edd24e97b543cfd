"""Replay of a step recorded on 2 DDP ranks (issue 33): ``rft replay`` runs the recorded update again on 2 ranks
under torchrun, each rank on its own recorded rows, and every rank's micro-batch logprobs and losses and the
global loss and grad norm equal the recorded ones bit for bit; a wrong checkpoint is caught on the ranks.

tests/dist_worker.py trains the tiny model on 2 ranks (gloo, one thread each) on a reward it can learn, with
every step recorded; the replay runs in the same environment (torchrun ranks, one thread each)."""

import subprocess
import sys

import pytest

from rftlib.monitor import records
from rftlib.train.replay import ReplayMismatch, replay
from test_train_distributed import run_worker


@pytest.fixture(scope="module")
def ddp_recorded(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp-rec")
    run_worker(out, "--backend", "ddp", "--steps", "2", "--set", "record_batches=all",
               "--set", "train_batch_size=2", nproc=2)
    return out / "runs" / "attempt-01-dist"


def test_a_two_rank_record_holds_each_ranks_rows(ddp_recorded):
    rec = records.read_record(ddp_recorded, 2)
    assert rec.world_size == 2 and len(rec.manifest["micro"]) == 2
    r0, r1 = rec.rank(0), rec.rank(1)
    assert r0["completion_ids"].shape[0] == r1["completion_ids"].shape[0] == 8  # 16 rows over 2 ranks
    assert rec.manifest["env"]["threads_per_rank"] == [1, 1]
    assert len(rec.manifest["opt_steps"]) == 2  # train_batch_size 2 of 4 prompts: two optimizer steps


@pytest.fixture(scope="module")
def step2_replayed(ddp_recorded):
    """Step 2 replayed on 2 ranks with one counterfactual (eps_clip 0.001) beside the recorded config: one torchrun
    job that the bitwise check of step 2 and the table's clip fractions both read (issue 41: one start saved)."""
    return replay(ddp_recorded, 2, [{"eps_clip": 0.001}], save=False)


@pytest.mark.parametrize("step", [1, 2])
def test_two_rank_replay_is_bitwise(ddp_recorded, step2_replayed, step):
    res = replay(ddp_recorded, step, save=False) if step == 1 else step2_replayed
    assert res.environment_differences == []
    assert res.faithful, res.first_mismatch
    ranks = {c["what"].split()[1] for c in res.checks if c["what"].startswith("rank")}
    assert ranks == {"0", "1"}  # both ranks' micro-batches were compared
    norms = [c for c in res.checks if c["what"].endswith("grad_norm")]
    assert len(norms) == 2 and all(c["replayed"] > 0 and c["recorded_hex"] == c["replayed_hex"] for c in norms)


def test_two_rank_replay_of_a_wrong_checkpoint_is_caught(ddp_recorded):
    with pytest.raises(ReplayMismatch, match="not the weights step 2 started from|max \\|dlogp\\|"):
        replay(ddp_recorded, 2, weights="ckpt:2", save=False)  # the final checkpoint: after step 2's update


def test_rft_replay_cli_on_two_ranks(ddp_recorded):
    p = subprocess.run([sys.executable, "-m", "rftlib.cli", "replay", str(ddp_recorded), "--step", "2",
                        "--vary", "policy_loss=gspo"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "FAITHFUL" in p.stdout and "policy_loss=gspo" in p.stdout


def _clip_counts(rec, rank: int, k: int, kw) -> tuple[float, float, float]:
    """(low, high, tokens) of rank ``rank``'s rows of optimizer step ``k``, worked out from the record alone: the
    recorded trainer logprobs (the faithful replay's, bit for bit), old logprobs, advantages and mask through the
    loss's own token view."""
    import torch

    from rftlib.algo.token_view import token_view

    t = rec.rank(rank)
    low = high = tokens = 0.0
    for p in rec.manifest["micro"][rank]:
        if p["k"] != k:
            continue
        ix = torch.tensor(p["rows"], dtype=torch.long)
        lp = t["trainer_logprobs"][p["epoch"], ix].float()  # (n, T)
        old = t["old_logprobs"][ix].float() if "old_logprobs" in t else lp
        mask = t["loss_mask"][ix].float()
        v = token_view(lp, old, t["advantages"][ix].float(), mask, loss_kwargs=kw)
        valid = mask > 0
        low += float((v["clip"][valid] < 0).sum())
        high += float((v["clip"][valid] > 0).sum())
        tokens += float(valid.sum())
    return low, high, tokens


def test_two_rank_table_clip_fractions_count_both_ranks_tokens(ddp_recorded, step2_replayed):
    """The replay table's clip fractions (recorded config and counterfactual) are over both ranks' tokens, as worked
    out from the record; rank 0's tokens alone give other fractions here, so a rank-0-only table fails this."""
    from rftlib.train import steps
    from rftlib.train.replay import counterfactual_config, replay_config

    res = step2_replayed
    assert res.faithful, res.first_mismatch
    rec = records.read_record(ddp_recorded, 2)
    cfg = replay_config(rec.manifest, world_size=2)
    kws = {"recorded": steps.loss_kwargs(cfg),
           "eps_clip=0.001": steps.loss_kwargs(counterfactual_config(cfg, {"eps_clip": 0.001}))}
    rank0_differs = False
    assert {r["config"] for r in res.table} == set(kws) and len(res.table) == 4  # 2 optimizer steps x 2 configs
    for row in res.table:
        per_rank = [_clip_counts(rec, r, row["opt_step"], kws[row["config"]]) for r in (0, 1)]
        low, high, tokens = (sum(c[i] for c in per_rank) for i in range(3))
        assert row["clip_low_frac"] == pytest.approx(low / tokens, rel=1e-12, abs=0)
        assert row["clip_high_frac"] == pytest.approx(high / tokens, rel=1e-12, abs=0)
        l0, h0, t0 = per_rank[0]
        rank0_differs |= (l0 / t0, h0 / t0) != (low / tokens, high / tokens)
    assert rank0_differs  # the check can tell a rank-0-only table from the whole one


def test_a_zero3_record_replays_faithful_on_two_ranks(tmp_path):
    """ZeRO-3 on 2 CPU ranks (issue 43): the record's snapshot holds the whole trainable tensors, and the replay
    loads them through the backend, gathered (a whole tensor copy_'d into a partitioned parameter crashed every
    ZeRO-3 replay); the update then equals the recorded one bit for bit."""
    pytest.importorskip("deepspeed", reason="scripts/setup.sh installs deepspeed (CPU ZeRO-3 tests)")
    from test_train_distributed import ZERO3
    run_worker(tmp_path, "--backend", "deepspeed", "--set", f"deepspeed_config={ZERO3}", "--steps", "2",
               "--set", "record_batches=[2]", nproc=2)
    run = tmp_path / "runs" / "attempt-01-dist"
    assert records.read_record(run, 2).manifest["backend"] == "deepspeed"
    res = replay(run, 2, save=False)
    assert res.weights.startswith("record snapshot") and res.environment_differences == []
    assert res.faithful, res.first_mismatch
    # the table's gradient is DeepSpeed's, gathered from its partitions (p.grad is empty under ZeRO: the row read
    # 0.0 and cos nan before): its norm is the trainer's own grad_norm of the step, up to float32 summation order
    # (DeepSpeed's norm over partitions in float32 vs the gathered tensors' in float64: ~sqrt(n) eps32 relative)
    rec = {ch["what"]: ch["recorded"] for ch in res.checks}
    for row in (r for r in res.table if r["config"] == "recorded"):
        want = rec[f"optimizer step {row['opt_step']}: grad_norm"]
        assert want > 0 and row["grad_norm"] == pytest.approx(want, rel=1e-3), (row, want)
