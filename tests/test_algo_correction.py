"""Truncated importance sampling weights (rftlib.algo.correction) on hand-computed 2x3 tensors."""

import math

import pytest
import torch

from rftlib.algo.correction import tis_weights

L = math.log
# per-token log-ratios old - behaviour; row 0's last token is masked and carries a tiny ratio (e^-9) that
# must not leak into anything
DIFF = torch.tensor([[L(1.5), L(3.0), -9.0],
                     [L(0.5), 0.0, L(1.2)]])
MASK = torch.tensor([[1.0, 1.0, 0.0],
                     [1.0, 1.0, 1.0]])
BEH = torch.full((2, 3), -1.0)
OLD = BEH + DIFF


def test_token_level_hand_computed():
    w, m = tis_weights(OLD, BEH, MASK, cap=2.0, level="token")
    # row 0: exp(ln1.5)=1.5, exp(ln3)=3 -> cap 2, masked -> 0; row 1: 0.5, 1, 1.2
    assert torch.allclose(w, torch.tensor([[1.5, 2.0, 0.0], [0.5, 1.0, 1.2]]), atol=1e-6)
    # 5 valid tokens: mean (1.5 + 2 + 0.5 + 1 + 1.2) / 5 = 6.2 / 5 = 1.24; one of five truncated
    assert m["is_weight_mean"] == pytest.approx(1.24, abs=1e-6)
    assert m["is_weight_max"] == pytest.approx(2.0, abs=1e-6)
    assert m["tis_truncated_frac"] == pytest.approx(0.2, abs=1e-6)
    # |diff|: ln1.5=0.405465 + ln3=1.098612 + ln2=0.693147 + 0 + ln1.2=0.182322 = 2.379546; /5
    assert m["mismatch_mean"] == pytest.approx(2.379546 / 5, abs=1e-5)
    assert m["mismatch_max"] == pytest.approx(1.098612, abs=1e-5)


def test_sequence_level_hand_computed():
    w, m = tis_weights(OLD, BEH, MASK, cap=2.0, level="sequence")
    # row 0: exp(ln1.5 + ln3) = 4.5 -> cap 2 on both valid tokens; row 1: 0.5 * 1 * 1.2 = 0.6
    assert torch.allclose(w, torch.tensor([[2.0, 2.0, 0.0], [0.6, 0.6, 0.6]]), atol=1e-6)
    # over the 2 sequences: mean (2 + 0.6) / 2 = 1.3, max 2, one of two truncated
    assert m["is_weight_mean"] == pytest.approx(1.3, abs=1e-6)
    assert m["is_weight_max"] == pytest.approx(2.0, abs=1e-6)
    assert m["tis_truncated_frac"] == pytest.approx(0.5, abs=1e-6)


def test_on_policy_is_one_detached_and_empty_rows_are_zero():
    old = torch.tensor([[-0.3, -2.0], [-1.0, -1.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    for level in ("token", "sequence"):
        w, m = tis_weights(old, old.detach().clone(), mask, cap=2.0, level=level)
        # identical logprobs: ratio exp(0) = 1 on valid tokens; the fully masked row gets 0 and is
        # left out of the metrics (mean over valid units stays 1)
        assert torch.equal(w, torch.tensor([[1.0, 1.0], [0.0, 0.0]]))
        assert not w.requires_grad
        assert m["is_weight_mean"] == pytest.approx(1.0) and m["tis_truncated_frac"] == 0
        assert m["mismatch_max"] == 0


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="level"):
        tis_weights(OLD, BEH, MASK, level="batch")
    with pytest.raises(ValueError, match="cap"):
        tis_weights(OLD, BEH, MASK, cap=0.5)
    with pytest.raises(ValueError, match="behaviour_logprobs"):
        tis_weights(OLD, BEH[:, :2], MASK)


# ---- the decoupled PPO objective of asynchronous rollouts (issue 32) -----------------------------------------

def _decoupled_batch():
    """2 rows x 3 tokens, A = (+1, -1), eps 0.2, cap C = 2. (prox, behaviour, ratio r = pi_theta / pi_prox):
    row 0: (-1.0, -2.2, 1.1) its IS weight capped: d = 1.2 > ln 2, w = 2; (-0.5, -0.5, 1.3) clipped high with
           A > 0; (-2.0, -1.9, 1.0) w = exp(-0.1)
    row 1: (-1.0, -1.0, 0.7) clipped low with A < 0; (-0.3, -0.5, 0.9) w = exp(0.2); (-1.5, -1.5, 1.25) A < 0
           and r > 1 + eps: not clipped (PPO clips that side only for A > 0)"""
    prox = torch.tensor([[-1.0, -0.5, -2.0], [-1.0, -0.3, -1.5]])
    beh = torch.tensor([[-2.2, -0.5, -1.9], [-1.0, -0.5, -1.5]])
    ratio = [[1.1, 1.3, 1.0], [0.7, 0.9, 1.25]]
    theta = prox + torch.log(torch.tensor(ratio))
    return prox, beh, ratio, theta, torch.tensor([1.0, -1.0]), torch.ones(2, 3)


def test_decoupled_ppo_loss_and_gradient_hand_computed():
    """l = w * max(-A r, -A clip(r)), w = min(exp(prox - behaviour), C), seq-mean-token-mean; the gradient with
    respect to log pi_theta is -A w r / (3 tokens * 2 rows) on unclipped tokens and 0 on clipped ones. Every
    expected number below comes from math on the batch's definition, not from the implementation."""
    from rftlib.algo.losses import grpo_loss

    prox, beh, ratio, theta, adv, mask = _decoupled_batch()
    d = [[-1.0 - -2.2, 0.0, -2.0 - -1.9], [0.0, -0.3 - -0.5, 0.0]]
    w = [[min(math.exp(x), 2.0) for x in row] for row in d]  # [[2, 1, e^-0.1], [1, e^0.2, 1]]
    A = [1.0, -1.0]
    clip = lambda r: min(max(r, 0.8), 1.2)  # noqa: E731
    per_tok = [[w[i][t] * max(-A[i] * ratio[i][t], -A[i] * clip(ratio[i][t])) for t in range(3)] for i in range(2)]
    want_loss = sum(sum(row) / 3 for row in per_tok) / 2
    clipped = [[False, True, False], [True, False, False]]
    want_grad = [[0.0 if clipped[i][t] else -A[i] * w[i][t] * ratio[i][t] / 6 for t in range(3)] for i in range(2)]

    weights, m = tis_weights(prox, beh, mask, cap=2.0)
    assert weights.flatten().tolist() == pytest.approx([x for row in w for x in row], rel=1e-6)
    assert m["tis_truncated_frac"].item() == pytest.approx(1 / 6)
    lp = theta.clone().requires_grad_(True)
    loss, _ = grpo_loss(lp, prox, adv, mask, aggregation="seq-mean-token-mean", clip_low=0.2, clip_high=0.2,
                        is_weights=weights)
    loss.backward()
    # float32: each input is within ~1 ulp of its real value and the sums are of 6 terms of size <= 2.2, so the
    # error is a few ulps of 2.2 (2.2 * 2**-23 ~ 3e-7): 1e-6 absolute leaves a margin and catches any wrong term
    assert loss.item() == pytest.approx(want_loss, abs=1e-6)
    assert lp.grad.flatten().tolist() == pytest.approx([g for row in want_grad for g in row], abs=1e-6)


def test_decoupled_at_lag_zero_is_the_unweighted_loss_bit_for_bit():
    """prox == behaviour exactly (an engine with the trainer's numerics, lag 0): every weight is exp(0) = 1.0
    exactly, and the weighted loss equals grpo_loss without weights bit for bit (times 1.0 is exact)."""
    from rftlib.algo.losses import grpo_loss

    prox, _, _, theta, adv, mask = _decoupled_batch()
    weights, m = tis_weights(prox, prox.clone(), mask, cap=2.0)
    assert torch.equal(weights, torch.ones(2, 3)) and m["mismatch_kl"].item() == 0.0
    a, _ = grpo_loss(theta, prox, adv, mask, is_weights=weights)
    b, _ = grpo_loss(theta, prox, adv, mask)
    assert torch.equal(a, b)


def test_mismatch_kl_hand_computed():
    """k3 estimate of KL(pi_b || pi_prox): mean over valid tokens of exp(d) - 1 - d, d = prox - behaviour."""
    prox, beh, _, _, _, mask = _decoupled_batch()
    ds = [1.2, 0.0, -0.1, 0.0, 0.2, 0.0]
    want = sum(math.exp(x) - 1 - x for x in ds) / 6  # (1.120117 + 0.004837 + 0.021403) / 6 = 0.191060
    _, m = tis_weights(prox, beh, mask, cap=2.0)
    assert m["mismatch_kl"].item() == pytest.approx(want, rel=1e-5)
    assert m["mismatch_kl"].item() == pytest.approx(0.191060, abs=1e-6)
