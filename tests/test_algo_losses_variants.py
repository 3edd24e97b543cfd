"""GSPO, CISPO and GMPO against hand-computed values (arithmetic in the comments).

The same losses against verl's implementations on the same tensors are in test_algo_peer_verl.py.
"""

import math

import pytest
import torch

from rftlib.algo.losses import POLICY_LOSSES, grpo_loss, ppo_clip

E = math.exp


# ---------------------------------------------------------------------------------------------
# GSPO (Zheng et al. 2025): one length-normalised ratio per completion, clip range 3e-4 / 4e-4.
def _gspo_example():
    # old logprobs 0, so logprobs are the per-token log ratios.
    # row 0 (A=+1): log ratios [0.3, -0.1, (pad 9.0)] -> mean over 2 valid tokens 0.1 -> s = e^0.1 = 1.105171
    # row 1 (A=-1): log ratios [2e-4, -2e-4, 3e-4]   -> mean 1e-4                      -> s = e^1e-4 = 1.000100
    logprobs = torch.tensor([[0.3, -0.1, 9.0], [2e-4, -2e-4, 3e-4]], requires_grad=True)
    old = torch.zeros(2, 3)
    adv = torch.tensor([1.0, -1.0])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    return logprobs, old, adv, mask


def test_gspo_by_hand():
    logprobs, old, adv, mask = _gspo_example()
    loss_mat, m = POLICY_LOSSES.get("gspo")(logprobs, old, adv, mask, clip_low=3e-4, clip_high=4e-4)
    # row 0: A>0, s = 1.105171 > 1 + 4e-4 -> clipped: max(-1.105171, -1.0004) = -1.0004 at every token
    # row 1: A<0, s = 1.000100 inside [0.9997, 1.0004] -> unclipped: -(-1) * 1.000100 = 1.000100
    torch.testing.assert_close(loss_mat[0, :2], torch.tensor([-1.0004, -1.0004]))
    torch.testing.assert_close(loss_mat[1], torch.full((3,), E(1e-4)))
    # the 2 valid tokens of row 0 are clipped, the 3 of row 1 are not: 2/5; 1 of 2 completions
    torch.testing.assert_close(m["ppo_clip_ratio"], torch.tensor(2 / 5))
    torch.testing.assert_close(m["seq_clip_frac"], torch.tensor(0.5))
    torch.testing.assert_close(m["seq_ratio_max"], torch.tensor(E(0.1)))
    # seq-mean-token-mean: row 0 -> -1.0004, row 1 -> 1.000100; mean = (-1.0004 + 1.000100) / 2 = -1.5e-4
    loss, _ = grpo_loss(logprobs, old, adv, mask, policy_loss="gspo", clip_low=3e-4, clip_high=4e-4)
    torch.testing.assert_close(loss, torch.tensor((-1.0004 + E(1e-4)) / 2), atol=1e-6, rtol=0)
    # gradient: row 0 clipped -> 0. Row 1, GSPO-token: d(-A * s_it)/d logp_it = s_1 = 1.000100 per token,
    # then / 3 tokens / 2 completions = 0.166683
    (grad,) = torch.autograd.grad(loss, logprobs)
    torch.testing.assert_close(grad[0], torch.zeros(3))
    torch.testing.assert_close(grad[1], torch.full((3,), E(1e-4) / 6))


def test_gspo_is_sequence_level_a_single_outlier_token_clips_nothing_alone():
    # PPO clips a token with ratio e^0.9 on its own; GSPO averages: log ratios [0.9, -0.9] -> s = 1, no clip
    logprobs = torch.tensor([[0.9, -0.9]], requires_grad=True)
    old, adv, mask = torch.zeros(1, 2), torch.tensor([1.0]), torch.ones(1, 2)
    _, m_ppo = ppo_clip(logprobs, old, adv, mask)
    _, m_gspo = POLICY_LOSSES.get("gspo")(logprobs, old, adv, mask)
    assert m_ppo["ppo_clip_ratio"] == 0.5 and m_gspo["ppo_clip_ratio"] == 0.0


def test_gspo_refuses_dual_clip_and_bad_range():
    logprobs, old, adv, mask = _gspo_example()
    with pytest.raises(ValueError, match="dual_clip"):
        POLICY_LOSSES.get("gspo")(logprobs, old, adv, mask, dual_clip=3.0)
    with pytest.raises(ValueError, match="clip_low < 1"):
        POLICY_LOSSES.get("gspo")(logprobs, old, adv, mask, clip_low=1.5)


# ---------------------------------------------------------------------------------------------
# CISPO (MiniMax-M1): -sg(clip(r, 1 - lo, 1 + hi)) * A * log pi on every token.
def test_cispo_by_hand_and_every_token_keeps_its_gradient():
    # log ratios: -1 - (-1.5) = 0.5 -> r = e^0.5 = 1.648721;  -2 - (-1) = -1 -> r = e^-1 = 0.367879
    logprobs = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    old = torch.tensor([[-1.5, -1.0]])
    adv, mask = torch.tensor([2.0]), torch.ones(1, 2)
    loss_mat, m = POLICY_LOSSES.get("cispo")(logprobs, old, adv, mask, clip_low=1.0, clip_high=0.28)
    # weights: min(1.648721, 1.28) = 1.28 (clipped); 0.367879 (floor 1 - 1 = 0: unclipped)
    # loss = -w * A * logp: -1.28 * 2 * -1 = 2.56;  -0.367879 * 2 * -2 = 1.471518
    torch.testing.assert_close(loss_mat, torch.tensor([[2.56, 4 * E(-1.0)]]))
    torch.testing.assert_close(m["ppo_clip_ratio"], torch.tensor(0.5))
    # gradient -w * A: [-2.56, -0.735759]; the clipped token still learns (PPO would give it 0)
    (grad,) = torch.autograd.grad(loss_mat.sum(), logprobs)
    torch.testing.assert_close(grad, torch.tensor([[-2.56, -2 * E(-1.0)]]))
    ppo_mat, _ = ppo_clip(logprobs, old, adv, mask)
    (ppo_grad,) = torch.autograd.grad(ppo_mat.sum(), logprobs)
    assert ppo_grad[0, 0] == 0.0 and grad[0, 0] != 0.0


def test_cispo_floor_when_set():
    # clip_low 0.2: floor 0.8; r = e^-1 = 0.367879 -> weight 0.8; loss = -0.8 * 1 * -2 = 1.6
    logprobs = torch.tensor([[-2.0]])
    loss_mat, m = POLICY_LOSSES.get("cispo")(logprobs, torch.tensor([[-1.0]]), torch.tensor([1.0]),
                                             torch.ones(1, 1), clip_low=0.2, clip_high=0.28)
    torch.testing.assert_close(loss_mat, torch.tensor([[1.6]]))
    assert m["ppo_clip_ratio"] == 1.0


# ---------------------------------------------------------------------------------------------
# GMPO (Zhao et al. 2025): geometric mean of token ratios, clipped in log space at +-0.4.
def test_gmpo_by_hand():
    # row 0, A=+1: log ratios [0.6, -0.2, 0.1]; A>0 caps above 0.4 -> [0.4, -0.2, 0.1]; mean 0.1
    #   -> ratio e^0.1 = 1.105171, loss -1.105171
    # row 1, A=-1: log ratios [-0.6, 0.2, -0.1]; A<0 raises below -0.4 -> [-0.4, 0.2, -0.1]; mean -0.1
    #   -> ratio e^-0.1 = 0.904837, loss +0.904837
    logprobs = torch.tensor([[0.6, -0.2, 0.1], [-0.6, 0.2, -0.1]], requires_grad=True)
    old, adv, mask = torch.zeros(2, 3), torch.tensor([1.0, -1.0]), torch.ones(2, 3)
    loss_mat, m = POLICY_LOSSES.get("gmpo")(logprobs, old, adv, mask, clip_low=0.4, clip_high=0.4)
    torch.testing.assert_close(loss_mat, torch.tensor([[-E(0.1)] * 3, [E(-0.1)] * 3]))
    torch.testing.assert_close(m["ppo_clip_ratio"], torch.tensor(2 / 6))  # token 0 of each row
    # seq-mean-token-mean: (-1.105171 + 0.904837) / 2 = -0.100167
    loss, _ = grpo_loss(logprobs, old, adv, mask, policy_loss="gmpo", clip_low=0.4, clip_high=0.4)
    torch.testing.assert_close(loss, torch.tensor((-E(0.1) + E(-0.1)) / 2))
    # gradient: clipped tokens 0; others d(-A e^{mean})/d lr_t = -A * ratio / 3, then / 2 rows
    #   row 0: -1.105171 / 6 = -0.184195; row 1: +0.904837 / 6 = 0.150806
    (grad,) = torch.autograd.grad(loss, logprobs)
    torch.testing.assert_close(grad, torch.tensor([[0.0, -E(0.1) / 6, -E(0.1) / 6], [0.0, E(-0.1) / 6, E(-0.1) / 6]]))


def test_gmpo_masked_tokens_do_not_count():
    # row with a padded token of log ratio 5: geometric mean over the 2 valid ones: (0.2 + 0) / 2 -> e^0.1
    logprobs = torch.tensor([[0.2, 0.0, 5.0]])
    loss_mat, _ = POLICY_LOSSES.get("gmpo")(logprobs, torch.zeros(1, 3), torch.tensor([1.0]),
                                            torch.tensor([[1.0, 1.0, 0.0]]))
    torch.testing.assert_close(loss_mat[0, 0], torch.tensor(-E(0.1)))


@pytest.mark.parametrize("name", ["gspo", "cispo", "gmpo"])
def test_zero_advantage_zero_gradient(name):
    g = torch.Generator().manual_seed(0)
    logprobs = (-torch.rand(3, 4, generator=g)).requires_grad_()
    old = logprobs.detach() + 0.05 * torch.randn(3, 4, generator=g)
    loss, m = grpo_loss(logprobs, old, torch.zeros(3), torch.ones(3, 4), policy_loss=name)
    (grad,) = torch.autograd.grad(loss, logprobs)
    assert torch.equal(grad, torch.zeros(3, 4))
    assert {"ppo_clip_ratio", "log_ratio_max", "ratio_max", "approx_kl_old"} <= set(m)


@pytest.mark.parametrize("name", ["gspo", "cispo", "gmpo"])
def test_on_policy_gradient_is_grpo_gradient(name):
    # exactly on-policy (old = logp, ratio 1, nothing clipped): every variant's gradient under
    # seq-mean-token-mean is GRPO's, -A_i / len_i / N per valid token (here A = [1, -2], lengths 2 and 3,
    # N = 2: row 0 -> -1/4, row 1 -> +2/6 = 1/3)
    logprobs = torch.tensor([[-1.0, -0.5, -3.0], [-0.2, -2.0, -1.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    loss, _ = grpo_loss(logprobs, logprobs.detach(), torch.tensor([1.0, -2.0]), mask, policy_loss=name,
                        clip_low=0.2, clip_high=0.2)
    (grad,) = torch.autograd.grad(loss, logprobs)
    torch.testing.assert_close(grad, torch.tensor([[-0.25, -0.25, 0.0], [1 / 3, 1 / 3, 1 / 3]]))


def test_gmpo_clips_only_on_the_advantage_side():
    # A=+1, log ratios [-0.6, 0.0]: only values above +0.4 are capped for A>0, so -0.6 stays:
    #   mean (-0.6 + 0) / 2 = -0.3 -> loss -e^-0.3 = -0.740818 (a two-sided clamp would give -e^-0.2)
    # A=-1, log ratios [0.6, 0.0]: only values below -0.4 are raised for A<0, so 0.6 stays:
    #   mean 0.3 -> loss +e^0.3 = 1.349859
    logprobs = torch.tensor([[-0.6, 0.0], [0.6, 0.0]])
    loss_mat, m = POLICY_LOSSES.get("gmpo")(logprobs, torch.zeros(2, 2), torch.tensor([1.0, -1.0]), torch.ones(2, 2))
    torch.testing.assert_close(loss_mat[:, 0], torch.tensor([-E(-0.3), E(0.3)]))
    assert m["ppo_clip_ratio"] == 0.0


def test_gmpo_zero_advantage_tokens_are_not_clipped():
    # Issue 19 item 6. Row 0 has A = 0: sgn 0 makes l_it = 0 whatever the log ratio, but nothing was
    # clipped there. Row 1, A = +1, log ratios [0.6, 0.1]: only 0.6 > 0.4 is clipped. 1 clipped token of 4.
    logprobs = torch.tensor([[0.6, 0.1], [0.6, 0.1]])
    _, m = POLICY_LOSSES.get("gmpo")(logprobs, torch.zeros(2, 2), torch.tensor([0.0, 1.0]), torch.ones(2, 2),
                                     clip_low=0.4, clip_high=0.4)
    torch.testing.assert_close(m["ppo_clip_ratio"], torch.tensor(1 / 4))
    # a whole batch of zero advantages (every group constant): nothing clipped
    _, m0 = POLICY_LOSSES.get("gmpo")(logprobs, torch.zeros(2, 2), torch.zeros(2), torch.ones(2, 2))
    assert m0["ppo_clip_ratio"] == 0.0
