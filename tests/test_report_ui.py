"""The report and live view without a kernel: a void A/B, honest axes, visible
overlapping curves; the live view's Stop button, time left, memory, a whole group of samples;
the demo's goal checked on both of its parts. Trainer rows are synthetic (the trainer's contract:
``_group``, ``memory/*``, ``timing/step``, ``<run_dir>/control/stop``)."""

import json

from matplotlib.backends.backend_agg import FigureCanvasAgg

from rftlib.config import make_config
from rftlib.report import compare as C
from rftlib.report import plots as P
from rftlib.report.attempt import EVAL_KEY, load_attempt
from rftlib.workbench import result_text
from test_report_units import fake_attempt


def _nothing_learned(d, reward=0.0):
    """Rewrite an attempt's training rows as a run where every group had equal rewards."""
    path = d / "logs" / "metrics.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    for r in rows[1:]:
        r.update(reward_mean=reward, correctness=reward, advantage_std=0.0, grad_norm=0.0)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


# ---- item 6 ------------------------------------------------------------------------------------
def test_compare_of_two_attempts_that_learned_nothing_is_void(tmp_path):
    a = load_attempt(_nothing_learned(fake_attempt(tmp_path, "attempt-01-a")))
    b = load_attempt(_nothing_learned(fake_attempt(tmp_path, "attempt-02-b", eps_clip=0.1, final=(0, 1, 0, 1))))
    html = str(C.difference_table([a, b], n_boot=200))
    assert "This comparison is void" in html and "no significant difference" not in html
    assert "every advantage was 0 at all 2 steps" in html
    assert "comparison void" in C.summary_text([a, b], n_boot=200)


def test_compare_with_one_learning_attempt_is_not_void(tmp_path):
    a = load_attempt(_nothing_learned(fake_attempt(tmp_path, "attempt-01-a")))
    b = load_attempt(fake_attempt(tmp_path, "attempt-02-b", eps_clip=0.1))  # advantage_std 0.8: it learned
    assert "void" not in str(C.difference_table([a, b], n_boot=200))


def test_overlay_axes_have_no_offset_and_keep_noise_flat(tmp_path):
    # reward_mean 5.877 +- 1e-4: matplotlib would label the axis "+5.877" and stretch the noise over it
    da, db = fake_attempt(tmp_path, "attempt-01-a"), fake_attempt(tmp_path, "attempt-02-b", eps_clip=0.1)
    for d, noise in ((da, 1e-4), (db, -1e-4)):
        path = d / "logs" / "metrics.jsonl"
        rows = [json.loads(x) for x in path.read_text().splitlines()]
        for i, r in enumerate(rows[1:]):
            r["reward_mean"] = 5.877 + noise * (-1) ** i
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    p = P.overlay([load_attempt(da), load_attempt(db)])
    FigureCanvasAgg(p.fig).draw()
    ax = [x for x in p.fig.axes if x.get_title() == "reward_mean"][0]
    assert ax.yaxis.get_major_formatter().get_offset() == ""
    lo, hi = ax.get_ylim()
    assert hi - lo >= 0.02 * 5.877 * 0.999  # at least 2% of the level: 4e-4 of noise stays a flat line
    assert all("+" not in t.get_text() and "e" not in t.get_text() for t in ax.get_yticklabels())


def test_identical_curves_stay_distinguishable(tmp_path):
    a = load_attempt(fake_attempt(tmp_path, "attempt-01-a"))
    b = load_attempt(fake_attempt(tmp_path, "attempt-02-b", eps_clip=0.1))  # the same training rows as a
    for p in (P.overlay([a, b]), P.overlay_eval([a, b])):
        l1, l2 = [ln for ln in p.fig.axes[0].lines if ln.get_label().startswith("attempt-")][:2]
        assert list(l1.get_ydata()) == list(l2.get_ydata())  # drawn on top of each other...
        assert l1.get_marker() != l2.get_marker() and l1.get_linestyle() != l2.get_linestyle()  # ...but visible
        assert l2.get_markerfacecolor() == "none"  # hollow: the first curve shows through


# ---- item 7: the live view ------------------------------------------------------------------------
GROUP = {"prompt": "What is 3+4?", "answer": "7", "completions": [
    {"text": "7", "reward": 1.0, "advantage": 1.5, "truncated": False},
    {"text": "8<0xE2><0x82><0xAC>\ufffd\ufffd", "reward": 0.0, "advantage": -0.5, "truncated": False},
    {"text": "3+4 is", "reward": 0.0, "advantage": -0.5, "truncated": True},
    {"text": "7\x07", "reward": 0.0, "advantage": -0.5, "truncated": False}]}


def _row(step, **kw):
    return {"step": step, "reward_mean": 0.25, "loss": 0.01, "grad_norm": 0.5, "advantage_std": 0.8,
            "response_length_mean": 5.0, "truncated": 0.25, "timing/step": 30.0, "memory/peak_rss_gib": 1.25, **kw}


def test_live_view_shows_a_group_time_left_memory_and_stops(tmp_path):
    from rftlib.report.live import LiveView

    cfg = make_config("tiny", {"num_steps": 10})
    view = LiveView(cfg, run_dir=tmp_path, display_now=False)
    view.update({"step": 0, EVAL_KEY: 0.5})
    view.update(_row(1, _group=GROUP))
    view.update(_row(2, _group=GROUP, **{"memory/cuda_peak_gib": 10.5, "memory/preflight_gib": 12.0}))
    status = view.text.value
    assert "4m00s left" in status  # 8 steps to go x 30 s/step = 240 s
    assert "RSS peak 1.25 GiB" in status and "GPU peak 10.5 GiB (preflight 12.0)" in status
    html = view.samples.value
    assert "Samples of step 2" in html and "What is 3+4?" in html and "its 4 completions" in html
    assert html.count("<tr style=") == 4 and "+1.500" in html and "-0.500" in html
    assert "8\u20ac\u27e8?\u27e9" in html and "\\x07" in html and "<0xE2>" not in html  # no byte garbage
    assert all("_group" not in r for r in view.rows)
    assert not (tmp_path / "control" / "stop").exists()
    view.stop.click()  # what the frontend's click runs
    assert (tmp_path / "control" / "stop").read_text().strip() == "stopped by user"
    assert view.stop.disabled and "Stopping" in view.stop.description
    view.finish()  # the cell ended (the trainer honoured the stop after step 2)
    assert view.stop.disabled and view.stop.description == "Stopped at step 2"


def test_live_view_time_left_within_the_time_budget(tmp_path):
    from rftlib.report.live import LiveView

    # 1000 steps at 30 s would be 8h19m; the 2-minute budget, 60 s spent by 2 steps, leaves 1m00s
    view = LiveView(make_config("tiny", {"num_steps": 1000, "max_train_minutes": 2}), run_dir=tmp_path,
                    display_now=False)
    view.update(_row(1))
    view.update(_row(2))
    assert "1m00s left" in view.text.value
    assert view.bar.max == 4  # the bar and the curves end where the budget will: 2 more steps of 30 s
    assert view.bar.value == 2
    view.finish()  # ran to its end: no Stop was clicked
    assert view.stop.disabled and view.stop.description == "Run finished"


def test_live_view_falls_back_to_the_steps_samples_file(tmp_path):
    from rftlib.report.live import LiveView

    (tmp_path / "logs" / "samples").mkdir(parents=True)
    (tmp_path / "logs" / "samples" / "samples_step1.jsonl").write_text("".join(
        json.dumps({"prompt": p, "answer": "2", "completion": c, "reward": r, "advantage": a}) + "\n"
        for p, c, r, a in [("1+1", "2", 1.0, 0.5), ("1+1", "3", 0.0, -0.5), ("2+2", "4", 1.0, 0.0)]))
    view = LiveView(make_config("tiny", {}), run_dir=tmp_path, display_now=False)
    view.update(_row(1))
    assert "1+1" in view.samples.value and "2+2" not in view.samples.value  # one whole group: prompt 1+1


def test_live_view_and_report_show_one_verdict_list(tmp_path):
    # the arithmetic task opts out of has_boxed: the panel must not show a FAIL the report leaves out
    from rftlib.report.live import latest_verdicts

    d = fake_attempt(tmp_path, "attempt-01-a")
    path = d / "logs" / "metrics.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    for r in rows[1:]:
        r["has_boxed"] = 0.0  # would FAIL has_boxed
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    from rftlib.monitor.health import RULES

    (d / "logs" / "health.json").write_text(json.dumps([{"name": n} for n in RULES.names() if n != "has_boxed"]))
    a = load_attempt(d)
    cfg = make_config("tiny", {})
    live = latest_verdicts(rows, cfg, skip=("has_boxed",))
    assert [(v.name, v.status) for v in live] == [(v.name, v.status) for v in a.verdicts]
    assert "has_boxed" not in {v.name for v in live}


def test_quiet_libraries_keeps_transformers_chatter_out_of_the_output(tmp_path, capsys):
    import warnings

    from transformers.utils import logging as tlog

    from rftlib.workbench import quiet_libraries

    log = tmp_path / "w.log"
    with quiet_libraries(log):
        tlog.get_logger("transformers.modeling_utils").warning("Some weights were not initialized")
        warnings.warn("`torch_dtype` is deprecated", FutureWarning)
    out = capsys.readouterr()
    assert "Some weights" not in out.err + out.out and "deprecated" not in out.err + out.out
    text = log.read_text()
    assert "Some weights were not initialized" in text and "FutureWarning: `torch_dtype` is deprecated" in text


# ---- issue 12 defect 9: the demo's goal is +15 points AND within 10 minutes -----------------------
SUMMARY = {"baseline": 0.42, "final": 0.70, "eval_mode": "greedy_pass@1", "eval_n": 100, "steps": 8,
           "best": 0.70, "best_step": 8}


def test_demo_goal_needs_both_the_gain_and_the_time():
    # 0.42 -> 0.70 is +28 points; 17.5 min of training misses the 10-minute part
    slow = result_text({**SUMMARY, "train_seconds": 17.5 * 60}, 15, 10)
    assert "NOT MET (training took 17.5 min > 10)" in slow and ": MET" not in slow
    fast = result_text({**SUMMARY, "train_seconds": 7.1 * 60}, 15, 10)
    assert fast.endswith("goal +15 points within 10 min of training: MET")
    small = result_text({**SUMMARY, "final": 0.50, "train_seconds": 20 * 60}, 15, 10)  # +8 points, 20 min
    assert "NOT MET (gain +8.0 points < +15; training took 20.0 min > 10)" in small


def test_demo_goal_met_at_exactly_15_points():
    # Issue 19 item 9: 0.42 -> 0.57 on 100 problems is 57 - 42 = 15 problems = +15 points exactly, but
    # 100 * (0.57 - 0.42) = 14.999999999999996 < 15 in floats; the goal compares counts of problems
    assert 100 * (0.57 - 0.42) < 15  # the float trap this guards against
    text = result_text({**SUMMARY, "final": 0.57, "train_seconds": 6 * 60}, 15, 10)
    assert text.endswith("goal +15 points within 10 min of training: MET") and "(+15 points)" in text
    # one problem fewer (0.56: +14) misses it; on 200 problems 0.42 -> 0.57 is 84 -> 114 = +30 problems = +15 points
    assert "NOT MET (gain +14.0 points < +15)" in result_text({**SUMMARY, "final": 0.56, "train_seconds": 60}, 15, 10)
    assert result_text({**SUMMARY, "final": 0.57, "eval_n": 200, "train_seconds": 60}, 15, 10).endswith(": MET")
