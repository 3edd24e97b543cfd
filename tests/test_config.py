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
    # issue 19 item 10: settings that were accepted and then divided by 0, flipped a sign or froze the ratio
    ({"loss_norm_const": 0.0}, r"loss_norm_const=0.0: Dr-GRPO's constant normaliser must be > 0"),
    ({"loss_norm_const": -48.0}, r"loss_norm_const=-48.0: .* must be > 0 .* or null for max_new_tokens"),
    ({"log_ratio_clamp": 0.0}, r"log_ratio_clamp=0.0: must be > 0"),
    ({"log_ratio_clamp": -20.0}, r"log_ratio_clamp=-20.0: must be > 0"),
    ({"adv_eps": -1e-6}, r"adv_eps=-1e-06: must be > 0 .* a negative eps can cancel a small std"),
    ({"adv_eps": 0.0}, r"adv_eps=0.0: must be > 0 .*0 / 0"),
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


# ---- non-finite settings (issue 12 defect 3) -------------------------------------------------------

# the float settings the issue names; the generic check must cover them and every other float field
NAMED_FLOATS = ["lr", "temperature", "beta", "max_grad_norm", "eps_clip", "eps_clip_high", "dual_clip", "adv_eps",
                "log_ratio_clamp", "entropy_coef", "weight_decay", "adam_beta1", "adam_beta2", "lora_dropout",
                "spike_grad_norm", "loss_norm_const"]


def _float_fields() -> list[str]:
    import typing

    hints = typing.get_type_hints(RunConfig)
    return [n for n, tp in hints.items() if tp is float or float in typing.get_args(tp)]


def test_named_float_settings_are_float_fields():
    assert set(NAMED_FLOATS) <= set(_float_fields())


@pytest.mark.parametrize("name", _float_fields())
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf"), "nan", "inf"])
def test_non_finite_float_is_refused_with_the_field_name(name, value):
    # papermill passes floats, the CLI passes strings ("nan" parses to a float NaN): both are refused
    with pytest.raises(ConfigError, match=rf"^{name}=(nan|inf|-inf): must be a finite number"):
        make_config(None, {name: value})


def test_yaml_nan_and_inf_are_refused_naming_the_field(tmp_path):
    for text, name in (("lr: .nan\n", "lr"), ("beta: .inf\n", "beta"), ("adam_beta2: -.inf\n", "adam_beta2")):
        p = tmp_path / "nan.yaml"
        p.write_text(text)
        with pytest.raises(ConfigError, match=rf"^{name}=(nan|inf|-inf): must be a finite number"):
            make_config(p)


def test_non_finite_value_inside_a_dict_setting_is_refused():
    with pytest.raises(ConfigError, match=r"eval_temperature\['heldout'\]=nan: must be a finite number"):
        make_config(None, {"eval_temperature": {"heldout": float("nan")}})


# ---- the schedule as the seeds count it (issue 12 defect 7) ---------------------------------------

def test_train_batch_in_samples_becomes_prompts():
    # OpenRLHF --train_batch_size 16 samples at 8 samples per prompt = 16 / 8 = 2 prompts per optimizer step;
    # a 16-prompt rollout then makes 16 / 2 = 8 optimizer steps
    cfg = make_config(None, {"n_samples_per_prompt": 8, "rollout_batch_size": 16, "train_batch_size_samples": 16,
                             "micro_batch_size": 1})
    assert cfg.train_batch_size == 2 and cfg.optimizer_steps_per_rollout == 8
    with pytest.raises(ConfigError, match=r"train_batch_size_samples=12 is not a whole number of prompts"):
        make_config(None, {"n_samples_per_prompt": 8, "train_batch_size_samples": 12})
    with pytest.raises(ConfigError, match=r"train_batch_size=4 \(prompts\) disagrees with train_batch_size_samples=16"):
        make_config(None, {"n_samples_per_prompt": 8, "train_batch_size_samples": 16, "train_batch_size": 4})


def test_episodes_over_a_pool_give_the_rollout_steps():
    # 400 prompts // 16 per rollout x 2 episodes = 25 x 2 = 50 rollout steps
    cfg = make_config(None, {"rollout_batch_size": 16, "micro_batch_size": 8, "pool_size": 400, "num_episodes": 2})
    assert cfg.num_steps == 50
    with pytest.raises(ConfigError, match=r"num_steps=60 disagrees with pool_size=400 // rollout_batch_size=16 x "
                                          r"num_episodes=2 = 50"):
        make_config(None, {"rollout_batch_size": 16, "micro_batch_size": 8, "pool_size": 400, "num_episodes": 2,
                           "num_steps": 60})
    with pytest.raises(ConfigError, match="pool_size and num_episodes go together"):
        make_config(None, {"pool_size": 400})
    with pytest.raises(ConfigError, match="pool_size=4 is smaller than one rollout"):
        make_config(None, {"pool_size": 4, "num_episodes": 1})


def test_a_derived_config_round_trips_as_resume_reloads_it():
    # resume_config rebuilds the saved dict with make_config(None, saved): derived fields must agree
    from rftlib.config import to_dict

    cfg = make_config("seed003-gpt-oss-20b-a28a")
    assert make_config(None, to_dict(cfg)) == cfg


def test_per_probe_eval_settings():
    cfg = make_config(None, {"eval_probes": ["heldout", "ood"], "eval_temperature": {"heldout": 0.6},
                             "eval_n_samples": {"heldout": 8}})
    assert cfg.eval_temperature == {"heldout": 0.6} and cfg.eval_n_samples == {"heldout": 8}
    assert make_config(None, {"eval_temperature": "{heldout: 0.6}"}).eval_temperature == {"heldout": 0.6}  # CLI
    with pytest.raises(ConfigError, match=r"eval_n_samples\['heldout'\]=8 at temperature 0"):
        make_config(None, {"eval_n_samples": {"heldout": 8}})
    with pytest.raises(ConfigError, match=r"eval_temperature names probes \['ood'\] that are not in eval_probes"):
        make_config(None, {"eval_temperature": {"ood": 0.6}})
    with pytest.raises(ConfigError, match=r"prompt_max_len=0: must be at least 1"):
        make_config(None, {"prompt_max_len": 0})


# ---- reward_mode (issue 14 item 6) ----------------------------------------------------------------

def test_reward_mode_reaches_the_task_the_way_the_trainer_builds_it():
    from rftlib.data.tasks import Example, build_task

    pytest.importorskip("math_verify", reason="math-verify not installed")
    # exact already equates 0.5 and \frac{1}{2} (its numeric fallback), so the pair that tells the modes
    # apart is 2*sqrt(2) vs sqrt(8): no string or numeric rule sees it, sympy does
    gold = Example("s", "Simplify sqrt(8).", "\\sqrt{8}")
    for mode, want in (("exact", 0.0), ("math_verify", 1.0)):
        cfg = make_config(None, {"reward_mode": mode})
        task = build_task(cfg.task, eval_size=cfg.eval_size, **cfg.task_args)  # as rftlib/train/loop.py does
        assert task.reward("The answer is \\boxed{2\\sqrt{2}}.", gold, False)[0] == want, mode
    with pytest.raises(ConfigError, match="reward_mode='fuzzy': choose exact or math_verify"):
        make_config(None, {"reward_mode": "fuzzy"})
    with pytest.raises(ConfigError, match="task 'code_problems' does not take a reward_mode"):
        make_config(None, {"reward_mode": "math_verify", "task": "code_problems"})
