"""rftlib.preflight.lr: seed 003's preflight_lr.sh (abort if LR@step20 < 30% of target)."""

import pytest

from rftlib.preflight.lr import lr_preflight, lr_preflight_for_steps, openrlhf_total_steps

A28 = dict(pool_size=400, n_samples_per_prompt=8, train_batch_size=16, num_episodes=1, warmup_ratio=0.05, lr=5e-7)


def test_total_steps_formula():
    assert openrlhf_total_steps(400, 8, 16, 1) == 200  # 400*8 // 16 * 1
    assert openrlhf_total_steps(50_000, 8, 16, 20) == 500_000
    assert openrlhf_total_steps(10, 1, 16, 1) == 0  # 10 // 16
    assert openrlhf_total_steps(400, 8, 16, 1, max_epochs=2) == 400
    with pytest.raises(ValueError):
        openrlhf_total_steps(400, 8, 0, 1)


def test_a28_passes_in_optimizer_steps():
    p = lr_preflight(**A28)
    assert (p.total_steps, p.warmup_steps) == (200, 10)
    # step 20: progress (20-10)/190; 0.1 + 0.9 * 0.5 * (1 + cos(pi * 10/190)) = 0.99386
    assert p.fraction_at_check == pytest.approx(0.99386, abs=1e-5)
    assert p.verdict == "ok" and p.ok
    assert "99.4%" in p.message
    assert "<- check" in p.table()


def test_a28_in_rollout_steps_refuses():
    # rollout 16 prompts * 8 samples / 16 per optimizer step = 8 optimizer steps per logged step:
    # logged step 20 = optimizer step 160, progress 150/190 -> 0.1 + 0.9 * 0.5 * (1 + cos(pi*150/190)) = 0.19489
    p = lr_preflight(**A28, rollout_batch_size=16)
    assert p.steps_per_rollout == 8 and p.verdict == "ok"
    assert "optimizer step 160" in p.message and "19.5%" in p.message
    r = lr_preflight(**A28, rollout_batch_size=16, check_unit="rollout")
    assert r.check_step == 160 and r.verdict == "refuse"
    assert r.fraction_at_check == pytest.approx(0.19489, abs=1e-5)


def test_long_warmup_refuses():
    # 50k pool, 20 episodes: 500k steps, warmup 25k; step 20 is at 20/25000 of target
    p = lr_preflight(50_000, 8, 16, 20, 0.05, 5e-7)
    assert p.verdict == "refuse"
    assert p.fraction_at_check == pytest.approx(20 / 25_000)
    assert "warmup lasts 25000 steps" in p.message


def test_empty_and_short_runs():
    assert lr_preflight(10, 1, 16, 1, 0.05, 1e-6).verdict == "refuse"  # 0 steps
    short = lr_preflight_for_steps(12, 0.05, 1e-6)  # ends before step 20: judged by its best LR
    assert short.verdict == "ok" and short.check_step == 1 and "only 12 steps" in short.message


def test_plot_headless():
    fig = lr_preflight(**A28).plot()
    assert fig.axes[0].get_xlabel() == "optimizer step"


@pytest.mark.parametrize("field", ["lr", "warmup_ratio", "min_lr_ratio", "min_fraction"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_input_is_refused_by_name_not_blamed_on_the_cosine(field, bad):
    # NaN fails every comparison: before the guard, lr=nan gave verdict "refuse" with "the cosine has
    # already decayed by then", and min_lr_ratio=nan the same; the error must name the input instead.
    args = dict(warmup_ratio=0.05, lr=5e-7, min_lr_ratio=0.1, min_fraction=0.3)
    args[field] = bad
    with pytest.raises(ValueError, match=rf"{field}={bad}: must be a finite number"):
        lr_preflight_for_steps(200, **args)
    with pytest.raises(ValueError, match=rf"{field}={bad}: must be a finite number"):
        lr_preflight(pool_size=400, n_samples_per_prompt=8, train_batch_size=16, num_episodes=1, **args)


def test_step_numbering_is_the_trainers_everywhere():
    # issue 15 item 5. 2 optimizer steps, warmup ratio 0.5: warmup ceil(1.0) = 1 step. The trainer's
    # step 1 trains at lr_at(0) = 0 (warmup starts from 0), step 2 at lr_at(1) = full LR 1e-3
    # (progress 0 -> factor 1). The message, the table, the plot and `rft preflight` all say so.
    import io
    from contextlib import redirect_stdout

    from rftlib import cli

    p = lr_preflight_for_steps(2, 0.5, 1e-3)
    assert "best LR, at step 2," in p.message and "100.0% of target" in p.message
    assert p.rows == [(1, 0.0, 0.0), (2, 1e-3, 1.0)]
    assert [ln.split()[:2] for ln in p.table().splitlines() if ln.strip()[:1].isdigit()] == [["1", "0"], ["2", "0.001"]]
    xs, ys = p.plot().axes[0].lines[0].get_data()
    assert list(xs) == [1, 2] and list(ys) == [0.0, 1e-3]
    buf = io.StringIO()
    with redirect_stdout(buf):
        cli.main(["preflight", "-p", "tiny", "--set", "num_steps=2", "--set", "warmup_ratio=0.5", "--set", "lr=1e-3"])
    lines = [ln.split() for ln in buf.getvalue().splitlines() if ln.strip().startswith("step ") and ln.split()[1].isdigit()]
    assert [(ln[1], ln[3]) for ln in lines[:2]] == [("1", "0.000e+00"), ("2", "1.000e-03")]
