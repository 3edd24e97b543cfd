"""A step whose update ran no row (every group constant, so every advantage is 0 and
``skip_zero_advantage_rows`` leaves every row out) logs no entropy, rather than 0 nats, and the
readers of the metrics (health verdicts, plots) take the missing key as "not measured".
"""

import pytest
import torch
from matplotlib.figure import Figure

from rftlib.monitor.health import check_health
from rftlib.report.plots import _panel
from rftlib.train.phases import UpdateResult
from rftlib.train.step_metrics import step_metrics

ENTROPY_KEYS = ("entropy_mean", "entropy_p10", "entropy_p90")


def _accumulators(entropy: list[float] | None):
    """allr/upd of a one-rank step with 4 rollout rows; ``entropy`` None: the update ran no row."""
    ran = entropy is not None
    allr = {"rewards": [1.0, 1.0, 0.0, 0.0], "diags": [], "advantages": [0.0] * 4 if not ran else [1.0, 1.0, -1.0, -1.0],
            "lengths": [3, 3, 3, 3], "truncated": [False] * 4, "gns": [],
            "metrics": [{"ppo_clip_ratio": 0.0, "ratio_max": 1.0}] if ran else [],
            "tok": [float(len(entropy))] if ran else [],
            "entropy": [torch.tensor(entropy)] if ran else [],
            "behaviour_diff": [torch.zeros(len(entropy))] if ran else [],
            "seq_log_ratio": [torch.zeros(4) if ran else torch.zeros(0)]}
    upd = UpdateResult(loss=[0.0], grad_norm=[0.0], lr=[1e-3], clip=(0.2, 0.2), rows_run=4 if ran else 0, rows_seen=4)
    return allr, upd


def _row(step, entropy):
    allr, upd = _accumulators(entropy)
    return step_metrics(allr, upd, {}, step=step, world_size=1, skipped_steps=0)


def test_a_step_that_ran_no_row_logs_no_entropy():
    row = _row(1, None)
    assert not set(ENTROPY_KEYS) & set(row), {k: row[k] for k in ENTROPY_KEYS if k in row}
    assert "behaviour_logprob_diff_max" not in row and "ppo_clip_ratio" not in row
    assert row["update/skipped_row_frac"] == 1.0
    # a step that ran rows: tokens of entropy [1, 2, 3, 4] -> mean 2.5; linear quantiles at
    # positions 0.1 x 3 = 0.3 -> 1.3 and 0.9 x 3 = 2.7 -> 3.7
    ran = _row(2, [1.0, 2.0, 3.0, 4.0])
    assert ran["entropy_mean"] == 2.5
    assert ran["entropy_p10"] == pytest.approx(1.3) and ran["entropy_p90"] == pytest.approx(3.7)


def test_skipped_steps_fire_no_entropy_collapse_and_leave_no_dip_in_the_plot():
    # steps 1-3 at 2.0 nats, then two steps with nothing to learn: the last 3 measured steps are all 2.0
    # (were [2, 0, 0], mean 0.67 < the 1.0 floor: a false "diversity collapse" warning)
    rows = [_row(s, [2.0, 2.0]) for s in (1, 2, 3)] + [_row(s, None) for s in (4, 5)]
    (v,) = check_health(rows, rules=["entropy_collapse"])
    assert v.status == "pass" and v.value == 2.0
    only_skipped = [_row(s, None) for s in (1, 2)]
    (na,) = check_health(only_skipped, rules=["entropy_collapse"])
    assert na.status == "n/a"
    ax = Figure().add_subplot(1, 1, 1)
    _panel(ax, rows, "entropy_mean", "entropy", band=("entropy_p10", "entropy_p90"), refs=[(1.0, "collapse")])
    line = ax.lines[0]
    assert list(line.get_xdata()) == [1, 2, 3] and list(line.get_ydata()) == [2.0, 2.0, 2.0]


def test_the_trainer_logs_no_entropy_when_every_group_is_constant(tiny_cfg, task_with):
    import rftlib.train.loop as loop

    cfg = tiny_cfg()
    tr = loop.Trainer(cfg, progress=False, task=task_with(cfg, lambda t, e, tr_: (1.0, {"correctness": 1.0})))
    try:
        row = tr.step()  # every group constant: every advantage 0, every row skipped
        assert row["update/skipped_row_frac"] == 1.0
        assert not set(ENTROPY_KEYS) & set(row)
    finally:
        tr.close()
