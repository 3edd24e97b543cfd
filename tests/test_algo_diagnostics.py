import math

import pytest
import torch

from rftlib.algo.diagnostics import importance_ess, simple_noise_scale


def test_simple_noise_scale_hand_computed():
    # |G_small|^2 = mean(5, 7) = 6 at B=2; |G_big|^2 = 3 at B=8
    # |G|^2 = (8*3 - 2*6) / (8 - 2) = 12/6 = 2 ; tr(S) = (6 - 3) / (1/2 - 1/8) = 3 / 0.375 = 8
    # B_simple = 8 / 2 = 4
    out = simple_noise_scale(torch.tensor([5.0, 7.0]), torch.tensor(3.0), 2, 8)
    assert out["gns_grad_sq"].item() == pytest.approx(2.0)
    assert out["gns_trace"].item() == pytest.approx(8.0)
    assert out["gns_b_simple"].item() == pytest.approx(4.0)


def test_simple_noise_scale_recovers_known_noise():
    # gradients g = mu + noise with |mu|^2 = 1 and tr(S) = d * sigma^2 = 100 * 0.04 = 4 -> B_simple = 4
    torch.manual_seed(0)
    d, sigma = 100, 0.2
    mu = torch.zeros(d)
    mu[0] = 1.0
    samples = mu + sigma * torch.randn(200_000, d)  # per-example gradients
    small = samples[:196_608].view(-1, 4, d).mean(1)  # (M, d) batches of 4
    big = samples[:196_608].view(-1, 64, d).mean(1)  # batches of 64
    out = simple_noise_scale(small.pow(2).sum(-1), big.pow(2).sum(-1).mean(), 4, 64)
    assert out["gns_b_simple"].item() == pytest.approx(4.0, rel=0.05)


def test_importance_ess():
    mask = torch.ones(2, 3)
    assert importance_ess(torch.zeros(2, 3), mask).item() == pytest.approx(1.0)  # on-policy
    # row sums 0 and ln 3: w = (1, 3): (1+3)^2 / ((1+9) * 2) = 16/20 = 0.8
    lr = torch.tensor([[0.0, 0.0, 0.0], [math.log(3.0), 0.0, 0.0]])
    assert importance_ess(lr, mask).item() == pytest.approx(0.8)
    # masked tokens do not count: the ln 3 sits on a masked token
    assert importance_ess(lr.flip(-1), torch.tensor([[1.0, 1, 1], [1, 1, 0]])).item() == pytest.approx(1.0)
