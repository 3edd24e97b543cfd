"""PPO-clip policy loss and the full grpo_loss, against hand-computed values and a plain loop."""

import math

import pytest
import torch

from rftlib.algo.aggregation import AGGREGATIONS
from rftlib.algo.losses import POLICY_LOSSES, grpo_loss, ppo_clip

LN = math.log


def _lp(ratios):
    """(logprobs, old_logprobs) with old = 0, so ratio = exp(logprobs) = the given numbers."""
    logprobs = torch.tensor(ratios, dtype=torch.float32).log().requires_grad_()
    return logprobs, torch.zeros_like(logprobs)


def test_ratio_one_gives_minus_masked_mean_advantage():
    # ratio 1 everywhere -> loss = -A on every token: row 0 -> -1, row 1 -> +2.
    # seq-mean-token-mean: row means -1 and 2 -> (-1 + 2) / 2 = 0.5 = -mean(A)
    logprobs = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.1, -4.0]])
    adv = torch.tensor([1.0, -2.0])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    loss_mat, _ = ppo_clip(logprobs, logprobs.clone(), adv, mask)
    torch.testing.assert_close(loss_mat, torch.tensor([[-1.0] * 3, [2.0] * 3]))
    loss, _ = grpo_loss(logprobs, logprobs.clone(), adv, mask)
    torch.testing.assert_close(loss, torch.tensor(0.5))


def test_zero_advantage_zero_loss_and_grad():
    g = torch.Generator().manual_seed(0)
    logprobs = torch.randn(3, 4, generator=g).requires_grad_()
    old = torch.randn(3, 4, generator=g)
    for mode in AGGREGATIONS.names():
        loss, _ = grpo_loss(logprobs, old, torch.zeros(3), torch.ones(3, 4), aggregation=mode)
        (grad,) = torch.autograd.grad(loss, logprobs)
        assert loss == 0.0 and torch.equal(grad, torch.zeros(3, 4))


# Row 0 has A = +1, row 1 has A = -1; ratios chosen on both sides of the clip range [0.8, 1.2].
RATIOS = [[1.5, 0.5], [0.5, 1.5]]
ADV = torch.tensor([1.0, -1.0])


def test_clipping_by_hand():
    logprobs, old = _lp(RATIOS)
    loss_mat, metrics = ppo_clip(logprobs, old, ADV, torch.ones(2, 2))
    # A=+1, r=1.5: max(-1.5, -1.2) = -1.2 (clipped)   A=+1, r=0.5: max(-0.5, -0.8) = -0.5 (unclipped)
    # A=-1, r=0.5: max( 0.5,  0.8) =  0.8 (clipped)   A=-1, r=1.5: max( 1.5,  1.2) =  1.5 (unclipped)
    torch.testing.assert_close(loss_mat, torch.tensor([[-1.2, -0.5], [0.8, 1.5]]))
    # clipped branch active on 2 of 4 tokens
    torch.testing.assert_close(metrics["ppo_clip_ratio"], torch.tensor(0.5))
    # masking out the (unclipped) token [1, 1]: 2 of 3
    _, metrics = ppo_clip(logprobs, old, ADV, torch.tensor([[1.0, 1.0], [1.0, 0.0]]))
    torch.testing.assert_close(metrics["ppo_clip_ratio"], torch.tensor(2 / 3))


def test_clip_higher_is_asymmetric():
    # clip range [1 - 0.2, 1 + 0.28] = [0.8, 1.28]
    logprobs, old = _lp([[1.5, 1.25], [0.5, 0.7]])
    loss_mat, metrics = ppo_clip(logprobs, old, ADV, torch.ones(2, 2), clip_low=0.2, clip_high=0.28)
    # A=+1: r=1.5 -> -1.28 (clipped at the raised ceiling); r=1.25 -> -1.25 (inside, unclipped)
    # A=-1: r=0.5 -> max(0.5, 0.8) = 0.8; r=0.7 -> max(0.7, 0.8) = 0.8 (floor unchanged at 0.8)
    torch.testing.assert_close(loss_mat, torch.tensor([[-1.28, -1.25], [0.8, 0.8]]))
    torch.testing.assert_close(metrics["ppo_clip_ratio"], torch.tensor(3 / 4))


def test_dual_clip_caps_negative_advantage():
    logprobs, old = _lp([[5.0, 2.0, 0.5]] * 2)
    adv = torch.tensor([-1.0, 1.0])
    loss_mat, metrics = ppo_clip(logprobs, old, adv, torch.ones(2, 3), dual_clip=3.0)
    # A=-1: r=5 -> max(5, 1.2) = 5, capped at -A*3 = 3; r=2 -> 2 (< 3); r=0.5 -> max(0.5, 0.8) = 0.8
    # A=+1: never capped: r=5 -> -1.2; r=2 -> -1.2; r=0.5 -> max(-0.5, -0.8) = -0.5
    torch.testing.assert_close(loss_mat, torch.tensor([[3.0, 2.0, 0.8], [-1.2, -1.2, -0.5]]))
    torch.testing.assert_close(metrics["dual_clip_frac"], torch.tensor(1 / 6))
    # the capped token gets no gradient; the uncapped A<0, r=2 token gets -A * r = 2
    (grad,) = torch.autograd.grad(loss_mat.sum(), logprobs)
    assert grad[0, 0] == 0.0
    torch.testing.assert_close(grad[0, 1], torch.tensor(2.0))
    assert "dual_clip_frac" not in ppo_clip(logprobs, old, adv, torch.ones(2, 3))[1]


@pytest.mark.parametrize("bad", [1.0, 0.5])
def test_dual_clip_must_exceed_one(bad):
    logprobs, old = _lp([[1.0]])
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        ppo_clip(logprobs, old, torch.tensor([1.0]), torch.ones(1, 1), dual_clip=bad)


def test_log_ratio_clamp_and_raw_max():
    # log ratios 30, -25, 0.1 (and 50 on a masked token, which must not show in the metrics)
    logprobs = torch.tensor([[30.0, -25.0, 0.1, 50.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    loss_mat, m = ppo_clip(logprobs, torch.zeros(1, 4), torch.tensor([-1.0]), mask)
    assert m["log_ratio_raw_max"] == 30.0
    assert m["log_ratio_max"] == 20.0 and m["log_ratio_min"] == -20.0
    torch.testing.assert_close(m["ratio_max"], torch.tensor(math.exp(20)))
    # A=-1, clamped ratio e^20: max(e^20, 1.2) = e^20, finite
    torch.testing.assert_close(loss_mat[0, 0], torch.tensor(math.exp(20)))
    assert torch.isfinite(loss_mat).all()


def test_log_ratio_abs_p99_by_hand():
    # |log ratio| = 0.00, 0.01, ..., 0.99 (100 valid tokens, signs alternate), plus a masked 9.0.
    # p99 position = 0.99 * (100 - 1) = 98.01 -> 0.98 + 0.01 * (0.99 - 0.98) = 0.9801
    vals = torch.arange(100) * 0.01 * torch.tensor([1.0, -1.0]).repeat(50)
    logprobs = torch.cat([vals, torch.tensor([9.0])]).view(1, 101)
    mask = torch.ones(1, 101)
    mask[0, -1] = 0.0
    _, m = ppo_clip(logprobs, torch.zeros(1, 101), torch.tensor([1.0]), mask)
    torch.testing.assert_close(m["log_ratio_abs_p99"], torch.tensor(0.9801))


def test_approx_kl_old_by_hand():
    # (r - 1) - ln r: r = 1.5 -> 0.5 - 0.405465 = 0.094535; r = 0.5 -> -0.5 + 0.693147 = 0.193147
    # RATIOS holds each twice: mean = (0.094535 + 0.193147) / 2 = 0.143841
    logprobs, old = _lp(RATIOS)
    _, m = ppo_clip(logprobs, old, ADV, torch.ones(2, 2))
    torch.testing.assert_close(m["approx_kl_old"], torch.tensor(0.143841), atol=1e-6, rtol=0)


def test_gradients_by_hand():
    # inside the clip range: d(-A r)/d logprob = -A r.  A=+2, r=1.1 -> -2.2;  A=-1, r=0.9 -> 0.9
    logprobs, old = _lp([[1.1, 1.5, 0.5], [0.9, 0.5, 1.5]])
    adv = torch.tensor([2.0, -1.0])
    loss_mat, _ = ppo_clip(logprobs, old, adv, torch.ones(2, 3))
    (grad,) = torch.autograd.grad(loss_mat.sum(), logprobs)
    # row 0 (A=+2): r=1.5 clipped -> 0; r=0.5 unclipped -> -2 * 0.5 = -1
    # row 1 (A=-1): r=0.5 clipped -> 0; r=1.5 unclipped -> 1.5
    torch.testing.assert_close(grad, torch.tensor([[-2.2, 0.0, -1.0], [0.9, 0.0, 1.5]]))


def test_metrics_with_empty_mask_are_zero():
    logprobs, old = _lp(RATIOS)
    loss, m = grpo_loss(logprobs, old, ADV, torch.zeros(2, 2), ref_logprobs=old, beta=0.1,
                        entropy=torch.ones(2, 2), dual_clip=3.0)
    assert loss == 0.0
    for k, v in m.items():
        assert v == 0.0, k


def test_metrics_are_detached_scalars():
    logprobs, old = _lp(RATIOS)
    ent = torch.rand(2, 2, requires_grad=True)
    _, m = grpo_loss(logprobs, old, ADV, torch.ones(2, 2), ref_logprobs=old - 0.1, entropy=ent, entropy_coef=0.01)
    expected = {"ppo_clip_ratio", "log_ratio_raw_max", "log_ratio_max", "log_ratio_min", "ratio_max",
                "log_ratio_abs_p99", "approx_kl_old", "kl", "entropy_mean", "policy_loss"}
    assert set(m) == expected
    for k, v in m.items():
        assert isinstance(v, torch.Tensor) and v.dim() == 0 and not v.requires_grad, k


def test_kl_term_and_metric():
    # ratio 1 everywhere (logprobs == old), A = [1, -1]: policy loss per token = -A.
    # ref - logp = ln 2 on every token: k3 = 2 - ln 2 - 1 = 0.306853
    logprobs = torch.tensor([[-1.0, -1.0], [-2.0, -2.0]])
    ref = logprobs + LN(2.0)
    mask = torch.ones(2, 2)
    loss0, m0 = grpo_loss(logprobs, logprobs, ADV, mask, ref_logprobs=ref, beta=0.0)
    # beta = 0: loss = mean(-A) = 0, but kl is still reported
    torch.testing.assert_close(loss0, torch.tensor(0.0))
    torch.testing.assert_close(m0["kl"], torch.tensor(0.306853), atol=1e-6, rtol=0)
    loss1, m1 = grpo_loss(logprobs, logprobs, ADV, mask, ref_logprobs=ref, beta=0.1)
    # 0 + 0.1 * 0.306853
    torch.testing.assert_close(loss1, torch.tensor(0.0306853), atol=1e-7, rtol=0)
    torch.testing.assert_close(m1["policy_loss"], torch.tensor(0.0))
    # k1 instead: logp - ref = -ln 2 = -0.693147
    _, mk1 = grpo_loss(logprobs, logprobs, ADV, mask, ref_logprobs=ref, kl_estimator="k1")
    torch.testing.assert_close(mk1["kl"], torch.tensor(-LN(2.0)))
    assert "kl" not in grpo_loss(logprobs, logprobs, ADV, mask)[1]


def test_entropy_bonus():
    # ratio 1, A = [1, -1] -> policy term 0 after seq-mean-token-mean; entropy mean = (1+2+3+4)/4 = 2.5
    # loss = 0 - 0.1 * 2.5 = -0.25
    logprobs = torch.zeros(2, 2, requires_grad=True)
    ent = torch.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    loss, m = grpo_loss(logprobs, logprobs.detach(), ADV, torch.ones(2, 2), entropy=ent, entropy_coef=0.1)
    torch.testing.assert_close(loss, torch.tensor(-0.25))
    torch.testing.assert_close(m["entropy_mean"], torch.tensor(2.5))
    # a bonus on an entropy that carries no gradient would silently do nothing: refused
    with pytest.raises(ValueError, match="entropy_grad=True"):
        grpo_loss(logprobs, logprobs.detach(), ADV, torch.ones(2, 2), entropy=ent.detach(), entropy_coef=0.1)
    # logging only (coef 0) is fine with a detached entropy
    grpo_loss(logprobs, logprobs.detach(), ADV, torch.ones(2, 2), entropy=ent.detach())


def test_unknown_names_and_bad_shapes():
    logprobs, old = _lp(RATIOS)
    mask = torch.ones(2, 2)
    assert POLICY_LOSSES.names() == ["cispo", "gmpo", "gspo", "ppo_clip"]
    with pytest.raises(ValueError, match="unknown policy loss 'reinforce'; valid: cispo, gmpo, gspo, ppo_clip"):
        grpo_loss(logprobs, old, ADV, mask, policy_loss="reinforce")
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        grpo_loss(logprobs, old, ADV, mask, aggregation="mean")
    with pytest.raises(ValueError, match="unknown kl estimator"):
        grpo_loss(logprobs, old, ADV, mask, ref_logprobs=old, kl_estimator="k9")
    with pytest.raises(ValueError, match=r"advantages must be \(N,\)"):
        grpo_loss(logprobs, old, torch.ones(2, 1), mask)


# ---------------------------------------------------------------------------------------------
# Vectorised grpo_loss vs a plain Python loop over tokens.
def _loop_grpo_loss(lp, old, adv, mask, ref, beta, mode, clip_low, clip_high, dual_clip, norm_const):
    n, t = len(lp), len(lp[0])
    rows = []  # per row: (sum of valid token losses, number of valid tokens)
    for i in range(n):
        total, count = 0.0, 0
        for j in range(t):
            if mask[i][j] == 0:
                continue
            log_r = min(max(lp[i][j] - old[i][j], -20.0), 20.0)
            r = math.exp(log_r)
            a = adv[i]
            loss = max(-a * r, -a * min(max(r, 1 - clip_low), 1 + clip_high))
            if dual_clip is not None and a < 0:
                loss = min(loss, -a * dual_clip)
            if ref is not None and beta > 0:
                d = ref[i][j] - lp[i][j]
                loss += beta * (math.exp(d) - d - 1)
            total, count = total + loss, count + 1
        rows.append((total, count))
    if mode == "seq-mean-token-mean":
        return sum(s / max(c, 1) for s, c in rows) / n
    if mode == "seq-mean-token-sum-norm":
        return sum(s / norm_const for s, _ in rows) / n
    return sum(s for s, _ in rows) / max(sum(c for _, c in rows), 1)


@pytest.mark.parametrize("mode", ["seq-mean-token-mean", "seq-mean-token-sum-norm", "token-mean"])
@pytest.mark.parametrize("with_kl", [False, True])
@pytest.mark.parametrize("dual_clip", [None, 2.0])
def test_vectorised_matches_loop(mode, with_kl, dual_clip):
    g = torch.Generator().manual_seed(42)
    n, t = 8, 7
    old = -torch.rand(n, t, generator=g, dtype=torch.float64) * 3  # (N, T)
    logprobs = old + 0.4 * torch.randn(n, t, generator=g, dtype=torch.float64)  # ratios ~ e^(+-0.4): some clipped
    ref = old + 0.3 * torch.randn(n, t, generator=g, dtype=torch.float64) if with_kl else None
    adv = torch.randn(n, generator=g, dtype=torch.float64)  # (N,)
    mask = (torch.rand(n, t, generator=g) > 0.3).double()  # (N, T)
    mask[3] = 0.0  # one fully masked row
    beta = 0.05 if with_kl else 0.0
    loss, _ = grpo_loss(logprobs, old, adv, mask, ref_logprobs=ref, beta=beta, aggregation=mode,
                        clip_low=0.2, clip_high=0.28, dual_clip=dual_clip, norm_const=10.0)
    expected = _loop_grpo_loss(logprobs.tolist(), old.tolist(), adv.tolist(), mask.tolist(),
                               None if ref is None else ref.tolist(), beta, mode, 0.2, 0.28, dual_clip, 10.0)
    assert abs(loss.item() - expected) < 1e-6


def test_is_weights_scale_the_policy_term_per_token_only():
    """TIS: with weights w the policy term of each token is w times its unweighted value; KL is not weighted.

    On-policy (ratio 1), ppo_clip's per-token loss is -A. Rows A = (1, -1), 2 tokens each, all valid;
    w = [[2, 0], [1, 0.5]] -> per-token policy losses [[-2, 0], [1, 0.5]], token-mean over 4 tokens
    = (-2 + 0 + 1 + 0.5) / 4 = -0.125 (unweighted: (-1 - 1 + 1 + 1) / 4 = 0).
    """
    lp = torch.zeros(2, 2)
    adv = torch.tensor([1.0, -1.0])
    mask = torch.ones(2, 2)
    w = torch.tensor([[2.0, 0.0], [1.0, 0.5]])
    loss, m = grpo_loss(lp, lp, adv, mask, aggregation="token-mean", is_weights=w)
    assert loss.item() == pytest.approx(-0.125)
    assert m["policy_loss"].item() == pytest.approx(-0.125)
    # with a reference, the KL term (k3 of log ratio 0.5: e^-0.5 - 1 + 0.5 = 0.10653) is added unweighted
    ref = torch.full((2, 2), -0.5)
    loss_kl, _ = grpo_loss(lp, lp, adv, mask, aggregation="token-mean", is_weights=w, ref_logprobs=ref, beta=1.0,
                           kl_estimator="k3")
    assert loss_kl.item() == pytest.approx(-0.125 + (math.exp(-0.5) - 1 + 0.5), abs=1e-6)
