"""rftlib.models.flex: a run that loads flex attention raises dynamo's recompile limit above the trainer's call mix
(bench/flex_recompiles.py measures it) and says so when a compiled frame falls back to running uncompiled, which
for flex attention is its unfused path holding (heads, T, T) scores (issue 42, item 6)."""

import torch

from rftlib.models import flex


def test_the_bound_raises_the_limits_and_restores_them():
    cfg = torch._dynamo.config
    before = (cfg.recompile_limit, cfg.accumulated_recompile_limit)
    with flex.bound_flex_recompiles(limit=96):
        assert (cfg.recompile_limit, cfg.accumulated_recompile_limit) == (max(before[0], 96), max(before[1], 384))
    assert (cfg.recompile_limit, cfg.accumulated_recompile_limit) == before


def test_a_frame_past_the_recompile_limit_is_reported(capsys):
    """A function compiled (eager backend: no codegen) for three dtypes under a limit of 2: the third call runs
    uncompiled, and rftlib prints its warning once, naming the unfused memory it costs."""
    torch._dynamo.reset()

    def f(x):
        return x * 2 + 1

    g = torch.compile(f, backend="eager")
    with flex.bound_flex_recompiles():
        torch._dynamo.config.recompile_limit = 2  # inside the block: restored on exit
        for dtype in (torch.float32, torch.float64, torch.int64):
            assert torch.equal(g(torch.ones(3, dtype=dtype)), torch.full((3,), 3, dtype=dtype))
        hits = flex.fallbacks()
    torch._dynamo.reset()
    out = capsys.readouterr().out
    assert len(hits) == 1 and "recompile_limit" in hits[0], hits
    assert out.count("[rft] WARNING: flex attention hit torch.compile's recompile limit (2)") == 1, out


def test_the_logprob_forward_asks_flex_on_cuda_for_its_main_kernel(monkeypatch):
    """flex_forward_kwargs: the main kernel for flex on CUDA, a fresh dict each call (torch fills its defaults in),
    nothing for other attention or a CPU; and completion_logprobs hands the kwargs to the backbone (what reaches
    transformers' flex_attention_forward as kernel_options)."""
    import types

    import rftlib.models.forward as fwd
    from rftlib.models.flex import flex_forward_kwargs
    from rftlib.models.loading import load_model_and_tokenizer

    flex = types.SimpleNamespace(_attn_implementation="flex_attention")
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    a, b = flex_forward_kwargs(flex, cuda), flex_forward_kwargs(flex, cuda)
    assert a == {"kernel_options": {"BACKEND": "TRITON"}} and a["kernel_options"] is not b["kernel_options"]
    assert flex_forward_kwargs(flex, cpu) == {}
    assert flex_forward_kwargs(types.SimpleNamespace(_attn_implementation="sdpa"), cuda) == {}
    model, _ = load_model_and_tokenizer("tiny")
    seen = []
    real = type(fwd.policy_parts(model).backbone).forward

    def spy(self, *a, **kw):
        seen.append(kw.get("kernel_options"))
        kw.pop("kernel_options", None)
        return real(self, *a, **kw)

    monkeypatch.setattr(type(fwd.policy_parts(model).backbone), "forward", spy)
    monkeypatch.setattr(fwd, "flex_forward_kwargs", lambda config, device: {"kernel_options": {"BACKEND": "X"}})
    ids = torch.ones(1, 3, dtype=torch.long)
    fwd.completion_logprobs(model, ids, torch.ones_like(ids), ids, torch.ones_like(ids))
    assert seen == [{"BACKEND": "X"}]
