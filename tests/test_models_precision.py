"""Precision: the float32 reference forward, the probe's threshold derived from measured noise, and what an
attempt says about the precision it ran in."""

import dataclasses

import pytest
import torch

from rftlib.models.forward import completion_logprobs
from rftlib.models.precision import describe, float32_compute
from rftlib.models.tiny import build_tiny_model
from rftlib.rollout.sync_probe import MARGIN, sync_threshold


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    d = build_tiny_model(tmp_path_factory.mktemp("tiny"), hidden=64, layers=2)
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    with torch.no_grad():  # weights of a trained model's scale, so bf16 rounding shows in the log-probs
        for p in model.parameters():
            p.mul_(8.0 if p.dim() == 2 else 1.0)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 360, (3, 14), generator=g)  # the tiny tokenizer's 363 ids  # (N, P+T)
    rows = dict(prompt_ids=ids[:, :8], prompt_mask=torch.ones(3, 8), completion_ids=ids[:, 8:],
                completion_mask=torch.ones(3, 6))
    return model, rows


def _lp(model, rows):
    with torch.no_grad():
        return completion_logprobs(model, **rows, with_entropy=False)[0]  # (N, T)


def test_float32_compute_runs_bf16_weights_in_float32(tiny):
    """bf16 weights under float32_compute give the float32 forward of those (rounded) weights: every op upcast,
    no cast back to bf16 inside the model (RMSNorm's .to(input_dtype), the bf16 attention mask) survives."""
    model, rows = tiny
    half = type(model)(model.config).eval()
    half.load_state_dict(model.state_dict())
    half = half.to(torch.bfloat16)
    exact = type(model)(model.config).eval()
    exact.load_state_dict({k: v.float() for k, v in half.state_dict().items()})  # the same rounded values, float32
    exact_buffers = dict(exact.named_buffers())
    for name, buf in half.named_buffers():  # rotary inv_freq too (not in the state dict), as the bf16 model holds it
        exact_buffers[name].copy_(buf.float())
    want = _lp(exact, rows)
    with float32_compute("cpu"):
        got = _lp(half, rows)
    plain = _lp(half, rows)  # the bf16 forward, for scale
    bf16_gap = float((plain.float() - want).abs().max())
    print(f"bf16 weights: float32_compute vs float32 copy {float((got - want).abs().max()):.2g}, "
          f"plain bf16 forward {bf16_gap:.2g}")
    assert got.dtype == torch.float32
    # float32 vs float32 through the same kernels: rounding of order 1e-6 x the logits' scale
    assert torch.allclose(got, want, atol=1e-4, rtol=0)
    assert bf16_gap > 100 * float((got - want).abs().max())  # the check could see a bf16 leak


def test_float32_compute_keeps_float32_through_casts_and_dtypes():
    """What model code does that would round to a half dtype inside the block (an explicit cast, a tensor made
    with a half dtype, a half weight) stays float32, so the reference really is float32 arithmetic."""
    x = torch.tensor([1.0 + 2**-12, 3.0])  # 1 + 2^-12 is not a bf16 value (8 mantissa bits)
    w = torch.tensor([2.0, 1.0], dtype=torch.bfloat16)
    with float32_compute("cpu"):
        casts = [x.to(torch.bfloat16), x.bfloat16(), x.half(), x.to(dtype=torch.float16), x.type(torch.bfloat16)]
        made = torch.full((2,), 1.0 + 2**-12, dtype=torch.bfloat16)
        prod = x * w
    assert all(c.dtype == torch.float32 and torch.equal(c, x) for c in casts)
    assert made.dtype == torch.float32 and made[0] == 1.0 + 2**-12
    assert prod.dtype == torch.float32 and torch.equal(prod, x * w.float())


def test_float32_compute_undoes_autocast(tiny):
    model, rows = tiny
    ref = _lp(model, rows)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        amp = _lp(model, rows)
        with float32_compute("cpu"):
            inner = _lp(model, rows)
    assert torch.equal(inner, ref)
    assert float((amp - ref).abs().max()) > 1e-3


def test_the_sync_threshold_comes_from_the_measured_noise():
    assert sync_threshold(1e-7, 0.05) == 0.05  # float32: the configured floor
    assert sync_threshold(0.15, 0.05) == pytest.approx(MARGIN * 0.15)  # bf16: 0.6, not 0.05


def test_describe_says_when_a_cpu_run_is_not_in_the_gpus_precision():
    cpu32 = describe("float32", None, "float32", "cpu")
    assert "no native bf16" in cpu32["note"] and "engines run float32" in cpu32["note"]
    assert describe("float32", torch.bfloat16, "bfloat16", "cpu") == {
        "trainer": "float32 weights, bfloat16 autocast", "engine": "bfloat16", "note": ""}
    assert "vllm_dtype" in describe("float32", torch.bfloat16, "float32", "cpu")["note"]
    assert describe("bfloat16", torch.bfloat16, "bfloat16", "cuda")["note"] == ""


def test_float16_runs_are_told_the_overflow_risk_and_the_bf16_alternative(capsys, tmp_path):
    """Seed 002 trains Qwen2.5 in float16 ("Dtype: float16 (memory optimization)"), which Qwen2-family models,
    trained in bf16, are reported to overflow (QwenLM/Qwen3 #761, #868, #826). The preset keeps float16; `rft
    preflight` and the launch plan say the risk and that its RTX 3080 (sm_86, Ampere) has bfloat16 at the same
    memory. Before the fix neither said anything."""
    from rftlib import cli
    from rftlib.config import make_config
    from rftlib.launch.plan import format_plan, make_plan
    from rftlib.models.precision import float16_note

    note = float16_note("float16", "Qwen/Qwen2.5-Coder-0.5B-Instruct", "RTX3080-10GB")
    assert "Qwen2-family" in note and "65504" in note and "#761, #868, #826" in note
    assert note.endswith("the RTX3080-10GB (sm_86) has it: --set dtype=bfloat16 avoids the overflow at the same memory")
    assert "an activation past float16's largest value (65504) becomes inf" in float16_note("float16", "other/llama", None)
    assert float16_note("bfloat16", "Qwen/Qwen2.5-1.5B", "H100-80GB") == ""
    assert float16_note("float32", "Qwen/Qwen2.5-1.5B", None) == ""

    cfg = make_config("seed002-fizzbuzz-rtx3080", {"runs_root": str(tmp_path)})
    assert cfg.dtype == "float16"  # the seed's own setting is kept
    cli.main(["preflight", "-p", "seed002-fizzbuzz-rtx3080"])
    out = capsys.readouterr().out
    assert "  precision: dtype float16: Qwen/Qwen2.5-Coder-0.5B-Instruct is a Qwen2-family model" in out
    plan = make_plan(dataclasses.replace(cfg, device="cuda", launch_gpu_type="RTX3080-10GB"), tmp_path / "run",
                     gpus_per_node=1)
    assert "NOTE: dtype float16: " in format_plan(plan) and "(sm_86) has it: --set dtype=bfloat16" in plan.precision["note"]


def test_building_the_tiny_model_leaves_the_callers_random_stream(tmp_path):
    """The first run on a fresh clone builds the tiny model (rftlib.models.tiny.tiny_model_dir); it must then draw
    the samples a run that finds the model built draws. build_tiny_model seeded torch's global generator, so a cold
    cache moved every later draw of the process (a first metrics fingerprint on a fresh clone differed from every
    later one). The weights are still the seed's, whatever the caller's stream."""
    from safetensors.torch import load_file

    torch.manual_seed(123)
    want = torch.rand(8)
    torch.manual_seed(123)
    a = build_tiny_model(tmp_path / "a")
    assert torch.equal(torch.rand(8), want)
    torch.manual_seed(7)  # another caller's stream: the same weights
    b = build_tiny_model(tmp_path / "b")
    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
