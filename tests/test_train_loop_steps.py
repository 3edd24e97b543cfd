"""The loop's step, detail by detail: the importance ESS over the whole batch, the LR schedule on a skipped
step, a fresh row order for each PPO epoch, float16 refused on CPU, prompt_max_len, a probe's eval mode, and
micro-batches trimmed to their own lengths."""

import math

import pytest
import torch

import rftlib.train.loop as loop
from toy_rewards import isdigit_share as digit_reward


def test_importance_ess_is_taken_over_the_batch_not_one_micro_batch(tiny_cfg, task_with):
    """micro_batch_size 1 (every seed-003 preset): a per-micro-batch ESS of one sequence is 1.0 by
    construction. Over the batch, the second PPO epoch's moved weights give ESS < 1."""
    cfg = tiny_cfg(micro_batch_size=1, num_updates_per_rollout=2, lr=5e-2, warmup_ratio=0.0)
    tr = loop.Trainer(cfg, progress=False, task=task_with(cfg, digit_reward))
    row = tr.step()
    tr.close()
    assert row["importance_ess"] < 0.999  # epoch 1 is exactly 1, epoch 2 below: the mean is below 1


def test_a_skipped_non_finite_step_still_advances_the_lr_schedule(tiny_cfg, task_with):
    poison = {"on": False}

    def reward(text, ex, truncated):
        return (float("nan") if poison["on"] else digit_reward(text, ex, truncated)[0]), {"correctness": 0.0}

    cfg = tiny_cfg(num_steps=4, warmup_ratio=0.0, lr=1e-2)
    tr = loop.Trainer(cfg, progress=False, task=task_with(cfg, reward))
    tr.step()
    poison["on"] = True
    with pytest.warns(UserWarning, match="optimizer step skipped"):
        tr.step()
    poison["on"] = False
    row = tr.step()
    tr.close()
    assert tr.scheduler.last_epoch == 3  # three optimizer steps planned, one skipped: the schedule went on
    # cosine over 4 steps to 0.1 x lr, the 3rd step's LR (2 taken): 1e-2 x (0.1 + 0.9 x (1 + cos(pi x 2/4)) / 2)
    assert row["lr"] == pytest.approx(1e-2 * (0.1 + 0.9 * (1 + math.cos(math.pi * 2 / 4)) / 2))


def test_ppo_epochs_see_the_rows_in_a_fresh_order(tiny_cfg, monkeypatch, task_with):
    seen = []
    real = loop.grpo_loss

    def spy(logp, old, adv, mask, **kw):
        seen.append(adv.detach().clone())
        return real(logp, old, adv, mask, **kw)

    monkeypatch.setattr(loop, "grpo_loss", spy)
    cfg = tiny_cfg(num_updates_per_rollout=2, micro_batch_size=4, rollout_batch_size=4, seed=3)
    tr = loop.Trainer(cfg, progress=False, task=task_with(cfg, digit_reward))
    tr.step()
    tr.close()
    first, second = torch.cat(seen[:4]), torch.cat(seen[4:])  # 16 rows, 4 micro-batches per epoch
    assert torch.equal(first.sort().values, second.sort().values)  # the same rows
    assert not torch.equal(first, second)  # in another order


def test_float16_is_refused_on_cpu_with_what_to_use(tiny_cfg):
    from rftlib.config import ConfigError

    with pytest.raises(ConfigError, match="float16 on CPU"):
        tiny_cfg(dtype="float16", device="cpu")
    if not torch.cuda.is_available():  # device auto resolves to the CPU here
        with pytest.raises(ValueError, match="float16 needs a CUDA device"):
            loop.Trainer(tiny_cfg(dtype="float16"), progress=False)


def test_prompt_max_len_drops_longer_training_prompts(tiny_cfg):
    import dataclasses

    from rftlib.config import ConfigError
    from rftlib.eval import format_prompts
    from rftlib.train.build import fit_prompts

    tr = loop.Trainer(tiny_cfg(), progress=False)
    pool = tr.task.train
    n0 = len(tr.tok(format_prompts(tr.tok, pool[:1], tr.task.system_prompt)[0], add_special_tokens=False)["input_ids"])
    long = [dataclasses.replace(e, prompt=e.prompt + " Think step by step." * 5) for e in pool[:3]]
    tr.task.train = pool[3:] + long  # 3 prompts far over the limit
    with pytest.warns(UserWarning, match=f"dropped 3 of {len(pool)} training prompts"):
        fit_prompts(tr.task, tr.tok, n0 + 2, say=True)
    assert tr.task.train == pool[3:]
    with pytest.raises(ConfigError, match="every training prompt is longer"):
        fit_prompts(tr.task, tr.tok, n0 - 5, say=True)
    tr.close()


def test_a_probe_with_eval_samples_is_evaluated_in_its_mode(tiny_cfg):
    """seed 003 section 9: a probe at temperature 0.6 with 4 samples is sampling_pass@4, labelled so."""
    tr = loop.Trainer(tiny_cfg(eval_temperature={"heldout": 0.6}, eval_n_samples={"heldout": 4}), progress=False)
    summary = tr.evaluate().metrics
    tr.close()
    assert "eval/heldout/sampling_pass@4" in summary and "eval/heldout/greedy_pass@1" not in summary
    import json

    res = json.loads((tr.run_dir / "eval" / "step_0_heldout.json").read_text())
    assert res["mode"] == "sampling_pass@4" and res["n_samples"] == 4 and res["temperature"] == 0.6


def test_micro_batches_trimmed_to_their_own_lengths_give_the_same_logprobs(tiny_cfg):
    """A micro-batch pays for its own padding only. Trimmed rows score every valid token as
    the untrimmed rollout does (positions come from the mask)."""
    from rftlib.eval import format_prompts
    from rftlib.models.forward import completion_logprobs
    from rftlib.train.update_parts import full_width, rows_of

    tr = loop.Trainer(tiny_cfg(autocast="none"), progress=False)
    exs = tr.task.train[:3]
    ro = tr.engine.generate(format_prompts(tr.tok, exs) + ["hi"], group_size=2, max_new_tokens=12, temperature=1.0)
    idx = torch.tensor([6, 7])  # the short prompt "hi": the rollout's left padding is all this pair's
    rows = rows_of(ro, idx)
    assert rows["prompt_ids"].shape[1] < ro.prompt_ids.shape[1]  # trimmed
    full = {k: getattr(ro, k)[idx] for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")}
    with torch.no_grad():
        a, _ = completion_logprobs(tr.model, **rows)
        b, _ = completion_logprobs(tr.model, **full)
    t1 = a.shape[1]
    assert torch.allclose(full_width(a, b.shape[1]), b, atol=1e-5)
    assert (b[:, t1:] == 0).all()
    tr.close()
