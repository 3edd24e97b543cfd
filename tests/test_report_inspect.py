"""The token inspector page (rftlib/report/inspect.py) without a browser: it loads nothing, carries its
per-token arrays as base64 float16 that decode within float16's rounding, escapes model output, shows
the same page in a sandboxed iframe, and folds a 4,096-token completion into chips while keeping every
clipped token. Views are synthetic (the interface of /work/notes/view33.md); no torch, no model."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from rftlib.report import inspect as I

ROOT = Path(__file__).resolve().parents[1]
QUANTITIES = {
    "c": {"label": "gradient weight dL/dlogp", "scale": "diverging", "per_config": True},
    "ratio": {"label": "importance ratio pi/pi_old", "scale": "log1", "per_config": True},
    "clip": {"label": "clipped (-1 low, +1 high, 0 no)", "scale": "categorical", "per_config": True},
    "entropy": {"label": "entropy (nats)", "scale": "sequential", "per_config": False},
    "gap": {"label": "trainer - behaviour logprob", "scale": "diverging", "per_config": False},
}


def make_row(i, n, rng, *, configs=("recorded", "gspo"), reward=1.0, advantage=0.5, pieces=None, values=None):
    """One completion of n tokens with every declared quantity (values override any of them)."""
    vals = {}
    for cf in configs:
        vals[f"c/{cf}"] = list(rng.normal(0, 1e-4, n))
        vals[f"ratio/{cf}"] = list(np.exp(rng.normal(0, 0.05, n)))
        vals[f"clip/{cf}"] = [0.0] * n
    vals["entropy"] = list(np.abs(rng.normal(0.5, 0.3, n)))
    vals["gap"] = list(rng.normal(0, 0.01, n))
    vals.update(values or {})
    return {"row": i, "rank": 0, "reward": reward, "components": {"correct": reward}, "advantage": advantage,
            "length": n, "truncated": False, "skipped": False,
            "pieces": pieces if pieces is not None else [f" w{t}" for t in range(n)], "values": vals,
            "totals": {f"sum c/{cf}": float(sum(x for x in vals[f"c/{cf}"] if x is not None)) for cf in configs}}


def make_view(groups, *, configs=("recorded", "gspo"), table=None, verdict=None, title="attempt-01-x · step 2"):
    """``groups``: a list of groups, each a list of rows (make_row's dicts)."""
    return {"schema": 1, "title": title, "attempt": "attempt-01-x", "step": 2,
            "header": {"policy version": 1, "loss (recorded)": -0.0123, "grad_norm (recorded)": 0.8123},
            "verdict": verdict, "configs": list(configs), "table": table or [],
            "quantities": QUANTITIES,
            "groups": [{"group": g, "prompt": f"What is {g}+{g}?", "answer": str(2 * g), "rows": rows}
                       for g, rows in enumerate(groups)]}


def small_view(**kw):
    rng = np.random.default_rng(0)
    return make_view([[make_row(g * 4 + r, 10 + r, rng) for r in range(4)] for g in range(3)], **kw)


# ---- nothing is fetched -------------------------------------------------------------------------
def test_page_loads_nothing_and_declares_its_csp():
    page = I.render_page(small_view())
    assert not re.search(r"""(?:src|href|action)\s*=\s*["']?\s*(?:https?:)?//""", page, re.I)
    assert not re.search(r"https?://", page)  # no URL at all: not in CSS url(), not in the script
    csp = re.findall(r'<meta http-equiv="Content-Security-Policy" content="([^"]*)">', page)
    assert csp == ["default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:"]
    assert page.count('<script type="application/json"') == 1
    assert page.count("<script") == 2 and page.count("</script>") == 2  # the data block and the renderer


def test_renderer_never_parses_html_from_data():
    """The pieces are model output: the JS may only set textContent (no innerHTML & co, no eval)."""
    js = (ROOT / "rftlib/report/inspect_page/inspector.js").read_text()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function",
                 "fetch(", "XMLHttpRequest", "import("):
        assert sink not in js, sink


def test_assets_are_package_data():
    """pyproject ships inspect_page/ with the package (an installed rftlib renders pages too)."""
    import fnmatch
    import tomllib

    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["rftlib.report"]
    for name in ("inspect_page/inspector.js", "inspect_page/inspector.css"):
        assert any(fnmatch.fnmatch(name, g) for g in globs), (name, globs)
        assert (ROOT / "rftlib/report" / name).exists()


def test_module_imports_no_torch():
    code = "import sys, rftlib.report.inspect; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0


# ---- the arrays -----------------------------------------------------------------------------------
def f16_bound(v, offset):
    """Half a float16 ulp of (v - offset)/scale, or half the subnormal spacing, times scale: scale is the
    power of two at or above max|v - offset| (encode_array's choice, derived here from the input)."""
    d = np.abs(np.asarray(v, dtype=np.float64) - offset)
    top = np.nanmax(d)
    scale = 2.0 ** math.ceil(math.log2(top))
    return np.maximum(d * 2.0 ** -11, scale * 2.0 ** -25) + 1e-15 * np.abs(np.asarray(v, dtype=np.float64))


def test_arrays_round_trip_within_float16_rounding():
    rng = np.random.default_rng(1)
    n = 300
    c = list(rng.normal(0, 1, n) * 10.0 ** rng.uniform(-9, -3, n))  # gradient weights over six decades
    ratio = list(1 + rng.normal(0, 1e-3, n))  # ratios a hair from 1
    ratio[5] = 1.0003
    c[7] = None  # a token that was not computed
    row = make_row(0, n, rng, values={"c/recorded": c, "ratio/recorded": ratio})
    view = make_view([[row, make_row(1, 20, rng)]])
    page = I.render_page(view)
    data = I.read_page_data(page)
    assert all(isinstance(a["b64"], str) for a in data["arrays"].values())
    dec = I.decode_arrays(page)
    got_c = dec["c/recorded"][:n]
    want_c = np.array([np.nan if x is None else x for x in c])
    assert np.isnan(got_c[7]) and np.isnan(want_c[7])
    ok = ~np.isnan(want_c)
    assert (np.abs(got_c[ok] - want_c[ok]) <= f16_bound(want_c, 0.0)[ok]).all()
    ratios = np.concatenate([r["values"]["ratio/recorded"] for r in view["groups"][0]["rows"]])  # one scale
    got_r = dec["ratio/recorded"]
    assert (np.abs(got_r - ratios) <= f16_bound(ratios, 1.0)).all()
    assert got_r[5] != 1.0 and abs(got_r[5] - 1.0003) < 1e-6  # 3e-4 above 1 survives float16
    # the second row's tokens follow the first's in the concatenated arrays
    rows = [r for g in data["groups"] for r in g["rows"]]
    assert [r["off"] for r in rows] == [0, n] and data["ntok"] == n + 20
    entropy = np.concatenate([r["values"]["entropy"] for r in view["groups"][0]["rows"]])  # one array, one scale
    assert (np.abs(dec["entropy"] - entropy) <= f16_bound(entropy, 0.0)).all()


def test_float32_arrays_are_the_values_as_float32():
    rng = np.random.default_rng(2)
    view = make_view([[make_row(0, 50, rng)]])
    dec = I.decode_arrays(I.render_page(view, dtype="float32"))
    want = np.array(view["groups"][0]["rows"][0]["values"]["c/gspo"], dtype=np.float32).astype(np.float64)
    assert np.array_equal(dec["c/gspo"], want)


def test_figures_stay_float64_and_nonfinite_ones_survive_json():
    view = small_view(table=[{"config": "recorded", "loss": -0.012345678901234, "grad_norm": float("nan")},
                             {"config": "gspo", "loss": float("inf"), "grad_norm": 0.5}])
    data = I.read_page_data(I.render_page(view))  # json.loads: the block is valid JSON (no bare NaN)
    assert data["table"]["columns"] == ["config", "loss", "grad_norm"]
    assert data["table"]["rows"] == [["recorded", -0.012345678901234, "NaN"], ["gspo", "inf", 0.5]]
    assert data["header"][1] == ["loss (recorded)", -0.0123]


# ---- untrusted text -------------------------------------------------------------------------------
HOSTILE = ["<script>alert(1)</script>", '"onerror=alert(1)', "</script><img src=x onerror=alert(2)>",
           "<!--", "&amp;", "\u2028x\u2029"]


def test_hostile_pieces_cannot_leave_the_data_block():
    rng = np.random.default_rng(3)
    row = make_row(0, len(HOSTILE), rng, pieces=HOSTILE)
    view = make_view([[row]], title="<b>step</b> 2")
    view["groups"][0]["prompt"] = "</script><script>alert(3)</script>"
    page = I.render_page(view)
    for s in ("<script>alert", "<img", "onerror=alert(1)</", "<b>step"):
        assert s not in page, s
    assert page.count("<script") == 2 and page.count("</script") == 2 and "<!--" not in page
    assert "<title>&lt;b&gt;step&lt;/b&gt; 2</title>" in page
    data = I.read_page_data(page)
    assert data["groups"][0]["rows"][0]["pieces"] == HOSTILE  # the text itself is kept, exactly
    assert data["groups"][0]["prompt"] == "</script><script>alert(3)</script>"


class _Frames(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def test_notebook_view_is_the_same_page_in_a_sandboxed_iframe():
    rng = np.random.default_rng(4)
    view = make_view([[make_row(0, len(HOSTILE), rng, pieces=HOSTILE)]])
    out = I.view_in_notebook(view)._repr_html_()
    p = _Frames()
    p.feed(out)
    assert [t for t, _ in p.tags] == ["iframe"]  # nothing of the page leaks into the notebook's DOM
    attrs = p.tags[0][1]
    assert attrs["sandbox"] == "allow-scripts"  # scripts run, but no same-origin, forms, popups or top navigation
    assert attrs["srcdoc"] == I.render_page(view)  # the file's page exactly: they cannot drift
    assert "<" not in out.split("srcdoc=", 1)[1].rsplit('"></iframe>', 1)[0]
    h = int(re.search(r"height:(\d+)px", attrs["style"])[1])
    assert 400 <= h <= 1400


def test_write_page_is_atomic(tmp_path, monkeypatch):
    view = small_view()
    path = I.write_page(view, tmp_path / "r" / "step-2.html")
    assert path.read_text() == I.render_page(view)
    import os

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        I.write_page(small_view(title="new"), path)
    assert path.read_text() == I.render_page(view)  # the old page, whole
    assert [p.name for p in path.parent.iterdir()] == ["step-2.html"]  # no temporary left behind


def test_bad_views_name_the_field():
    rng = np.random.default_rng(5)
    bad = make_view([[make_row(0, 5, rng), make_row(1, 6, rng)]])
    bad["groups"][0]["rows"][1]["pieces"] = bad["groups"][0]["rows"][1]["pieces"][:-1]
    with pytest.raises(I.ViewError, match=r'view\["groups"\]\[0\]\["rows"\]\[1\]\["pieces"\]: must be a list of 6'):
        I.render_page(bad)
    bad = make_view([[make_row(0, 5, rng)]])
    bad["groups"][0]["rows"][0]["values"]["c/gspo"] = [0.0] * 4
    with pytest.raises(I.ViewError, match=r'\["values"\]\["c/gspo"\]: has 4 values for a row of length 5'):
        I.render_page(bad)
    bad = make_view([[make_row(0, 5, rng, values={"c/cispo": [0.0] * 5})]])
    with pytest.raises(I.ViewError, match=r'\["c/cispo"\]: not a declared quantity/config'):
        I.render_page(bad)
    with pytest.raises(I.ViewError, match=r'view\["configs"\]: must be a list starting with "recorded"'):
        I.render_page(make_view([[make_row(0, 5, rng)]], configs=("gspo", "recorded")))


# ---- long completions -----------------------------------------------------------------------------
N = 4096


def long_row_values():
    """A 4,096-token row whose kept tokens are placed by hand: |c| max 2e-5 at 1000, 1.2e-6 at 100 and
    150 and 1.5e-6 at 3000 (>= 5% of the max: kept), 0.9e-6 at 500 (4.5%: not kept at tau 5%, kept at
    4%), a clipped token at 2000 (under gspo only), |gap| 0.7 nats at 2500 (kept), 0.4 at 2700 (not)."""
    c = [1e-9 * (-1) ** t for t in range(N)]
    c[1000], c[3000], c[100], c[150], c[500] = -2e-5, 1.5e-6, 1.2e-6, -1.2e-6, 0.9e-6
    clip_rec, clip_gspo = [0.0] * N, [0.0] * N
    clip_gspo[2000] = 1.0
    gap = [0.0] * N
    gap[2500], gap[2700] = -0.7, 0.4
    return c, clip_rec, clip_gspo, gap


# Worked out by hand from the rule (first/last 32, +-8 around kept tokens, hidden runs > 48 fold):
# shown [0,32) [92,109) [142,159) [992,1009) [1992,2009) [2492,2509) [2992,3009) [4064,4096); the hidden
# run [109,142) is 33 tokens, so it stays shown.
EXPECTED_CHIPS = [[32, 92], [159, 992], [1009, 1992], [2009, 2492], [2509, 2992], [3009, 4064]]


def test_collapse_plan_on_a_4096_token_completion():
    c, clip_rec, clip_gspo, gap = long_row_values()
    plan = I.collapse_plan(c, [clip_rec, clip_gspo], 0.05, gap=gap)
    assert plan == EXPECTED_CHIPS
    hidden = {t for a, b in plan for t in range(a, b)}
    assert 2000 not in hidden and all(x not in hidden for x in (100, 150, 1000, 3000, 2500))
    # tau moves the line: at 4% the 0.9e-6 token at 500 is kept and splits a chip around it
    assert I.collapse_plan(c, [clip_rec, clip_gspo], 0.04, gap=gap) == \
        [[32, 92], [159, 492], [509, 992]] + EXPECTED_CHIPS[2:]
    # without the clip array the clipped token folds away with its run
    assert [1992, 2009] not in I.collapse_plan(c, [clip_rec], 0.05, gap=gap)
    assert I.collapse_plan(c, None, 0.05, gap=gap)[2] == [1009, 2492]


def test_collapse_plan_edge_cases():
    assert I.collapse_plan([0.0] * N) == [[32, N - 32]]  # nothing stands out (advantage 0): one chip
    # an on-policy row: every token's gradient weight is -A_i/|y_i|, none differs from its row's: one chip
    assert I.collapse_plan([-1e-3] * N) == [[32, N - 32]]
    on_policy = [-1e-3] * N
    on_policy[700] = 0.0  # one token the loss clipped (no gradient) stands out from its row and is kept
    assert I.collapse_plan(on_policy) == [[32, 692], [709, N - 32]]
    assert I.collapse_plan([(-1.0) ** t for t in range(N)]) == []  # every token as far from the median: nothing folds
    assert I.collapse_plan([0.0] * (64 + 48)) == []  # 48 hidden tokens: too short to fold
    assert I.collapse_plan([0.0] * (64 + 49)) == [[32, 81]]
    assert I.collapse_plan([None] * 200) == [[32, 168]]
    # ratios: 0.5 and 2 stand out alike (|log r|), 1 does not
    r = [1.0] * 400
    r[100], r[300] = 0.5, 2.0
    assert I.collapse_plan(r, scale="log1") == [[32, 92], [109, 292], [309, 368]]


def test_page_plans_the_long_row_and_keeps_every_clipped_token():
    c, clip_rec, clip_gspo, gap = long_row_values()
    rng = np.random.default_rng(6)
    long = make_row(0, N, rng, values={"c/recorded": c, "clip/recorded": clip_rec, "clip/gspo": clip_gspo,
                                       "gap": gap})
    view = make_view([[long, make_row(1, 30, rng)]])
    data = I.read_page_data(I.render_page(view))
    assert data["plan"]["key"] == "c/recorded" and data["plan"]["tau"] == 0.05
    plans = [r["plan"] for r in data["groups"][0]["rows"]]
    assert plans == [EXPECTED_CHIPS, []]


def test_an_unclaimed_verdict_is_not_shown_as_not_reproduced():
    """faithful None (CONTROLLED in another environment, NOT CHECKED) was bool()ed to False: a red NOT REPRODUCED
    badge over a verdict that refuted nothing (issue 43)."""
    def shown(faithful, text):
        return I.page_data(small_view(verdict={"faithful": faithful, "text": text}))["verdict"]
    assert shown(None, "NOT CHECKED (no micro-batch ran)") == {"faithful": None, "badge": "NOT CHECKED",
                                                               "text": "NOT CHECKED (no micro-batch ran)"}
    assert shown(None, "CONTROLLED: the environment differs")["badge"] == "CONTROLLED"
    assert shown(False, "NOT REPRODUCED: x")["badge"] == "NOT REPRODUCED"
    assert shown(True, "FAITHFUL: x")["badge"] == "FAITHFUL"
    js = (ROOT / "rftlib" / "report" / "inspect_page" / "inspector.js").read_text()
    assert "D.verdict.badge" in js  # the page shows the badge the data names
