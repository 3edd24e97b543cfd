"""Mixed precision keeps float32 master weights: training with half-precision
weights moves them as float32 training does, and float16 full fine-tuning steps.

Why the comparison holds exactly enough to test: AdamW's first step is
``delta = -lr * m_hat / (sqrt(v_hat) + eps) = -lr * g / (|g| + eps)`` (bias-corrected moments of one
gradient), so every element with |g| >> eps = 1e-8 moves by exactly lr, whatever its gradient's size or
the precision it was computed in. Two runs whose gradients differ only by rounding move the same
elements by the same amount; they can differ only where a gradient is within rounding of 0. Pure
bfloat16 AdamW instead rounds ``w - 1e-6`` back to ``w`` for any |w| > ~2.6e-4 (bf16 keeps 8 significant
bits: spacing 2^-8 |w|), so almost nothing moves.
"""

from dataclasses import replace

import pytest
import torch

import rftlib.train.build as build
import rftlib.train.loop as loop
from rftlib.train.loop import Trainer
from toy_rewards import ascii_digit_share as digit_reward  # varies between a prompt's samples: advantages non-zero

LR = 1e-6  # seed 000's order of magnitude; far below bf16's spacing for the tiny model's weights


def _one_step_delta(cfg, task_with) -> tuple[dict[str, torch.Tensor], Trainer]:
    """(per trainable parameter: weight after one optimizer step - before, in float32; the trainer)."""
    tr = Trainer(cfg, progress=False, task=task_with(cfg, digit_reward))
    try:
        before = {n: p.detach().float().clone() for n, p in tr.model.named_parameters() if p.requires_grad}
        tr.train()
        after = {n: p.detach().float() for n, p in tr.model.named_parameters() if p.requires_grad}
    finally:
        tr.close()
    return {n: after[n] - before[n] for n in before}, tr


def _moved_fraction(delta: dict[str, torch.Tensor]) -> float:
    """Fraction of trainable elements whose update is at least lr/2 in size (Adam's first step: lr)."""
    moved = sum(int((d.abs() > LR / 2).sum()) for d in delta.values())
    return moved / sum(d.numel() for d in delta.values())


@pytest.fixture(scope="module")
def bf16_exact_model(tiny_dir, tmp_path_factory):
    """The tiny model with every weight rounded to a bfloat16 value, saved in float32: loaded as float32 or
    as bfloat16 it holds the same numbers, so the two runs below differ only in how the update is applied."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path_factory.mktemp("bf16_exact")
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.bfloat16().float())
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_dir).save_pretrained(out)
    return str(out)


@pytest.mark.parametrize("lora_rank", [0, 4], ids=["full", "lora"])
def test_bf16_step_at_lr_1e6_moves_weights_as_fp32_training_does(tiny_cfg, task_with, bf16_exact_model, lora_rank):
    base = dict(model=bf16_exact_model, num_steps=1, save_steps=0, eval_steps=0, lr=LR, weight_decay=0.0,
                warmup_ratio=0.0, lora_rank=lora_rank, lora_alpha=2 * max(lora_rank, 1), autocast="bf16")
    d32, _ = _one_step_delta(tiny_cfg(**base, dtype="float32"), task_with)
    d16, tr = _one_step_delta(tiny_cfg(**base, dtype="bfloat16"), task_with)
    assert all(p.dtype == torch.float32 for p in tr.model.parameters() if p.requires_grad)  # the masters
    f32 = _moved_fraction(d32)
    # the float32 run trains (LoRA: only B moves on step 1; A's gradient is 0 while B is 0)
    assert f32 > (0.5 if lora_rank == 0 else 0.3), f32
    if lora_rank == 0:
        # every weight is a float32 master holding the same values, forwards run bf16 autocast on them:
        # the same update, element for element (pure-bf16 AdamW moved ~0%: each 1e-6 step is below bf16's
        # spacing and rounds away)
        for n in d32:
            torch.testing.assert_close(d16[n], d32[n], rtol=0, atol=0, msg=n)
        return
    # LoRA: the frozen base stays bfloat16 (that is LoRA's memory saving), so the ops autocast leaves alone
    # (norms, residual adds) round differently, the samples drawn differ and so do the gradients: compare how
    # much moves, not which elements. Adam's first step moves every element with |g| >> eps by lr; a
    # bf16 adapter would move none of them
    f16 = _moved_fraction(d16)
    assert f16 > 0.3 and abs(f16 - f32) < 0.1, (f16, f32)


def test_float16_full_finetune_steps_with_a_grad_scaler(tiny_cfg, task_with, monkeypatch):
    """float16 weights, full fine-tuning: the GradScaler unscales float32 masters' gradients (it refuses
    float16 ones: 'Attempting to unscale FP16 gradients', which crashed the first step before), and the
    step moves the weights. float16 is refused on a CPU for speed (the config, and resolve_dtype for
    device auto); the test steps past those two checks only, so the trainer takes its GPU path."""
    monkeypatch.setattr(build, "resolve_dtype", lambda name, device: name)
    cfg = replace(tiny_cfg(num_steps=1, save_steps=0, eval_steps=0, lr=1e-3, warmup_ratio=0.0, lora_rank=0),
                  dtype="float16")
    delta, tr = _one_step_delta(cfg, task_with)
    assert tr.backend.scaler is not None and tr.amp == torch.float16
    assert all(p.dtype == torch.float32 for p in tr.model.parameters() if p.requires_grad)
    assert _moved_fraction(delta) > 0.5


def _all_pass(text, ex, truncated):
    """Seed 002's FizzBuzz once the model solves it: every completion passes every test (reward 1.0)."""
    return 1.0, {"correctness": 1.0}


def test_float16_steps_through_an_optimizer_batch_with_no_live_row(tiny_cfg, task_with, monkeypatch):
    """Seed 002's setting: float16 with a GradScaler, LoRA, row skipping on, no KL term, and
    every group scoring 1.0, so every advantage is 0 and the update runs no micro-batch. The scaler must
    still see a backward before it unscales: before the fix the loop zero-filled the gradients and stepped,
    and GradScaler.unscale_ raised ("Attempted unscale_ but _scale is None"): the first all-solved batch
    crashed the run. torch.amp.GradScaler("cpu") is the same class a GPU run uses, so this runs here."""
    monkeypatch.setattr(build, "resolve_dtype", lambda name, device: name)  # float16 is refused on CPU for speed
    cfg = replace(tiny_cfg(num_steps=2, save_steps=0, eval_steps=0, lora_rank=4, lora_alpha=8, beta=0.0,
                           skip_zero_advantage_rows=True, warmup_ratio=0.0, weight_decay=0.0), dtype="float16")
    tr = Trainer(cfg, progress=False, task=task_with(cfg, _all_pass))
    try:
        assert isinstance(tr.backend.scaler, torch.amp.GradScaler) and tr.skips_rows()
        before = {n: p.detach().clone() for n, p in tr.model.named_parameters() if p.requires_grad}
        for _ in range(2):
            row = tr.step()
            assert row["advantage_std"] == 0.0 and row["grad_norm"] == 0.0  # nothing to learn from
        # a zero gradient moves no weight (no weight decay) and finds no inf: the scale stays at its start
        assert all(torch.equal(p, before[n]) for n, p in tr.model.named_parameters() if p.requires_grad)
        assert tr.backend.scaler.get_scale() == 2.0 ** 16
        assert tr.skipped_steps == 0 and tr.scheduler.last_epoch == 2  # both steps taken, the schedule on time
    finally:
        tr.close()


@pytest.mark.parametrize("lora_rank,stream", [(0, torch.float32), (4, torch.bfloat16)], ids=["full", "lora"])
def test_the_residual_stream_runs_in_the_embeddings_dtype(tiny_dir, lora_rank, stream):
    """What the memory preflight counts (tests/test_preflight_memory.py): bf16 weights with the
    torch backends' float32 masters under bf16 autocast. Full fine-tuning makes every weight a float32 master,
    the embedding too; autocast leaves the lookup and the residual adds alone, so every decoder layer's input
    (what gradient checkpointing keeps) is float32. Under LoRA the frozen bf16 base keeps it bfloat16."""
    from rftlib.models.loading import apply_lora, load_model_and_tokenizer
    from rftlib.backends.torch_backend import keep_float32_masters

    model, tok = load_model_and_tokenizer(str(tiny_dir), "bfloat16")
    model = apply_lora(model, rank=lora_rank, alpha=2 * max(lora_rank, 1), dropout=0.0,
                       target_modules=["q_proj", "v_proj"])
    keep_float32_masters([p for p in model.parameters() if p.requires_grad])  # what TorchBackend does
    seen = []
    layers = (model.get_base_model() if lora_rank else model).model.layers
    hooks = [layer.register_forward_pre_hook(lambda m, args, kw: seen.append(args[0].dtype if args else
                                                                              kw["hidden_states"].dtype),
                                             with_kwargs=True) for layer in layers]
    ids = tok("12 + 3 =", return_tensors="pt")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(**ids)
    for h in hooks:
        h.remove()
    assert len(seen) == len(layers) and set(seen) == {stream}
