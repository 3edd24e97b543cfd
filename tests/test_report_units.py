"""rftlib.report without a kernel: bootstrap arithmetic, attempt loading, index, tables, live views,
and the committed notebook templates (in sync, outputs cleared, one literal parameters cell)."""

import ast
import json

import nbformat
import numpy as np
import pytest
import yaml

from rftlib.config import RunConfig, to_dict
from rftlib.report import compare as C
from rftlib.report.attempt import EVAL_KEY, key_differences, list_attempts, load_attempt
from rftlib.report.html import Html, table
from rftlib.report.index import build_index, index_ids, write_index


# ---- a fake run directory, written the way the trainer writes one ------------------------------
def fake_attempt(root, attempt_id, *, eps_clip=0.2, correct=(0, 1, 0, 1), final=(1, 1, 0, 1), steps=2, notes=""):
    d = root / attempt_id
    (d / "logs" / "samples").mkdir(parents=True)
    (d / "eval").mkdir()
    cfg = {**to_dict(RunConfig()), "eps_clip": eps_clip, "num_steps": steps, "notes": notes, "model": "tiny"}
    prov = {"git_sha": "0123456789abcdef", "git_dirty": False, "created": "2026-01-02T03:04:05", "packages": {}}
    (d / "config.yaml").write_text(yaml.safe_dump({"attempt_id": attempt_id, "config": cfg, "provenance": prov}))
    rows = [{"step": 0, EVAL_KEY: sum(correct) / len(correct)}]
    for s in range(1, steps + 1):
        rows.append({"step": s, "reward_mean": 0.1 * s, "correctness": 0.1 * s, "has_boxed": 1.0, "grad_norm": 0.5,
                     "advantage_std": 0.8, "ppo_clip_ratio": 0.05, "entropy_mean": 2.0, "entropy_p10": 1.5,
                     "entropy_p90": 2.5, "ratio_max": 1.2, "response_length_mean": 20.0, "truncated": 0.1,
                     "loss": -0.01, "lr": 1e-3})
    rows[-1][EVAL_KEY] = sum(final) / len(final)
    (d / "logs" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    def ev(step, c):
        res = [{"id": f"p{i}", "prompt": f"q{i}", "answer": "1", "completion": "x", "reward": float(v),
                "correct": float(v), "length": 3} for i, v in enumerate(c)]
        return {"mode": "greedy_pass@1", "dataset": "heldout", "n_problems": len(c), "temperature": 0.0,
                "max_new_tokens": 8, "greedy_pass@1": sum(c) / len(c), "results": res}

    (d / "eval" / "step_0.json").write_text(json.dumps(ev(0, correct)))
    (d / "eval" / f"step_{steps}.json").write_text(json.dumps(ev(steps, final)))
    (d / "summary.json").write_text(json.dumps({"steps": steps, "baseline": rows[0][EVAL_KEY]}))
    (d / "logs" / "samples" / f"samples_step{steps}.jsonl").write_text(
        json.dumps({"prompt": "1+1", "answer": "2", "completion": "<b>2</b>", "reward": 1.0, "advantage": 0.5}) + "\n")
    return d


# ---- bootstrap -----------------------------------------------------------------------------------
def test_paired_bootstrap_matches_hand_values():
    # a = [0,0,0,0], b = [1,1,0,0]: d = [1,1,0,0], mean 0.5; resampled means lie in [0, 1]
    ci = C.paired_bootstrap([0, 0, 0, 0], [1, 1, 0, 0], n_boot=4000, seed=1)
    assert ci.mean == 0.5 and ci.n == 4
    assert 0.0 <= ci.lo < 0.5 < ci.hi <= 1.0
    # identical attempts: every difference is 0, so the interval is exactly [0, 0] and P(d <= 0) = 1
    same = C.paired_bootstrap([1, 0, 1], [1, 0, 1])
    assert (same.mean, same.lo, same.hi, same.p_le_0) == (0.0, 0.0, 0.0, 1.0)


def test_paired_bootstrap_is_the_resampled_mean_of_differences():
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 2, 50), rng.integers(0, 2, 50)
    ci = C.paired_bootstrap(a, b, n_boot=2000, seed=3)
    # the same computation written as a loop over resamples
    r = np.random.default_rng(3)
    idx = r.integers(0, 50, size=(2000, 50))
    means = [float(np.mean(b[i] - a[i])) for i in idx]
    assert ci.lo == pytest.approx(np.quantile(means, 0.025)) and ci.hi == pytest.approx(np.quantile(means, 0.975))
    with pytest.raises(ValueError, match="equal-length"):
        C.paired_bootstrap([1, 0], [1])


def test_paired_eval_diff_pairs_problems_by_id(tmp_path):
    a = load_attempt(fake_attempt(tmp_path, "attempt-28-eps-clip-0.2", final=(0, 1, 0, 1)))
    b = load_attempt(fake_attempt(tmp_path, "attempt-29-eps-clip-0.1", eps_clip=0.1, final=(1, 1, 1, 1)))
    ci, note = C.paired_eval_diff(a, b, "final", n_boot=1000)
    assert ci.mean == 0.5 and ci.n == 4 and "4 paired problems" in note
    g, _ = C.gain_ci(b, n_boot=1000)  # b: step 0 (0,1,0,1) -> final (1,1,1,1)
    assert g.mean == 0.5
    html = C.difference_table([a, b], n_boot=500)
    assert "+50.0" in html and "eps_clip: 0.2 \u2192 0.1" in html
    assert "eps_clip" in C.config_diff_table([a, b])
    # different modes are refused, as seed 003 says
    doc = json.loads((b.run_dir / "eval" / "step_2.json").read_text())
    doc["mode"] = "sampling_pass@8"
    (b.run_dir / "eval" / "step_2.json").write_text(json.dumps(doc))
    ci, note = C.paired_eval_diff(load_attempt(a.run_dir), load_attempt(b.run_dir), "final")
    assert ci is None and "modes differ" in note


# ---- attempts, index -----------------------------------------------------------------------------
def test_index_is_rebuilt_from_the_run_directories(tmp_path):
    runs, out = tmp_path / "runs", tmp_path / "reports"
    fake_attempt(runs, "attempt-01-base", notes="the baseline")
    fake_attempt(runs, "attempt-02-eps-clip-0.1", eps_clip=0.1, notes="tighter <clip>")
    (runs / "not-an-attempt").mkdir()  # ignored: no config.yaml
    out.mkdir()
    (out / "attempt-01-base.html").write_text("<html></html>")
    html = (write_index(runs, out)).read_text()
    assert list(index_ids(html)) == ["attempt-01-base", "attempt-02-eps-clip-0.1"]
    assert '<a href="attempt-01-base.html">' in html and "no report: rft report" in html
    assert "eps_clip: 0.2 &rarr; <b>0.1</b>" in html and "tighter &lt;clip&gt;" in html  # notes escaped
    assert "0123456789" in html and "2026-01-02 03:04:05" in html
    import shutil

    shutil.rmtree(runs / "attempt-01-base")
    fake_attempt(runs, "attempt-03-new")
    html = build_index(runs, out)
    assert list(index_ids(html)) == ["attempt-02-eps-clip-0.1", "attempt-03-new"]
    with pytest.raises(ValueError, match="baseline attempt 'attempt-09' is not in"):
        build_index(runs, out, baseline="attempt-09")


def test_attempt_reads_partial_runs(tmp_path):
    d = fake_attempt(tmp_path, "attempt-05-crashed", steps=3)
    (d / "summary.json").unlink()
    a = list_attempts(tmp_path)[0]
    assert a.status == "incomplete (3/3 steps)" and a.summary is None
    base, best, final = a.baseline_best_final()
    assert base == 0.5 and best == (3, 0.75) and final == 0.75
    assert "greedy_pass@1 on heldout (4 problems" in a.eval_label()
    assert {v.status for v in a.verdicts} <= {"pass", "warn", "fail", "n/a"}
    assert key_differences(a.config, None) == {"model": ("smollm2-135m", "tiny"), "num_steps": (30, 3)}


def test_analysis_sections_render(tmp_path):
    from rftlib.report import analysis, plots

    d = fake_attempt(tmp_path, "attempt-07-x", notes="why <this>")
    a = load_attempt(d)
    head = analysis.header(a)
    assert "why &lt;this&gt;" in head and "attempt-07-x" in head
    assert "<pre" in analysis.samples_table(a) and "&lt;b&gt;2&lt;/b&gt;" in analysis.samples_table(a)
    assert "rft eval RUN_DIR" in analysis.checkpoint_table(a)
    for p in (plots.tier1(a), plots.tier2(a), plots.tier3(a), plots.timeline(a), plots.eval_curve(a), plots.overlay([a, a])):
        png, meta = p._repr_png_()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000 and meta["alt"]
    assert len(analysis.report_sections(d)) == 15  # + the timeline (issue 32)


def test_table_escapes_and_colours():
    html = table(["a", "b"], [("<x>", 0.000012345)], row_status=["fail"])
    assert "&lt;x&gt;" in html and "1.234e-05" in html and "#fbd5d5" in html
    assert isinstance(html, Html) and html._repr_html_() == str(html)


# ---- live views ----------------------------------------------------------------------------------
def _rows():
    rows = [{"step": 0, EVAL_KEY: 0.2}]
    for s in range(1, 5):
        rows.append({"step": s, "reward_mean": 0.0, "reward_std": 0.0, "loss": 0.0, "grad_norm": 0.0,
                     "advantage_std": 0.0, "truncated": 0.9, "response_length_mean": 12, "ppo_clip_ratio": 0.0})
    return rows


def test_text_view_prints_lines_and_verdict_changes():
    from rftlib.report.live import TextView

    out = []
    view = TextView(RunConfig(num_steps=4), every=2, write=out.append)
    for r in _rows():
        view.update(r)
    text = "\n".join(out)
    assert "step 0 baseline: held-out greedy_pass@1 0.200" in text
    assert "step 2/4  reward 0.000" in text and "step 4/4" in text
    assert "health: FAIL grad_norm" in text and "health: FAIL reward_stuck" in text
    assert sum("FAIL grad_norm" in x for x in out) == 1  # a verdict is announced once, when it changes


def test_live_view_updates_widgets_with_curves_and_verdicts():
    pytest.importorskip("ipywidgets")
    from rftlib.report.live import LiveView

    view = LiveView(RunConfig(num_steps=4), display_now=False)
    for r in _rows():
        view.update(r)
    assert view.bar.value == 4 and "reward 0.000" in view.text.value
    assert bytes(view.image.value)[:4] == b"\x89PNG"
    assert "grad_norm" in view.health.value and "FAIL" in view.health.value


# ---- templates -----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["train.ipynb", "sft.ipynb", "validate.ipynb", "analysis.ipynb", "compare.ipynb"])
def test_committed_notebook_is_generated_clean_with_literal_parameters(name):
    from rftlib.notebooks import TEMPLATES

    nb = nbformat.read(f"notebooks/{name}", as_version=4)
    assert [c.source for c in nb.cells] == [c.source for c in TEMPLATES[name]().cells], \
        "notebook out of date: run python -m rftlib.notebooks"
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in nb.cells if c.cell_type == "code")
    params = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(params) == 1
    for stmt in ast.parse(params[0].source).body:  # only `name[: type] = <literal>  # comment`
        assert isinstance(stmt, (ast.Assign, ast.AnnAssign)), ast.dump(stmt)
        ast.literal_eval(stmt.value)
    if name != "train.ipynb":  # every parameter documented on its line, typed
        lines = [x for x in params[0].source.splitlines() if x and not x.startswith("#")]
        assert all(":" in x.split("=")[0] and "  # " in x for x in lines), lines


# ---- validation's controls on seed 002's problem --------------------------------------------------
def test_validation_controls_on_fizzbuzz_run_in_the_sandbox():
    from rftlib.data.code_problems import code_problems_task
    from rftlib.validate import control_completions, control_example

    task = code_problems_task(train_size=8)
    ex = control_example(task)
    assert ex.meta["entry_point"] == "fizzbuzz"  # seed 002's problem, picked when the task has it
    right, wrong = control_completions(ex)
    r, d = task.reward(right, ex, False)
    assert r == 1.0 and d["tests_passed"] == d["tests_total"] == 5  # the seed's 5 test cases
    r, d = task.reward(wrong, ex, False)
    assert r < 1.0 and d["tests_passed"] < 5


def test_the_step_line_shows_turns_and_tool_success_for_a_multi_turn_run():
    """The live view's and the text view's line (status_line): a multi-turn row's mean turns, tool calls per
    trajectory and the share of calls that ran (tool_ok / tool_calls: 0.9 of 1.2 -> 75%); a single-turn row has
    neither."""
    from rftlib.config import make_config
    from rftlib.report.live import status_line

    cfg = make_config("tiny")
    base = {"step": 3, "reward_mean": 0.5, "loss": 0.1, "grad_norm": 0.2, "ppo_clip_ratio": 0.0,
            "response_length_mean": 20.0, "truncated": 0.0}
    line = status_line({**base, "turns": 2.25, "tool_calls": 1.2, "tool_ok": 0.9}, cfg)
    assert "turns 2.2" in line and "tools 1.20/traj (75% ran)" in line, line
    assert "tools 0.00/traj" in status_line({**base, "turns": 1.0, "tool_calls": 0.0, "tool_ok": 0.0}, cfg)
    plain = status_line(base, cfg)
    assert "turns" not in plain and "tools" not in plain
