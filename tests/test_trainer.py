"""The trainer end to end on the tiny model: metrics, checkpoints, resume, NaN handling, reference."""

import json
import math
import os

import pytest
import torch

from rftlib.monitor.metrics import read_metrics
from rftlib.train import checkpoint as ckpt
from rftlib.train.loop import Trainer

REQUIRED = [
    "reward_mean", "reward_std", "reward_min", "reward_max", "reward_p90", "correctness",
    "advantage_mean", "advantage_std", "advantage_min", "advantage_max", "policy_loss", "loss",
    "entropy_mean", "entropy_p10", "entropy_p90", "grad_norm", "ppo_clip_ratio", "log_ratio_raw_max",
    "log_ratio_max", "log_ratio_min", "ratio_max", "log_ratio_abs_p99", "response_length_mean",
    "response_length_max", "truncated", "lr", "timing/generate", "timing/reward", "timing/reference",
    "timing/update", "timing/step",
]


def _run(cfg, **kw):
    tr = Trainer(cfg, progress=False, **kw)
    try:
        summary = tr.train()
    finally:
        tr.close()
    return tr, summary


def varied_reward(text, ex, trunc):
    """The tiny random model is never right, so every advantage would be 0: a reward that varies
    with the completion gives the update something to do."""
    return float(len(text) % 2), {"correctness": 0.0}


def _strip_timing(rows):
    return [{k: v for k, v in r.items() if not k.startswith(("timing/", "memory/"))} for r in rows]


def test_run_writes_metrics_checkpoints_samples(tiny_cfg):
    cfg = tiny_cfg(num_steps=3, save_steps=1, max_ckpt_num=2, beta=0.05)
    tr, summary = _run(cfg)
    rows = read_metrics(tr.run_dir)
    assert [r["step"] for r in rows] == [0, 1, 2, 3]  # step-0 baseline eval, then one line per step
    for r in rows[1:]:
        missing = [k for k in REQUIRED + ["kl"] if k not in r]
        assert missing == [], missing
        assert all(math.isfinite(r[k]) for k in REQUIRED)
    assert "eval/heldout/greedy_pass@1" in rows[0] and "eval/heldout/greedy_pass@1" in rows[-1]
    # on-policy single update: ratio is exactly 1, so nothing is clipped
    assert rows[1]["ppo_clip_ratio"] == 0.0 and rows[1]["ratio_max"] == pytest.approx(1.0)
    root = tr.run_dir / "training_state"
    assert ckpt.list_steps(tr.run_dir) == [2, 3]  # max_ckpt_num = 2 pruned step_1
    assert os.readlink(root / "step_latest") == "step_3"
    for f in ["trainable.pt", "optimizer.pt", "scheduler.pt", "rng_rank0.pt", "trainer_state.json", "adapter"]:
        assert (root / "step_3" / f).exists(), f
    assert json.loads((root / "step_3" / "trainer_state.json").read_text())["step"] == 3
    assert (tr.run_dir / "logs" / "samples" / "samples_step3.jsonl").exists()
    assert list((tr.run_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert summary["steps"] == 3 and summary["baseline"] is not None


def test_four_steps_equal_two_plus_resume_two(tiny_cfg):
    a, _ = _run(tiny_cfg(num_steps=4, save_steps=0, name="straight"))
    b_cfg = tiny_cfg(num_steps=4, save_steps=0, stop_after_steps=2, name="split")
    b, _ = _run(b_cfg)
    assert ckpt.list_steps(b.run_dir) == [2]  # a session stop always checkpoints
    from dataclasses import replace

    b2, _ = _run(replace(b_cfg, stop_after_steps=None), run_dir=b.run_dir, resume=True)
    ra, rb = _strip_timing(read_metrics(a.run_dir)), _strip_timing(read_metrics(b.run_dir))
    assert len(ra) == len(rb) == 5
    assert ra == rb  # identical metrics on CPU, float for float


def test_nonfinite_loss_skips_step_and_keeps_weights(tiny_cfg):
    from rftlib.data.tasks import math_em_reward

    poison = {"on": False}

    def reward(text, ex, trunc):
        _, d = math_em_reward(text, ex, trunc)
        return (float("nan") if poison["on"] else float(len(text) % 2)), d  # varied rewards: nonzero advantages

    tr = Trainer(tiny_cfg(lr=5e-2), progress=False, reward_override=reward)
    tr.step()
    poison["on"] = True
    before = {k: v.detach().clone() for k, v in tr.model.named_parameters() if v.requires_grad}
    with pytest.warns(UserWarning, match=r"non-finite loss \(nan\).* optimizer step skipped, weights unchanged"):
        row = tr.step()
    after = dict(tr.model.named_parameters())
    assert row["skipped_steps"] == 1 and math.isnan(row["loss"])
    assert all(torch.equal(before[k], after[k]) for k in before)  # the NaN step changed nothing
    poison["on"] = False
    row = tr.step()  # training goes on
    assert math.isfinite(row["loss"]) and row["skipped_steps"] == 1
    tr.save()
    state = ckpt.load_checkpoint(ckpt.latest_dir(tr.run_dir))
    assert all(torch.isfinite(t).all() for t in state["trainable"].values())
    assert any(not torch.equal(before[k], state["trainable"][k]) for k in before)  # step 3 did update
    tr.close()


def test_training_logprobs_match_behaviour_logprobs(tiny_cfg):
    """At ratio 1 the trainer's logprobs (hidden states + chunked head, explicit position ids)
    equal what generate sampled with: same model, same temperature, left padding."""
    from rftlib.eval import format_prompts
    from rftlib.train.forward import completion_logprobs

    tr = Trainer(tiny_cfg(temperature=0.7, autocast="none"), progress=False)
    ex = tr.task.train[:3]
    ro = tr.engine.generate(format_prompts(tr.tok, ex), group_size=2, max_new_tokens=10, temperature=0.7)
    with torch.no_grad():
        lp, ent = completion_logprobs(tr.model, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask,
                                      temperature=0.7, chunk_size=7)
    assert torch.allclose(lp, ro.behaviour_logprobs, atol=1e-4)
    assert (ent[ro.completion_mask > 0] > 0).all()
    tr.close()


def test_lora_reference_is_base_model_with_adapter_disabled(tiny_cfg, tiny_dir):
    """After training moves the adapter, the reference still equals the untouched base model."""
    from transformers import AutoModelForCausalLM

    from rftlib.eval import format_prompts
    from rftlib.train.forward import completion_logprobs

    tr, _ = _run(tiny_cfg(num_steps=2, beta=0.1, autocast="none", lr=5e-2), reward_override=varied_reward)
    ro = tr.engine.generate(format_prompts(tr.tok, tr.task.train[:2]), group_size=2, max_new_tokens=8,
                            temperature=1.0)
    rows = (ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask)
    base = AutoModelForCausalLM.from_pretrained(tiny_dir)
    with torch.no_grad():
        with tr.ref.active() as ref:
            ref_lp, _ = completion_logprobs(ref, *rows)
        base_lp, _ = completion_logprobs(base, *rows)
        pol_lp, _ = completion_logprobs(tr.model, *rows)
    assert torch.allclose(ref_lp, base_lp, atol=1e-5)
    assert not torch.allclose(pol_lp, base_lp, atol=1e-3)  # the policy did move
    assert tr.ref.copy is None  # no second copy of the weights under LoRA


def test_off_policy_updates_and_eps_clip_reach_the_loss(tiny_cfg, monkeypatch):
    import rftlib.train.loop as loop

    seen = []
    real = loop.grpo_loss

    def spy(*a, **kw):
        seen.append((kw["clip_low"], kw["clip_high"], kw["aggregation"]))
        return real(*a, **kw)

    monkeypatch.setattr(loop, "grpo_loss", spy)
    cfg = tiny_cfg(num_steps=2, num_updates_per_rollout=2, eps_clip=0.1, eps_clip_high=0.28,
                   loss_agg_mode="token-mean", lr=5e-2)
    tr, _ = _run(cfg, reward_override=varied_reward)
    assert not tr.on_policy and tr.opt_steps_per_rollout == 2
    assert set(seen) == {(0.1, 0.28, "token-mean")}
    rows = read_metrics(tr.run_dir)[1:]
    # the second pass over a rollout sees moved weights: ratios leave 1
    assert max(r["log_ratio_abs_p99"] for r in rows) > 0


def test_full_finetune_reference_copy(tiny_cfg):
    tr, _ = _run(tiny_cfg(num_steps=1, lora_rank=0, beta=0.1))
    assert tr.ref.copy is not None
    assert all(not p.requires_grad for p in tr.ref.copy.parameters())


def test_init_adapter_starts_from_a_saved_adapter(tiny_cfg):
    """Seed 001 starts RL from an SFT LoRA adapter: the new attempt's adapter equals the saved one."""
    first, _ = _run(tiny_cfg(num_steps=1, lr=5e-2, save_steps=1, warmup_ratio=0.0), reward_override=varied_reward)
    adapter = first.run_dir / "training_state" / "step_1" / "adapter"
    saved = {k: v for k, v in first.model.named_parameters() if v.requires_grad}
    second = Trainer(tiny_cfg(init_adapter=str(adapter), name="from-sft"), progress=False)
    now = {k: v for k, v in second.model.named_parameters() if v.requires_grad}
    assert saved.keys() == now.keys()
    assert all(torch.equal(saved[k], now[k]) for k in saved)
    assert any(not torch.equal(v, torch.zeros_like(v)) for k, v in now.items() if "lora_B" in k)
    second.close()


def test_task_args_are_checked_against_the_builder(tiny_cfg):
    from rftlib.config import ConfigError

    with pytest.raises(ConfigError, match=r"task_args \['pool'\] are not arguments of task 'arithmetic'; it takes: seed"):
        tiny_cfg(task_args={"pool": 3})
    assert tiny_cfg(task_args={"seed": 7}).task_args == {"seed": 7}


def test_entropy_bonus_trains(tiny_cfg):
    """entropy_coef != 0 back-propagates through the entropy (it used to be computed without grad)."""
    tr, _ = _run(tiny_cfg(num_steps=1, entropy_coef=0.01, warmup_ratio=0.0), reward_override=varied_reward)
    row = read_metrics(tr.run_dir)[1]
    assert math.isfinite(row["loss"]) and row["grad_norm"] > 0


def test_resume_uses_the_resumed_configs_lr_and_tolerates_a_torn_metrics_line(tiny_cfg):
    from dataclasses import replace

    from rftlib.train.schedule import lr_at

    cfg = tiny_cfg(num_steps=4, save_steps=0, stop_after_steps=2, lr=1e-3, warmup_ratio=0.0)
    a, _ = _run(cfg)
    with open(a.run_dir / "logs" / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "rew')  # killed mid-write after the step-2 checkpoint
    b, _ = _run(replace(cfg, stop_after_steps=None, lr=1e-2), run_dir=a.run_dir, resume=True)
    rows = read_metrics(b.run_dir)
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
    # optimizer step 3 (2 taken) on the resumed schedule of lr 1e-2
    assert rows[3]["lr"] == pytest.approx(lr_at(2, total_steps=4, warmup_steps=0, lr=1e-2, min_lr_ratio=0.1))


def test_dropout_with_off_policy_updates_is_refused(tiny_cfg):
    from rftlib.config import ConfigError

    with pytest.raises(ConfigError, match="PPO clips on dropout noise"):
        tiny_cfg(lora_dropout=0.1, num_updates_per_rollout=2)
    with pytest.raises(ConfigError, match="KL reference would be the base model"):
        tiny_cfg(init_adapter="/tmp/x", beta=0.04)
