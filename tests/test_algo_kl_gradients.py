"""Which KL estimators regularise when they sit in the loss.

On a categorical policy pi = softmax(theta) over V = 5 tokens and a fixed pi_ref, each estimator is
evaluated at every token y of the support and weighted by pi(y) (detached: a sampled token is data,
not differentiated), which gives the *exact* expected gradient a loss term would have on-policy.
It is compared with autograd of the closed forms
    reverse KL(pi || pi_ref) = sum_y pi (log pi - log pi_ref)
    forward KL(pi_ref || pi) = sum_y pi_ref (log pi_ref - log pi).
Derivation (d est / d log pi(y), times grad log pi(y), summed with weights pi(y)):
    k1: sum pi grad log pi = grad sum pi = 0
    k2, k3+: sum pi (log pi - log pi_ref) grad log pi = grad reverse KL
    k3: sum pi (1 - pi_ref / pi) grad log pi = -sum pi_ref grad log pi = grad forward KL
"""

import math

import pytest
import torch

from rftlib.algo.kl import KL_ESTIMATORS, kl_penalty
from rftlib.algo.losses import grpo_loss
from rftlib.config import ConfigError, make_config

THETA = torch.tensor([1.0, -0.5, 0.3, 2.0, -1.2])  # policy logits (V,)
REF = torch.log_softmax(torch.tensor([0.2, 0.4, -0.3, 0.5, 0.1]), dim=0)  # (V,) log pi_ref


def _expected_grad(name):
    """(exact E_{y~pi}[est], exact E_{y~pi}[grad_theta est]) of estimator ``name``."""
    theta = THETA.clone().requires_grad_()
    logp = torch.log_softmax(theta, dim=0)  # (V,)
    est = kl_penalty(name, logp.unsqueeze(0), REF.unsqueeze(0))[0]  # (V,) the estimator at each token
    value = (logp.exp().detach() * est).sum()
    (grad,) = torch.autograd.grad(value, theta)
    return value.detach(), grad


def _closed_form(forward=False):
    theta = THETA.clone().requires_grad_()
    logp = torch.log_softmax(theta, dim=0)
    kl = (REF.exp() * (REF - logp)).sum() if forward else (logp.exp() * (logp - REF)).sum()
    (grad,) = torch.autograd.grad(kl, theta)
    return kl.detach(), grad


def test_the_example_has_a_real_kl_gradient():
    _, rev = _closed_form()
    _, fwd = _closed_form(forward=True)
    assert rev.norm() > 0.25  # a gradient to get wrong (0.29 here)
    cos = torch.dot(rev, fwd) / (rev.norm() * fwd.norm())
    assert cos < 0.99 and (rev - fwd).abs().max() > 0.05  # forward and reverse differ here


def test_k1_in_the_loss_has_zero_expected_gradient():
    value, grad = _expected_grad("k1")
    kl, _ = _closed_form()
    torch.testing.assert_close(value, kl)  # unbiased value...
    torch.testing.assert_close(grad, torch.zeros(5), atol=1e-6, rtol=0)  # ...and no gradient at all


@pytest.mark.parametrize("name", ["k2", "k3+"])
def test_k2_and_k3_plus_gradients_are_the_reverse_kl_gradient(name):
    _, grad = _expected_grad(name)
    _, rev = _closed_form()
    torch.testing.assert_close(grad, rev, atol=1e-6, rtol=1e-5)


def test_k3_plus_value_is_k3_value_unbiased():
    v3p, _ = _expected_grad("k3+")
    v3, _ = _expected_grad("k3")
    kl, _ = _closed_form()
    torch.testing.assert_close(v3p, v3)
    torch.testing.assert_close(v3p, kl)


def test_k3_in_the_loss_differentiates_to_the_forward_kl():
    _, grad = _expected_grad("k3")
    _, fwd = _closed_form(forward=True)
    _, rev = _closed_form()
    torch.testing.assert_close(grad, fwd, atol=1e-6, rtol=1e-5)
    assert (grad - rev).abs().max() > 0.05


def test_k3_plus_through_grpo_loss_monte_carlo():
    # The same through the trainer's loss: M = 20000 tokens sampled from pi (seed 0), advantages 0, so
    # the loss is beta * mean_t KL_t (token-mean). Its gradient estimates E[grad est]; the Monte Carlo
    # error of this mean is ~ std / sqrt(M) ~ 0.01 here: tolerance 0.05 absolute.
    M = 20000
    y = torch.multinomial(torch.softmax(THETA, 0), M, replacement=True, generator=torch.Generator().manual_seed(0))
    _, rev = _closed_form()
    for name, want in (("k3+", rev), ("k1", torch.zeros(5))):
        theta = THETA.clone().requires_grad_()
        logp = torch.log_softmax(theta, 0)[y].unsqueeze(-1)  # (M, 1): one token per row
        loss, m = grpo_loss(logp, logp.detach(), torch.zeros(M), torch.ones(M, 1), ref_logprobs=REF[y].unsqueeze(-1),
                            beta=1.0, kl_estimator=name, aggregation="token-mean")
        (grad,) = torch.autograd.grad(loss, theta)
        torch.testing.assert_close(grad, want, atol=0.05, rtol=0)


def test_k3_plus_by_hand():
    # logp - ref = [0.5, 0, -0.5] -> value k3 = [0.148721, 0, 0.106531] (d = -0.5: e^-0.5 + 0.5 - 1;
    # d = 0.5: e^0.5 - 0.5 - 1), gradient k2's d/dlogp = logp - ref = [0.5, 0, -0.5]
    logp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    ref = torch.tensor([[-1.5, -2.0, 0.0]])
    kl = kl_penalty("k3+", logp, ref)
    torch.testing.assert_close(kl, torch.tensor([[0.106531, 0.0, 0.148721]]), atol=1e-6, rtol=0)
    (grad,) = torch.autograd.grad(kl.sum(), logp)
    torch.testing.assert_close(grad, torch.tensor([[0.5, 0.0, -0.5]]))
    assert "k3+" in KL_ESTIMATORS


def test_kl_in_reward_by_hand():
    from rftlib.algo.shaping import kl_in_reward

    # sums over valid tokens: row 0: 0.1 + 0.2 = 0.3 (the padded 5.0 ignored); row 1: 0.3 - 0.1 + 0 = 0.2
    # beta 0.5: [1 - 0.15, 0 - 0.1] = [0.85, -0.1]
    out = kl_in_reward(torch.tensor([1.0, 0.0]), torch.tensor([[0.1, 0.2, 5.0], [0.3, -0.1, 0.0]]),
                       torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]), beta=0.5)
    torch.testing.assert_close(out, torch.tensor([0.85, -0.1]))


def test_k3_gradient_stays_bounded():
    # Issue 19 item 5. d k3 / d logp = 1 - e^d with d = ref - logp: -3.3e6 at d = 15 before the cap.
    # With k3 capped at 10 (verl), the gradient is nonzero only where e^d - d - 1 < 10, i.e.
    # d in (-11, d*) with e^d* - d* - 1 = 10 (bisection below, d* = 2.610): |1 - e^d| < e^d* - 1 = 12.61.
    lo, hi = 0.0, 5.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if math.expm1(mid) - mid < 10 else (lo, mid)
    bound = math.expm1(hi)  # 12.61
    ref = torch.linspace(-30.0, 30.0, 60001).unsqueeze(0)  # (1, M): d from -30 to 30 in steps of 1e-3
    logp = torch.zeros_like(ref, requires_grad=True)
    kl_penalty("k3", logp, ref).sum().backward()
    # float32: the value near the cap is 10 up to ~1e-6, which moves d* by ~1e-7: 1e-5 relative is ample
    assert logp.grad.abs().max() <= bound * (1 + 1e-5)
    assert logp.grad.abs().max() > 0.99 * bound  # the bound is reached just below d*, not a loose one
    # at d = 15 the token is past the cap: value 10, no gradient (was 1 - e^15 = -3.3e6)
    logp15 = torch.zeros(1, 1, requires_grad=True)
    kl = kl_penalty("k3", logp15, torch.full((1, 1), 15.0))
    kl.sum().backward()
    assert kl.item() == 10.0 and logp15.grad.item() == 0.0
    # through the loss with beta = 1 (token-mean over one token): the same bounded gradient
    lp = torch.zeros(1, 1, requires_grad=True)
    loss, _ = grpo_loss(lp, lp.detach(), torch.zeros(1), torch.ones(1, 1), ref_logprobs=torch.full((1, 1), 2.0),
                        beta=1.0, kl_estimator="k3", aggregation="token-mean")
    (g,) = torch.autograd.grad(loss, lp)
    torch.testing.assert_close(g, torch.tensor([[1 - math.exp(2.0)]]))  # below the cap: k3's own gradient


# ---- the configuration: k1 in the loss refused with what to use; the seed-000 presets fixed ------
def test_config_refuses_k1_in_the_loss_and_says_what_to_use():
    with pytest.raises(ConfigError, match=r"kl_estimator='k1' with beta=0.04 in the loss: .*zero expected gradient"
                                          r".*k3\+.*kl_in_reward: true"):
        make_config(None, {"beta": 0.04, "kl_estimator": "k1"})
    make_config(None, {"beta": 0.04, "kl_estimator": "k3+"})
    make_config(None, {"beta": 0.04, "kl_estimator": "k1", "kl_in_reward": True})
    make_config(None, {"beta": 0.0, "kl_estimator": "k1"})  # no KL term: k1 is only logged


@pytest.mark.parametrize("preset", ["seed000-phase15", "seed000-phase15-cpu"])
def test_seed000_presets_regularise(preset):
    cfg = make_config(preset)
    assert cfg.beta == 0.04 and cfg.kl_estimator == "k1" and cfg.kl_in_reward


@pytest.mark.parametrize("over, msg", [
    ({"kl_in_reward": True, "beta": 0.0}, "kl_in_reward: true with beta 0 subtracts nothing"),
    ({"kl_in_reward": True, "beta": 0.01, "kl_estimator": "k3+"}, "use k1 .* or k3"),
])
def test_config_kl_in_reward_errors(over, msg):
    with pytest.raises(ConfigError, match=msg):
        make_config(None, over)
