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
