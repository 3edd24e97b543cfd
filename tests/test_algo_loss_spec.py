"""Each registered policy loss declares its settings class (its fields, ranges and rules, and clip_range():
the clip the loss is called with), the aggregations its objective is defined under and its default one
(rftlib.algo.loss_spec); the config and the trainer read the declaration and name no loss. A loss with
settings of its own (the toy loss below: toy_clip) is added by its settings class and its function, in this
file alone: no config field is written for it.

GSPO and GMPO average a per-completion quantity over completions (only seq-mean-token-mean computes
that; token-mean weighs a completion by its length), CISPO normalises by the batch's token count.
"""

from dataclasses import dataclass

import pytest
import torch
import yaml

import rftlib.train.loop as loop
from rftlib.algo.loss_spec import POLICY_LOSSES, register_loss
from rftlib.config import ConfigError, make_config, to_dict
from rftlib.settings import Section, ranged
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


@pytest.mark.parametrize("overrides, message", [
    ({"eps_clip": 0.0}, r"eps_clip=0.0: must be in \(0, 1\) \(seed 003 uses 0.1-0.2\)"),
    ({"eps_clip_high": -0.1}, r"eps_clip_high=-0.1: must be > 0 \(DAPO's clip-higher uses 0.28\)"),
    ({"gspo_eps_clip_high": 1.5}, r"gspo_eps_clip_high=1.5: must be in \(0, 1\) \(GSPO's sequence-ratio range"),
    ({"cispo_eps_clip": 1.5}, r"cispo_eps_clip=1.5: must be in \[0, 1\] \(1: no floor on the IS weight"),
    ({"cispo_eps_clip_high": 0.0}, r"cispo_eps_clip_high=0.0: must be > 0 \(the IS-weight ceiling"),
    ({"gmpo_eps_clip": 0.0}, r"gmpo_eps_clip=0.0: must be > 0 \(a log-ratio bound; GMPO's paper uses 0.4\)"),
])
def test_every_builtin_loss_settings_class_checks_its_values_in_use_or_not(overrides, message):
    # policy_loss stays ppo_clip: gspo's, cispo's and gmpo's values are checked all the same (wrong either way)
    with pytest.raises(ConfigError, match=f"^{message}"):
        make_config(None, overrides)


# ---- a loss registered in one place, with settings of its own, then validated and trained with ------------

@dataclass
class ToySettings(Section):
    """toy_reinforce's own settings: its IS-weight cap, declared here only (no RunConfig field is written)."""

    toy_clip: float = ranged(0.2, gt=0, lt=1, msg="must be in (0, 1) (the toy's weight cap is 1 + this)")
    """the IS weight is capped at 1 + toy_clip_high (toy_clip when that is None)"""
    toy_clip_high: float | None = None
    """the cap above, if not toy_clip's"""

    def rules(self) -> list[str]:
        if self.toy_clip_high is not None and self.toy_clip_high < self.toy_clip:
            return [f"toy_clip_high={self.toy_clip_high}: below toy_clip={self.toy_clip}"]
        return []

    def clip_range(self):
        return self.toy_clip, self.toy_clip_high


@pytest.fixture
def toy_loss(monkeypatch):
    """Register 'toy_reinforce' (REINFORCE with a capped IS weight, token-mean only) with ToySettings for one
    test; returns the (clip_low, clip_high) of each call."""
    monkeypatch.setattr(POLICY_LOSSES, "_table", dict(POLICY_LOSSES._table))  # the registration ends with the test
    calls = []

    @register_loss("toy_reinforce", settings=ToySettings, aggregations=("token-mean",),
                   why="toy_reinforce is written for token-mean")
    def toy_reinforce(logprobs, old_logprobs, advantages, mask, *, clip_low, clip_high, dual_clip, log_ratio_clamp):
        calls.append((clip_low, clip_high))
        w = torch.exp(logprobs - old_logprobs).detach().clamp(max=1.0 + clip_high)  # (N, T)
        return -w * advantages.unsqueeze(-1) * logprobs, {}

    return calls


def test_a_registered_loss_takes_its_own_settings(toy_loss, tmp_path):
    cfg = make_config(None, {"policy_loss": "toy_reinforce", "toy_clip": 0.3})
    assert cfg.toy_clip == 0.3 and cfg.toy_clip_high is None and cfg.loss_args == {"toy_clip": 0.3}
    assert cfg.section(ToySettings) == ToySettings(toy_clip=0.3, toy_clip_high=None)
    assert clip_range(cfg) == (0.3, 0.3) and loss_kwargs(cfg)["aggregation"] == "token-mean"
    assert clip_range(make_config(None, {"policy_loss": "toy_reinforce", "toy_clip": 0.3, "toy_clip_high": 0.5})) == (0.3, 0.5)
    default = make_config(None, {"policy_loss": "toy_reinforce"})  # not given: ToySettings' default
    assert default.toy_clip == 0.2 and default.loss_args == {} and clip_range(default) == (0.2, 0.2)
    assert make_config(None, {"policy_loss": "toy_reinforce", "toy_clip": "0.3"}).toy_clip == 0.3  # as the CLI gives it
    assert make_config(None, {"policy_loss": "toy_reinforce", "loss_args": {"toy_clip": 0.3}}).toy_clip == 0.3
    preset = tmp_path / "toy.yaml"
    preset.write_text("policy_loss: toy_reinforce\ntoy_clip: 0.25\n")  # a preset names it flat, as any field
    assert make_config(preset).toy_clip == 0.25


def test_a_registered_loss_settings_are_checked_by_its_settings_class(toy_loss):
    toy = {"policy_loss": "toy_reinforce"}
    with pytest.raises(ConfigError, match=r"^toy_clip=1.5: must be in \(0, 1\) \(the toy's weight cap is 1 \+ this\)"):
        make_config(None, {**toy, "toy_clip": 1.5})
    with pytest.raises(ConfigError, match=r"^toy_clip_high=0.1: below toy_clip=0.3"):  # its rules()
        make_config(None, {**toy, "toy_clip": 0.3, "toy_clip_high": 0.1})
    with pytest.raises(ConfigError, match=r"^parameter 'toy_clip' in overrides: expected float, got str 'wide'"):
        make_config(None, {**toy, "toy_clip": "wide"})
    with pytest.raises(ConfigError, match=r"^toy_clip=nan: must be a finite number"):
        make_config(None, {**toy, "toy_clip": float("nan")})
    with pytest.raises(ConfigError, match=r"^toy_clip is a setting of policy_loss 'toy_reinforce'; with policy_loss "
                                          r"'gspo' it would change nothing: set policy_loss toy_reinforce, or leave "
                                          r"toy_clip out"):
        make_config(None, {"policy_loss": "gspo", "toy_clip": 0.3})
    with pytest.raises(ConfigError, match=r"^unknown parameter 'toy_clp' in overrides; did you mean toy_clip"):
        make_config(None, {**toy, "toy_clp": 0.3})
    with pytest.raises(ConfigError, match="loss_agg_mode='seq-mean-token-mean' with policy_loss toy_reinforce: "
                                          "toy_reinforce is written for token-mean; use token-mean"):
        make_config(None, {**toy, "loss_agg_mode": "seq-mean-token-mean"})
    with pytest.raises(ConfigError, match="dual_clip=3.0 with policy_loss toy_reinforce: .* set dual_clip null"):
        make_config(None, {**toy, "dual_clip": 3.0})


def test_an_unregistered_loss_setting_is_unknown():
    # without the toy's registration, toy_clip is nobody's setting
    with pytest.raises(ConfigError, match=r"^unknown parameter 'toy_clip' in overrides"):
        make_config(None, {"toy_clip": 0.3})


def test_a_registered_loss_settings_are_written_flat_and_read_back(toy_loss):
    cfg = make_config(None, {"policy_loss": "toy_reinforce", "toy_clip": 0.3})
    d = to_dict(cfg)
    assert "loss_args" not in d and (d["toy_clip"], d["toy_clip_high"]) == (0.3, None)  # what ran, defaults too
    again = make_config(None, yaml.safe_load(yaml.safe_dump(d)))  # as config.yaml is written and resumed
    assert to_dict(again) == d and again.section(ToySettings) == ToySettings(0.3, None) and again.toy_clip == 0.3
    plain = to_dict(make_config(None, {}))  # no loss setting outside RunConfig's fields: its fields alone
    assert "loss_args" not in plain and "toy_clip" not in plain


def test_a_loss_settings_class_must_say_its_clip_range(monkeypatch):
    monkeypatch.setattr(POLICY_LOSSES, "_table", dict(POLICY_LOSSES._table))

    @dataclass
    class NoClip(Section):
        typo_clip: float = 0.2

    with pytest.raises(ValueError, match=r"settings=.*NoClip.*: a policy loss's settings must be a @dataclass "
                                         r"subclass of rftlib.settings.Section with a clip_range\(\) method"):
        register_loss("typo_loss", settings=NoClip)(lambda *a, **k: None)

    @dataclass
    class NoDefault(Section):
        typo_clip: float

        def clip_range(self):
            return self.typo_clip, None

    with pytest.raises(ValueError, match=r"settings NoDefault.typo_clip has no default"):
        register_loss("typo_loss", settings=NoDefault)(lambda *a, **k: None)
    assert "typo_loss" not in POLICY_LOSSES


def test_a_registered_loss_trains_through_the_trainer(tiny_cfg, monkeypatch, toy_loss, task_with):
    seen = []
    real = loop.grpo_loss
    monkeypatch.setattr(loop, "grpo_loss", lambda *a, **kw: seen.append(kw) or real(*a, **kw))
    adv = []
    real_adv = loop.compute_advantages
    monkeypatch.setattr(loop, "compute_advantages", lambda *a, **kw: adv.append(real_adv(*a, **kw)) or adv[-1])
    cfg = tiny_cfg(policy_loss="toy_reinforce", toy_clip=0.3, lr=1e-2, warmup_ratio=0.0)
    tr = loop.Trainer(cfg, progress=False, task=task_with(cfg, half_constant_reward))
    before = {k: v.detach().clone() for k, v in tr.model.named_parameters() if v.requires_grad}
    try:
        row = tr.step()
    finally:
        tr.close()
    assert (adv[-1] != 0).any()  # a learning signal to train on
    assert toy_loss and set(toy_loss) == {(0.3, 0.3)}  # its own clip, toy_clip (toy_clip_high None: the same)
    assert {(kw["policy_loss"], kw["aggregation"]) for kw in seen} == {("toy_reinforce", "token-mean")}
    assert row["grad_norm"] > 0 and (row["eps_clip_low"], row["eps_clip_high"]) == (0.3, 0.3)
    assert any(not torch.equal(before[k], v) for k, v in tr.model.named_parameters() if v.requires_grad)
    # the attempt's config.yaml keeps it, and a resume reads it back
    assert yaml.safe_load((tr.run_dir / "config.yaml").read_text())["config"]["toy_clip"] == 0.3
    resumed = loop.resume_config(tr.run_dir, num_steps=cfg.num_steps + 1)
    assert resumed.toy_clip == 0.3 and clip_range(resumed) == (0.3, 0.3)
