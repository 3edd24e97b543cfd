"""params/: a preset for every seed setup with the seed's numbers, and a CPU-scaled variant of each
that runs here (tiny model) with the same algorithmic settings. Every -cpu preset runs one step."""

import math
from pathlib import Path

import pytest

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
                                    n_samples_per_prompt=8, rollout_batch_size=16, train_batch_size=16,
                                    micro_batch_size=1, eps_clip=0.2, max_new_tokens=4096, warmup_ratio=0.05),
    "seed003-gpt-oss-20b-a27": dict(lr=5e-7, beta=0.001, lora_rank=32, eps_clip=0.1, max_new_tokens=4096),
    "seed003-gpt-oss-20b-a28a": dict(eps_clip=0.2, num_steps=200, eval_steps=5, lr=5e-7),
    "seed003-gpt-oss-20b-a28b": dict(eps_clip=0.1, num_steps=200, eval_steps=5, lr=5e-7),
    "seed003-gpt-oss-120b": dict(model="openai/gpt-oss-120b", lr=1e-6, beta=0.0, lora_rank=64, lora_alpha=128,
                                 n_samples_per_prompt=8, rollout_batch_size=8, train_batch_size=8, eps_clip=0.1,
                                 max_new_tokens=3072, warmup_ratio=0.03),
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
def test_cpu_variant_keeps_the_algorithm(name):
    assert f"{name}-cpu" in CPU_PRESETS
    full, cpu = make_config(name), make_config(f"{name}-cpu")
    assert cpu.model == "tiny"
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
    assert trainer.run_dir.name.startswith("attempt-01-") and trainer.run_dir.name.endswith("-cpu")
    assert all(math.isfinite(row[k]) for k in ("loss", "grad_norm", "reward_mean", "entropy_mean"))
    assert ("kl" in row) == (cfg.beta > 0)
    assert row["eps_clip_low"] == cfg.eps_clip
    assert (trainer.run_dir / "training_state" / "step_1" / "trainable.pt").exists()
