"""The report notebooks under papermill, through the `rft` verbs, and their HTML in headless Chromium.

One module fixture builds seed 003's A/B on the tiny preset: attempt A (eps_clip 0.2) through
`rft train` (notebooks/train.ipynb, which evaluates every checkpoint and writes the report by
executing notebooks/analysis.ipynb), attempt B (eps_clip 0.1) trained in-process then `rft eval`
and `rft report`, the A/B report through `rft compare` (notebooks/compare.ipynb), and seed 002's
validation through `rft validate` (notebooks/validate.ipynb). Each notebook runs once.

Screenshots and the HTML go to $RFTLIB_ARTEFACTS (default: a pytest temp dir, printed).
Browser tests skip, saying why, where no Chromium is installed (scripts/setup_browser.sh installs it).
"""

import base64
import json
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import nbformat
import pytest

from rftlib import cli
from rftlib.report.attempt import load_attempt
from rftlib.report.index import index_ids

T_ID = "attempt-27-train-notebook"
A_ID, B_ID = "attempt-28-eps-clip-0.2", "attempt-28-eps-clip-0.1"


def train_arm(runs, attempt_id, eps_clip, task_with):
    """One A/B arm, on toy_rewards.has_digit: a reward the untrained tiny model can earn (1 if the
    completion holds a digit). With it the A/B arms learn, and diverge."""
    from rftlib.attempts import create_attempt
    from rftlib.config import make_config
    from rftlib.train.loop import Trainer
    from toy_rewards import has_digit

    # two updates per rollout: the second is off-policy, so the ratio moves and eps_clip binds
    cfg = make_config("tiny", {"runs_root": str(runs), "name": attempt_id[11:], "eps_clip": eps_clip, "num_steps": 6,
                               "eval_steps": 2, "lr": 2e-2, "warmup_ratio": 0.0, "num_updates_per_rollout": 2,
                               "notes": f"seed 003 a28 A/B arm: eps_clip {eps_clip}. Tiny model with a test reward "
                                        "(1 if the completion holds a digit), also what 'accuracy' means here."})
    trainer = Trainer(cfg, create_attempt(cfg, attempt_id), progress=False, task=task_with(cfg, has_digit))
    trainer.train()
    trainer.close()


@pytest.fixture(scope="module")
def ws(tmp_path_factory, task_with):
    root = tmp_path_factory.mktemp("ws")
    runs, reports = root / "runs", root / "reports"
    # T: the whole train notebook from a shell: train, every checkpoint evaluated, report, index
    assert cli.main(["train", "-p", "tiny", "--set", f"runs_root={runs}", "--set", f"attempt_id={T_ID}",
                     "--set", "name=train-notebook", "--set", "notes=rft train -p tiny: the train notebook"]) == 0
    assert cli.main(["eval", str(runs / T_ID)]) == 0  # resumable: everything is already there
    # seed 003's A/B (a28a eps_clip 0.2 vs a28b 0.1), then the verbs a user runs on finished attempts
    train_arm(runs, A_ID, 0.2, task_with)
    train_arm(runs, B_ID, 0.1, task_with)
    assert cli.main(["report", str(runs / B_ID), "--baseline", str(runs / A_ID)]) == 0
    assert cli.main(["compare", str(runs / A_ID), str(runs / B_ID)]) == 0
    # seed 002's validation, in its own runs root
    vruns, vreports = root / "validation-runs", root / "validation-reports"
    assert cli.main(["validate", "-p", "seed002-fizzbuzz-rtx3080-tiny-cpu", "--set", f"runs_root={vruns}", "--out", str(vreports)]) == 0
    return {"root": root, "runs": runs, "reports": reports, "vruns": vruns, "vreports": vreports,
            "vdir": next(p for p in vruns.iterdir() if p.is_dir())}


def _errors(nb_path):
    nb = nbformat.read(str(nb_path), as_version=4)
    return [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]


def _pngs(nb_path):
    nb = nbformat.read(str(nb_path), as_version=4)
    return [o["data"]["image/png"] for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
            if "image/png" in o.get("data", {})]


def test_train_notebook_writes_checkpoint_evals_and_report(ws):
    a = ws["runs"] / T_ID
    assert not _errors(a / "notebook.ipynb") and not _errors(a / "analysis.ipynb")
    ck = {p.name: json.loads(p.read_text()) for p in sorted((a / "eval").glob("ckpt_step_*.json"))}
    assert sorted(ck) == ["ckpt_step_1.json", "ckpt_step_2.json", "ckpt_step_3.json"]  # every checkpoint
    assert ck["ckpt_step_3.json"]["final"] is True and "trainer's eval" in ck["ckpt_step_3.json"]["source"]
    assert ck["ckpt_step_1.json"]["source"].startswith("rftlib.eval_checkpoints")
    assert all(d["mode"] == "greedy_pass@1" and d["n_problems"] == 16 for d in ck.values())
    assert len(_pngs(a / "analysis.ipynb")) == 5  # tier 1, eval curve, tier 2, tier 3, timeline
    html = (ws["reports"] / f"{T_ID}.html").read_text()
    assert "rft train -p tiny: the train notebook" in html and "Health verdicts" in html
    assert "A.verdict_table(" not in html and "from rftlib.report import" not in html  # code hidden


def test_checkpoint_eval_is_resumable(ws):
    from rftlib.eval_checkpoints import eval_checkpoints

    b = ws["runs"] / T_ID
    logs = []
    first = eval_checkpoints(b, log=logs.append)
    assert sorted(first) == [1, 2, 3] and all("cached" in x for x in logs)  # nothing recomputed
    (b / "eval" / "ckpt_step_1.json").unlink()
    logs.clear()
    again = eval_checkpoints(b, log=logs.append)
    assert any("step 1: greedy_pass@1" in x for x in logs) and sum("cached" in x for x in logs) == 2
    assert [r["completion"] for r in again[1]["results"]] == [r["completion"] for r in first[1]["results"]]


def test_compare_report_shows_both_attempts(ws):
    a, b = load_attempt(ws["runs"] / A_ID), load_attempt(ws["runs"] / B_ID)
    assert {r["eps_clip_low"] for r in a.train_rows} == {0.2} and {r["eps_clip_low"] for r in b.train_rows} == {0.1}
    assert a.train_rows[0]["ppo_clip_ratio"] > 0 and b.train_rows[0]["ppo_clip_ratio"] > 0  # the clip binds
    assert [r["ppo_clip_ratio"] for r in a.train_rows] != [r["ppo_clip_ratio"] for r in b.train_rows]  # they diverge
    html = (ws["reports"] / f"compare-{A_ID}-vs-{B_ID}.html").read_text()
    assert A_ID in html and B_ID in html and len(re.findall(r'<img[^>]*src="data:image/png;base64,', html)) == 2
    assert "eps_clip: 0.2 \u2192 0.1" in html  # the config difference, in the difference table
    assert "95% CI" in html and "16 paired problems" in html
    from rftlib.report.compare import paired_eval_diff

    ci, _ = paired_eval_diff(a, b, "final", n_boot=2000)
    assert ci.n == 16 and ci.lo <= ci.mean <= ci.hi and f"{100 * ci.mean:+.1f}" in html


def test_validation_fills_the_seed_tables(ws):
    v = json.loads((ws["vdir"] / "validation.json").read_text())
    names = [c["component"] for c in v["checks"]]
    for need in ("Rollout", "Reward computation", "Reward tensor", "Advantage calculation", "KL penalty",
                 "Backpropagation"):
        assert need in names
    assert all(c["status"] in ("pass", "warn", "n/a") for c in v["checks"]), v["checks"]
    assert {c["component"]: c["status"] for c in v["checks"]}["Backpropagation"] == "pass"
    assert [t[0] for t in v["timing"]][:3] == ["Model loading (policy)", "Setup (task, reference, optimizer)",
                                                "Generation (per step)"]
    assert any(m[0].startswith("Peak RSS") and m[1] > 0 for m in v["memory"])
    assert not _errors(ws["vdir"] / "notebook.ipynb")


def test_index_rebuilt_after_delete_and_add(ws, tmp_path):
    runs = tmp_path / "runs"
    shutil.copytree(ws["runs"], runs)
    out = tmp_path / "reports"
    assert cli.main(["index", "--runs", str(runs), "--out", str(out)]) == 0
    assert list(index_ids((out / "index.html").read_text())) == [T_ID, B_ID, A_ID]
    shutil.rmtree(runs / A_ID)  # one deleted ...
    shutil.copytree(ws["vdir"], runs / ws["vdir"].name)  # ... one added
    assert cli.main(["index", "--runs", str(runs), "--out", str(out)]) == 0
    html = (out / "index.html").read_text()
    assert list(index_ids(html)) == sorted([T_ID, B_ID, ws["vdir"].name],
                                           key=lambda s: (int(re.match(r"attempt-(\d+)", s)[1]), s))
    assert A_ID not in html and "3 attempt(s)" in html


# ---- headless Chromium ----------------------------------------------------------------------------
def test_the_report_links_each_recorded_batch_to_its_inspector_page(ws):
    """rft train -p tiny records its eval steps (here the final step, 3): the report's records table links
    reports/<id>/step-3.html, which write_report built, self-contained (no fetch: its CSP forbids one)."""
    html = (ws["reports"] / f"{T_ID}.html").read_text()
    assert "Recorded batches" in html and f'href="{T_ID}/step-3.html"' in html
    page = (ws["reports"] / T_ID / "step-3.html").read_text()
    assert "Content-Security-Policy" in page and "default-src 'none'" in page
    assert (ws["runs"] / T_ID / "records" / "step_3" / "manifest.json").exists()


CHROME = next((b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
needs_chrome = pytest.mark.skipif(CHROME is None, reason="no Chromium: run `bash scripts/setup_browser.sh` "
                                                          "(apt-get install chromium) to enable the browser checks")


@pytest.fixture(scope="module")
def artefacts(tmp_path_factory):
    d = Path(os.environ.get("RFTLIB_ARTEFACTS") or tmp_path_factory.mktemp("artefacts"))
    d.mkdir(parents=True, exist_ok=True)
    print(f"\n[artefacts] screenshots and HTML in {d}")
    return d


class _Imgs(HTMLParser):
    def __init__(self):
        super().__init__()
        self.imgs = []

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.imgs.append(dict(attrs))


def _chrome(url, tmp, *args):
    prof = tmp / f"profile-{len(list(tmp.glob('profile-*')))}"  # a fresh --user-data-dir each run
    return subprocess.run([CHROME, *FLAGS, f"--user-data-dir={prof}", *args, url], capture_output=True, text=True,
                          timeout=120)


def _open(html_path, name, artefacts, tmp_path):
    """Dump the DOM (console messages to stderr) and take a 1280x2000 screenshot."""
    url = Path(html_path).resolve().as_uri()
    dom = _chrome(url, tmp_path, "--enable-logging=stderr", "--v=0", "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    console = [x for x in dom.stderr.splitlines() if ":CONSOLE" in x]
    assert not console, console  # no console errors (nor any console output)
    shot = artefacts / f"{name}.png"
    r = _chrome(url, tmp_path, f"--screenshot={shot}", "--window-size=1280,2000")
    assert r.returncode == 0 and shot.exists(), r.stderr[-2000:]
    from matplotlib.image import imread

    pixels = imread(str(shot))
    assert pixels.shape[:2] == (2000, 1280) and pixels.std() > 0.05  # something rendered, not a blank page
    shutil.copy(html_path, artefacts / f"{name}.html")
    p = _Imgs()
    p.feed(dom.stdout)
    return dom.stdout, p.imgs


def _check_figures(imgs, n):
    assert len(imgs) == n, [i.get("alt") for i in imgs]
    for img in imgs:
        src = img["src"]
        assert src.startswith("data:image/png;base64,"), src[:60]  # embedded: the page loads nothing
        png = base64.b64decode(src.split(",", 1)[1])
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000 and img.get("alt")


@needs_chrome
def test_attempt_report_in_chromium(ws, artefacts, tmp_path):
    dom, imgs = _open(ws["reports"] / f"{B_ID}.html", "report-attempt-B", artefacts, tmp_path)
    _check_figures(imgs, 5)  # tier 1, eval curve, tier 2, tier 3, timeline
    assert "rft-verdicts" in dom and "Tier 2: stability" in dom and "eps_clip 0.1" in dom
    assert f"Differences from <b>{A_ID}</b>" in dom  # the config diff against the baseline attempt
    assert "<script" not in dom  # self-contained: no CDN scripts


@needs_chrome
def test_train_notebook_report_in_chromium(ws, artefacts, tmp_path):
    dom, imgs = _open(ws["reports"] / f"{T_ID}.html", "report-train-notebook", artefacts, tmp_path)
    _check_figures(imgs, 5)
    assert "rft-ckpt" in dom and "(final)" in dom  # the checkpoint evals


@needs_chrome
def test_compare_report_in_chromium(ws, artefacts, tmp_path):
    dom, imgs = _open(ws["reports"] / f"compare-{A_ID}-vs-{B_ID}.html", "report-compare", artefacts, tmp_path)
    _check_figures(imgs, 2)  # eval curves, overlaid training metrics
    assert A_ID in dom and B_ID in dom and "rft-compare" in dom


@needs_chrome
def test_index_in_chromium(ws, artefacts, tmp_path):
    dom, imgs = _open(ws["reports"] / "index.html", "index", artefacts, tmp_path)
    assert list(index_ids(dom)) == [T_ID, B_ID, A_ID]  # by attempt number, then id
    assert f'href="{B_ID}.html"' in dom and f'href="compare-{A_ID}-vs-{B_ID}.html"' in dom
    assert "no report: rft report" in dom  # A has none: the index says how to make it
    assert not imgs


@needs_chrome
def test_validation_report_in_chromium(ws, artefacts, tmp_path):
    dom, imgs = _open(ws["vreports"] / f"{ws['vdir'].name}.html", "report-validation", artefacts, tmp_path)
    assert "Component Validation" in dom and "Timing Analysis" in dom and "Memory Usage" in dom
    assert "rft-validation" in dom and not imgs
