"""Each registered policy loss declares its clip settings, the
aggregations its objective is defined under and its own checks (rftlib.algo.loss_spec); the config
and the trainer read the declaration and name no loss.

GSPO and GMPO average a per-completion quantity over completions (only seq-mean-token-mean computes
that; token-mean weighs a completion by its length), CISPO normalises by the batch's token count.
"""

import pytest
import torch

import rftlib.train.loop as loop
from rftlib.algo.loss_spec import POLICY_LOSSES, register_loss
from rftlib.config import ConfigError, make_config
from rftlib.train.steps import clip_range, loss_kwargs
from toy_rewards import half_constant_reward


@pytest.mark.parametrize("name, agg", [("ppo_clip", "seq-mean-token-mean"), ("gspo", "seq-mean-token-mean"),
                                       ("gmpo", "seq-mean-token-mean"), ("cispo", "token-mean")])
def test_auto_aggregation_is_the_loss_own(name, agg):
    cfg = make_config(None, {"policy_loss": name})
    assert cfg.loss_agg_mode == "auto"  # stored as given, so a saved config re-validates with another loss
    assert loss_kwargs(cfg)["aggregation"] == agg


@pytest.mark.parametrize("name, agg, reason", [
    ("gspo", "token-mean", r"GSPO's objective is the mean over completions .* use seq-mean-token-mean \(or auto\)"),
    ("gspo", "seq-mean-token-sum-norm", "GSPO.* weights each completion by its length"),
    ("gmpo", "token-mean", r"GMPO's loss is one number per completion.* use seq-mean-token-mean"),
    ("cispo", "seq-mean-token-mean", r"CISPO normalises by the batch's token count .* use token-mean or "
                                     r"seq-mean-token-sum-norm"),
])
def test_an_aggregation_the_loss_is_not_defined_under_is_refused_with_the_reason(name, agg, reason):
    with pytest.raises(ConfigError, match=rf"loss_agg_mode='{agg}' with policy_loss {name}: {reason}"):
        make_config(None, {"policy_loss": name, "loss_agg_mode": agg})


def test_aggregations_a_loss_is_defined_under_are_taken_as_given():
    for agg in ("seq-mean-token-mean", "seq-mean-token-sum-norm", "token-mean"):  # a per-token surrogate: any
        assert loss_kwargs(make_config(None, {"loss_agg_mode": agg}))["aggregation"] == agg
    cfg = make_config(None, {"policy_loss": "cispo", "loss_agg_mode": "seq-mean-token-sum-norm"})
    assert loss_kwargs(cfg)["aggregation"] == "seq-mean-token-sum-norm"


def test_every_preset_still_validates_and_runs_the_aggregation_it_did():
    from pathlib import Path

    for p in sorted(Path("params").glob("*.yaml")):
        cfg = make_config(p.stem)
        # no preset names a policy loss: ppo_clip, whose auto is GRPO's mode; Dr-GRPO presets keep theirs
        want = "seq-mean-token-sum-norm" if "drgrpo" in p.stem else "seq-mean-token-mean"
        assert loss_kwargs(cfg)["aggregation"] == want, p.stem


# ---- a loss registered in one place, then validated and trained with --------------------------------
@pytest.fixture
def toy_loss(monkeypatch):
    """Register 'toy_reinforce' (REINFORCE with a clipped IS weight, token-mean only) for one test."""
    monkeypatch.setattr(POLICY_LOSSES, "_table", dict(POLICY_LOSSES._table))  # the registration ends with the test
    calls = []

    def checks(v):
        return [] if v["eps_clip_high"] is None or v["eps_clip_high"] <= 0.5 else [
            f"eps_clip_high={v['eps_clip_high']}: toy_reinforce caps its weight at 1.5"]

    @register_loss("toy_reinforce", clip_fields=("eps_clip", "eps_clip_high"), aggregations=("token-mean",),
                   why="toy_reinforce is written for token-mean", validate=checks)
    def toy_reinforce(logprobs, old_logprobs, advantages, mask, *, clip_low, clip_high, dual_clip, log_ratio_clamp):
        calls.append((clip_low, clip_high))
        w = torch.exp(logprobs - old_logprobs).detach().clamp(max=1.0 + clip_high)  # (N, T)
        return -w * advantages.unsqueeze(-1) * logprobs, {}

    return calls


def test_a_registered_loss_is_validated_from_its_spec(toy_loss):
    cfg = make_config(None, {"policy_loss": "toy_reinforce", "eps_clip": 0.1, "eps_clip_high": 0.3})
    assert clip_range(cfg) == (0.1, 0.3) and loss_kwargs(cfg)["aggregation"] == "token-mean"
    with pytest.raises(ConfigError, match="loss_agg_mode='seq-mean-token-mean' with policy_loss toy_reinforce: "
                                          "toy_reinforce is written for token-mean; use token-mean"):
        make_config(None, {"policy_loss": "toy_reinforce", "loss_agg_mode": "seq-mean-token-mean"})
    with pytest.raises(ConfigError, match="eps_clip_high=0.8: toy_reinforce caps its weight at 1.5"):
        make_config(None, {"policy_loss": "toy_reinforce", "eps_clip_high": 0.8})
    with pytest.raises(ConfigError, match="dual_clip=3.0 with policy_loss toy_reinforce: .* set dual_clip null"):
        make_config(None, {"policy_loss": "toy_reinforce", "dual_clip": 3.0})


def test_a_registered_loss_with_an_unknown_clip_setting_is_refused(monkeypatch):
    monkeypatch.setattr(POLICY_LOSSES, "_table", dict(POLICY_LOSSES._table))
    register_loss("typo_loss", clip_fields=("eps_clp", "eps_clip_high"))(lambda *a, **k: None)
    with pytest.raises(ConfigError, match="policy_loss 'typo_loss' takes its clip from 'eps_clp', which is not a "
                                          "RunConfig field"):
        make_config(None, {})


def test_a_registered_loss_trains_through_the_trainer(tiny_cfg, monkeypatch, toy_loss, task_with):
    seen = []
    real = loop.grpo_loss
    monkeypatch.setattr(loop, "grpo_loss", lambda *a, **kw: seen.append(kw) or real(*a, **kw))
    adv = []
    real_adv = loop.compute_advantages
    monkeypatch.setattr(loop, "compute_advantages", lambda *a, **kw: adv.append(real_adv(*a, **kw)) or adv[-1])
    cfg = tiny_cfg(policy_loss="toy_reinforce", eps_clip_high=0.3, lr=1e-2, warmup_ratio=0.0)
    tr = loop.Trainer(cfg, progress=False, task=task_with(cfg, half_constant_reward))
    before = {k: v.detach().clone() for k, v in tr.model.named_parameters() if v.requires_grad}
    try:
        row = tr.step()
    finally:
        tr.close()
    assert (adv[-1] != 0).any()  # a learning signal to train on
    assert toy_loss and set(toy_loss) == {(0.2, 0.3)}  # its clip settings, read through its spec
    assert {(kw["policy_loss"], kw["aggregation"]) for kw in seen} == {("toy_reinforce", "token-mean")}
    assert row["grad_norm"] > 0 and (row["eps_clip_low"], row["eps_clip_high"]) == (0.2, 0.3)
    assert any(not torch.equal(before[k], v) for k, v in tr.model.named_parameters() if v.requires_grad)
