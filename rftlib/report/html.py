"""Small HTML building blocks for reports: an ``Html`` string that notebooks display, tables with
inline styles (they survive nbconvert and need no stylesheet), status colours.

Everything returns plain strings (``Html`` is a ``str``), so tests can check the content directly.
"""

from __future__ import annotations

import html as _html
import math
from typing import Any, Iterable, Sequence

# one colour per verdict status (background, text); also used for component checks
STATUS_STYLE = {
    "pass": ("#d9f2dd", "#14532d"),
    "warn": ("#fff1c2", "#7a4b00"),
    "fail": ("#fbd5d5", "#7f1d1d"),
    "n/a": ("#eceff3", "#374151"),
}
_TABLE = "border-collapse:collapse;font-size:13px;margin:6px 0 12px 0"
_CELL = "border:1px solid #d0d7de;padding:3px 8px;text-align:left;vertical-align:top"
_HEAD = _CELL + ";background:#f3f4f6;font-weight:600"


class Html(str):
    """A string that Jupyter renders as HTML (the last expression of a cell)."""

    def _repr_html_(self) -> str:
        return str(self)


def esc(v: Any) -> str:
    return _html.escape(str(v), quote=True)


def fmt(v: Any, digits: int = 4) -> str:
    """A compact, human-readable value: 4 significant digits for floats, repr-like for the rest."""
    if v is None:
        return "\u2014"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            return str(v)
        if v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e5):
            return f"{v:.{digits - 1}e}"
        return f"{v:.{digits}g}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(fmt(x, digits) for x in v) + "]"
    return str(v)


def pct(v: float | None, digits: int = 1) -> str:
    return "\u2014" if v is None else f"{100 * v:.{digits}f}%"


def status_badge(status: str, text: str | None = None) -> str:
    """A coloured label; ``text`` defaults to the status itself (no emoji: fonts may lack them)."""
    bg, fg = STATUS_STYLE.get(status, STATUS_STYLE["n/a"])
    return (f'<span class="rft-status rft-{esc(status.replace("/", ""))}" style="background:{bg};color:{fg};'
            f'padding:1px 6px;border-radius:3px;font-weight:600">{esc(text or status.upper())}</span>')


def table(headers: Sequence[str] | None, rows: Iterable[Sequence[Any]], *, row_status: Sequence[str] | None = None,
          raw: Sequence[int] = (), cls: str = "", caption: str | None = None) -> Html:
    """An HTML table. Cells are escaped except the column indices in ``raw`` (already HTML).
    ``row_status`` colours whole rows by verdict status."""
    out = [f'<table class="rft-table {esc(cls)}" style="{_TABLE}">']
    if caption:
        out.append(f'<caption style="caption-side:top;text-align:left;font-weight:600;padding:2px 0">'
                   f"{esc(caption)}</caption>")
    if headers:
        out.append("<thead><tr>" + "".join(f'<th style="{_HEAD}">{esc(h)}</th>' for h in headers) + "</tr></thead>")
    out.append("<tbody>")
    for i, row in enumerate(rows):
        style = ""
        if row_status is not None:
            bg, fg = STATUS_STYLE.get(row_status[i], STATUS_STYLE["n/a"])
            style = f' style="background:{bg};color:{fg}"'
        cells = "".join(f'<td style="{_CELL}">{c if j in raw else esc(fmt(c))}</td>' for j, c in enumerate(row))
        out.append(f"<tr{style}>{cells}</tr>")
    out.append("</tbody></table>")
    return Html("".join(out))


def kv_table(pairs: Iterable[tuple[str, Any]], *, caption: str | None = None, raw_values: bool = False) -> Html:
    return table(None, [(k, v) for k, v in pairs], caption=caption, raw=(1,) if raw_values else ())


def pre(text: str, max_chars: int | None = None) -> str:
    """Preformatted, escaped text (for completions); newlines and whitespace kept visible."""
    if max_chars is not None and len(text) > max_chars:
        text = text[:max_chars] + f"\u2026 [{len(text) - max_chars} more chars]"
    return (f'<pre style="white-space:pre-wrap;margin:0;max-width:640px;font-size:12px">'
            f"{esc(text) if text else '<i>(empty)</i>'}</pre>")


def section(title: str, body: str = "", level: int = 3) -> Html:
    return Html(f"<h{level}>{esc(title)}</h{level}>{body}")


def join(*parts: str) -> Html:
    return Html("".join(parts))
