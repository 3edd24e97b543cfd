"""The token inspector (issue 33 item 3): one self-contained HTML page per recorded step.

The page renders a *view* (the plain dict of /work/notes/view33.md, built by the record/replay code
from a recorded batch and its replays): the header figures, the replay's faithfulness verdict, the
per-config table, and every group of G completions with its rewards, advantages and the completion
tokens coloured by a chosen quantity (gradient weight, ratio, clip side, entropy, gap ...) under a
chosen config. This module only renders; it never reads a record and never imports torch.

    render_page(view) -> str          the page: inline JS/CSS, a CSP that forbids any fetch, one JSON block
    write_page(view, path)            the same, written atomically (tmp + os.replace)
    view_in_notebook(view)            the same page in a sandboxed ``<iframe srcdoc>`` (JupyterLab)
    collapse_plan(values, clip, tau)  which tokens of a long completion are shown and which collapse to a chip
    decode_arrays(data)               the page's per-token arrays back as numpy (for tests and tools)

Why the page is built this way:
- **Nothing is fetched.** The JS and CSS are inlined from ``inspect_page/`` and a Content-Security-Policy
  meta (``default-src 'none'``) turns any attempt to load something into a console error, which the
  browser test fails on. The page works from a file, a mail attachment or an iframe alike.
- **Compact.** A seed-003 step holds 512 rows x 4,096 tokens; per-token arrays are base64 float16
  (or float32), one array per ``quantity/config`` over the concatenated tokens of every row, never
  JSON float lists. A float16 array is stored as ``(v - offset) / scale`` with ``scale`` a power of two
  (exact) at or above max|v - offset|, so gradient weights of 1e-7 keep float16's relative precision
  instead of underflowing; ``offset`` is 1 for ratios (a ratio of 1.0003 keeps its 3e-4). The decoded
  value is within ``max(|v - offset| * 2**-11, scale * 2**-25)`` of the input (half a float16 ulp of the
  scaled value, or half the subnormal spacing). Exact figures (header, table, totals) stay float64.
- **Safe with model output.** Pieces are untrusted: they travel inside the JSON block with ``<``, ``>``
  and ``&`` as ``\\u003c`` escapes (no ``</script>`` can end the block), and the JS only ever sets
  ``textContent``, never ``innerHTML``.
- **One renderer.** JupyterLab shows the very same page in ``<iframe sandbox="allow-scripts" srcdoc>``,
  so the notebook and the file cannot drift, and the page cannot reach the notebook.
- **Readable at 4,096 tokens.** :func:`collapse_plan` keeps the tokens that matter and folds the other
  long runs into chips (``⋯ 812 tokens · max|c| 2.1e-5 · Σc -3.0e-4 ⋯``). It runs here for the page's
  default colouring (so it is tested without a browser) and the page's JS, a line-for-line port of it,
  re-plans when the reader changes the quantity, the config or the threshold.
"""

from __future__ import annotations

import base64
import html as _html
import json
import math
import os
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from rftlib.monitor.files import chmod_as_umask

SCHEMA = 1
TAU = 0.05  # a token is kept if its |q| >= TAU * the row's max |q| (the page's slider starts here)
EDGE = 32  # the first and last EDGE tokens of a completion are always shown
CONTEXT = 8  # +- CONTEXT tokens around every kept token are shown
MIN_RUN = 48  # a hidden run is folded into a chip only when longer than this
GAP_KEEP = 0.5  # nats: a token whose |trainer - behaviour logprob| exceeds this is kept whatever it is coloured by
DEFAULT_OPEN = 3  # groups whose tokens are rendered when the fragment names none
CSP = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:"
SCALES = ("diverging", "log1", "sequential", "categorical")
SORT_KEYS = ("spread", "clip", "ratio", "sumc", "index")  # the page's sort menu, in the fragment's spelling


class ViewError(ValueError):
    """A view that does not follow the interface (/work/notes/view33.md); the message names the field."""


# ---- the collapse decision ----------------------------------------------------------------------
def interest(values: Sequence[float | None], scale: str = "diverging") -> np.ndarray:
    """How much a token stands out under a colour scale: |log v| for ratios (``log1``: 0.5 and 2 are
    equally far from 1), ``v != 0`` for categories, |v| otherwise; NaN/None (not computed) count 0."""
    v = np.asarray([np.nan if x is None else x for x in values], dtype=np.float64)  # (T,)
    if scale == "log1":
        with np.errstate(divide="ignore", invalid="ignore"):
            m = np.abs(np.log(v))
    elif scale == "categorical":
        m = (np.nan_to_num(v) != 0).astype(np.float64)
    else:
        m = np.abs(v)
    m[~np.isfinite(m)] = 0.0
    return m


def collapse_plan(values: Sequence[float | None], clip: Sequence[float | None] | Sequence[Sequence] | None = None,
                  tau: float = TAU, *, scale: str = "diverging", gap: Sequence[float | None] | None = None,
                  edge: int = EDGE, context: int = CONTEXT, min_run: int = MIN_RUN) -> list[list[int]]:
    """The runs of one completion that collapse into chips: ``[[start, end), ...]`` in token positions.

    A token is *kept* if ``interest(values) >= tau * max`` over the row (and the row's max is > 0), where on a
    diverging scale (the gradient weight c, the gap) a value counts by its distance from the row's median: an
    on-policy row gives every token the same c (-A_i/|y_i| under the sequence mean), so a rule on |c| itself kept
    every token and folded nothing; what stands out is the token whose weight differs from its row's. Also kept if
    it is clipped under any config (``clip``: one array, or a list of arrays, non-zero = clipped), or if
    ``|gap| > GAP_KEEP`` nats. The first and last ``edge`` tokens and ``+-context`` around each kept token
    are shown too. Every other run of hidden tokens longer than ``min_run`` becomes a chip; shorter runs
    are shown (a chip for 10 tokens would hide more than it saves). The page's JS implements the same
    rule (``collapsePlan`` in inspector.js) for other quantities and thresholds.
    """
    if not 0 <= tau <= 1:
        raise ValueError(f"collapse_plan: tau must be in [0, 1], got {tau!r}")
    v = np.asarray([np.nan if x is None else x for x in values], dtype=np.float64)  # (T,)
    if scale == "diverging":
        fin = v[np.isfinite(v)]
        if fin.size:
            v = v - np.median(fin)
    m = interest(v, scale)  # (T,)
    n = len(m)
    keep = np.zeros(n, dtype=bool)
    top = float(m.max()) if n else 0.0
    if top > 0:
        keep |= m >= tau * top
    clips = [] if clip is None else ([clip] if len(clip) == 0 or not isinstance(clip[0], (list, tuple, np.ndarray))
                                     else list(clip))
    for c in clips:
        if len(c) != n:
            raise ValueError(f"collapse_plan: a clip array has {len(c)} values for {n} tokens")
        keep |= interest(c, "categorical") > 0
    if gap is not None:
        if len(gap) != n:
            raise ValueError(f"collapse_plan: the gap array has {len(gap)} values for {n} tokens")
        keep |= interest(gap) > GAP_KEEP
    shown = np.zeros(n, dtype=bool)
    shown[:edge] = True
    shown[max(0, n - edge):] = True
    for t in np.flatnonzero(keep):
        shown[max(0, t - context):t + context + 1] = True
    runs, t = [], 0
    while t < n:
        if shown[t]:
            t += 1
            continue
        s = t
        while t < n and not shown[t]:
            t += 1
        if t - s > min_run:
            runs.append([int(s), int(t)])
    return runs


# ---- the data block -----------------------------------------------------------------------------
def _finite_or_text(v: Any) -> Any:
    """A JSON-safe figure: floats stay floats (float64), NaN and inf become strings (JSON has neither)."""
    if isinstance(v, bool) or v is None or isinstance(v, (int, str)):
        return v
    if isinstance(v, (float, np.floating)):
        v = float(v)
        return v if math.isfinite(v) else ("NaN" if v != v else ("inf" if v > 0 else "-inf"))
    if isinstance(v, np.integer):
        return int(v)
    return str(v)


def encode_array(values: np.ndarray, dtype: str = "float16", offset: float = 0.0) -> dict[str, Any]:
    """One per-token array as base64 little-endian float16 (scaled, see the module doc) or float32.
    NaN marks a token the quantity was not computed for."""
    v = np.asarray(values, dtype=np.float64)  # (N_tok,)
    if dtype == "float32":
        return {"dtype": "f32", "scale": 1.0, "offset": 0.0,
                "b64": base64.b64encode(v.astype("<f4").tobytes()).decode("ascii")}
    if dtype != "float16":
        raise ValueError(f"encode_array: dtype must be 'float16' or 'float32', got {dtype!r}")
    d = v - offset
    fin = np.isfinite(d)
    top = float(np.abs(d[fin]).max()) if fin.any() else 0.0
    scale = 2.0 ** math.ceil(math.log2(top)) if top > 0 else 1.0  # a power of two: dividing by it is exact
    return {"dtype": "f16", "scale": scale, "offset": float(offset),
            "b64": base64.b64encode((d / scale).astype("<f2").tobytes()).decode("ascii")}


def decode_array(enc: dict[str, Any]) -> np.ndarray:
    """The inverse of :func:`encode_array` (float64; NaN where not computed)."""
    raw = base64.b64decode(enc["b64"])
    if enc["dtype"] == "f32":
        return np.frombuffer(raw, dtype="<f4").astype(np.float64)
    return np.frombuffer(raw, dtype="<f2").astype(np.float64) * enc["scale"] + enc["offset"]


def _keys(view: dict[str, Any]) -> list[tuple[str, str, str | None]]:
    """Every ``(array key, quantity, config or None)`` the view's quantities declare, in page order."""
    out = []
    for q, spec in view["quantities"].items():
        if spec.get("per_config"):
            out += [(f"{q}/{c}", q, c) for c in view["configs"]]
        else:
            out.append((q, q, None))
    return out


def check_view(view: Any) -> None:
    """Raise :class:`ViewError` naming the first field that breaks the interface (view33.md)."""
    def need(cond: bool, where: str, what: str) -> None:
        if not cond:
            raise ViewError(f"inspector view: {where}: {what}")

    need(isinstance(view, dict), "view", f"must be a dict, got {type(view).__name__}")
    need(view.get("schema") == SCHEMA, 'view["schema"]', f"must be {SCHEMA}, got {view.get('schema')!r}")
    for k in ("configs", "quantities", "groups"):
        need(k in view, f'view["{k}"]', "missing")
    cfgs = view["configs"]
    need(isinstance(cfgs, list) and cfgs and cfgs[0] == "recorded", 'view["configs"]',
         f'must be a list starting with "recorded", got {cfgs!r}')
    need(len(set(cfgs)) == len(cfgs), 'view["configs"]', f"repeats a name: {cfgs!r}")
    need(isinstance(view["quantities"], dict) and view["quantities"], 'view["quantities"]', "must be a non-empty dict")
    for q, spec in view["quantities"].items():
        need("/" not in q, f'view["quantities"]["{q}"]', 'a quantity name cannot hold "/"')
        need(isinstance(spec, dict) and spec.get("scale") in SCALES, f'view["quantities"]["{q}"]["scale"]',
             f"must be one of {SCALES}, got {spec.get('scale') if isinstance(spec, dict) else spec!r}")
    known = {k for k, _, _ in _keys(view)}
    need(isinstance(view.get("table", []), list), 'view["table"]', "must be a list of dicts (one per config)")
    for i, row in enumerate(view.get("table") or []):
        need(isinstance(row, dict), f'view["table"][{i}]', "must be a dict")
    for gi, g in enumerate(view["groups"]):
        gw = f'view["groups"][{gi}]'
        need(isinstance(g, dict) and isinstance(g.get("rows"), list), f"{gw}[\"rows\"]", "missing or not a list")
        for ri, r in enumerate(g["rows"]):
            rw = f'{gw}["rows"][{ri}]'
            n = r.get("length")
            need(isinstance(n, int) and n >= 0, f'{rw}["length"]', f"must be an int >= 0, got {n!r}")
            pieces = r.get("pieces")
            need(isinstance(pieces, list) and len(pieces) == n, f'{rw}["pieces"]',
                 f"must be a list of {n} strings (the row's length), got "
                 f"{len(pieces) if isinstance(pieces, list) else type(pieces).__name__}")
            need(all(isinstance(p, str) for p in pieces), f'{rw}["pieces"]', "every piece must be a str")
            env = r.get("env") or []
            need(isinstance(env, list) and all(isinstance(j, int) and 0 <= j < n for j in env), f'{rw}["env"]',
                 f"must be a list of token positions in [0, {n}) (the environment's tokens), got {env!r:.80}")
            for k, vals in (r.get("values") or {}).items():
                need(k in known, f'{rw}["values"]["{k}"]',
                     f"not a declared quantity/config (declared: {', '.join(sorted(known))})")
                need(vals is None or len(vals) == n, f'{rw}["values"]["{k}"]',
                     f"has {len(vals) if vals is not None else 0} values for a row of length {n}")


def page_data(view: dict[str, Any], dtype: str = "float16", tau: float = TAU) -> dict[str, Any]:
    """The JSON the page reads: the view's figures with their order kept (lists of pairs), the per-token
    arrays encoded, each row's token offset into them, and the collapse plan for the default colouring."""
    check_view(view)
    keys = _keys(view)
    rows = [r for g in view["groups"] for r in g["rows"]]
    offsets = np.cumsum([0] + [r["length"] for r in rows])  # (rows + 1,)
    ntok = int(offsets[-1])
    arrays: dict[str, Any] = {}
    full: dict[str, np.ndarray] = {}
    for key, q, _ in keys:
        if not any((r.get("values") or {}).get(key) is not None for r in rows):
            continue  # not computed for any row (e.g. no replay): the page offers no such colouring
        a = np.full(ntok, np.nan)  # (N_tok,)
        for r, o in zip(rows, offsets):
            vals = (r.get("values") or {}).get(key)
            if vals is not None and r["length"]:
                a[o:o + r["length"]] = [np.nan if x is None else x for x in vals]
        full[key] = a
        scale = view["quantities"][q]["scale"]
        arrays[key] = encode_array(a, dtype, offset=1.0 if scale == "log1" else 0.0)
    first_q = next(iter(view["quantities"]))
    plan_key = next((k for k, q, _ in keys if q == first_q and k in full), None)
    clip_keys = [k for k, q, _ in keys if q == "clip" and k in full]
    groups, i = [], 0
    for g in view["groups"]:
        out_rows = []
        for r in g["rows"]:
            o, n = int(offsets[i]), r["length"]
            i += 1
            plan = []
            if plan_key is not None and n:
                sl = slice(o, o + n)
                plan = collapse_plan(full[plan_key][sl], [full[k][sl] for k in clip_keys] or None, tau,
                                     scale=view["quantities"][first_q]["scale"],
                                     gap=full["gap"][sl] if "gap" in full else None)
            out_rows.append({
                "row": r.get("row"), "rank": r.get("rank"), "reward": _finite_or_text(r.get("reward")),
                "components": [[k, _finite_or_text(v)] for k, v in (r.get("components") or {}).items()],
                "advantage": _finite_or_text(r.get("advantage")), "length": n,
                "truncated": bool(r.get("truncated")), "skipped": bool(r.get("skipped")),
                "off": o, "pieces": list(r["pieces"]), "env": [int(j) for j in r.get("env") or []],
                "totals": [[k, _finite_or_text(v)] for k, v in (r.get("totals") or {}).items()],
                "plan": plan})
        groups.append({"group": g.get("group", len(groups)), "prompt": str(g.get("prompt", "")),
                       "answer": str(g.get("answer", "")), "rows": out_rows})
    table = view.get("table") or []
    columns: list[str] = []
    for row in table:
        columns += [k for k in row if k not in columns]
    verdict = view.get("verdict")
    return {
        "schema": SCHEMA, "title": str(view.get("title", "")), "attempt": view.get("attempt"),
        "step": view.get("step"),
        "header": [[str(k), _finite_or_text(v)] for k, v in (view.get("header") or {}).items()],
        "verdict": None if verdict is None else verdict_badge(verdict),
        "configs": list(view["configs"]),
        "table": {"columns": columns, "rows": [[_finite_or_text(row.get(c)) for c in columns] for row in table]},
        "quantities": [{"key": q, "label": str(s.get("label", q)), "scale": s["scale"],
                        "per_config": bool(s.get("per_config"))} for q, s in view["quantities"].items()],
        "arrays": arrays, "ntok": ntok, "groups": groups,
        "plan": {"key": plan_key, "tau": tau, "edge": EDGE, "context": CONTEXT, "min_run": MIN_RUN,
                 "gap_keep": GAP_KEEP, "default_open": DEFAULT_OPEN},
    }


def verdict_badge(verdict: dict[str, Any]) -> dict[str, Any]:
    """A replay's verdict as the page shows it: {faithful (True, False, or None: not claimed), badge, text}. Only
    faithful False is NOT REPRODUCED (red); None is CONTROLLED (another environment, the control passed) or NOT
    CHECKED, a neutral badge: no equality was claimed, and none was refuted."""
    f, text = verdict.get("faithful"), str(verdict.get("text", ""))
    f = None if f is None else bool(f)
    if f is None:
        badge = "CONTROLLED" if text.startswith("CONTROLLED") else "NOT CHECKED"
    else:
        badge = "FAITHFUL" if f else "NOT REPRODUCED"
    return {"faithful": f, "badge": badge, "text": text}


def _json_for_script(data: Any) -> str:
    """JSON that cannot end its ``<script>`` element: ``<``, ``>``, ``&`` as ``\\u`` escapes (JSON.parse
    reads them back as the same characters). NaN/inf are refused (JSON.parse would fail on them)."""
    s = json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return s.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026") \
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def _asset(name: str) -> str:
    return resources.files("rftlib.report").joinpath("inspect_page", name).read_text(encoding="utf-8")


# ---- the page -----------------------------------------------------------------------------------
def render_page(view: dict[str, Any], *, dtype: str = "float16", tau: float = TAU) -> str:
    """The inspector page for one view: a complete HTML document that loads nothing.

    ``dtype`` is the per-token arrays' encoding (``"float16"``: half the bytes, relative error 2**-11;
    ``"float32"``: the recorded values as float32). ``tau`` is the collapse threshold the page opens
    with (its slider changes it)."""
    data = page_data(view, dtype=dtype, tau=tau)
    title = _html.escape(data["title"] or f"{data['attempt']} step {data['step']}", quote=True)
    js, css = _asset("inspector.js"), _asset("inspector.css")
    for name, text in (("inspector.js", js), ("inspector.css", css)):
        if "</" in text.replace("<\\/", ""):
            raise RuntimeError(f"rftlib/report/inspect_page/{name} holds '</': it would end its inline element")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
            f"<meta http-equiv=\"Content-Security-Policy\" content=\"{CSP}\">\n"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
            f"<title>{title}</title>\n<style>\n{css}\n</style>\n</head>\n<body>\n"
            "<div class=\"rft-inspector\" id=\"rft-inspector\"><noscript>The inspector needs JavaScript "
            "(inline only; it loads nothing).</noscript></div>\n"
            f"<script type=\"application/json\" id=\"rft-data\">{_json_for_script(data)}</script>\n"
            f"<script>\n{js}\n</script>\n</body></html>\n")


def write_page(view: dict[str, Any], path: str | os.PathLike, **kw: Any) -> Path:
    """Write :func:`render_page` to ``path`` atomically (a temporary file in the same directory, then
    ``os.replace``): a reader sees the old page or the new one, never half of one."""
    path = Path(path)
    page = render_page(view, **kw)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(page)
            f.flush()
            os.fsync(f.fileno())
        chmod_as_umask(tmp)  # mkstemp's 0600 would keep every other reader of a shared reports/ out
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


class NotebookView:
    """The inspector in JupyterLab: the page itself in a sandboxed iframe (scripts only: it cannot reach
    the notebook, its cookies or the network)."""

    def __init__(self, page: str, height: int):
        self.page, self.height = page, height

    def _repr_html_(self) -> str:
        return (f'<iframe class="rft-inspector-frame" sandbox="allow-scripts" '
                f'style="width:100%;height:{self.height}px;border:1px solid #d0d7de" '
                f'srcdoc="{_html.escape(self.page, quote=True)}"></iframe>')

    def save(self, path: str | os.PathLike) -> Path:
        """The same page to a file, atomically."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(self.page)
        chmod_as_umask(tmp)
        os.replace(tmp, path)
        return path


def notebook_height(view: dict[str, Any]) -> int:
    """A height that shows the header and the first open groups without a second scroll bar in most
    cases: 360 px of header and controls, 24 px per row of the first DEFAULT_OPEN groups, ~4 lines of
    tokens per row; at most 1400 px (the page scrolls inside the frame beyond that)."""
    rows = sum(len(g["rows"]) for g in view["groups"][:DEFAULT_OPEN])
    return int(min(1400, 360 + rows * (24 + 4 * 18) + 40 * max(0, len(view["groups"]) - DEFAULT_OPEN)))


def view_in_notebook(view: dict[str, Any], *, height: int | None = None, **kw: Any) -> NotebookView:
    """The object a notebook cell returns to show the inspector: ``_repr_html_`` is
    ``<iframe sandbox="allow-scripts" srcdoc="...">`` holding exactly :func:`render_page`'s page."""
    return NotebookView(render_page(view, **kw), height or notebook_height(view))


def decode_arrays(page_or_data: str | dict[str, Any]) -> dict[str, np.ndarray]:
    """Every per-token array of a page (its HTML, or :func:`page_data`'s dict), decoded to float64."""
    data = page_or_data if isinstance(page_or_data, dict) else read_page_data(page_or_data)
    return {k: decode_array(v) for k, v in data["arrays"].items()}


def read_page_data(page: str) -> dict[str, Any]:
    """The JSON data block of a rendered page (exactly one must be there)."""
    start_tag = '<script type="application/json" id="rft-data">'
    if page.count(start_tag) != 1:
        raise ValueError(f"expected one inspector data block, found {page.count(start_tag)}")
    body = page.split(start_tag, 1)[1].split("</script>", 1)[0]
    return json.loads(body)


__all__: Iterable[str] = ("render_page", "write_page", "view_in_notebook", "collapse_plan", "page_data",
                          "decode_arrays", "read_page_data", "check_view", "ViewError", "NotebookView")
