"""The trainer end to end on the tiny model: metrics, checkpoints, resume, NaN handling, reference.

The tiny random model never answers arithmetic: every reward 0, every advantage 0, nothing
trains, and a resume that restored nothing would still match. So the tests that need learning
train on ``digit_reward`` (toy_rewards.ascii_digit_share), a signal the tiny model moves within a
few steps, and check that advantages, weights and Adam moments are non-zero / changed before
comparing anything. A test hands the trainer its reward in the config's task (conftest's task_with).
"""

import json
import math
import os
import shutil
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

import rftlib.backends.torch_backend as torch_backend
import rftlib.train.loop as loop
from rftlib.config import make_config
from rftlib.monitor.metrics import read_metrics
from rftlib.train import checkpoint as ckpt
from rftlib.train.loop import Trainer
from rftlib.train.sampler import PromptSampler
from toy_rewards import ascii_digit_share as digit_reward

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
    """Rewards that vary with the completion, so advantages are non-zero (no learnable direction)."""
    return float(len(text) % 2), {"correctness": 0.0}


def _strip_timing(rows):
    return [{k: v for k, v in r.items() if not k.startswith(("timing/", "memory/", "throughput/"))} for r in rows]


def _trainable(tr) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in tr.model.named_parameters() if v.requires_grad}


def test_digit_reward_is_scored_as_written():
    assert digit_reward("ab12", None, False)[0] == 0.5  # 2 digits of 4 characters
    assert digit_reward("", None, False)[0] == 0.0 and digit_reward("\u00b2\u0663", None, False)[0] == 0.0  # ASCII only


def test_digit_reward_is_learned(tiny_cfg, task_with):
    """The signal the tests below rely on really trains, in the right direction: the mean reward
    of steps 9-10 is over 3x that of step 1 (measured: 0.07 -> 0.88)."""
    cfg = tiny_cfg(num_steps=10, save_steps=0, lora_rank=0, lr=3e-2, warmup_ratio=0.0)
    tr, _ = _run(cfg, task=task_with(cfg, digit_reward))
    rows = read_metrics(tr.run_dir)[1:]
    assert all(r["advantage_max"] > 0 for r in rows)
    first, last = rows[0]["reward_mean"], (rows[-1]["reward_mean"] + rows[-2]["reward_mean"]) / 2
    assert last > 3 * first, [round(r["reward_mean"], 3) for r in rows]


def test_run_writes_metrics_checkpoints_samples(tiny_cfg, task_with):
    cfg = tiny_cfg(num_steps=3, save_steps=1, max_ckpt_num=2, beta=0.05)
    tr, summary = _run(cfg, task=task_with(cfg, digit_reward))
    rows = read_metrics(tr.run_dir)
    assert [r["step"] for r in rows] == [0, 1, 2, 3]  # step-0 baseline eval, then one line per step
    for r in rows[1:]:
        missing = [k for k in REQUIRED + ["kl"] if k not in r]
        assert missing == [], missing
        assert all(math.isfinite(r[k]) for k in REQUIRED)
        assert r["advantage_std"] > 0 and r["grad_norm"] > 0  # a step that trained, not all-zero metrics
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


def _snapshot(tr) -> dict:
    """Everything a resume must restore, as the trainer holds it after its last step."""
    sd = tr.optimizer.state_dict()
    return {
        "weights": _trainable(tr),
        "adam": {f"{i}.{k}": v.clone() for i, st in sd["state"].items() for k, v in st.items()},  # step, exp_avg(_sq)
        "param_groups": [{k: v for k, v in g.items() if k != "params"} for g in sd["param_groups"]],
        "scheduler": tr.scheduler.state_dict(),
        "sampler": tr.sampler.state(),
        "rng": torch.get_rng_state(),
        "metrics": _strip_timing(read_metrics(tr.run_dir)),
    }


def _differences(a: dict, b: dict) -> set[str]:
    """The parts of two snapshots that are not bit for bit equal."""
    out = set()
    for part in ("weights", "adam"):
        if a[part].keys() != b[part].keys() or any(not torch.equal(a[part][k], b[part][k]) for k in a[part]):
            out.add(part)
    for part in ("param_groups", "scheduler", "sampler", "metrics"):
        if a[part] != b[part]:
            out.add(part)
    if not torch.equal(a["rng"], b["rng"]):
        out.add("rng")
    return out


@pytest.fixture(scope="module", params=[16, 0], ids=["lora", "full"])
def resume_runs(request, tmp_path_factory, task_with):
    """4 straight steps, and the same config stopped after 2 (a session stop checkpoints step 2)."""
    root = tmp_path_factory.mktemp("resume")
    base = {"runs_root": str(root), "num_steps": 4, "save_steps": 0, "lr": 3e-2, "lora_rank": request.param}
    straight_cfg = make_config("tiny", {**base, "name": "straight"})
    straight = Trainer(straight_cfg, progress=False, task=task_with(straight_cfg, digit_reward))
    init = _trainable(straight)
    straight.train()
    straight.close()
    after4 = _snapshot(straight)  # now: the RNG state is global
    split_cfg = make_config("tiny", {**base, "name": "split", "stop_after_steps": 2})
    split = Trainer(split_cfg, progress=False, task=task_with(split_cfg, digit_reward))
    split.train()
    split.close()
    after2 = _snapshot(split)
    assert ckpt.list_steps(split.run_dir) == [2]
    return SimpleNamespace(init=init, straight=after4, at2=after2, split_dir=split.run_dir,
                           cfg=replace(split_cfg, stop_after_steps=None), task_with=task_with)


def _resume_two_more(runs, tmp_path) -> dict:
    d = tmp_path / runs.split_dir.name  # a copy, so that each resume starts from the same step-2 checkpoint
    shutil.copytree(runs.split_dir, d, symlinks=True)
    tr = Trainer(runs.cfg, run_dir=d, resume=True, progress=False, task=runs.task_with(runs.cfg, digit_reward))
    try:
        tr.train()
        return _snapshot(tr)
    finally:
        tr.close()


def test_four_steps_equal_two_plus_resume_two(resume_runs, tmp_path):
    r = resume_runs
    rows = r.straight["metrics"][1:]
    assert len(rows) == 4 and all(row["advantage_max"] > 0 and row["grad_norm"] > 0 for row in rows)
    moved = {k for k in r.init if not torch.equal(r.init[k], r.straight["weights"][k])}
    assert moved == set(r.init)  # every trainable tensor moved
    moments = {k: v for k, v in r.straight["adam"].items() if k.endswith(("exp_avg", "exp_avg_sq"))}
    assert len(moments) == 2 * len(r.init) and all(v.abs().sum() > 0 for v in moments.values())
    # steps 3-4 changed everything a resume must restore, so matching them is not free
    assert {"weights", "adam", "scheduler", "sampler", "rng", "metrics"} <= _differences(r.at2, r.straight)

    resumed = _resume_two_more(r, tmp_path)
    assert _differences(resumed, r.straight) == set()  # weights, Adam moments, scheduler, cursor, RNG: bit for bit


RESUME_BREAKS = {  # skip one restore; what the comparison must then see differ
    "optimizer": (lambda mp: mp.setattr(torch.optim.AdamW, "load_state_dict", lambda self, sd: None),
                  {"adam", "weights"}),
    "scheduler": (lambda mp: mp.setattr(torch.optim.lr_scheduler.LambdaLR, "load_state_dict", lambda self, sd: None),
                  {"scheduler", "weights"}),
    "sampler": (lambda mp: mp.setattr(PromptSampler, "load_state", lambda self, s: None), {"sampler", "weights"}),
    # patched where the backend looks it up (it imports the function at the top of its module)
    "weights": (lambda mp: mp.setattr(torch_backend, "load_trainable_state", lambda model, state: None), {"weights"}),
    "rng": (lambda mp: mp.setattr(ckpt, "set_rng_state", lambda s: None), {"rng", "weights"}),
}


@pytest.mark.parametrize("broken", list(RESUME_BREAKS))
def test_resume_comparison_catches_a_resume_that_skips_a_restore(resume_runs, tmp_path, monkeypatch, broken):
    """The bit-for-bit comparison above can fail: a resume that skips loading one piece of state
    differs from the straight run in that piece (and in the weights it goes on to produce)."""
    patch, expected = RESUME_BREAKS[broken]
    patch(monkeypatch)
    resumed = _resume_two_more(resume_runs, tmp_path)
    assert expected <= _differences(resumed, resume_runs.straight)


def test_nonfinite_loss_skips_step_and_keeps_weights(tiny_cfg, task_with):
    poison = {"on": False}

    def reward(text, ex, trunc):
        r, d = digit_reward(text, ex, trunc)
        return (float("nan") if poison["on"] else r), d

    cfg = tiny_cfg(lr=5e-2, warmup_ratio=0.0)
    tr = Trainer(cfg, progress=False, task=task_with(cfg, reward))
    row = tr.step()
    assert row["advantage_max"] > 0 and row["grad_norm"] > 0
    poison["on"] = True
    before = _trainable(tr)
    moments = {i: {k: v.clone() for k, v in st.items()} for i, st in tr.optimizer.state_dict()["state"].items()}
    assert any(st["exp_avg"].abs().sum() > 0 for st in moments.values())  # step 1 trained (lora_B; lora_A has 0 grad while B = 0)
    with pytest.warns(UserWarning, match=r"non-finite loss \(nan\).* optimizer step skipped, weights unchanged"):
        row = tr.step()
    after = dict(tr.model.named_parameters())
    assert row["skipped_steps"] == 1 and math.isnan(row["loss"])
    assert all(torch.equal(before[k], after[k]) for k in before)  # the NaN step changed no weight
    now = tr.optimizer.state_dict()["state"]
    assert all(torch.equal(moments[i][k], now[i][k]) for i in moments for k in moments[i])  # nor a moment
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
    from rftlib.models.forward import completion_logprobs

    tr = Trainer(tiny_cfg(temperature=0.7, autocast="none"), progress=False)
    ex = tr.task.train[:3]
    ro = tr.engine.generate(format_prompts(tr.tok, ex), group_size=2, max_new_tokens=10, temperature=0.7)
    with torch.no_grad():
        lp, ent = completion_logprobs(tr.model, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask,
                                      temperature=0.7, chunk_size=7)
    assert torch.allclose(lp, ro.behaviour_logprobs, atol=1e-4)
    assert (ent[ro.completion_mask > 0] > 0).all()
    tr.close()


def test_lora_reference_is_base_model_with_adapter_disabled(tiny_cfg, tiny_dir, task_with):
    """After training moves the adapter, the reference still equals the untouched base model."""
    from transformers import AutoModelForCausalLM

    from rftlib.eval import format_prompts
    from rftlib.models.forward import completion_logprobs

    cfg = tiny_cfg(num_steps=2, beta=0.1, autocast="none", lr=5e-2)
    tr, _ = _run(cfg, task=task_with(cfg, varied_reward))
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


def test_off_policy_updates_and_eps_clip_reach_the_loss(tiny_cfg, monkeypatch, task_with):
    seen = []
    real = loop.grpo_loss

    def spy(*a, **kw):
        seen.append((kw["clip_low"], kw["clip_high"], kw["aggregation"]))
        return real(*a, **kw)

    monkeypatch.setattr(loop, "grpo_loss", spy)
    cfg = tiny_cfg(num_steps=2, num_updates_per_rollout=2, eps_clip=0.1, eps_clip_high=0.28,
                   loss_agg_mode="token-mean", lr=5e-2)
    tr, _ = _run(cfg, task=task_with(cfg, varied_reward))
    assert not tr.on_policy and tr.opt_steps_per_rollout == 2
    assert set(seen) == {(0.1, 0.28, "token-mean")}
    rows = read_metrics(tr.run_dir)[1:]
    # the second pass over a rollout sees moved weights: ratios leave 1
    assert max(r["log_ratio_abs_p99"] for r in rows) > 0


def test_full_finetune_reference_copy(tiny_cfg, tiny_dir, task_with):
    """Full fine-tuning with beta > 0 keeps a frozen copy that stays the base model while the
    policy moves (a copy sharing the policy's tensors would move with it)."""
    from transformers import AutoModelForCausalLM

    cfg = tiny_cfg(num_steps=2, lora_rank=0, beta=0.1, lr=3e-2, warmup_ratio=0.0)
    tr, _ = _run(cfg, task=task_with(cfg, digit_reward))
    assert tr.ref.copy is not None
    assert all(not p.requires_grad for p in tr.ref.copy.parameters())
    base = dict(AutoModelForCausalLM.from_pretrained(tiny_dir).named_parameters())
    ref, pol = dict(tr.ref.copy.named_parameters()), dict(tr.model.named_parameters())
    assert ref.keys() == base.keys() == pol.keys()
    assert all(torch.equal(ref[k], base[k]) for k in base)
    assert all(not torch.equal(pol[k], base[k]) for k in base)  # every policy tensor moved


def test_init_adapter_starts_from_a_saved_adapter(tiny_cfg, task_with):
    """Seed 001 starts RL from an SFT LoRA adapter: the new attempt's adapter equals the saved one."""
    cfg = tiny_cfg(num_steps=1, lr=5e-2, save_steps=1, warmup_ratio=0.0)
    first, _ = _run(cfg, task=task_with(cfg, varied_reward))
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


@pytest.mark.parametrize("coef", [0.0, 0.01])
def test_entropy_bonus_trains(tiny_cfg, task_with, coef):
    """entropy_coef != 0 back-propagates through the entropy (it used to be computed without grad).

    A constant reward makes every advantage 0 and beta is 0, so the policy loss has no gradient:
    grad_norm is exactly 0 without the bonus, and > 0 only if the bonus's gradient reaches the weights."""
    cfg = tiny_cfg(num_steps=1, entropy_coef=coef, beta=0.0, warmup_ratio=0.0)
    tr, _ = _run(cfg, task=task_with(cfg, lambda text, ex, trunc: (1.0, {})))
    row = read_metrics(tr.run_dir)[1]
    assert row["advantage_max"] == row["advantage_min"] == 0.0 and math.isfinite(row["loss"])
    assert (row["grad_norm"] > 0) == (coef != 0)


def test_resume_uses_the_resumed_configs_lr_and_tolerates_a_torn_metrics_line(tiny_cfg):
    cfg = tiny_cfg(num_steps=4, save_steps=0, stop_after_steps=2, lr=1e-3, warmup_ratio=0.0)
    a, _ = _run(cfg)
    with open(a.run_dir / "logs" / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "rew')  # killed mid-write after the step-2 checkpoint
    b, _ = _run(replace(cfg, stop_after_steps=None, lr=1e-2), run_dir=a.run_dir, resume=True)
    rows = read_metrics(b.run_dir)
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
    # optimizer step 3 (2 of 4 taken) on the resumed schedule of lr 1e-2, no warmup, floor 0.1:
    # cosine 0.5 * (1 + cos(pi * 2/4)) = 0.5, rescaled 0.5 * 0.9 + 0.1 = 0.55 -> 5.5e-3 (1e-3 run: 5.5e-4)
    assert rows[3]["lr"] == pytest.approx(5.5e-3)


def test_dropout_with_off_policy_updates_is_refused(tiny_cfg):
    from rftlib.config import ConfigError

    with pytest.raises(ConfigError, match="PPO clips on dropout noise"):
        tiny_cfg(lora_dropout=0.1, num_updates_per_rollout=2)
    with pytest.raises(ConfigError, match="KL reference would be the base model"):
        tiny_cfg(init_adapter="/tmp/x", beta=0.04)


def test_lm_head_chunk_is_sized_from_the_vocabulary_by_default(tiny_cfg, monkeypatch, task_with):
    """logprob_chunk_size 0 (the default): the Trainer asks auto_chunk_size for the model's vocabulary
    and every LM-head pass of the step runs with that many rows; a set value is passed as it is."""
    import rftlib.models.forward as forward

    asked, used = [], []
    monkeypatch.setattr(loop, "auto_chunk_size", lambda v: asked.append(v) or 5)
    real = forward.chunked_logprobs_entropy
    monkeypatch.setattr(forward, "chunked_logprobs_entropy", lambda *a, **k: used.append(k["chunk_size"]) or real(*a, **k))
    cfg = tiny_cfg(num_steps=1, eval_steps=0)
    tr = Trainer(cfg, progress=False, task=task_with(cfg, varied_reward))
    assert asked == [tr.model.config.vocab_size] and tr.logprob_chunk_size == 5
    tr.step()
    assert used and set(used) == {5}, used
    tr.close()
    tr = Trainer(tiny_cfg(logprob_chunk_size=9, num_steps=1, eval_steps=0), progress=False)
    assert tr.logprob_chunk_size == 9 and asked == [tr.model.config.vocab_size]
    tr.close()
