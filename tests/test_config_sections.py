"""The config's sections: declared choices and ranges refuse bad values naming the field, each section
checks itself, RunConfig keeps every flat name, and the derived values are computed in one place."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from rftlib.config import ConfigError, RunConfig, config_fields, make_config, to_dict
from rftlib.settings import (SECTIONS, EngineSettings, LaunchSettings, ModelSettings, OptimizationSettings,
                             RolloutSettings, Section, declared_problems)


def test_runconfig_is_every_section_in_order_and_nothing_else():
    names = [f.name for cls in SECTIONS for f in dataclasses.fields(cls)]
    assert len(names) == len(set(names)), "a field is declared in two sections"
    assert list(config_fields()) == names
    assert all(issubclass(RunConfig, cls) for cls in SECTIONS)


def test_section_hands_a_lower_layer_only_its_fields():
    cfg = make_config(None, {"temperature": 0.7, "n_samples_per_prompt": 4})
    ro = cfg.section(RolloutSettings)
    assert type(ro) is RolloutSettings and not isinstance(ro, RunConfig)
    assert (ro.temperature, ro.n_samples_per_prompt) == (0.7, 4)
    assert not hasattr(ro, "lr")  # only the rollout's fields
    assert set(dataclasses.asdict(ro)) == {f.name for f in dataclasses.fields(RolloutSettings)}


@pytest.mark.parametrize("override, message", [
    ({"dtype": "fp8"}, "dtype='fp8': choose auto, float32, bfloat16 or float16"),
    ({"vllm_weight_sync": "ftp"}, "vllm_weight_sync='ftp': choose auto, nccl, rpc or disk"),
    ({"top_p": 1.5}, r"top_p=1.5: must be in \(0, 1\]"),
    ({"warmup_ratio": 1.0}, r"warmup_ratio=1.0: must be in \[0, 1\)"),
    ({"tis_cap": 0.5}, "tis_cap=0.5: the truncated-IS cap must be >= 1"),
    ({"vllm_base_port": 70000}, "vllm_base_port=70000: not a TCP port"),
    ({"n_samples_per_prompt": 1}, "n_samples_per_prompt=1: GRPO needs at least 2 generations"),
])
def test_declared_choices_and_ranges_refuse_naming_the_field(override, message):
    with pytest.raises(ConfigError, match=message):
        make_config(None, override)


def test_optional_ranged_fields_accept_none_and_check_a_value():
    assert make_config(None, {"dual_clip": None}).dual_clip is None
    assert make_config(None, {"dual_clip": 3.0}).dual_clip == 3.0
    with pytest.raises(ConfigError, match="dual_clip=1.0: the dual-clip constant must be > 1"):
        make_config(None, {"dual_clip": 1.0})


def test_every_closed_choice_is_a_literal_whose_default_is_one_of_its_choices():
    hints = typing.get_type_hints(RunConfig)
    literals = {n: typing.get_args(t) for n, t in hints.items() if typing.get_origin(t) is typing.Literal}
    assert {"dtype", "autocast", "eval_dtype", "vllm_dtype", "vllm_placement", "tis_level",
            "dynamic_sampling", "logprob_recompute", "zero3_gather_for_generation"} <= set(literals)
    defaults = to_dict(RunConfig())
    for name, choices in literals.items():
        assert defaults[name] in choices, name


def test_a_section_checks_itself_without_the_rest_of_the_config():
    assert ModelSettings().check() == []
    assert ModelSettings(lora_rank=-1).check() == ["lora_rank=-1: use 0 for full fine-tuning or a positive rank"]
    assert ModelSettings(init_adapter="adapters/sft", lora_rank=0).check() == [
        "init_adapter needs LoRA (lora_rank > 0): it loads a LoRA adapter"]
    assert EngineSettings(vllm_placement="nowhere").check() == [
        "vllm_placement='nowhere': choose colocate or server"]
    problems = LaunchSettings(train_gpus=[0, 1], rollout_gpus=[1, 2]).check()
    assert problems == ["train_gpus=[0, 1] and rollout_gpus=[1, 2] share GPUs [1]: give each GPU one role"]


def test_a_new_section_gets_the_declared_checks_for_free():
    from rftlib.settings import ranged

    @dataclasses.dataclass
    class Probe(Section):
        mode: typing.Literal["a", "b"] = "a"
        rate: float = ranged(0.5, ge=0, le=1)

    assert Probe().check() == []
    assert declared_problems(Probe(mode="c", rate=2.0)) == ["mode='c': choose a or b", "rate=2.0: must be in [0, 1]"]
    assert Probe(rate=float("nan")).check()[0] == "rate=nan: must be a finite number (NaN and inf are refused)"


@pytest.mark.parametrize("over", [
    {},
    {"num_steps": 7, "rollout_batch_size": 8, "train_batch_size": 2, "num_updates_per_rollout": 3,
     "micro_batch_size": 2, "warmup_ratio": 0.1},
    {"pool_size": 400, "num_episodes": 2, "rollout_batch_size": 16, "micro_batch_size": 16},
])
def test_derived_schedule_values(over):
    cfg = make_config(None, over)
    rbs = over.get("rollout_batch_size", 8)
    tbs = over.get("train_batch_size") or rbs
    steps = over["pool_size"] // rbs * over["num_episodes"] if "pool_size" in over else over.get("num_steps", 30)
    total = steps * over.get("num_updates_per_rollout", 1) * (rbs // tbs)  # worked out here, not read back
    assert cfg.total_optimizer_steps == total
    ratio = over.get("warmup_ratio", 0.05)
    assert cfg.warmup_steps == -(-int(round(ratio * 1000)) * total // 1000)  # ceil(ratio x total), OpenRLHF's
    from rftlib.config import schedule
    assert schedule(cfg)["optimizer_steps"] == total


def test_derived_kl_and_policy_facts():
    assert not make_config(None, {}).needs_reference
    cfg = make_config(None, {"beta": 0.04})
    assert cfg.needs_reference and cfg.kl_in_loss
    cfg = make_config(None, {"beta": 0.04, "kl_in_reward": True, "kl_estimator": "k1"})
    assert cfg.needs_reference and not cfg.kl_in_loss
    assert make_config(None, {}).on_policy  # hf engine on the trainer's module, one step per rollout
    assert not make_config(None, {"num_updates_per_rollout": 2}).on_policy
    assert not make_config(None, {"rollout_engine": "vllm"}).on_policy


def test_flat_names_replace_and_yaml_keys_keep_working(tmp_path):
    p = tmp_path / "x.yaml"
    p.write_text("eps_clip: 0.1\nvllm_num_engines: 2\n")
    cfg = make_config(p, {"lr": 1e-3})
    assert (cfg.eps_clip, cfg.vllm_num_engines, cfg.lr) == (0.1, 2, 1e-3)
    assert dataclasses.replace(cfg, eps_clip=0.3).section(OptimizationSettings).lr == 1e-3


def test_literals_that_mirror_a_catalog_name_the_same_choices():
    """loss_seq_norm and reward_mode are closed sets the algorithm / reward code defines; their Literal must
    list the same values (the config refuses by the Literal, the code branches on the catalog)."""
    from rftlib.algo.catalog import SEQ_NORMS
    from rftlib.rewards.math import MODES

    hints = typing.get_type_hints(RunConfig)
    assert typing.get_args(hints["loss_seq_norm"]) == SEQ_NORMS
    assert typing.get_args(hints["reward_mode"]) == MODES
