import pytest

from rftlib.config import ConfigError, RunConfig, field_docs, make_config


def test_defaults_and_preset_overrides():
    cfg = make_config("default")
    assert cfg.model == "smollm2-135m" and cfg.warmup_ratio == 0.0  # preset value
    assert cfg.eps_clip == RunConfig().eps_clip  # untouched default
    assert make_config("default", {"eps_clip": 0.1}).eps_clip == 0.1


def test_every_field_documented():
    docs = field_docs()
    missing = [f for f in RunConfig.__dataclass_fields__ if not docs.get(f)]
    assert missing == []


def test_unknown_key_lists_near_match():
    with pytest.raises(ConfigError, match=r"unknown parameter 'eps_clp' in overrides; did you mean eps_clip"):
        make_config(None, {"eps_clp": 0.1})


def test_unknown_key_in_preset_names_file(tmp_path):
    p = tmp_path / "x.yaml"
    p.write_text("lr: 1e-4\nnum_step: 3\n")
    with pytest.raises(ConfigError, match=r"unknown parameter 'num_step' in .*x.yaml; did you mean num_steps"):
        make_config(p)


def test_malformed_yaml_names_file_and_line(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("lr: 1e-4\neps_clip: [0.1\nbeta: 0\n")
    with pytest.raises(ConfigError, match=r"malformed YAML at .*bad.yaml:\d+:\d+"):
        make_config(p)


@pytest.mark.parametrize("over, msg", [
    ({"n_samples_per_prompt": 1}, "at least 2 generations per prompt"),
    ({"rollout_batch_size": 8, "train_batch_size": 3}, "train_batch_size=3 must divide rollout_batch_size=8"),
    ({"micro_batch_size": 5}, r"micro_batch_size=5 must divide .* = 8 x 8 = 64"),
    ({"temperature": 0.0}, "must sample"),
    ({"lr": -1e-4}, "learning rate must be positive"),
    ({"loss_agg_mode": "mean"}, "valid values are seq-mean-token-mean"),
    ({"dual_clip": 0.5}, "must be > 1"),
])
def test_impossible_settings(over, msg):
    with pytest.raises(ConfigError, match=msg):
        make_config(None, over)


def test_type_errors_and_coercion():
    assert make_config(None, {"lr": 1}).lr == 1.0  # int for float is fine
    assert make_config(None, {"num_steps": "7"}).num_steps == 7  # CLI strings are parsed
    assert make_config(None, {"lora_target_modules": "q_proj,v_proj"}).lora_target_modules == ["q_proj", "v_proj"]
    with pytest.raises(ConfigError, match=r"parameter 'num_steps' in overrides: expected int, got str 'many'"):
        make_config(None, {"num_steps": "many"})
