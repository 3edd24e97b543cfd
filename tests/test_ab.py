"""`rft ab`: one attempt per variant, validated before anything trains, then the compare report.

The end-to-end test trains three arms of the tiny model (GRPO's ppo_clip vs GSPO vs CISPO) on a reward
the untrained tiny model can earn (1 if the completion holds a digit: its samples are noise, some hold
digits), so every arm has non-zero advantages and moves; the real compare notebook then runs over
the three, and its HTML must name each arm's policy_loss in the config diff.
"""

import json
import re

import pytest

from rftlib.ab import parse_vary, plan_variants, run_ab
from rftlib.config import ConfigError, make_config, to_dict
from rftlib.report.attempt import key_differences


def test_parse_vary_types_values_and_refuses_bad_flags():
    assert parse_vary(["policy_loss=ppo_clip, gspo", "eps_clip=0.2,0.1"]) == [
        ("policy_loss", ["ppo_clip", "gspo"]), ("eps_clip", [0.2, 0.1])]  # YAML: 0.1 is a float
    assert parse_vary(["kl_in_reward=false,true"]) == [("kl_in_reward", [False, True])]
    for bad, msg in ((["polcy_loss=a,b"], "not a RunConfig field"), (["policy_loss=gspo"], "two or more values"),
                     (["policy_loss"], "NAME=V1,V2"), (["eps_clip=0.1,0.2", "eps_clip=0.3,0.4"], "varied twice"),
                     ([], "at least one --vary")):
        with pytest.raises(ConfigError, match=msg):
            parse_vary(bad)


def test_plan_is_the_product_and_every_config_is_validated_first():
    vs = plan_variants("tiny", {"num_steps": 2}, parse_vary(["policy_loss=ppo_clip,gspo", "eps_clip=0.2,0.1"]))
    # 2 x 2 = 4 arms in product order; each config carries its values and names itself in the notes
    assert [v.label for v in vs] == ["policy_loss=ppo_clip, eps_clip=0.2", "policy_loss=ppo_clip, eps_clip=0.1",
                                     "policy_loss=gspo, eps_clip=0.2", "policy_loss=gspo, eps_clip=0.1"]
    assert [(v.config.policy_loss, v.config.eps_clip, v.config.num_steps) for v in vs] == [
        ("ppo_clip", 0.2, 2), ("ppo_clip", 0.1, 2), ("gspo", 0.2, 2), ("gspo", 0.1, 2)]
    assert vs[2].config.notes == "A/B: policy_loss=gspo, eps_clip=0.2"
    with pytest.raises(ConfigError, match="both --set and --vary"):
        plan_variants("tiny", {"eps_clip": 0.3}, parse_vary(["eps_clip=0.2,0.1"]))
    trained = []
    with pytest.raises(ConfigError, match="variant policy_loss=bogus: policy_loss='bogus'"):
        run_ab("tiny", {}, parse_vary(["policy_loss=ppo_clip,gspo,bogus"]), train=trained.append, compare=print)
    assert trained == []  # the bad third arm failed before the first one trained


def test_a_crashed_arm_keeps_the_others_and_is_reported():
    lines, compared = [], []

    def train(params):
        if params["policy_loss"] == "gspo":
            raise RuntimeError("out of memory")
        return f"run-{params['policy_loss']}"

    dirs, res, failed = run_ab("tiny", {}, parse_vary(["policy_loss=ppo_clip,gspo,cispo"]), train=train,
                               compare=lambda d: compared.append(d) or "report.html", write=lines.append)
    assert dirs == ["run-ppo_clip", "run-cispo"] and res == "report.html" and failed == ["policy_loss=gspo"]
    assert compared == [["run-ppo_clip", "run-cispo"]]
    assert any("policy_loss=gspo failed: RuntimeError: out of memory" in x for x in lines)
    dirs, res, failed = run_ab("tiny", {}, parse_vary(["policy_loss=ppo_clip,gspo"]), train=train,
                               compare=lambda d: pytest.fail("one finished arm is not an A/B"), write=lines.append)
    assert res is None and failed == ["policy_loss=gspo"]


def test_an_on_policy_loss_ab_is_flagged_as_unable_to_differ():
    from rftlib.ab import on_policy_warning

    # default preset: 8 prompts per rollout, one optimizer step on all of them: ratio == 1 throughout
    on = plan_variants("default", {}, parse_vary(["policy_loss=ppo_clip,gspo,gmpo"]))
    assert "exactly 1" in on_policy_warning(on) and "train_batch_size" in on_policy_warning(on)
    # cispo's own aggregation is token-mean (loss_agg_mode auto): its arm differs on-policy too
    assert on_policy_warning(plan_variants("default", {}, parse_vary(["policy_loss=ppo_clip,cispo"]))) == ""
    pinned = plan_variants("default", {"loss_agg_mode": "token-mean"}, parse_vary(["policy_loss=ppo_clip,cispo"]))
    assert "exactly 1" in on_policy_warning(pinned)
    # 8 / 4 = two optimizer steps per rollout: the second is off-policy, the losses can differ
    off = plan_variants("default", {"train_batch_size": 4}, parse_vary(["policy_loss=ppo_clip,gspo,cispo"]))
    assert on_policy_warning(off) == ""
    # a field that changes the gradient even on-policy (the advantages) is a real A/B
    adv = plan_variants("default", {}, parse_vary(["advantage_estimator=grpo,rloo"]))
    assert on_policy_warning(adv) == ""


# Each family variant (issue 14) as the researcher sets it: it must show in the report's config diff
VARIANTS = {"policy_loss": "gspo", "advantage_estimator": "rloo", "scale_rewards": "batch",
            "dynamic_sampling": "refill", "mask_truncated_completions": True, "overlong_buffer_len": 8,
            "kl_in_reward": True, "kl_estimator": "k3+", "reward_mode": "math_verify", "loss_agg_mode": "token-mean",
            "cispo_eps_clip_high": 0.5, "gspo_eps_clip": 1e-3, "gmpo_eps_clip": 0.3}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_every_family_variant_shows_in_the_config_diff(name):
    over = {name: VARIANTS[name]}
    if name in ("kl_in_reward",):
        over["beta"] = 0.01  # kl_in_reward needs a KL coefficient
    if name == "kl_estimator":
        over["beta"] = 0.01
    if name == "reward_mode":
        pytest.importorskip("math_verify", reason="reward_mode=math_verify needs the math extra")
    cfg = make_config("default", over)
    d = key_differences(to_dict(cfg), None)  # against the defaults, as the attempt report's diff
    assert d[name][1] == VARIANTS[name], d


def test_rft_ab_grpo_gspo_cispo_trains_each_arm_and_writes_the_compare_report(tmp_path, task_with):
    from rftlib.attempts import create_attempt
    from rftlib.report.publish import write_compare
    from rftlib.train.loop import Trainer
    from toy_rewards import has_digit

    runs, reports = tmp_path / "runs", tmp_path / "reports"
    base = {"runs_root": str(runs), "num_steps": 3, "eval_steps": 3, "lr": 2e-2, "warmup_ratio": 0.0}
    moved = {}

    def train(params):
        params = dict(params)
        cfg = make_config(params.pop("preset"), {**params, "name": params["policy_loss"]})
        trainer = Trainer(cfg, create_attempt(cfg), progress=False, task=task_with(cfg, has_digit))
        before = {k: v.detach().clone() for k, v in trainer.model.named_parameters() if v.requires_grad}
        trainer.train()
        after = dict(trainer.model.named_parameters())
        moved[cfg.policy_loss] = max((after[k].detach() - v).abs().max().item() for k, v in before.items())
        trainer.close()
        return trainer.run_dir

    dirs, html, failed = run_ab("tiny", base, parse_vary(["policy_loss=ppo_clip,gspo,cispo"]), train=train,
                                compare=lambda d: write_compare(d, reports))
    assert failed == [] and len(dirs) == 3
    assert all(v > 0 for v in moved.values()), moved  # every arm trained (non-zero advantages moved weights)
    for d in dirs:  # the reward varied within groups: non-zero advantages in every arm
        rows = [json.loads(x) for x in (d / "logs" / "metrics.jsonl").read_text().splitlines()]
        assert any(r["advantage_std"] > 0 for r in rows if "advantage_std" in r), rows[-1].keys()
    page = html.read_text()
    assert html.name == "compare-" + "-vs-".join(d.name for d in dirs) + ".html"
    for d in dirs:
        assert d.name in page
    # the config diff table has a policy_loss row with each arm's value, in arm order
    table = re.search(r'<table[^>]*rft-compare-config.*?</table>', page, re.S)
    assert table, "no config diff table in the compare report"
    row = re.search(r"<tr>\s*<td[^>]*>policy_loss</td>(.*?)</tr>", table.group(0), re.S)
    assert row and re.findall(r"<td[^>]*>([^<]*)</td>", row.group(1)) == ["ppo_clip", "gspo", "cispo"], table.group(0)[:800]
    assert "A/B: policy_loss=cispo" in page  # the notes name the arm
