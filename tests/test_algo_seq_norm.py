"""Which rows the seq-mean aggregations divide by.

``dynamic_sampling: mask`` empties the loss mask of groups whose rewards are all equal. Those rows
have advantage 0, so their policy loss is 0 whatever the normaliser; if the normaliser still counts
them (loss_seq_norm all, TRL's), masking changes nothing at all. verl divides by the rows left in
the loss (nonempty, the default), so masking scales the informative rows up to a full batch's weight.
"""

from dataclasses import replace

import pytest
import torch

import rftlib.train.loop as loop
from rftlib.algo.aggregation import batch_totals
from rftlib.algo.losses import grpo_loss
from rftlib.config import ConfigError, make_config
from rftlib.train.steps import loss_totals
from toy_rewards import half_constant_reward

# 4 rows of T = 3; row 2 has an empty loss mask (a masked group), row 3 one token
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0]])


def test_batch_totals_by_hand():
    for norm, rows in (("nonempty", 3.0), ("all", 4.0)):
        seqs, tokens = batch_totals(MASK, seq_norm=norm)
        assert seqs.item() == rows and tokens.item() == 6.0  # 2 + 3 + 0 + 1 tokens either way
    with pytest.raises(ValueError, match="seq_norm 'some': choose nonempty or all"):
        batch_totals(MASK, seq_norm="some")
    # nothing in the loss: clamped to 1 so the loss is 0, not 0 / 0
    seqs, tokens = loss_totals(make_config(None, {}), torch.zeros(2, 3))
    assert (seqs.item(), tokens.item()) == (1.0, 1.0)


def test_masked_rows_leave_the_seq_mean_normaliser():
    # on-policy (ratio 1), A = [1, -2, 0, 0]; rows 2-3 are a constant group, masked out of the loss.
    # seq-mean-token-mean: d loss / d logp_it = -A_i / len_i / num_seqs at row i's valid tokens:
    #   nonempty: num_seqs = 2 -> row 0: -1/2/2 = -0.25, row 1: +2/3/2 = 1/3
    #   all:      num_seqs = 4 -> half of that: -0.125 and 1/6 -- the same as not masking at all
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    adv = torch.tensor([1.0, -2.0, 0.0, 0.0])
    logp = torch.tensor([[-1.0, -0.5, -3.0], [-0.2, -2.0, -1.0], [-1.0, -1.0, -1.0], [-0.3, -0.3, -0.3]],
                        requires_grad=True)
    grads = {}
    for norm in ("nonempty", "all"):
        num_seqs, num_tokens = batch_totals(mask, seq_norm=norm)
        loss, _ = grpo_loss(logp, logp.detach(), adv, mask, aggregation="seq-mean-token-mean", num_seqs=num_seqs,
                            num_tokens=num_tokens)
        (grads[norm],) = torch.autograd.grad(loss, logp)
    live = torch.tensor([[-0.25, -0.25, 0.0], [1 / 3, 1 / 3, 1 / 3], [0.0] * 3, [0.0] * 3])
    torch.testing.assert_close(grads["nonempty"], live)
    torch.testing.assert_close(grads["all"], live / 2)


def test_a_mask_that_changes_no_gradient_is_refused():
    with pytest.raises(ConfigError, match=r"dynamic_sampling: mask with loss_agg_mode seq-mean-token-mean and "
                                          r"loss_seq_norm all changes no gradient.*set loss_seq_norm nonempty"):
        make_config(None, {"dynamic_sampling": "mask", "loss_seq_norm": "all"})
    with pytest.raises(ConfigError, match="loss_seq_norm='every': choose nonempty or all"):
        make_config(None, {"loss_seq_norm": "every"})
    assert make_config(None, {}).loss_seq_norm == "nonempty"
    make_config(None, {"dynamic_sampling": "mask"})  # nonempty: the masked rows leave the normaliser
    # token-mean divides by tokens, and a KL term or an entropy bonus reads the masked rows: not a no-op
    make_config(None, {"dynamic_sampling": "mask", "loss_seq_norm": "all", "loss_agg_mode": "token-mean"})
    make_config(None, {"dynamic_sampling": "mask", "loss_seq_norm": "all", "beta": 0.01, "kl_estimator": "k3+"})
    make_config(None, {"dynamic_sampling": "mask", "loss_seq_norm": "all", "entropy_coef": 0.01})


def test_dynamic_sampling_mask_moves_the_trainer_gradient(tiny_cfg, task_with):
    # One rollout, three updates of the same weights: off (the completion mask), mask under nonempty,
    # mask under all. With B*G = 16 rows of which k are in constant groups, seq-mean-token-mean gives
    # grad(mask, nonempty) = grad(off) * 16 / (16 - k) and grad(mask, all) = grad(off).
    seen = []  # the batch each update trained on (the advantages phase's result)
    cfg = tiny_cfg(dynamic_sampling="mask", lr=1e-2)
    tr = loop.Trainer(cfg, progress=False, task=task_with(cfg, half_constant_reward),
                      hooks=[lambda phase, s, res: phase == "advantages" and seen.append(res)])
    grads = []

    def step(loss_finite):  # record the accumulated gradient; leave the weights as they are
        grads.append([p.grad.detach().clone() for p in tr.params])
        tr.optimizer.zero_grad(set_to_none=True)
        return 1.0, True

    tr.backend.step = step
    try:
        tr.step()  # mask, nonempty (the default)
        batch = seen[-1]
        adv, lmask = batch.advantages, batch.loss_mask
        masked_rows = int((lmask.sum(-1) == 0).sum())
        assert masked_rows == 8 and bool((adv[lmask.sum(-1) == 0] == 0).all())  # 2 of the 4 groups constant
        tr.update(replace(batch, loss_mask=batch.rollout.completion_mask))  # off: every row in the loss
        tr.cfg = replace(tr.cfg, loss_seq_norm="all")
        tr.update(batch)  # mask, all
    finally:
        tr.close()
    g_mask, g_off, g_all = grads
    assert any(float(g.abs().max()) > 0 for g in g_off), "the update must have a gradient to compare"
    # The rows run are the same in each update, in the same order. off and (mask, all) divide by 16: the same
    # arithmetic. (mask, nonempty) divides by 8 instead: a factor 2, exact in float32 and bf16 alike, so every
    # intermediate (bf16 autocast included) is scaled exactly; 1e-5 relative only guards against denormals.
    for a, b, c in zip(g_mask, g_off, g_all):
        torch.testing.assert_close(a, b * 16 / (16 - masked_rows), atol=1e-7, rtol=1e-5)
        torch.testing.assert_close(c, b, atol=1e-7, rtol=1e-5)
