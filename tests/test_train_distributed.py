"""Data parallelism on 2 CPU ranks (gloo): torch DDP and DeepSpeed ZeRO-3 against one process.

Each run is tests/dist_worker.py: the tiny model on a reward it can learn (so advantages are non-zero
and the weights move), rollouts seeded per prompt (so sharding the prompts over ranks does not
change what is sampled). With the same global batch, one process and 2 ranks must then produce the
same losses, grad norms and weights, up to float32 summation order: the ranks' gradients are summed
by an all-reduce instead of by autograd in one order, which moves results by ~1e-7 relative; we
allow 1e-5 (relative on loss/grad norm, absolute on weights of magnitude ~1e-2).

These start real torchrun jobs (seconds each; DeepSpeed's first start also JIT-compiles its shm
op once, cached under ~/.cache/torch_extensions by scripts/setup.sh).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rftlib.train.dist import without_group_env

REPO = Path(__file__).resolve().parents[1]
WORKER = REPO / "tests" / "dist_worker.py"
ZERO3 = REPO / "tests" / "data" / "zero3_tiny.json"
pytest.importorskip("deepspeed", reason="scripts/setup.sh installs deepspeed (CPU ZeRO-3 tests)")


def run_worker(out: Path, *args: str, nproc: int = 1, timeout: int = 900, load: bool = True) -> dict | None:
    env = without_group_env({**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"})
    if nproc == 1:
        cmd = [sys.executable, str(WORKER), str(out), *args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               str(WORKER), str(out), *args]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-6000:]}")
    return torch.load(out / "result.pt", weights_only=False) if load else None


def run_plan(out: Path, backend: str, plan: dict[str, tuple[str, ...]], *, nproc: int = 1) -> dict[str, dict]:
    """The runs of ``plan`` (name -> worker arguments) one after another in one process or torchrun job
    (tests/dist_worker.py --plan): each as it would be alone, without a start-up of its own."""
    import json

    out.mkdir(parents=True, exist_ok=True)
    (out / "plan.json").write_text(json.dumps({name: list(args) for name, args in plan.items()}))
    run_worker(out, "--backend", backend, "--plan", str(out / "plan.json"), nproc=nproc, load=False)
    return {name: torch.load(out / name / "result.pt", weights_only=False) for name in plan}


def _train_rows(res):
    return [r for r in res["rows"] if "loss" in r]


def assert_same_run(a: dict, b: dict, *, rel: float = 1e-5, atol: float = 1e-5) -> None:
    ra, rb = _train_rows(a), _train_rows(b)
    assert len(ra) == len(rb) == 4
    for x, y in zip(ra, rb):
        assert x["reward_mean"] == y["reward_mean"]  # the same completions were sampled
        assert x["advantage_std"] > 0  # there was something to learn
        for k in ("loss", "policy_loss", "grad_norm", "entropy_mean", "importance_ess"):
            assert math.isclose(x[k], y[k], rel_tol=rel, abs_tol=1e-9), (x["step"], k, x[k], y[k])
    # the held-out eval, sharded over ranks (5 problems: one rank's shard is padded), gives the same numbers
    ea, eb = [r for r in a["rows"] if "eval/heldout/mean_length" in r], [r for r in b["rows"] if "eval/heldout/mean_length" in r]
    assert len(ea) == len(eb) == 2
    for x, y in zip(ea, eb):
        assert x["eval/heldout/mean_length"] == y["eval/heldout/mean_length"]
        assert x["eval/heldout/greedy_pass@1"] == y["eval/heldout/greedy_pass@1"]
    assert a["weights"].keys() == b["weights"].keys()
    for k in a["weights"]:
        assert torch.allclose(a["weights"][k], b["weights"][k], atol=atol, rtol=0), k
    moved = [k for k in a["weights"] if "lora_B" in k and a["weights"][k].abs().max() > 0]
    assert moved, "LoRA B starts at 0: training must have moved it"


# The runs this module compares, by name: each made once in one process (single) and once on 2 ranks (ddp), all of
# a backend's runs in one process or torchrun job (run_plan; issue 41: four starts of each saved). "default" first.
BATCH_STATISTICS = {
    "reinforce_pp-token_mean": ("advantage_estimator=reinforce_pp_baseline", "loss_agg_mode=token-mean"),
    "batch_scale-seq_sum_norm": ("scale_rewards=batch", "loss_agg_mode=seq-mean-token-sum-norm"),
}


def _sets(*sets: str) -> tuple[str, ...]:
    return tuple(a for s in sets for a in ("--set", s))


def _wide() -> tuple[str, ...]:  # test_ddp_and_zero3_at_the_default_persistence_threshold_match_one_process's model
    from rftlib.models.tiny import tiny_model_dir

    return ("--model", str(tiny_model_dir(384)), "--steps", "2")


@pytest.fixture(scope="module")
def singles(tmp_path_factory):
    plan = {"default": (), **{k: _sets(*v) for k, v in BATCH_STATISTICS.items()},
            "skip_rows": _sets("skip_zero_advantage_rows=true"), "wide": _wide()}
    return run_plan(tmp_path_factory.mktemp("single"), "single", plan)


@pytest.fixture(scope="module")
def ddps(tmp_path_factory):
    plan = {"default": (), **{k: _sets(*v) for k, v in BATCH_STATISTICS.items()}, "wide": _wide(),
            "train_batch_size_1": ("--steps", "2", *_sets("train_batch_size=1"))}
    return run_plan(tmp_path_factory.mktemp("ddp"), "ddp", plan, nproc=2)


@pytest.fixture(scope="module")
def single(singles):
    return singles["default"]


@pytest.fixture(scope="module")
def ddp(ddps):
    return ddps["default"]


def test_ddp_two_ranks_match_one_process(single, ddp):
    assert_same_run(single, ddp)


@pytest.mark.parametrize("name", list(BATCH_STATISTICS))
def test_batch_statistics_and_aggregations_match_one_process_on_two_ranks(singles, ddps, name):
    """Advantages that use batch statistics (REINFORCE++'s batch mean/std, GRPO with
    scale_rewards: batch) are computed over the global batch, so 2 ranks equal one process; and the
    token-mean and seq-mean-token-sum-norm aggregations normalise by global totals as the default does.
    Per-rank statistics (the old code) give other advantages, so other losses and weights."""
    import yaml

    from rftlib.eval_checkpoints import attempt_config

    for res in (singles[name], ddps[name]):  # the settings reached both runs of the plans
        cfg = attempt_config(Path(res["run_dir"]))
        assert all(getattr(cfg, k) == yaml.safe_load(v) for k, v in (s.split("=", 1) for s in BATCH_STATISTICS[name]))
    assert_same_run(singles[name], ddps[name])


def test_one_rank_deepspeed_with_row_skipping_follows_one_process(singles, tmp_path):
    """DeepSpeed steps its optimizer after a fixed count of micro-batches; skipping
    zero-advantage rows (on by default) ran fewer, so optimizer steps fell out of line with the schedule
    and gradients spilled into the next rollout. One DeepSpeed rank (no torchrun) with skipping asked for
    must train as one process does: the same losses, grad norms and weights. (entropy_mean is not
    compared: the single process, which does skip, measures it over the rows it ran.)"""
    skip = ("--set", "skip_zero_advantage_rows=true")
    one = singles["skip_rows"]
    ds = run_worker(tmp_path / "ds", "--backend", "deepspeed", "--set", "zero_stage=2", *skip)
    ra, rb = _train_rows(one), _train_rows(ds)
    assert len(ra) == len(rb) == 4 and any(r["update/skipped_row_frac"] > 0 for r in ra)  # rows were skipped
    for x, y in zip(ra, rb):
        assert x["advantage_std"] > 0 and x["reward_mean"] == y["reward_mean"]
        # the loss is a sum of O(1) terms A * ratio that cancel to ~0 (advantages are zero-mean per group), and
        # the two runs sum different micro-batches (one skips rows): its float32 rounding is absolute,
        # ~ (terms) x eps x |term| ~ 1e-6, not relative; the grad norm is not near 0, so relative
        for k, tol in (("loss", dict(abs_tol=1e-5)), ("policy_loss", dict(abs_tol=1e-5)),
                       ("grad_norm", dict(rel_tol=1e-5))):
            assert math.isclose(x[k], y[k], **tol), (x["step"], k, x[k], y[k])
    for k in one["weights"]:
        assert torch.allclose(one["weights"][k], ds["weights"][k], atol=1e-5, rtol=0), k


@pytest.mark.same_kernels  # bit for bit against a run on the same kernels: not in the forced-ISA pass
def test_ddp_stop_and_resume_equals_uninterrupted(ddp, tmp_path):
    """2 ranks, 2 steps, a stop (checkpoint), a relaunch that resumes for 2 more: the same weights and
    Adam moments, bit for bit, as 4 uninterrupted steps (gloo's reductions are deterministic)."""
    run_worker(tmp_path, "--backend", "ddp", "--stop-after", "2", nproc=2)
    resumed = run_worker(tmp_path, "--backend", "ddp", "--resume", nproc=2)
    assert resumed["step"] == 4
    for k in ddp["weights"]:
        assert torch.equal(ddp["weights"][k], resumed["weights"][k]), k
    assert ddp["adam"].keys() == resumed["adam"].keys() and ddp["adam"]
    for i in ddp["adam"]:
        for k in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(ddp["adam"][i][k], resumed["adam"][i][k]), (i, k)
        assert ddp["adam"][i]["exp_avg_sq"].abs().max() > 0  # the moments are real, not empty
    assert [r["loss"] for r in _train_rows(ddp)] == [r["loss"] for r in _train_rows(resumed)]


@pytest.mark.plumbing
def test_resume_with_another_world_size_is_refused(ddp, tiny_cfg):
    from rftlib.train.loop import Trainer

    run_dir = Path(ddp["run_dir"])
    cfg = tiny_cfg(backend="single", num_steps=5)
    with pytest.raises(RuntimeError, match=r"saved by 2 rank\(s\) with backend ddp; resuming with 1 rank\(s\)"):
        Trainer(cfg, run_dir, resume=True, progress=False)


@pytest.fixture(scope="module")
def zero3s(tmp_path_factory):
    """ZeRO-3 on 2 ranks, in one torchrun job: every parameter partitioned (zero3_tiny.json) on the tiny model, and
    DeepSpeed's default configuration on the wide one (test_ddp_and_zero3_at_the_default_persistence_threshold_...)."""
    return run_plan(tmp_path_factory.mktemp("zero3"), "deepspeed",
                    {"default": _sets(f"deepspeed_config={ZERO3}"), "wide": _wide()}, nproc=2)


@pytest.fixture(scope="module")
def zero3(zero3s):
    return zero3s["default"]


def test_zero3_two_ranks_match_one_process_and_partition(single, zero3):
    assert_same_run(single, zero3)
    (local0, full0), (local1, full1) = zero3["partition"]
    assert full0 == full1 and local0 + local1 >= full0  # each rank holds its shard (padding aside)
    assert abs(local0 / full0 - 0.5) < 0.02 and abs(local1 / full1 - 0.5) < 0.02, zero3["partition"]


@pytest.mark.same_kernels  # bit for bit against a run on the same kernels: not in the forced-ISA pass
def test_zero3_lora_checkpoints_are_adapter_sized_resume_exactly_and_deepspeed_state_optional(zero3, tmp_path):
    """A LoRA checkpoint under ZeRO-3 holds adapter-sized files only (seed 003's PeftModel
    + ZeRO-3 save wrote ~203 GB of full-model shards beside a 91 MB adapter); with DeepSpeed's own state in it, a
    stop after 2 of 4 steps and a resume equal the uninterrupted run bit for bit (weights and every rank's Adam
    moments); DeepSpeed's state can be left out as the seed's --disable_ds_ckpt does, and such a checkpoint still
    resumes the weights and the LR schedule exactly (AdamW's moments restart). (Issue 41: one test where two
    started the same stopped run, test_zero3_stop_and_resume_equals_uninterrupted's and this one's.)"""
    from rftlib.models.tiny import tiny_model_dir

    base = sum(f.stat().st_size for f in tiny_model_dir().glob("*.safetensors"))  # the whole model's weights
    ds = _sets(f"deepspeed_config={ZERO3}", "save_steps=1")
    lean_ds = (*ds, *_sets("deepspeed_checkpoint=false"))

    def sizes(run_dir):
        step = Path(run_dir) / "training_state" / "step_2"
        adapter = sum(f.stat().st_size for f in (step / "adapter").iterdir())
        files = [f.stat().st_size for f in step.rglob("*") if f.is_file()]
        # no file holds the base model (a leaked shard would be a large part of its weights): the tiny model's
        # LoRA is a sixth of it, so the bound is half the model, not a multiple of the adapter
        assert max(files) < base / 2, (max(files), base)
        return sum(files), adapter, step

    # both stopped runs in one torchrun job, then both resumes in another (each run in its own directory); the step
    # directories are measured before the resumes write theirs
    stopped = run_plan(tmp_path, "deepspeed", {"with_ds": (*ds, "--stop-after", "2"),
                                               "lean": (*lean_ds, "--stop-after", "2")}, nproc=2)
    total, adapter, step = sizes(stopped["with_ds"]["run_dir"])
    # the adapter, the gathered trainable tensors, and DeepSpeed's partitions of them with AdamW's m, v
    assert (step / "deepspeed").is_dir() and total < 12 * adapter, (total, adapter, base)
    lean = stopped["lean"]
    lean_total, adapter, step = sizes(lean["run_dir"])
    assert not (step / "deepspeed").exists() and lean_total < 4 * adapter and lean_total < total, (lean_total, total)

    resumed_runs = run_plan(tmp_path, "deepspeed", {"with_ds": (*ds, "--resume"), "lean": (*lean_ds, "--resume")},
                            nproc=2)
    resumed = resumed_runs["with_ds"]
    assert resumed["step"] == 4
    for k in zero3["weights"]:
        assert torch.equal(zero3["weights"][k], resumed["weights"][k]), k
    a = zero3["adam_local"]["optimizer_state_dict"]["state"]
    b = resumed["adam_local"]["optimizer_state_dict"]["state"]
    assert a.keys() == b.keys() and a
    for i in a:
        for k in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(a[i][k], b[i][k]), (i, k)
            assert a[i][k].abs().max() > 0

    resumed = resumed_runs["lean"]
    assert resumed["step"] == 4
    for k in lean["weights"]:  # scattered back into the partitions exactly as they were saved
        assert torch.equal(lean["weights"][k], resumed["init"][k]), k
    assert any(not torch.equal(resumed["init"][k], resumed["weights"][k]) for k in lean["weights"])  # and trained on
    print(f"ZeRO-3 LoRA step dir: {total / 1e3:.0f} kB with DeepSpeed's state, {lean_total / 1e3:.0f} kB without; "
          f"adapter {adapter / 1e3:.0f} kB, whole tiny model {base / 1e3:.0f} kB")


def test_ddp_and_zero3_at_the_default_persistence_threshold_match_one_process(singles, ddps, zero3s):
    """DDP and ZeRO-3 at DeepSpeed's default persistence threshold (1e5 elements), 2 steps, on a tiny
    model wide enough that ZeRO-3 releases its large weights after each use and gathers them again
    (hidden 384: q_proj 384 x 384 = 147,456 and each MLP weight 384 x 768 = 294,912 elements; the k/v
    projections, 192 x 384 = 73,728, and the norms stay whole), so both kinds of parameter are in one
    run. The tiny model's layers (hidden 64) are all below the threshold, hence zero3_tiny.json's 0
    above; this is the default configuration a user gets. (The same check ran on SmolLM2-135M: 316 s or more.)"""
    z3 = zero3s["wide"]
    # the default threshold, and the model big enough for it: attention and MLP weights are released,
    # something is kept whole (a model that shrank below the threshold would fail here, not pass vacuously)
    assert z3["persistence_threshold"] == 100_000, z3["persistence_threshold"]
    released = z3["released"]
    for part in ("q_proj", "o_proj", "gate_proj", "up_proj", "down_proj"):  # base weights, one per layer (2)
        assert sum(part in n and "lora" not in n for n in released) == 2, (part, sorted(released))
    assert all(numel > 100_000 for numel in released.values()), released
    assert not any("norm" in n or "k_proj" in n or "lora" in n for n in released), sorted(released)  # kept whole
    one, two = singles["wide"], ddps["wide"]
    for other in (two, z3):
        ra, rb = _train_rows(one), _train_rows(other)
        assert len(ra) == len(rb) == 2
        for x, y in zip(ra, rb):
            assert x["reward_mean"] == y["reward_mean"] and x["advantage_std"] > 0
            for k in ("loss", "grad_norm"):
                assert math.isclose(x[k], y[k], rel_tol=1e-4, abs_tol=1e-9), (k, x[k], y[k])
        # Adam moves every coordinate by ~lr whatever its gradient's size, so float noise in a coordinate
        # with a near-zero gradient shows up at ~lr in that weight; compare the whole update instead. Measured
        # (2-core EPYC, float32): 6.5e-6 (DDP) and 2.8e-5 (ZeRO-3) of the update's norm on this model, loss and
        # grad norm within 1e-7 relative; SmolLM2-135M gave 6.6e-5 and 9.6e-5. The bounds are the SmolLM2 test's
        # (an order of magnitude above the larger model's noise), not refitted to this one
        ks = list(one["weights"])
        diff = sum(((one["weights"][k] - other["weights"][k]) ** 2).sum() for k in ks) ** 0.5
        update = sum(((one["weights"][k] - one["init"][k]) ** 2).sum() for k in ks) ** 0.5
        print(f"{'zero3' if other is z3 else 'ddp'}: diff/update {float(diff / update):.2e}")
        assert update > 0 and diff / update < 1e-3, (float(diff), float(update))


@pytest.mark.plumbing
def test_rft_train_nproc_makes_the_attempt_and_hands_it_to_the_ranks(tmp_path, monkeypatch):
    """`rft train --nproc 2` makes the attempt (the preset and --set resolved once, here) and hands its directory
    to run_ranks, whose torchrun job the notebook test below runs for real (issue 41: the two tests started the
    same torchrun and ranks; that test now makes this one's checks on the ranks)."""
    import rftlib.cli.train as cli_train
    from rftlib.cli import main
    from rftlib.train.loop import resume_config

    got = []
    monkeypatch.setattr(cli_train, "run_ranks", lambda run_dir, nproc, resume=False: got.append(
        (Path(run_dir), nproc, resume)) or 0)
    assert main(["train", "--nproc", "2", "-p", "tiny", "--set", "backend=ddp", "--set", "num_steps=2",
                 "--set", f"runs_root={tmp_path}"]) == 0
    (run_dir,) = tmp_path.glob("attempt-01-tiny")
    assert got == [(run_dir, 2, False)]
    cfg = resume_config(run_dir)  # what every rank reads
    assert (cfg.backend, cfg.num_steps, cfg.model) == ("ddp", 2, "tiny")


@pytest.mark.plumbing
def test_torchrun_command_for_one_and_two_nodes():
    from rftlib.train.torchrun import torchrun_command

    one = torchrun_command(2, ["train", "-p", "x"], python="py")
    assert one == ["py", "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone", "-m", "rftlib.cli",
                   "train", "-p", "x"]
    two = torchrun_command(8, ["train"], nnodes=2, node_rank=1, rdzv_endpoint="10.0.0.1:29400", python="py")
    assert two[3:9] == ["--nproc_per_node=8", "--nnodes=2", "--node_rank=1", "--rdzv-backend=c10d",
                        "--rdzv-endpoint=10.0.0.1:29400", "--rdzv-id=rftlib"]
    with pytest.raises(ValueError, match="rdzv_endpoint"):
        torchrun_command(8, ["train"], nnodes=2)


@pytest.mark.plumbing
def test_train_notebook_with_nproc_2_runs_ranks_under_torchrun(tmp_path):
    """train.ipynb under papermill with nproc=2: the kernel starts torchrun and streams the ranks' lines; rank 0
    alone writes (one line per step, one summary), every rank saves its RNG state."""
    import json

    import papermill as pm

    out = tmp_path / "out.ipynb"
    pm.execute_notebook(str(REPO / "notebooks" / "train.ipynb"), str(out), cwd=str(REPO), progress_bar=False,
                        parameters={"preset": "tiny", "nproc": 2, "backend": "ddp", "num_steps": 2,
                                    "runs_root": str(tmp_path / "runs"), "live_view": False})
    (run_dir,) = (tmp_path / "runs").glob("attempt-*")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["backend"] == "ddp" and summary["steps"] == 2
    text = out.read_text()
    assert text.count("[rft] step 2/2") == 1  # the ranks' lines are in the executed notebook, one rank's
    from rftlib.monitor.metrics import read_metrics

    assert [r["step"] for r in read_metrics(run_dir)] == [0, 1, 2]  # one line per step, not one per rank
    assert (run_dir / "logs" / "launch_command.txt").read_text().split()[1:4] == [
        "-m", "torch.distributed.run", "--nproc_per_node=2"]
    assert sorted(p.name for p in (run_dir / "training_state" / "step_2").glob("rng_rank*.pt")) == [
        "rng_rank0.pt", "rng_rank1.pt"]


def test_optimizer_batches_split_groups_across_ranks_as_openrlhf_counts_samples(ddps):
    """seed 003 a28: 16 samples (2 prompts) per optimizer step over 4 ranks. Here: 4 samples (1 prompt of
    G = 4) over 2 ranks, so each rank steps on half a group; advantages were taken over whole groups."""
    res = ddps["train_batch_size_1"]
    rows = _train_rows(res)
    assert len(rows) == 2
    for r in rows:
        assert r["advantage_std"] > 0 and math.isfinite(r["loss"]) and r["grad_norm_max"] > 0
    assert res["adam"] and all(int(s["step"]) == 8 for s in res["adam"].values())  # 2 rollouts x 4 optimizer steps
