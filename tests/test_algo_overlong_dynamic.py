"""DAPO's overlong handling and dynamic sampling: the pure functions (rftlib.algo.filtering/shaping)
by hand, and the refill step (rftlib.train.steps) on synthetic rewards where half the groups are
all-correct."""

import pytest
import torch

from rftlib.algo.advantages import compute_advantages
from rftlib.algo.filtering import constant_groups, group_row_mask, untruncated_mask
from rftlib.algo.shaping import overlong_penalty
from rftlib.config import ConfigError, make_config
from rftlib.train.steps import Groups, clip_range, dynamic_sampling, loss_kwargs, loss_mask, shape_rewards


# ---- overlong ---------------------------------------------------------------------------------
def test_overlong_penalty_by_hand():
    # L_max 10, buffer 4 -> the ramp starts after 10 - 4 = 6 tokens
    # lengths [5, 6, 7, 9, 10] -> excess [0, 0, 1, 3, 4] -> -excess / 4 = [0, 0, -0.25, -0.75, -1]
    lengths = torch.tensor([5, 6, 7, 9, 10])
    torch.testing.assert_close(overlong_penalty(lengths, 10, 4), torch.tensor([0.0, 0.0, -0.25, -0.75, -1.0]))
    # factor 0.5 halves it
    torch.testing.assert_close(overlong_penalty(lengths, 10, 4, 0.5), torch.tensor([0.0, 0.0, -0.125, -0.375, -0.5]))
    with pytest.raises(ValueError, match="buffer_len must be in"):
        overlong_penalty(lengths, 10, 11)


def test_untruncated_mask_drops_truncated_rows():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    out = untruncated_mask(mask, torch.tensor([False, True, False]))
    torch.testing.assert_close(out, torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0]]))


# ---- the pure dynamic-sampling test -------------------------------------------------------------
def test_constant_groups_by_hand():
    # G=3: [1,1,1] constant, [1,0,1] not, [0,0,0] constant, [0.5,0.5,0.5] constant
    r = torch.tensor([1.0, 1, 1, 1, 0, 1, 0, 0, 0, 0.5, 0.5, 0.5])
    assert constant_groups(r, 3).tolist() == [True, False, True, True]
    assert group_row_mask(~constant_groups(r, 3), 3).tolist() == [0.0] * 3 + [1.0] * 3 + [0.0] * 6


# ---- the refill step on a synthetic task ----------------------------------------------------------
G, B = 4, 4


def _rewards(prompt_id: int) -> torch.Tensor:
    """Even prompts are solved by every sample (all-correct: no signal), odd ones by half."""
    return torch.ones(G) if prompt_id % 2 == 0 else torch.tensor([1.0, 0.0, 1.0, 0.0])


class Sampler:
    """Prompts 0, 1, 2, ... in order; each call is one generate, counted."""

    def __init__(self):
        self.next_id, self.calls, self.asked = 0, 0, []

    def __call__(self, k: int) -> Groups:
        ids = list(range(self.next_id, self.next_id + k))
        self.next_id += k
        self.calls += 1
        self.asked.append(k)
        return Groups(ids, torch.cat([_rewards(i) for i in ids]))


def test_refill_fills_the_batch_when_half_the_groups_are_all_correct():
    sample = Sampler()
    first = sample(B)  # prompts 0-3: 0 and 2 all-correct -> 2 informative
    out = dynamic_sampling(first, sample, group_size=G, mode="refill", max_rounds=3)
    # round 1 asks ceil((4 - 2) / (2/4)) = 4 prompts (4-7), of which 5 and 7 are informative -> full
    assert sample.asked == [4, 4] and out.items == [1, 3, 5, 7]
    torch.testing.assert_close(out.rewards, torch.tensor([1.0, 0.0, 1.0, 0.0] * 4))
    assert out.row_mask.tolist() == [1.0] * 16
    assert out.metrics == {"dyn/constant_group_frac": 0.5, "dyn/extra_rollouts": 16.0, "dyn/rounds": 1.0,
                           "dyn/filled": 1.0, "dyn/masked_group_frac": 0.0}
    # every group of the refilled batch now carries signal
    adv = compute_advantages("grpo", out.rewards, G).view(B, G)
    assert (adv != 0).any(dim=1).all()


def test_refill_cap_tops_up_with_masked_groups():
    sample = Sampler()
    out = dynamic_sampling(sample(B), sample, group_size=G, mode="refill", max_rounds=0)
    # no extra generate allowed: informative 1, 3 then the dropped 0, 2 as masked filler
    assert sample.calls == 1 and out.items == [1, 3, 0, 2]
    assert out.row_mask.tolist() == [1.0] * 8 + [0.0] * 8
    assert out.metrics["dyn/filled"] == 0.0 and out.metrics["dyn/masked_group_frac"] == 0.5
    assert out.metrics["dyn/extra_rollouts"] == 0.0


def test_refill_when_nothing_informative_yet_asks_a_whole_batch():
    sample = Sampler()
    first = Groups([0, 2, 4, 6], torch.cat([_rewards(i) for i in (0, 2, 4, 6)]))  # all constant
    sample.next_id = 8
    out = dynamic_sampling(first, sample, group_size=G, mode="refill", max_rounds=1)
    # informative fraction 0 -> ask B = 4 (prompts 8-11: 9 and 11 informative); cap 1 -> 2 fillers
    assert sample.asked == [4] and out.items == [9, 11, 0, 2]
    assert out.metrics["dyn/constant_group_frac"] == 6 / 8 and out.metrics["dyn/extra_rollouts"] == 16.0


def test_mask_and_off_modes_do_not_sample():
    sample = Sampler()
    first = sample(B)
    masked = dynamic_sampling(first, sample, group_size=G, mode="mask")
    assert sample.calls == 1 and masked.items == [0, 1, 2, 3]
    assert masked.row_mask.tolist() == [0.0] * 4 + [1.0] * 4 + [0.0] * 4 + [1.0] * 4
    off = dynamic_sampling(first, sample, group_size=G, mode="off")
    assert off.row_mask.tolist() == [1.0] * 16 and off.metrics["dyn/constant_group_frac"] == 0.5


# ---- config -> loop settings -----------------------------------------------------------------------
def test_loss_kwargs_take_each_loss_its_own_clip_range():
    assert clip_range(make_config(None, {"policy_loss": "gspo"})) == (3e-4, 4e-4)
    assert clip_range(make_config(None, {"policy_loss": "cispo"})) == (1.0, 0.28)
    assert clip_range(make_config(None, {"policy_loss": "gmpo"})) == (0.4, 0.4)
    assert clip_range(make_config(None, {"eps_clip": 0.1})) == (0.1, 0.1)
    assert clip_range(make_config(None, {"eps_clip_high": 0.28})) == (0.2, 0.28)
    kw = loss_kwargs(make_config(None, {"beta": 0.04, "kl_estimator": "k1", "kl_in_reward": True}))
    assert kw["beta"] == 0.0 and kw["kl_estimator"] == "k1"  # the KL is in the reward, not the loss
    assert loss_kwargs(make_config(None, {"beta": 0.04, "kl_estimator": "k3+"}))["beta"] == 0.04


def test_shape_rewards_overlong_then_kl():
    cfg = make_config(None, {"max_new_tokens": 10, "overlong_buffer_len": 4, "beta": 0.5, "kl_estimator": "k1",
                             "kl_in_reward": True})
    # lengths [10, 3]: penalties [-1, 0] -> [1 - 1, 1 + 0] = [0, 1]
    # k1 = behaviour - ref per token: row 0 [0.2, 0.2] (2 valid), row 1 [0.4] -> sums 0.4, 0.4; x 0.5 = 0.2
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    out, m = shape_rewards(cfg, torch.tensor([1.0, 1.0]), torch.tensor([10, 3]),
                           behaviour_logprobs=torch.tensor([[-1.0, -1.0], [-1.0, -9.0]]),
                           ref_logprobs=torch.tensor([[-1.2, -1.2], [-1.4, 0.0]]), completion_mask=mask)
    torch.testing.assert_close(out, torch.tensor([-0.2, 0.8]))
    assert m["overlong_penalty_mean"] == -0.5 and abs(m["kl_reward_penalty_mean"] - 0.2) < 1e-6


def test_loss_mask_composes_truncation_and_groups():
    cfg = make_config(None, {"mask_truncated_completions": True})
    out = loss_mask(cfg, torch.ones(4, 2), torch.tensor([True, False, False, False]),
                    row_mask=torch.tensor([1.0, 1.0, 0.0, 0.0]))
    assert out.tolist() == [[0.0, 0.0], [1.0, 1.0], [0.0, 0.0], [0.0, 0.0]]
    # off by default: only the row mask applies
    out = loss_mask(make_config(None, {}), torch.ones(2, 2), torch.tensor([True, False]))
    assert out.tolist() == [[1.0, 1.0], [1.0, 1.0]]


@pytest.mark.parametrize("over, msg", [
    ({"dynamic_sampling": "filter"}, "dynamic_sampling='filter': choose off, mask or refill"),
    ({"dynamic_sampling_max_rounds": -1}, "dynamic_sampling_max_rounds=-1"),
    ({"overlong_buffer_len": 100, "max_new_tokens": 48}, r"overlong_buffer_len=100: must be in \[0, max_new_tokens=48\]"),
    ({"overlong_penalty_factor": float("nan")}, "overlong_penalty_factor=nan"),
    ({"scale_rewards": "global"}, "scale_rewards='global': valid values are batch, group, none"),
    ({"scale_rewards": "batch", "advantage_estimator": "rloo"}, "has its own scaling"),
    ({"policy_loss": "gspo", "gspo_eps_clip": 0.0}, r"gspo_eps_clip=0.0: must be in \(0, 1\)"),
    ({"policy_loss": "cispo", "dual_clip": 3.0}, "dual_clip=3.0 with policy_loss cispo"),
    ({"cispo_eps_clip": 1.5}, r"cispo_eps_clip=1.5: must be in \[0, 1\]"),
    ({"gmpo_eps_clip": -0.1}, "gmpo_eps_clip=-0.1"),
])
def test_variant_settings_refused_with_the_field_name(over, msg):
    with pytest.raises(ConfigError, match=msg):
        make_config(None, over)


def test_variant_defaults():
    cfg = make_config(None, {})
    assert (cfg.scale_rewards, cfg.dynamic_sampling, cfg.dynamic_sampling_max_rounds, cfg.mask_truncated_completions,
            cfg.overlong_buffer_len, cfg.overlong_penalty_factor, cfg.kl_in_reward) == (None, "off", 3, False, 0, 1.0, False)
    for name in ("rloo", "reinforce_pp_baseline"):
        make_config(None, {"advantage_estimator": name})
    for name in ("gspo", "gmpo"):
        make_config(None, {"policy_loss": name, "loss_agg_mode": "seq-mean-token-mean"})
    make_config(None, {"policy_loss": "cispo", "loss_agg_mode": "token-mean"})


def test_gather_groups_pads_rollouts_of_different_widths():
    from rftlib.rollout.base import Rollout
    from rftlib.train.steps import gather_groups

    def ro(p, t, base):  # 2 groups of G=2; prompts width p, completions width t, values from base
        n = 4
        return Rollout(prompt_ids=torch.full((n, p), base) + torch.arange(n).unsqueeze(-1), prompt_mask=torch.ones(n, p),
                       completion_ids=torch.full((n, t), base + 50), completion_mask=torch.ones(n, t),
                       behaviour_logprobs=torch.full((n, t), -1.0), truncated=torch.tensor([False, True, False, False]),
                       texts=[f"{base}-{i}" for i in range(n)], group_size=2)

    a, b = ro(2, 3, 10), ro(3, 1, 20)
    out = gather_groups([(a, 1), (b, 0)], pad_id=0)  # group 1 of a (rows 2, 3), group 0 of b (rows 0, 1)
    # prompts left-padded to width 3: a's rows [12, 12] and [13, 13] get one pad in front
    assert out.prompt_ids.tolist() == [[0, 12, 12], [0, 13, 13], [20, 20, 20], [21, 21, 21]]
    assert out.prompt_mask.tolist() == [[0, 1, 1], [0, 1, 1], [1, 1, 1], [1, 1, 1]]
    # completions right-padded to width 3: b's single token then pads, masked, logprob 0
    assert out.completion_ids.tolist() == [[60] * 3, [60] * 3, [70, 0, 0], [70, 0, 0]]
    assert out.completion_mask.tolist() == [[1] * 3, [1] * 3, [1, 0, 0], [1, 0, 0]]
    assert out.behaviour_logprobs.tolist() == [[-1] * 3, [-1] * 3, [-1, 0, 0], [-1, 0, 0]]
    assert out.truncated.tolist() == [False, False, False, True]
    assert out.texts == ["10-2", "10-3", "20-0", "20-1"] and out.group_size == 2
