"""The token inspector page in headless Chromium: the renderer's JS run on a synthetic view.

One page, opened with a fragment (``#sort=spread&color=c&cf=gspo&open=0,1&pin=0.2.17``) the way a link
or a screenshot opens it: the cards come in reward-spread order, the counterfactual (gspo) columns are
there, the 4,096-token completion is folded into the chips the Python rule (inspect.collapse_plan)
plans for the values the page decoded, the pinned tooltip shows the token's values, a hostile piece is
text, and the console is silent (a CSP violation or a script error would print there). The screenshot
goes to $RFTLIB_ARTEFACTS/inspector.png. Skips without Chromium, as the report browser tests do
(their helpers: tests/test_notebooks_reports.py)."""

from __future__ import annotations

import math
import re
import statistics
from html.parser import HTMLParser

import numpy as np
import pytest

from rftlib.report import inspect as I
from test_notebooks_reports import CHROME, _chrome, artefacts, needs_chrome  # noqa: F401 (artefacts: a fixture)
from test_report_inspect import EXPECTED_CHIPS, HOSTILE, make_row, make_view

FRAGMENT = "#sort=spread&color=c&cf=gspo&open=0,1&pin=0.2.17"
REWARDS = [[1, 1, 1, 1], [1, 0, 1, 0], [1, 0, 0, 0], [0.5, 0.5, 0.5, 0.6], [1, 1, 0, 0]]
N = 4096
ENV_TOKENS = (5, 6, 7)


class _Dom(HTMLParser):
    """A small DOM: every element as (tag, attrs, text inside it), in document order."""

    VOID = {"br", "meta", "input", "img", "link", "hr", "col", "wbr"}

    def __init__(self):
        super().__init__()
        self.els, self.stack = [], []

    def handle_starttag(self, tag, attrs):
        e = {"tag": tag, "attrs": dict(attrs), "text": [], "up": list(self.stack)}
        self.els.append(e)
        if tag not in self.VOID:
            self.stack.append(e)

    def handle_endtag(self, tag):
        while self.stack:
            if self.stack.pop()["tag"] == tag:
                break

    def handle_data(self, data):
        for e in self.stack:
            e["text"].append(data)

    def find(self, cls=None, tag=None, within=None, **attrs):
        return [e for e in self.els if (cls is None or cls in (e["attrs"].get("class") or "").split())
                and (tag is None or e["tag"] == tag) and all(e["attrs"].get(k) == v for k, v in attrs.items())
                and (within is None or any(u is within for u in e["up"]))]


def text(e):
    return "".join(e["text"])


def long_gspo_values():
    """The long row's c under gspo, every value exact in float16 after the page's power-of-two scaling, so
    the browser's decoded values and Python's are the same numbers. Every token has the row's weight C = -2**-20
    (on-policy: -A/|y|) except: 2**-16 - 2**-20 from C at 1000 (the max), 2**-20 from C at 100 and 150 and
    1.5 * 2**-20 at 3000 (>= 5% of the max: kept), 2**-21 at 500 (< 5%). The collapse rule measures from the
    row's median (C), so the page's JS must compute that median as Python does: on |c| itself every token
    would stand out and nothing would fold."""
    C = -2.0 ** -20
    c = [C] * N
    c[1000], c[100], c[150], c[3000], c[500] = -2.0 ** -16, C + 2.0 ** -20, C - 2.0 ** -20, C + 1.5 * 2.0 ** -20, \
        C + 2.0 ** -21
    clip = [0.0] * N
    clip[2000] = 1.0
    gap = [0.0] * N
    gap[2500] = -0.75
    return c, clip, gap


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    rng = np.random.default_rng(7)
    groups = []
    for g, rewards in enumerate(REWARDS):
        rows = []
        for r, rew in enumerate(rewards):
            i = g * 4 + r
            if g == 1 and r == 0:
                c, clip, gap = long_gspo_values()
                rec = [2.0 ** -30] * N
                rec[50] = 2.0 ** -16  # the recorded config's plan differs: the page must re-plan for gspo
                rows.append(make_row(i, N, rng, reward=rew, advantage=rew - 0.5, values={
                    "c/gspo": c, "clip/gspo": clip, "gap": gap, "c/recorded": rec}))
            elif g == 0 and r == 2:
                pieces = [f" t{t}" for t in range(24)]
                pieces[3:3 + len(HOSTILE)] = HOSTILE
                pieces[17] = " seventeen\n"
                rows.append(make_row(i, 24, rng, reward=rew, advantage=0.0, pieces=pieces))
            else:
                rows.append(make_row(i, 20 + r, rng, reward=rew, advantage=rew - statistics.mean(rewards)))
        groups.append(rows)
    groups[0][1]["env"] = list(ENV_TOKENS)  # a multi-turn row: tokens 5-7 are the environment's
    table = [{"config": "recorded", "loss": -0.0123, "grad_norm": 0.8123, "cos_rec": 1.0},
             {"config": "gspo", "loss": -0.0110, "grad_norm": 0.734, "cos_rec": 0.912}]
    view = make_view(groups, table=table, verdict={"faithful": True, "text": "FAITHFUL (bitwise; cpu float32)"})
    path = I.write_page(view, tmp_path_factory.mktemp("inspect") / "step-2.html")
    return view, path


@pytest.fixture(scope="module")
def dom(page, tmp_path_factory):
    if CHROME is None:
        pytest.skip("no Chromium: run `bash scripts/setup_browser.sh` (apt-get install chromium)")
    view, path = page
    r = _chrome(path.resolve().as_uri() + FRAGMENT, tmp_path_factory.mktemp("chrome"), "--enable-logging=stderr",
                "--v=0", "--virtual-time-budget=10000", "--dump-dom")
    assert r.returncode == 0, r.stderr[-2000:]
    d = _Dom()
    d.feed(r.stdout)
    return d, r.stdout, r.stderr


@needs_chrome
def test_inspector_console_is_silent(dom):
    d, html, err = dom
    console = [x for x in err.splitlines() if ":CONSOLE" in x or "Content Security Policy" in x]
    assert not console, console  # no CSP violation, no script error, no log
    root = d.find(id="rft-inspector")[0]
    assert root["attrs"].get("data-ready") == "1"  # the renderer ran to its end


@needs_chrome
def test_inspector_cards_follow_the_fragment(dom, page):
    d, html, _ = dom
    view, _ = page
    spread = {g["group"]: statistics.pstdev(r["reward"] for r in g["rows"]) for g in view["groups"]}
    want = sorted(spread, key=lambda g: (-spread[g], g))
    cards = d.find("rft-card", tag="section")
    assert [int(c["attrs"]["data-group"]) for c in cards] == want == [1, 4, 2, 3, 0]
    opened = [int(c["attrs"]["data-group"]) for c in cards if "rft-open" in c["attrs"]["class"].split()]
    assert sorted(opened) == [0, 1]  # open=0,1: only those render tokens
    toks = d.find("rft-toks")
    assert sorted({int(t["attrs"]["data-group"]) for t in toks}) == [0, 1]
    assert d.find("rft-verdict")[0]["text"] == ["FAITHFUL"]
    assert text(d.find("rft-legend-name")[0]) == "gradient weight dL/dlogp \u00b7 gspo"  # colour=c, cf=gspo


@needs_chrome
def test_inspector_shows_the_counterfactual_columns(dom):
    d, _, _ = dom
    heads = [text(e) for e in d.find("rft-cf", tag="th")]
    assert heads and all(h.endswith("gspo") for h in heads)  # one column per gspo total, beside recorded's
    assert any(h.startswith("sum c") for h in heads)
    table = [text(e) for e in d.find(tag="td") if text(e) in ("-0.011", "0.734", "0.912")]
    assert table == ["-0.011", "0.734", "0.912"]  # the replay table's gspo row


@needs_chrome
def test_inspector_folds_the_long_completion_as_python_plans(dom, page):
    d, _, _ = dom
    view, path = page
    chips = [[int(e["attrs"]["data-a"]), int(e["attrs"]["data-b"])] for e in d.find("rft-chip")]
    # what Python plans on the values the page carries (decoded float16) for the gspo colouring
    dec = I.decode_arrays(path.read_text())
    off = sum(r["length"] for r in view["groups"][0]["rows"])
    sl = slice(off, off + N)
    planned = I.collapse_plan(dec["c/gspo"][sl], [dec["clip/recorded"][sl], dec["clip/gspo"][sl]], 0.05,
                              gap=dec["gap"][sl])
    assert chips == planned == EXPECTED_CHIPS
    # the first chip: tokens 32..91, each of the row's weight -2**-20 (9.54e-7), so their sum is -5.72e-5
    assert text(d.find("rft-chip")[0]) == "\u22ef 60 tokens \u00b7 max|c| 9.5e-7 \u00b7 \u03a3c -5.7e-5 \u22ef"
    box = d.find("rft-toks", **{"data-group": "1", "data-row": "0"})[0]
    shown = [int(e["attrs"]["data-t"]) for e in d.find("rft-tok", within=box)]
    hidden = {t for a, b in EXPECTED_CHIPS for t in range(a, b)}
    assert shown == [t for t in range(N) if t not in hidden]  # every other token, in order
    clipped = [int(e["attrs"]["data-t"]) for e in d.find("rft-clipped", within=box)]
    assert clipped == [2000]  # the clipped token is shown, and marked


@needs_chrome
def test_inspector_pins_the_fragments_token_and_keeps_pieces_as_text(dom, page):
    d, html, _ = dom
    view, _ = page
    tip = d.find(id="rft-tip")[0]
    assert "rft-pinned-tip" in tip["attrs"]["class"].split() and "hidden" not in tip["attrs"]
    t = text(tip)
    assert "seventeen" in t and "token 17 of 24" in t and "\u21b5" in t  # the newline shown as a mark
    row = view["groups"][0]["rows"][2]["values"]
    cells = [text(e) for e in d.find(tag="td", within=tip)]
    for cf in ("recorded", "gspo"):
        want = row[f"c/{cf}"][17]
        assert any(_close(c, want) for c in cells), (cf, want)
    pinned = d.find("rft-pinned")
    assert len(pinned) == 1 and pinned[0]["attrs"]["data-t"] == "17"
    # the hostile pieces are text nodes: escaped in the serialised DOM, and no element came of them
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert len(d.find(tag="script")) == 2 and not d.find(tag="img")


def _close(cell, want):
    try:
        return abs(float(cell) - want) <= 1e-3 * abs(want)
    except ValueError:
        return False


@needs_chrome
def test_inspector_screenshot_is_not_blank(page, artefacts, tmp_path):
    _, path = page
    shot = artefacts / "inspector.png"
    r = _chrome(path.resolve().as_uri() + FRAGMENT, tmp_path, f"--screenshot={shot}", "--window-size=1280,2000",
                "--virtual-time-budget=10000", "--hide-scrollbars")
    assert r.returncode == 0 and shot.exists(), r.stderr[-2000:]
    from PIL import Image

    img = Image.open(shot).convert("RGB")
    assert img.size == (1280, 2000)
    colours = img.getcolors(maxcolors=1 << 20)
    assert len(colours) > 200  # text, the table, coloured token spans: not a blank page
    white = max(n for n, c in colours if c == (255, 255, 255))
    assert white < 0.95 * 1280 * 2000
    # the token colouring: the diverging scale's red and blue tints both appear
    px = np.asarray(img, dtype=np.int32)
    reddish = ((px[..., 0] - px[..., 2]) > 40).sum()
    bluish = ((px[..., 2] - px[..., 0]) > 40).sum()
    assert reddish > 500 and bluish > 500, (reddish, bluish)


@needs_chrome
def test_inspector_colours_tokens_by_the_chosen_quantity(dom, page):
    """color=c&cf=gspo: each token's background is the diverging scale of its c under gspo, red above 0,
    blue below, alpha 0.75 * sqrt(|c| / max|c|) over the batch (the scale the legend shows)."""
    d, _, _ = dom
    view, path = page
    dec = I.decode_arrays(path.read_text())
    top = np.nanmax(np.abs(dec["c/gspo"]))
    box = d.find("rft-toks", **{"data-group": "0", "data-row": "0"})[0]
    spans = d.find("rft-tok", within=box)
    vals = view["groups"][0]["rows"][0]["values"]["c/gspo"]
    assert len(spans) == len(vals)
    coloured = 0
    for e in spans:
        v = vals[int(e["attrs"]["data-t"])]
        alpha = 0.75 * math.sqrt(abs(v) / top)
        m = re.search(r"background-color: rgba\((\d+), (\d+), (\d+), ([\d.]+)\)", e["attrs"].get("style", ""))
        if alpha < 0.004:
            assert m is None
            continue
        assert m, (e["attrs"], v)
        coloured += 1
        assert tuple(int(x) for x in m.groups()[:3]) == ((214, 39, 40) if v > 0 else (31, 119, 180)), v
        # the page writes 3 decimals (5e-4); Chromium keeps alpha in 8 bits (half a step: 1/510) and
        # serialises it with 3 decimals again (5e-4)
        assert abs(float(m[4]) - alpha) <= 5e-4 + 1 / 510 + 5e-4, (m[4], alpha)
    assert coloured >= len(spans) // 2


@needs_chrome
def test_inspector_greys_the_environments_tokens(dom):
    """A multi-turn row's environment tokens (its ``env`` positions: model mask 0) are greyed (rft-env), carry no
    quantity's colour and say why on hover; every other token of the row is the model's, coloured as before."""
    d, _, _ = dom
    box = d.find("rft-toks", **{"data-group": "0", "data-row": "1"})[0]
    spans = d.find("rft-tok", within=box)
    assert len(spans) == 21
    env = [e for e in spans if "rft-env" in e["attrs"]["class"].split()]
    assert [int(e["attrs"]["data-t"]) for e in env] == list(ENV_TOKENS)
    for e in env:
        assert "background-color" not in (e["attrs"].get("style") or "") and "not in the loss" in e["attrs"]["title"]
    assert any("background-color" in (e["attrs"].get("style") or "") for e in spans if e not in env)
