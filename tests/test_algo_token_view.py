"""Per-token gradient weights (c_t = dL/dlogp_t), ratios and clip sides of one grpo_loss call
(rftlib.algo.token_view), checked against values worked out independently:

- closed forms of c per aggregation, for clipped, capped and in-range tokens, and of the KL and entropy parts;
- central finite differences of grpo_loss itself (float64) for EVERY registered policy loss (and a toy one
  registered here), with each loss's stop-gradients held at their base values (replayed ``.detach()``
  results), which is what back-propagation differentiates: CISPO's value is -sg(w) A logp, whose plain
  derivative is not its gradient;
- on a toy softmax policy, sum_t c_t grad logp_t + sum_t dL/dH_t grad H_t, with those per-token gradients in
  closed form, equals autograd's gradient of the loss;
- clip sides on hand-made ratios for each built-in, and against the loss's own clip metric.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
from torch.overrides import TorchFunctionMode

from rftlib.algo.loss_spec import POLICY_LOSSES, LossSpec, loss_spec, register_loss
from rftlib.algo.losses import grpo_loss
from rftlib.algo.token_view import cosine, grad_weights, inferred_view, token_stats, token_view
from rftlib.settings import PPOClipSettings, Section, ranged

F64 = torch.float64
BUILTINS = ("cispo", "gmpo", "gspo", "ppo_clip")


def _kw(policy_loss="ppo_clip", aggregation="seq-mean-token-mean", clip_low=0.2, clip_high=0.2, **over):
    """grpo_loss settings as rftlib.train.steps.loss_kwargs gives them."""
    return {**dict(policy_loss=policy_loss, aggregation=aggregation, kl_estimator="k3", beta=0.0, clip_low=clip_low,
                   clip_high=clip_high, dual_clip=None, log_ratio_clamp=20.0, entropy_coef=0.0), **over}


def _batch(seed=0, n=4, T=6, spread=0.3, lengths=(6, 4, 3, 5)):
    """A float64 micro-batch: logp (n, T) < 0, old = logp - N(0, spread) (off-policy), adv (n,) with both signs,
    mask (n, T) right-padded to ``lengths``."""
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(n, T, generator=g, dtype=F64) * 3 - 0.05  # (n, T)
    old = logp - spread * torch.randn(n, T, generator=g, dtype=F64)  # (n, T)
    adv = torch.tensor([1.3, -0.7, 0.4, -1.1], dtype=F64)[:n]  # (n,)
    mask = (torch.arange(T).unsqueeze(0) < torch.tensor(lengths[:n]).unsqueeze(1)).to(F64)  # (n, T)
    return logp, old, adv, mask


# ---- closed forms ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("aggregation, totals, weight", [
    # on-policy GRPO: c_t = -A_i / (|y_i| n_seq), with the optimizer batch's n_seq (8), not the micro-batch's 4
    ("seq-mean-token-mean", dict(num_seqs=8.0, num_tokens=50.0, norm_const=16.0), lambda L: 1.0 / (L * 8.0)),
    # DAPO token-mean: -A_i / n_tok
    ("token-mean", dict(num_seqs=8.0, num_tokens=50.0, norm_const=16.0), lambda L: torch.full_like(L, 1 / 50.0)),
    # Dr-GRPO: -A_i / (C n_seq)
    ("seq-mean-token-sum-norm", dict(num_seqs=8.0, num_tokens=50.0, norm_const=16.0),
     lambda L: torch.full_like(L, 1 / (16.0 * 8.0))),
])
def test_c_on_policy_is_minus_the_advantage_times_the_aggregation_weight(aggregation, totals, weight):
    logp, _, adv, mask = _batch()
    g = grad_weights(logp, logp.clone(), adv, mask, loss_kwargs=_kw(aggregation=aggregation), totals=totals)
    lengths = mask.sum(-1)  # (n,) = 6, 4, 3, 5
    want = (-adv * weight(lengths)).unsqueeze(-1) * mask  # (n, T)
    torch.testing.assert_close(g["c"], want, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(g["c_policy"], want, rtol=1e-12, atol=1e-15)
    assert g["c_entropy"] is None and float(g["c_kl"].abs().max()) == 0.0
    assert g["loss"].dim() == 0 and not g["loss"].requires_grad


def test_a_ppo_clipped_token_gets_zero_and_an_unclipped_off_policy_token_minus_a_r():
    logp, _, adv, mask = _batch()  # adv = 1.3, -0.7, 0.4, -1.1
    old = logp.clone()
    old[0, 1] = logp[0, 1] - math.log(1.5)  # A > 0, r = 1.5 > 1.2: clipped high, c = 0
    old[1, 2] = logp[1, 2] - math.log(0.5)  # A < 0, r = 0.5 < 0.8: clipped low, c = 0
    old[1, 0] = logp[1, 0] - math.log(1.5)  # A < 0, r = 1.5: not clipped (pessimistic branch), c = -A r / (|y| n)
    old[2, 0] = logp[2, 0] - math.log(0.5)  # A > 0, r = 0.5: not clipped, c = -A r / (|y| n)
    g = grad_weights(logp, old, adv, mask, loss_kwargs=_kw(), totals=dict(num_seqs=4.0))
    assert float(g["c"][0, 1]) == 0.0 and float(g["c"][1, 2]) == 0.0
    assert g["c"][1, 0].item() == pytest.approx(0.7 * 1.5 / (4 * 4.0), rel=1e-12)
    assert g["c"][2, 0].item() == pytest.approx(-0.4 * 0.5 / (3 * 4.0), rel=1e-12)
    assert g["c"][0, 0].item() == pytest.approx(-1.3 / (6 * 4.0), rel=1e-12)  # r = 1


def test_cispo_c_is_minus_a_times_the_clipped_weight_over_the_token_count():
    # cispo (rftlib.algo.losses): loss_t = -sg(clip(r, 1 - lo, 1 + hi)) A logp_t, token-mean over n_tok, so
    # dL/dlogp_t = -A clip(r_t) / n_tok: the capped token keeps a gradient, scaled to 1 + hi
    logp, _, adv, mask = _batch()
    old = logp.clone()
    old[0, 0] = logp[0, 0] - math.log(1.5)  # r = 1.5 > 1.28: capped, w = 1.28
    old[1, 1] = logp[1, 1] - math.log(0.3)  # r = 0.3 < 1 - 0.5: raised, w = 0.5
    old[2, 2] = logp[2, 2] - math.log(1.1)  # in range, w = 1.1
    kw = _kw("cispo", "token-mean", clip_low=0.5, clip_high=0.28)
    g = grad_weights(logp, old, adv, mask, loss_kwargs=kw, totals=dict(num_tokens=40.0))
    assert g["c"][0, 0].item() == pytest.approx(-1.3 * 1.28 / 40.0, rel=1e-12)
    assert g["c"][1, 1].item() == pytest.approx(0.7 * 0.5 / 40.0, rel=1e-12)
    assert g["c"][2, 2].item() == pytest.approx(-0.4 * 1.1 / 40.0, rel=1e-12)
    assert g["c"][3, 0].item() == pytest.approx(1.1 / 40.0, rel=1e-12)  # r = 1


def test_gspo_at_ratio_one_gives_ppo_clip_c_and_in_range_minus_a_s_over_length():
    logp, _, adv, mask = _batch()
    tot = dict(num_seqs=6.0)
    ppo = grad_weights(logp, logp.clone(), adv, mask, loss_kwargs=_kw(), totals=tot)["c"]
    gspo = grad_weights(logp, logp.clone(), adv, mask, loss_kwargs=_kw("gspo", clip_low=3e-4, clip_high=4e-4),
                        totals=tot)["c"]
    torch.testing.assert_close(gspo, ppo, rtol=1e-12, atol=0.0)
    # off-policy, in a wide range: c_t = -A_i s_i / (|y_i| n_seq), s_i = exp(mean over row i of log r)
    old = logp - 0.02 * torch.linspace(-1, 1, logp.numel(), dtype=F64).reshape(logp.shape)
    g = grad_weights(logp, old, adv, mask, loss_kwargs=_kw("gspo", clip_low=0.5, clip_high=0.5), totals=tot)
    L = mask.sum(-1)
    s = torch.exp(((logp - old) * mask).sum(-1) / L)  # (n,)
    torch.testing.assert_close(g["c"], (-adv * s / (L * 6.0)).unsqueeze(-1) * mask, rtol=1e-12, atol=0.0)


def test_kl_and_entropy_parts_have_their_closed_forms():
    # k2 = (logp - ref)^2 / 2: d/dlogp = beta (logp - ref) times the weight 1 / (|y_i| n_seq); the entropy bonus
    # -coef H_t: dL/dH_t = -coef / (|y_i| n_seq)
    logp, _, adv, mask = _batch()
    ref = logp + 0.1 * torch.arange(logp.numel(), dtype=F64).reshape(logp.shape) / logp.numel()
    ent = torch.rand(logp.shape, dtype=F64, generator=torch.Generator().manual_seed(3))
    kw = _kw(beta=0.05, kl_estimator="k2", entropy_coef=0.01)
    g = grad_weights(logp, logp.clone(), adv, mask, loss_kwargs=kw, totals=dict(num_seqs=5.0), ref=ref, entropy=ent)
    w = (1.0 / (mask.sum(-1) * 5.0)).unsqueeze(-1) * mask  # (n, T)
    torch.testing.assert_close(g["c_kl"], 0.05 * (logp - ref) * w, rtol=1e-10, atol=1e-15)
    torch.testing.assert_close(g["c_policy"], -adv.unsqueeze(-1) * w, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(g["c_entropy"], -0.01 * w, rtol=1e-12, atol=1e-15)
    # the loss and policy loss values are grpo_loss's
    loss, m = grpo_loss(logp, logp.clone(), adv, mask, ref_logprobs=ref, entropy=ent, num_seqs=5.0, **kw)
    assert float(g["loss"]) == float(loss) and float(g["policy_loss"]) == float(m["policy_loss"])


def test_tis_weights_scale_the_policy_weight_and_the_callers_tensors_get_no_grad():
    logp, _, adv, mask = _batch()
    isw = torch.full_like(logp, 0.5)
    isw[0, 0] = 2.0
    lp = logp.clone().requires_grad_(True)
    g = grad_weights(lp, logp.clone(), adv, mask, loss_kwargs=_kw(), totals=dict(num_seqs=4.0), is_weights=isw)
    assert g["c"][0, 0].item() == pytest.approx(-1.3 * 2.0 / (6 * 4.0), rel=1e-12)
    assert g["c"][1, 0].item() == pytest.approx(0.7 * 0.5 / (4 * 4.0), rel=1e-12)
    assert lp.grad is None


def test_bad_arguments_are_refused_naming_them():
    logp, old, adv, mask = _batch()
    with pytest.raises(ValueError, match=r"token_view: loss_kwargs .*\['num_seqs'\] go in their own arguments"):
        grad_weights(logp, old, adv, mask, loss_kwargs={**_kw(), "num_seqs": 3.0}, totals={})
    with pytest.raises(ValueError, match=r"token_view: totals has \['num_rows'\]"):
        grad_weights(logp, old, adv, mask, loss_kwargs=_kw(), totals={"num_rows": 3.0})


# ---- finite differences, every registered loss ------------------------------------------------------------

@dataclass
class _ToySettings(Section):
    toy_eps: float = ranged(0.2, gt=0, lt=1, msg="must be in (0, 1)")

    def clip_range(self):
        return self.toy_eps, None


def _toy_clip(logprobs, old_logprobs, advantages, mask, *, clip_low, clip_high, dual_clip, log_ratio_clamp):
    """PPO's clipped surrogate written out again, with no token view: the inferred view must find its clips."""
    r = torch.exp(logprobs - old_logprobs)  # (N, T)
    a = advantages.unsqueeze(-1)  # (N, 1)
    return torch.maximum(-a * r, -a * r.clamp(1 - clip_low, 1 + clip_high)), {}


@pytest.fixture
def toy_loss(monkeypatch):
    """'toy_clip' registered for one test, with no token_view."""
    monkeypatch.setattr(POLICY_LOSSES, "_table", dict(POLICY_LOSSES._table))
    register_loss("toy_clip", settings=_ToySettings)(_toy_clip)
    return "toy_clip"


class _FrozenStopGradients(TorchFunctionMode):
    """Records every ``.detach()`` result of a first evaluation, then hands those same values back, in order,
    in later evaluations: the loss evaluated with its stop-gradients held at the base point, whose
    derivative is what autograd computes (torch's detach contributes nothing to the backward)."""

    def __init__(self, record: list):
        super().__init__()
        self.record, self.replay, self.i = record, bool(record), 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in (torch.Tensor.detach, torch.detach):
            if self.replay:
                assert self.record[self.i].shape == out.shape, "the loss detached something else this time"
                out, self.i = self.record[self.i], self.i + 1
            else:
                self.record.append(out.clone())
        return out


def _fd(f, x: torch.Tensor, h=1e-6, frozen=True) -> torch.Tensor:
    """Central differences of the scalar f(x) at every element of x (float64), stop-gradients frozen."""
    record: list = []
    with _FrozenStopGradients(record):
        f(x)
    out = torch.zeros_like(x)
    for k in range(x.numel()):
        e = torch.zeros_like(x).reshape(-1)
        e[k] = h
        e = e.reshape(x.shape)
        vals = []
        for xs in (x + e, x - e):
            if frozen:
                with _FrozenStopGradients(record):
                    vals.append(float(f(xs)))
            else:
                vals.append(float(f(xs)))
        out.reshape(-1)[k] = (vals[0] - vals[1]) / (2 * h)
    return out


def _cases():
    names = sorted(set(POLICY_LOSSES.names()) | {"toy_clip"})
    for name in names:
        aggs = (("seq-mean-token-mean", "seq-mean-token-sum-norm", "token-mean") if name == "toy_clip"
                else (loss_spec(name).aggregations or ("seq-mean-token-mean", "seq-mean-token-sum-norm", "token-mean")))
        for agg in aggs:
            yield name, agg


@pytest.mark.parametrize("name, agg", list(_cases()))
def test_c_equals_finite_differences_of_grpo_loss_for_every_registered_loss(toy_loss, name, agg):
    assert set(BUILTINS) <= set(POLICY_LOSSES.names())
    logp, old, adv, mask = _batch(seed=1)
    old[0] = logp[0] - 0.3  # row 0 off-policy as a whole: GSPO clips it at 0.2
    ref = logp + 0.2 * torch.randn(logp.shape, dtype=F64, generator=torch.Generator().manual_seed(5))
    ent = torch.rand(logp.shape, dtype=F64, generator=torch.Generator().manual_seed(6))
    isw = 0.5 + torch.rand(logp.shape, dtype=F64, generator=torch.Generator().manual_seed(7))
    tot = dict(num_seqs=7.0, num_tokens=31.0, norm_const=9.0)
    for est in ("k3", "k3+", "k2"):
        kw = _kw(name, agg, beta=0.1, kl_estimator=est, entropy_coef=0.02)
        g = grad_weights(logp, old, adv, mask, loss_kwargs=kw, totals=tot, ref=ref, entropy=ent, is_weights=isw)

        def loss_of_logp(x):
            return grpo_loss(x, old, adv, mask, ref_logprobs=ref, entropy=ent, is_weights=isw, **tot, **kw)[0]

        def loss_of_entropy(hh):
            return grpo_loss(logp, old, adv, mask, ref_logprobs=ref, entropy=hh, is_weights=isw, **tot, **kw)[0]

        torch.testing.assert_close(g["c"], _fd(loss_of_logp, logp), rtol=1e-6, atol=1e-8)
        torch.testing.assert_close(g["c_entropy"], _fd(loss_of_entropy, ent), rtol=1e-6, atol=1e-8)
        assert float(g["c"].abs().sum()) > 1e-3  # not a vacuous 0 == 0

        def policy_of_logp(x):
            return grpo_loss(x, old, adv, mask, is_weights=isw, **tot, **{**kw, "beta": 0.0, "entropy_coef": 0.0})[0]

        torch.testing.assert_close(g["c_policy"], _fd(policy_of_logp, logp), rtol=1e-6, atol=1e-8)


def test_the_frozen_stop_gradients_matter_for_cispo_so_the_fd_check_is_not_vacuous():
    # cispo's value -w A logp with w = clip(r) moves with logp through w; its gradient does not (sg)
    logp, old, adv, mask = _batch(seed=1)
    kw = _kw("cispo", "token-mean", clip_low=1.0, clip_high=0.28)
    g = grad_weights(logp, old, adv, mask, loss_kwargs=kw, totals={})

    def f(x):
        return grpo_loss(x, old, adv, mask, **kw)[0]

    plain = _fd(f, logp, frozen=False)
    assert float((plain - g["c"]).abs().max()) > 1e-3
    torch.testing.assert_close(g["c"], _fd(f, logp), rtol=1e-6, atol=1e-8)


# ---- a toy softmax policy: sum_t c_t grad logp_t (+ entropy part) is autograd's gradient --------------------

@pytest.mark.parametrize("name, agg", [("ppo_clip", "seq-mean-token-mean"), ("gspo", "seq-mean-token-mean"),
                                       ("cispo", "token-mean"), ("gmpo", "seq-mean-token-mean")])
def test_c_times_per_token_gradients_sums_to_the_autograd_gradient_on_a_softmax_policy(name, agg):
    g = torch.Generator().manual_seed(11)
    n, T, H, V = 4, 6, 5, 7
    x = torch.randn(n, T, H, dtype=F64, generator=g)  # (n, T, H) features
    Wt = (0.5 * torch.randn(H, V, dtype=F64, generator=g)).requires_grad_(True)  # (H, V): a linear layer
    y = torch.randint(0, V, (n, T), generator=g)  # (n, T) sampled tokens
    lsm = torch.log_softmax(x @ Wt, dim=-1)  # (n, T, V)
    logp = lsm.gather(-1, y.unsqueeze(-1)).squeeze(-1)  # (n, T)
    ent = -(lsm.exp() * lsm).sum(-1)  # (n, T)
    _, _, adv, mask = _batch()
    old = logp.detach() - 0.3 * torch.randn(n, T, dtype=F64, generator=g)  # some tokens clipped
    ref = logp.detach() + 0.1 * torch.randn(n, T, dtype=F64, generator=g)
    kw = _kw(name, agg, beta=0.04, kl_estimator="k3", entropy_coef=0.01)
    tot = dict(num_seqs=4.0, num_tokens=float(mask.sum()), norm_const=6.0)
    loss, _ = grpo_loss(logp, old, adv, mask, ref_logprobs=ref, entropy=ent, **tot, **kw)
    (want,) = torch.autograd.grad(loss, [Wt])  # (H, V)

    cw = grad_weights(logp, old, adv, mask, loss_kwargs=kw, totals=tot, ref=ref, entropy=ent)
    with torch.no_grad():
        p = lsm.exp()  # (n, T, V)
        onehot = torch.nn.functional.one_hot(y, V).to(F64)  # (n, T, V)
        d_logp_dz = onehot - p  # d log softmax(z)_y / dz
        d_ent_dz = -p * (lsm + ent.unsqueeze(-1))  # d H / dz, H = -sum p log p
        dz = cw["c"].unsqueeze(-1) * d_logp_dz + cw["c_entropy"].unsqueeze(-1) * d_ent_dz  # (n, T, V)
        got = torch.einsum("nth,ntv->hv", x, dz)  # z = x W: dL/dW = sum_t x_t dz_t^T
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-13)
    assert float(want.abs().max()) > 1e-4


# ---- clip sides ---------------------------------------------------------------------------------------------

def _hand(log_r_rows, adv):
    """(logp, old, adv, mask) with log(pi/pi_old) = log_r_rows (n, T) given by hand, mask all ones."""
    lr = torch.tensor(log_r_rows, dtype=F64)
    logp = torch.full_like(lr, -1.0)
    return logp, logp - lr, torch.tensor(adv, dtype=F64), torch.ones_like(lr)


def test_ppo_clip_sides_on_hand_made_ratios():
    L = math.log
    logp, old, adv, mask = _hand([[L(1.5), L(0.5), L(1.1)],      # A > 0: high; low side not clipped; in range
                                  [L(0.5), L(1.5), L(4.0)],      # A < 0: low; not clipped; dual (4 > 3): high
                                  [L(1.5), L(0.5), L(1.25)]],    # A = 0: nothing is clipped
                                 [1.0, -1.0, 0.0])
    mask[0, 2] = 0.0
    v = token_view(logp, old, adv, mask, loss_kwargs=_kw(clip_low=0.2, clip_high=0.28, dual_clip=3.0))
    assert v["clip"].tolist() == [[1, 0, 0], [-1, 0, 1], [0, 0, 0]] and v["clip"].dtype == torch.int8
    assert v["dual"].tolist() == [[False] * 3, [False, False, True], [False] * 3] and v["inferred"] is False
    torch.testing.assert_close(v["ratio"], torch.tensor([[1.5, 0.5, 1.1], [0.5, 1.5, 4.0], [1.5, 0.5, 1.25]],
                                                        dtype=F64))


def test_gspo_clips_whole_rows_on_the_sequence_ratio():
    logp, old, adv, mask = _hand([[0.3, 0.3, 0.3],      # A > 0, s = e^0.3 > 1.1: high
                                  [-0.3, -0.3, -0.3],   # A < 0, s = e^-0.3 < 0.9: low
                                  [-0.3, -0.3, -0.3],   # A > 0, s low: not clipped
                                  [1.0, -1.0, 0.0]],    # A < 0, tokens far out but s = 1: not clipped
                                 [1.0, -1.0, 1.0, -1.0])
    v = token_view(logp, old, adv, mask, loss_kwargs=_kw("gspo", clip_low=0.1, clip_high=0.1))
    assert v["clip"].tolist() == [[1] * 3, [-1] * 3, [0] * 3, [0] * 3]
    s = torch.tensor([math.exp(0.3), math.exp(-0.3), math.exp(-0.3), 1.0], dtype=F64)
    torch.testing.assert_close(v["ratio"], s.unsqueeze(-1).expand(4, 3))  # the sequence ratio, not the token's


def test_cispo_sides_are_where_the_weight_was_capped_or_raised_whatever_the_advantage():
    L = math.log
    logp, old, adv, mask = _hand([[L(1.5), L(0.3), L(1.1)], [L(1.5), L(0.3), L(1.1)]], [1.0, -1.0])
    v = token_view(logp, old, adv, mask, loss_kwargs=_kw("cispo", "token-mean", clip_low=0.5, clip_high=0.28))
    assert v["clip"].tolist() == [[1, -1, 0], [1, -1, 0]]
    torch.testing.assert_close(v["weight"], torch.tensor([[1.28, 0.5, 1.1]] * 2, dtype=F64))


def test_gmpo_clips_the_log_ratio_on_the_advantage_side():
    # the same log ratios in every row; what is clipped depends on the advantage's sign
    logp, old, adv, mask = _hand([[0.5, -0.5, 0.1]] * 3, [1.0, -1.0, 0.0])
    v = token_view(logp, old, adv, mask, loss_kwargs=_kw("gmpo", clip_low=0.4, clip_high=0.4))
    assert v["clip"].tolist() == [[1, 0, 0], [0, -1, 0], [0, 0, 0]]


@pytest.mark.parametrize("name, agg, clip", [("ppo_clip", "seq-mean-token-mean", (0.2, 0.28)),
                                             ("gspo", "seq-mean-token-mean", (0.02, 0.02)),
                                             ("cispo", "token-mean", (0.5, 0.28)),
                                             ("gmpo", "seq-mean-token-mean", (0.2, 0.2))])
def test_each_builtin_view_counts_what_its_loss_metric_counts_and_clipped_means_what_the_gradient_says(name, agg,
                                                                                                       clip):
    logp, old, adv, mask = _batch(seed=2, spread=0.4)
    kw = _kw(name, agg, clip_low=clip[0], clip_high=clip[1])
    v = token_view(logp, old, adv, mask, loss_kwargs=kw)
    _, m = grpo_loss(logp, old, adv, mask, **kw)
    frac = float((v["clip"] != 0).to(F64).sum() / mask.sum())
    assert frac == pytest.approx(float(m["ppo_clip_ratio"]), abs=1e-7) and 0.0 < frac < 1.0
    c = grad_weights(logp, old, adv, mask, loss_kwargs=kw, totals={})["c"]
    live = (mask > 0) & (adv != 0).unsqueeze(-1)
    if name == "cispo":  # a capped or raised token keeps its gradient, scaled
        assert bool((c[live] != 0).all())
    else:  # a clipped token gets no gradient, an unclipped one does
        assert torch.equal((v["clip"] != 0)[live], (c == 0)[live])
        iv = inferred_view(logp, old, adv, mask, loss_kwargs=kw)
        if name == "gspo":  # clipped rows agree; the inferred side is the token's log-ratio sign, not the row's
            assert torch.equal(iv["clip"] != 0, v["clip"] != 0)
        else:
            assert torch.equal(iv["clip"], v["clip"])


def test_a_loss_with_no_view_gets_one_inferred_from_its_gradient(toy_loss):
    L = math.log
    logp, old, adv, mask = _hand([[L(1.5), L(0.5), L(1.1)], [L(0.5), L(1.5), L(1.0)], [L(1.5), L(0.5), 0.0]],
                                 [1.0, -1.0, 0.0])
    mask[0, 2] = 0.0
    v = token_view(logp, old, adv, mask, loss_kwargs=_kw("toy_clip", clip_low=0.2, clip_high=0.2))
    assert v["inferred"] is True and v["clip"].tolist() == [[1, 0, 0], [-1, 0, 0], [0, 0, 0]]
    torch.testing.assert_close(v["ratio"], torch.tensor([[1.5, 0.5, 1.1], [0.5, 1.5, 1.0], [1.5, 0.5, 1.0]],
                                                        dtype=F64))
    ppo = token_view(logp, old, adv, mask, loss_kwargs=_kw(clip_low=0.2, clip_high=0.2))
    assert torch.equal(ppo["clip"], v["clip"])
    torch.testing.assert_close(v["is_weight"], torch.ones_like(logp))


def test_every_builtin_loss_declares_its_view_and_a_bad_declaration_is_refused():
    for name in BUILTINS:
        assert loss_spec(name).token_view == f"rftlib.algo.losses:{name}_view"
        assert callable(POLICY_LOSSES.get(name).view_fn())
    with pytest.raises(ValueError, match=r"token_view='ppo_clip_view': give the view function or its "
                                         r"'package.module:attr', or None"):
        LossSpec(None, settings=PPOClipSettings, token_view="ppo_clip_view")


# ---- cosine and the table's figures -------------------------------------------------------------------------

def test_cosine_of_flat_gradients():
    assert float(cosine(torch.tensor([1.0, 0.0]), torch.tensor([1.0, 1.0]))) == pytest.approx(1 / math.sqrt(2), rel=1e-15)
    a = [torch.tensor([[3.0, 0.0]]), torch.tensor([4.0])]  # per-parameter tensors, flattened in order
    b = [torch.tensor([[-3.0, 0.0]]), torch.tensor([-4.0])]
    assert float(cosine(a, b)) == pytest.approx(-1.0, rel=1e-15)
    assert float(cosine(a, [torch.tensor([[0.0, 5.0]]), torch.tensor([0.0])])) == 0.0
    assert math.isnan(float(cosine(torch.zeros(3), torch.ones(3))))
    with pytest.raises(ValueError, match="have 3 and 2 elements"):
        cosine(torch.ones(3), torch.ones(2))


def test_token_stats_over_valid_tokens():
    view = {"clip": torch.tensor([[1, 0, -1, 1], [0, -1, 0, 0]], dtype=torch.int8),
            "ratio": torch.tensor([[1.5, 1.0, 0.5, 9.0], [1.0, 0.7, 1.2, 1.0]])}
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]])  # the 9.0 and its +1 are padding
    c = torch.tensor([[0.0, -0.25, 0.0, 100.0], [0.5, 0.0, -0.125, 0.125]])
    s = token_stats(view, c, mask)
    assert float(s["clip_low"]) == pytest.approx(2 / 7) and float(s["clip_high"]) == pytest.approx(1 / 7)
    assert float(s["ratio_max"]) == 1.5 and float(s["ratio_mean"]) == pytest.approx(6.9 / 7)
    assert float(s["sum|c|"]) == 1.0
    assert "sum|c|" not in token_stats(view, None, mask)
