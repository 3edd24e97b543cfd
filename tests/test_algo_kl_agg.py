"""KL estimators, loss aggregation modes and masked reductions, against hand-computed values."""

import math

import pytest
import torch

from rftlib.algo.aggregation import AGGREGATIONS, aggregate, masked_max, masked_mean, masked_min, masked_quantile
from rftlib.algo.kl import KL_ESTIMATORS, kl_penalty

# ---------------------------------------------------------------------------------------------
# KL estimators. logp - ref = [0.5, 0, -0.5]  ->  d = ref - logp = [-0.5, 0, 0.5]
LOGP = torch.tensor([[-1.0, -2.0, -0.5]])  # (1, 3)
REF = torch.tensor([[-1.5, -2.0, 0.0]])  # (1, 3)


def test_k1():
    torch.testing.assert_close(kl_penalty("k1", LOGP, REF), torch.tensor([[0.5, 0.0, -0.5]]))


def test_k2():
    # 0.5 * 0.5^2 = 0.125
    torch.testing.assert_close(kl_penalty("k2", LOGP, REF), torch.tensor([[0.125, 0.0, 0.125]]))


def test_k3():
    # e^d - d - 1: e^-0.5 + 0.5 - 1 = 0.606531 - 0.5 = 0.106531; 0; e^0.5 - 0.5 - 1 = 0.148721
    torch.testing.assert_close(kl_penalty("k3", LOGP, REF), torch.tensor([[0.106531, 0.0, 0.148721]]), atol=1e-6, rtol=0)


@pytest.mark.parametrize("name", ["k1", "k2", "k3", "k3+"])
def test_identical_policies_give_zero(name):
    logp = torch.randn(4, 5, generator=torch.Generator().manual_seed(0))
    assert torch.equal(kl_penalty(name, logp, logp.clone()), torch.zeros(4, 5))


def test_k2_k3_nonnegative():
    g = torch.Generator().manual_seed(1)
    logp, ref = torch.randn(50, 20, generator=g) * 3, torch.randn(50, 20, generator=g) * 3
    assert (kl_penalty("k3", logp, ref) >= 0).all()
    assert (kl_penalty("k2", logp, ref) >= 0).all()


def test_k3_clamps_log_ratio_and_value():
    # d = +-100 clamps to +-20 before exp (finite: e^20 - 21 and e^-20 + 19), then the value is capped
    # at 10 as verl's low_var_kl caps it; past the cap the gradient is 0, not inf or NaN
    logp = torch.tensor([[0.0, 0.0]], requires_grad=True)
    ref = torch.tensor([[100.0, -100.0]])
    kl = kl_penalty("k3", logp, ref)
    torch.testing.assert_close(kl, torch.tensor([[10.0, 10.0]]))
    kl.sum().backward()
    assert torch.equal(logp.grad, torch.zeros(1, 2))


def test_unknown_kl_estimator():
    assert KL_ESTIMATORS.names() == ["k1", "k2", "k3", "k3+"]
    with pytest.raises(ValueError, match=r"unknown kl estimator 'k4'; valid: k1, k2, k3, k3\+"):
        kl_penalty("k4", LOGP, REF)


# ---------------------------------------------------------------------------------------------
# Aggregation on a 2x3 example.
LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])  # (2, 3)
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])  # row 0: 2 tokens, row 1: 1 token


def test_seq_mean_token_mean_by_hand():
    # row means: (1 + 2) / 2 = 1.5, 4 / 1 = 4; mean over 2 rows: 5.5 / 2 = 2.75
    torch.testing.assert_close(aggregate("seq-mean-token-mean", LOSS, MASK), torch.tensor(2.75))


def test_seq_mean_token_sum_norm_by_hand():
    # norm_const defaults to T = 3: (3/3 + 4/3) / 2 = 7/6
    torch.testing.assert_close(aggregate("seq-mean-token-sum-norm", LOSS, MASK), torch.tensor(7 / 6))
    # norm_const = 4: (3/4 + 4/4) / 2 = 0.875
    torch.testing.assert_close(aggregate("seq-mean-token-sum-norm", LOSS, MASK, norm_const=4.0), torch.tensor(0.875))


def test_token_mean_by_hand():
    # (1 + 2 + 4) / 3 valid tokens = 7/3
    torch.testing.assert_close(aggregate("token-mean", LOSS, MASK), torch.tensor(7 / 3))


def test_fully_masked_row_contributes_nothing():
    garbage = torch.tensor([[float("nan"), float("inf"), 1e9]])
    loss3 = torch.cat([LOSS, garbage])  # (3, 3)
    mask3 = torch.cat([MASK, torch.zeros(1, 3)])  # (3, 3)
    for mode in AGGREGATIONS.names():
        # with the same totals, the extra all-padding row changes nothing
        torch.testing.assert_close(aggregate(mode, loss3, mask3, num_seqs=2), aggregate(mode, LOSS, MASK))
    # with the default num_seqs = N = 3 it still adds 0 to the sum: 5.5 / 3
    torch.testing.assert_close(aggregate("seq-mean-token-mean", loss3, mask3), torch.tensor(5.5 / 3))


@pytest.mark.parametrize("mode", ["seq-mean-token-mean", "seq-mean-token-sum-norm", "token-mean"])
def test_micro_batches_sum_to_full_batch(mode):
    g = torch.Generator().manual_seed(0)
    loss = torch.randn(6, 5, generator=g, requires_grad=True)  # (N, T)
    mask = (torch.rand(6, 5, generator=g) > 0.4).float()  # (N, T), uneven lengths
    mask[:4, 0] = 1.0
    full = aggregate(mode, loss, mask)
    totals = dict(num_seqs=6, num_tokens=mask.sum(), norm_const=5)
    parts = [aggregate(mode, loss[s], mask[s], **totals) for s in (slice(0, 2), slice(2, 6))]
    torch.testing.assert_close(parts[0] + parts[1], full)
    # and so are the gradients (gradient accumulation is exact)
    (full_grad,) = torch.autograd.grad(full, loss)
    (acc_grad,) = torch.autograd.grad(parts[0] + parts[1], loss)
    torch.testing.assert_close(acc_grad, full_grad)


def test_aggregate_errors():
    with pytest.raises(ValueError, match="unknown loss aggregation 'sum'; valid: seq-mean-token-mean"):
        aggregate("sum", LOSS, MASK)
    with pytest.raises(ValueError, match=r"\(N, T\)"):
        aggregate("token-mean", LOSS, MASK[:, :2])


def test_all_masked_is_zero_not_nan():
    zeros = torch.zeros(2, 3)
    for mode in AGGREGATIONS.names():
        assert aggregate(mode, LOSS, zeros) == 0.0


# ---------------------------------------------------------------------------------------------
# Masked reductions (metrics).
def test_masked_reductions_by_hand():
    # valid values of LOSS under MASK: 1, 2, 4
    assert masked_mean(LOSS, MASK) == 7 / 3
    assert masked_max(LOSS, MASK) == 4.0
    assert masked_min(LOSS, MASK) == 1.0
    # median of [1, 2, 4] = 2; q = 0.75: position 0.75 * 2 = 1.5 -> 2 + 0.5 * (4 - 2) = 3
    assert masked_quantile(LOSS, MASK, 0.5) == 2.0
    assert masked_quantile(LOSS, MASK, 0.75) == 3.0


def test_masked_reductions_empty_mask_give_zero():
    zeros = torch.zeros(2, 3)
    for fn in (masked_mean, masked_max, masked_min):
        assert fn(LOSS, zeros) == 0.0
    assert masked_quantile(LOSS, zeros, 0.99) == 0.0


def test_masked_quantile_matches_torch_quantile():
    g = torch.Generator().manual_seed(3)
    x, mask = torch.randn(7, 11, generator=g), (torch.rand(7, 11, generator=g) > 0.5).float()
    for q in (0.0, 0.3, 0.99, 1.0):
        torch.testing.assert_close(masked_quantile(x, mask, q), torch.quantile(x[mask > 0], q))
