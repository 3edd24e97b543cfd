"""The LR schedule (rftlib.algo.schedule; the optimizer's LambdaLR from rftlib.backends.scheduler):
warmup + cosine-to-min-LR, checked by hand and against transformers."""

import math

import pytest
import torch
from transformers import get_scheduler

from rftlib.algo.schedule import lr_at, warmup_steps_for
from rftlib.backends.scheduler import make_scheduler

CONFIGS = [  # (total_steps, warmup_ratio, lr)
    (200, 0.05, 5e-7),  # seed 003 a28: 400 prompts * 8 samples // 16 * 1 episode
    (37, 0.03, 1e-6),  # 120B warmup ratio, odd length
    (10, 0.0, 1e-5),  # no warmup
    (5, 0.5, 2e-5),  # warmup is half the run
]


def _lrs_from(scheduler, optimizer, n):
    lrs = []
    for _ in range(n):
        lrs.append(optimizer.param_groups[0]["lr"])  # the LR this optimizer step would use
        optimizer.step()
        scheduler.step()
    return lrs


def _optimizer(lr):
    return torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=lr)


def test_hand_values():
    # total 200, warmup ceil(200*0.05) = 10, lr 1.0, floor 0.1
    kw = dict(total_steps=200, warmup_steps=10, lr=1.0)
    assert lr_at(0, **kw) == 0.0  # warmup starts at 0: the first step has LR 0
    assert lr_at(5, **kw) == pytest.approx(0.5)  # 5/10
    assert lr_at(10, **kw) == pytest.approx(1.0)  # end of warmup, progress 0
    assert lr_at(105, **kw) == pytest.approx(0.55)  # progress 0.5: cos = 0 -> 0.5*0.9 + 0.1
    assert lr_at(200, **kw) == pytest.approx(0.1)  # floor = min_lr_ratio * lr
    assert lr_at(200, min_lr_ratio=0.0, **kw) == pytest.approx(0.0)


def test_warmup_steps_is_ceil():
    assert warmup_steps_for(200, 0.05) == 10
    assert warmup_steps_for(37, 0.03) == 2  # 1.11 -> 2
    assert warmup_steps_for(10, 0.0) == 0
    with pytest.raises(ValueError):
        warmup_steps_for(10, 1.5)


@pytest.mark.parametrize("total, ratio, lr", CONFIGS)
def test_matches_lr_at_and_transformers(total, ratio, lr):
    warmup = warmup_steps_for(total, ratio)
    ours_opt = _optimizer(lr)
    ours = _lrs_from(make_scheduler(ours_opt, total_steps=total, warmup_steps=warmup), ours_opt, total + 1)
    hf_opt = _optimizer(lr)
    hf_sched = get_scheduler(
        "cosine_with_min_lr", hf_opt, num_warmup_steps=warmup, num_training_steps=total,
        scheduler_specific_kwargs={"min_lr_rate": 0.1},
    )
    hf = _lrs_from(hf_sched, hf_opt, total + 1)
    pure = [lr_at(k, total_steps=total, warmup_steps=warmup, lr=lr) for k in range(total + 1)]
    assert ours == hf  # bit-identical: same formula, same float ops
    assert all(math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-20) for a, b in zip(ours, pure))


def test_openrlhf_min_lr_kwarg_is_the_same_floor():
    # OpenRLHF passes min_lr = 0.1 * lr rather than min_lr_rate; the schedule is the same.
    opt = _optimizer(5e-7)
    s = get_scheduler("cosine_with_min_lr", opt, num_warmup_steps=10, num_training_steps=200,
                      scheduler_specific_kwargs={"min_lr": 5e-8})
    hf = _lrs_from(s, opt, 201)
    pure = [lr_at(k, total_steps=200, warmup_steps=10, lr=5e-7) for k in range(201)]
    assert all(math.isclose(a, b, rel_tol=1e-9) for a, b in zip(hf, pure))


def test_scheduler_state_dict_resumes():
    opt = _optimizer(1.0)
    s = make_scheduler(opt, total_steps=50, warmup_steps=5)
    _lrs_from(s, opt, 20)
    opt2 = _optimizer(1.0)
    s2 = make_scheduler(opt2, total_steps=50, warmup_steps=5)
    s2.load_state_dict(s.state_dict())
    opt2.load_state_dict(opt.state_dict())
    assert opt2.param_groups[0]["lr"] == pytest.approx(lr_at(20, total_steps=50, warmup_steps=5, lr=1.0))
