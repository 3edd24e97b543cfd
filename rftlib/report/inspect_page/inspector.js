// The token inspector's renderer (rftlib/report/inspect.py inlines this file into every page).
//
// It reads the one JSON block (#rft-data), decodes the per-token arrays (base64 float16/float32),
// and builds the page with createElement/textContent only: pieces are model output, never HTML.
// Every control lives in the URL fragment (#sort=spread&color=c&cf=gspo&open=0,1&tau=0.05&pin=0.2.17),
// so a link or a screenshot shows one deterministic state. Only open groups render their tokens.
// collapsePlan() is a line-for-line port of inspect.py's collapse_plan (tested against it).
(function () {
  "use strict";
  var root = document.getElementById("rft-inspector");
  var D = JSON.parse(document.getElementById("rft-data").textContent);
  var P = D.plan;
  var QUANT = {};
  D.quantities.forEach(function (q) { QUANT[q.key] = q; });
  var SORTS = [["spread", "reward spread (std)"], ["clip", "clip fraction"], ["ratio", "max ratio"],
               ["sumc", "\u03a3|c|"], ["index", "index"]];

  // ---- arrays ------------------------------------------------------------------------------------
  var F16 = new Float64Array(65536);
  (function () {
    for (var h = 0; h < 65536; h++) {
      var s = h & 0x8000 ? -1 : 1, e = (h >> 10) & 0x1f, f = h & 0x3ff;
      F16[h] = e === 0 ? s * f * Math.pow(2, -24) : e === 31 ? (f ? NaN : s * Infinity)
        : s * (1 + f / 1024) * Math.pow(2, e - 15);
    }
  })();
  function bytes(b64) {
    var bin = atob(b64), n = bin.length, u = new Uint8Array(n);
    for (var i = 0; i < n; i++) u[i] = bin.charCodeAt(i);
    return u;
  }
  var ARR = {};
  Object.keys(D.arrays).forEach(function (k) {
    var enc = D.arrays[k], u = bytes(enc.b64), dv = new DataView(u.buffer), out = new Float64Array(D.ntok), i;
    if (enc.dtype === "f32") for (i = 0; i < D.ntok; i++) out[i] = dv.getFloat32(4 * i, true);
    else for (i = 0; i < D.ntok; i++) out[i] = F16[dv.getUint16(2 * i, true)] * enc.scale + enc.offset;
    ARR[k] = out;
  });
  function keyOf(q, cf) { return QUANT[q] && QUANT[q].per_config ? q + "/" + cf : q; }
  var DELTA = {};
  // The values a token is coloured by: q under cf, or (delta) q under cf minus q recorded.
  function colourArray(st) {
    var k = keyOf(st.color, st.cf);
    if (!st.delta || !QUANT[st.color] || !QUANT[st.color].per_config || st.cf === "recorded") return ARR[k];
    var r = ARR[keyOf(st.color, "recorded")], c = ARR[k];
    if (!r || !c) return undefined;
    if (!DELTA[k]) {
      var d = new Float64Array(D.ntok);
      for (var i = 0; i < D.ntok; i++) d[i] = c[i] - r[i];
      DELTA[k] = d;
    }
    return DELTA[k];
  }
  function colourScale(st) {
    var q = QUANT[st.color];
    if (!q) return "diverging";
    return st.delta && q.per_config && st.cf !== "recorded" && q.scale !== "categorical" ? "diverging" : q.scale;
  }

  // ---- the collapse rule (inspect.py: interest, collapse_plan) ----------------------------------
  function interest(v, scale) {
    var m;
    if (scale === "log1") m = Math.abs(Math.log(v));
    else if (scale === "categorical") return v !== v || v === 0 ? 0 : 1;
    else m = Math.abs(v);
    return isFinite(m) ? m : 0;
  }
  function rowMedian(vals, off, n) {  // numpy's median of the row's finite values (0 when none)
    var a = [], t, h;
    for (t = 0; t < n; t++) if (isFinite(vals[off + t])) a.push(vals[off + t]);
    if (!a.length) return 0;
    a.sort(function (x, y) { return x - y; });
    h = a.length >> 1;
    return a.length % 2 ? a[h] : (a[h - 1] + a[h]) / 2;
  }
  function collapsePlan(vals, off, n, clips, gap, tau, scale) {
    var t, i, m = new Float64Array(n), keep = new Uint8Array(n), shown = new Uint8Array(n), top = 0;
    var med = vals && scale === "diverging" ? rowMedian(vals, off, n) : 0;  // distance from the row's median
    for (t = 0; t < n; t++) { m[t] = vals ? interest(vals[off + t] - med, scale) : 0; if (m[t] > top) top = m[t]; }
    if (top > 0) for (t = 0; t < n; t++) if (m[t] >= tau * top) keep[t] = 1;
    clips.forEach(function (c) { for (var t = 0; t < n; t++) if (interest(c[off + t], "categorical") > 0) keep[t] = 1; });
    if (gap) for (t = 0; t < n; t++) if (interest(gap[off + t], "diverging") > P.gap_keep) keep[t] = 1;
    for (t = 0; t < Math.min(P.edge, n); t++) shown[t] = 1;
    for (t = Math.max(0, n - P.edge); t < n; t++) shown[t] = 1;
    for (t = 0; t < n; t++) if (keep[t]) for (i = Math.max(0, t - P.context); i < Math.min(n, t + P.context + 1); i++) shown[i] = 1;
    var runs = [];
    t = 0;
    while (t < n) {
      if (shown[t]) { t++; continue; }
      var s = t;
      while (t < n && !shown[t]) t++;
      if (t - s > P.min_run) runs.push([s, t]);
    }
    return runs;
  }
  var CLIPS = Object.keys(ARR).filter(function (k) { return k.split("/")[0] === "clip"; }).map(function (k) { return ARR[k]; });
  function planFor(row, st) {
    var usePre = st.tau === P.tau && keyOf(st.color, st.cf) === P.key && !(st.delta && st.cf !== "recorded");
    if (usePre) return row.plan;
    return collapsePlan(colourArray(st), row.off, row.length, CLIPS, ARR.gap, st.tau, colourScale(st));
  }

  // ---- state in the fragment --------------------------------------------------------------------
  function defaults() {
    return {sort: "index", color: D.quantities[0].key, cf: D.configs[0], open: null, tau: P.tau, pin: null, delta: false};
  }
  function readState() {
    var st = defaults(), h = new URLSearchParams(location.hash.replace(/^#/, ""));
    if (SORTS.some(function (s) { return s[0] === h.get("sort"); })) st.sort = h.get("sort");
    if (QUANT[h.get("color")]) st.color = h.get("color");
    if (D.configs.indexOf(h.get("cf")) >= 0) st.cf = h.get("cf");
    if (h.get("open") !== null) st.open = h.get("open").split(",").filter(function (x) { return x !== ""; }).map(Number);
    var tau = parseFloat(h.get("tau"));
    if (tau >= 0 && tau <= 1) st.tau = tau;
    var pin = (h.get("pin") || "").split(".").map(Number);
    if (pin.length === 3 && pin.every(function (x) { return x >= 0; })) st.pin = pin;
    st.delta = h.get("delta") === "1";
    return st;
  }
  function writeState() {
    var parts = ["sort=" + S.sort, "color=" + encodeURIComponent(S.color), "cf=" + encodeURIComponent(S.cf)];
    if (S.open) parts.push("open=" + S.open.join(","));
    if (S.tau !== P.tau) parts.push("tau=" + S.tau);
    if (S.pin) parts.push("pin=" + S.pin.join("."));
    if (S.delta) parts.push("delta=1");
    try { history.replaceState(null, "", "#" + parts.join("&")); } catch (e) { /* a sandboxed srcdoc frame */ }
  }
  var S = readState();
  var EXPANDED = {};  // "g.r.start" -> true: chips the reader opened

  // ---- formatting -------------------------------------------------------------------------------
  function fmt(v) {
    if (v === null || v === undefined) return "\u2014";
    if (typeof v !== "number") return String(v);
    if (v !== v) return "NaN";
    if (v === 0) return "0";
    var a = Math.abs(v);
    if (a >= 1e-3 && a < 1e5) return String(Number(v.toPrecision(4)));
    return v.toExponential(3).replace("e+", "e");
  }
  function fmt1(v) { return v === 0 ? "0" : v !== v ? "NaN" : v.toExponential(1).replace("e+", "e"); }
  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = text;
    return e;
  }
  var CTRL = /[\u0000-\u0008\u000b-\u001f\u007f]/;
  // A piece as text nodes, whitespace made visible: a newline shows a faint return mark and still
  // breaks the line; a tab an arrow; a piece of spaces only shows middle dots; control characters \xNN.
  function appendPiece(span, piece) {
    var blank = /^[ \t]+$/.test(piece), buf = "";
    function flush() { if (buf) { span.appendChild(document.createTextNode(buf)); buf = ""; } }
    function mark(t, cls) { flush(); span.appendChild(el("span", cls || "rft-ws", t)); }
    for (var i = 0; i < piece.length; i++) {
      var ch = piece[i];
      if (ch === "\n") { mark("\u21b5"); buf += "\n"; }
      else if (ch === "\r") mark("\u240d");
      else if (ch === "\t") mark("\u2192" + (blank ? "" : " "));
      else if (ch === " " && blank) mark("\u00b7");
      else if (CTRL.test(ch)) mark("\\x" + ("0" + ch.charCodeAt(0).toString(16)).slice(-2), "rft-ctl");
      else buf += ch;
    }
    if (!piece.length) mark("\u2205");
    flush();
  }

  // ---- colours ----------------------------------------------------------------------------------
  var NORM = {};
  function norm(st) {
    var a = colourArray(st), scale = colourScale(st), k = keyOf(st.color, st.cf) + (st.delta ? "~d" : "");
    if (!a) return null;
    if (NORM[k]) return NORM[k];
    var lo = Infinity, hi = -Infinity, top = 0;
    for (var i = 0; i < a.length; i++) {
      var v = a[i];
      if (v !== v || !isFinite(v)) continue;
      if (v < lo) lo = v;
      if (v > hi) hi = v;
      var m = interest(v, scale);
      if (m > top) top = m;
    }
    NORM[k] = {lo: lo, hi: hi, top: top, scale: scale};
    return NORM[k];
  }
  function colour(v, nm) {
    if (v !== v || !nm) return "";
    var s = nm.scale, x;
    if (s === "categorical") return v === 0 ? "" : v < 0 ? "rgba(31,119,180,0.55)" : v === 1 ? "rgba(230,85,13,0.55)" : "rgba(117,107,177,0.55)";
    if (s === "sequential") {
      x = nm.hi > nm.lo ? (v - nm.lo) / (nm.hi - nm.lo) : 0;
      return "rgba(106,81,163," + (0.75 * Math.sqrt(Math.max(0, Math.min(1, x)))).toFixed(3) + ")";
    }
    x = s === "log1" ? Math.log(v) : v;
    if (!isFinite(x) || nm.top === 0) return x > 0 ? "rgba(214,39,40,0.75)" : x < 0 ? "rgba(31,119,180,0.75)" : "";
    var a = 0.75 * Math.sqrt(Math.min(1, Math.abs(x) / nm.top));
    return a < 0.004 ? "" : (x > 0 ? "rgba(214,39,40," : "rgba(31,119,180,") + a.toFixed(3) + ")";
  }

  // ---- group statistics for sorting -------------------------------------------------------------
  function groupStat(g, key, st) {
    if (key === "index") return g.group;
    if (key === "spread") {
      var rs = g.rows.map(function (r) { return r.reward; }).filter(function (x) { return typeof x === "number"; });
      if (!rs.length) return NaN;
      var mu = rs.reduce(function (a, b) { return a + b; }, 0) / rs.length;
      return Math.sqrt(rs.reduce(function (a, b) { return a + (b - mu) * (b - mu); }, 0) / rs.length);
    }
    var q = {clip: "clip", ratio: "ratio", sumc: "c"}[key], a = ARR[keyOf(q, st.cf)];
    if (!a) return NaN;
    var n = 0, acc = key === "ratio" ? -Infinity : 0;
    g.rows.forEach(function (r) {
      for (var t = r.off; t < r.off + r.length; t++) {
        var v = a[t];
        if (v !== v) continue;
        n++;
        if (key === "clip") acc += v !== 0 ? 1 : 0;
        else if (key === "ratio") acc = Math.max(acc, v);
        else acc += Math.abs(v);
      }
    });
    if (!n) return NaN;
    return key === "clip" ? acc / n : acc;
  }
  function sortedGroups(st) {
    var keyed = D.groups.map(function (g) { return [groupStat(g, st.sort, st), g]; });
    keyed.sort(function (x, y) {
      var a = x[0], b = y[0];
      if (st.sort !== "index") {
        if (a !== a && b === b) return 1;
        if (b !== b && a === a) return -1;
        if (a === a && b === b && a !== b) return b - a;
      }
      return x[1].group - y[1].group;
    });
    return keyed.map(function (x) { return x[1]; });
  }
  function openSet(order) {
    if (S.open) return S.open;
    return order.slice(0, P.default_open).map(function (g) { return g.group; });
  }

  // ---- header -----------------------------------------------------------------------------------
  function header() {
    var h = el("header", "rft-head");
    h.appendChild(el("h1", null, D.title || (D.attempt + " \u00b7 step " + D.step)));
    var v = el("span", "rft-verdict");
    if (!D.verdict) { v.textContent = "no replay"; v.classList.add("rft-none"); v.title = "no replay of this step yet: rft replay RUN --step " + D.step; }
    else {  // faithful: true FAITHFUL, false NOT REPRODUCED, null CONTROLLED / NOT CHECKED (inspect.verdict_badge)
      v.textContent = D.verdict.badge;
      v.classList.add(D.verdict.faithful === true ? "rft-ok" : D.verdict.faithful === false ? "rft-bad" : "rft-none");
    }
    var line = el("div", "rft-verdict-line");
    line.appendChild(v);
    if (D.verdict && D.verdict.text) line.appendChild(el("span", "rft-verdict-text", D.verdict.text));
    h.appendChild(line);
    var dl = el("dl", "rft-figs");
    D.header.forEach(function (kv) {
      var d = el("div");
      d.appendChild(el("dt", null, kv[0]));
      var dd = el("dd", null, fmt(kv[1]));
      if (typeof kv[1] === "number") dd.title = String(kv[1]);
      d.appendChild(dd);
      dl.appendChild(d);
    });
    h.appendChild(dl);
    return h;
  }
  function configTable() {
    var box = el("section", "rft-configs");
    box.appendChild(el("h2", null, "Replay: every config on this batch"));
    if (!D.table.rows.length) {
      box.appendChild(el("p", "rft-muted", "No replay was run: the tokens show the recorded quantities only. " +
        "rft replay " + (D.attempt || "RUN") + " --step " + D.step + " --vary policy_loss=gspo,cispo"));
      return box;
    }
    var t = el("table", "rft-table"), tr = el("tr");
    D.table.columns.forEach(function (c) { tr.appendChild(el("th", null, c)); });
    t.appendChild(tr);
    var ci = D.table.columns.indexOf("config");
    D.table.rows.forEach(function (row) {
      var r = el("tr");
      if (ci >= 0 && row[ci] === S.cf) r.className = "rft-sel";
      row.forEach(function (v) { var td = el("td", null, fmt(v)); if (typeof v === "number") td.title = String(v); r.appendChild(td); });
      t.appendChild(r);
    });
    box.appendChild(t);
    return box;
  }

  // ---- controls ---------------------------------------------------------------------------------
  function select(label, id, options, value, onchange) {
    var w = el("label", "rft-ctl-item"), s = el("select");
    s.id = id;
    w.appendChild(el("span", null, label));
    options.forEach(function (o) {
      var op = el("option", null, o[1]);
      op.value = o[0];
      if (o[2]) op.disabled = true;
      if (o[0] === value) op.selected = true;
      s.appendChild(op);
    });
    s.addEventListener("change", function () { onchange(s.value); });
    w.appendChild(s);
    return w;
  }
  function controls() {
    var c = el("div", "rft-controls");
    c.appendChild(select("colour by", "rft-color", D.quantities.map(function (q) {
      return [q.key, q.label, !Object.keys(ARR).some(function (k) { return k.split("/")[0] === q.key; })];
    }), S.color, function (v) { S.color = v; update(); }));
    c.appendChild(select("config", "rft-cf", D.configs.map(function (x) { return [x, x]; }), S.cf,
      function (v) { S.cf = v; update(); }));
    var dl = el("label", "rft-ctl-item"), dc = el("input");
    dc.type = "checkbox"; dc.id = "rft-delta"; dc.checked = S.delta;
    dc.addEventListener("change", function () { S.delta = dc.checked; update(); });
    dl.appendChild(dc); dl.appendChild(el("span", null, "\u0394 vs recorded"));
    c.appendChild(dl);
    c.appendChild(select("sort groups by", "rft-sort", SORTS.map(function (s) { return [s[0], s[1]]; }), S.sort,
      function (v) { S.sort = v; update(); }));
    var tl = el("label", "rft-ctl-item"), sl = el("input"), tv = el("span", "rft-tau", "\u03c4 " + (100 * S.tau).toFixed(0) + "%");
    sl.type = "range"; sl.min = "0"; sl.max = "0.5"; sl.step = "0.01"; sl.value = String(S.tau); sl.id = "rft-tau";
    sl.title = "collapse threshold: a token is kept if its |value| >= \u03c4 \u00d7 its row's max";
    sl.addEventListener("input", function () { tv.textContent = "\u03c4 " + (100 * sl.value).toFixed(0) + "%"; });
    sl.addEventListener("change", function () { S.tau = parseFloat(sl.value); update(); });
    tl.appendChild(el("span", null, "collapse")); tl.appendChild(sl); tl.appendChild(tv);
    c.appendChild(tl);
    var all = el("button", "rft-btn", "open all"), none = el("button", "rft-btn", "close all");
    all.addEventListener("click", function () { S.open = D.groups.map(function (g) { return g.group; }); update(); });
    none.addEventListener("click", function () { S.open = []; update(); });
    c.appendChild(all); c.appendChild(none);
    return c;
  }
  function legend() {
    var nm = norm(S), q = QUANT[S.color], box = el("div", "rft-legend");
    var name = q ? q.label : S.color;
    if (q && q.per_config) name += " \u00b7 " + S.cf + (S.delta && S.cf !== "recorded" ? " \u2212 recorded" : "");
    box.appendChild(el("span", "rft-legend-name", name));
    if (!nm || nm.lo === Infinity) { box.appendChild(el("span", "rft-muted", " not computed for this config")); return box; }
    var stops;
    if (nm.scale === "categorical") stops = [[-1, "low"], [0, "no"], [1, "high"]];
    else if (nm.scale === "sequential") stops = [0, 0.25, 0.5, 0.75, 1].map(function (f) { var v = nm.lo + f * (nm.hi - nm.lo); return [v, fmt(v)]; });
    else if (nm.scale === "log1") stops = [-1, -0.5, 0, 0.5, 1].map(function (f) { var v = Math.exp(f * nm.top); return [v, fmt(v)]; });
    else stops = [-1, -0.5, 0, 0.5, 1].map(function (f) { return [f * nm.top, fmt(f * nm.top)]; });
    stops.forEach(function (s) { var sw = el("span", "rft-swatch", s[1]); sw.style.backgroundColor = colour(s[0], nm); box.appendChild(sw); });
    return box;
  }
  function topTokens() {
    var a = colourArray(S), scale = colourScale(S), box = el("section", "rft-top");
    if (!a) return box;
    var where = [];
    D.groups.forEach(function (g) { g.rows.forEach(function (r, ri) { for (var t = 0; t < r.length; t++) where.push([interest(a[r.off + t], scale), g, ri, t]); }); });
    where.sort(function (x, y) { return y[0] - x[0] || x[1].group - y[1].group || x[2] - y[2] || x[3] - y[3]; });
    var top = where.slice(0, 20).filter(function (w) { return w[0] > 0; });
    box.appendChild(el("h2", null, "Where the update went: the top " + top.length + " tokens by |" + S.color + "|"));
    var list = el("div", "rft-top-list");
    top.forEach(function (w) {
      var g = w[1], r = g.rows[w[2]], b = el("button", "rft-top-tok");
      var p = el("span", "rft-piece");
      appendPiece(p, r.pieces[w[3]]);
      b.appendChild(p);
      b.appendChild(el("span", "rft-muted", " g" + g.group + " r" + (r.row === null ? w[2] : r.row) + " t" + w[3] + " " + fmt(a[r.off + w[3]])));
      b.addEventListener("click", function () { pinToken(g.group, w[2], w[3], true); });
      list.appendChild(b);
    });
    box.appendChild(list);
    return box;
  }

  // ---- group cards ------------------------------------------------------------------------------
  function rowColumns(g) {
    // the totals the view gives per row, grouped by config (recorded first), else Σc and clip fraction
    var keys = [];
    g.rows.forEach(function (r) { r.totals.forEach(function (kv) { if (keys.indexOf(kv[0]) < 0) keys.push(kv[0]); }); });
    var cols = [];
    if (keys.length) {
      keys.filter(function (k) { return k.indexOf("/") < 0; }).forEach(function (k) { cols.push({label: k, cfg: null, total: k}); });
      D.configs.forEach(function (cf) {
        keys.filter(function (k) { return k.slice(k.lastIndexOf("/") + 1) === cf && k.indexOf("/") >= 0; })
          .forEach(function (k) { cols.push({label: k.slice(0, k.lastIndexOf("/")), cfg: cf, total: k}); });
      });
      keys.filter(function (k) { return k.indexOf("/") >= 0 && D.configs.indexOf(k.slice(k.lastIndexOf("/") + 1)) < 0; })
        .forEach(function (k) { cols.push({label: k, cfg: null, total: k}); });
    } else {
      D.configs.forEach(function (cf) {
        if (ARR["c/" + cf]) cols.push({label: "\u03a3c", cfg: cf, sum: "c/" + cf});
        if (ARR["clip/" + cf]) cols.push({label: "clip frac", cfg: cf, frac: "clip/" + cf});
      });
    }
    return cols;
  }
  function colValue(col, r) {
    if (col.total) { var kv = r.totals.filter(function (x) { return x[0] === col.total; })[0]; return kv ? kv[1] : null; }
    var a = ARR[col.sum || col.frac], n = 0, acc = 0;
    for (var t = r.off; t < r.off + r.length; t++) { var v = a[t]; if (v !== v) continue; n++; acc += col.sum ? v : (v !== 0 ? 1 : 0); }
    return n ? (col.sum ? acc : acc / n) : null;
  }
  function stats(g) {
    var rs = g.rows.map(function (r) { return r.reward; }).filter(function (x) { return typeof x === "number"; });
    var mu = rs.reduce(function (a, b) { return a + b; }, 0) / (rs.length || 1);
    var sd = Math.sqrt(rs.reduce(function (a, b) { return a + (b - mu) * (b - mu); }, 0) / (rs.length || 1));
    return [mu, sd];
  }
  var SHARE_TOTAL = null;
  function share(g) {
    var a = ARR[keyOf("c", S.cf)];
    if (!a) return null;
    if (SHARE_TOTAL === null || SHARE_TOTAL[0] !== S.cf) {
      var tot = 0;
      for (var i = 0; i < a.length; i++) if (a[i] === a[i]) tot += Math.abs(a[i]);
      SHARE_TOTAL = [S.cf, tot];
    }
    return SHARE_TOTAL[1] > 0 ? groupStat(g, "sumc", S) / SHARE_TOTAL[1] : null;
  }
  function card(g, open) {
    var c = el("section", "rft-card" + (open ? " rft-open" : ""));
    c.dataset.group = g.group;
    var head = el("div", "rft-card-head"), tog = el("button", "rft-btn rft-toggle", open ? "\u25be tokens" : "\u25b8 tokens");
    tog.addEventListener("click", function () {
      var cur = openSet(sortedGroups(S)).slice(), i = cur.indexOf(g.group);
      if (i >= 0) cur.splice(i, 1); else cur.push(g.group);
      S.open = cur; update();
    });
    head.appendChild(tog);
    head.appendChild(el("span", "rft-gid", "group " + g.group));
    var ms = stats(g);
    head.appendChild(el("span", "rft-gstat", "reward " + fmt(ms[0]) + " \u00b1 " + fmt(ms[1])));
    var sh = share(g);
    if (sh !== null) head.appendChild(el("span", "rft-gstat", "share of \u03a3|c| " + (100 * sh).toFixed(1) + "%"));
    var cl = groupStat(g, "clip", S), mr = groupStat(g, "ratio", S);
    if (cl === cl) head.appendChild(el("span", "rft-gstat", "clip " + (100 * cl).toFixed(1) + "%"));
    if (mr === mr) head.appendChild(el("span", "rft-gstat", "max ratio " + fmt(mr)));
    c.appendChild(head);
    var pr = el("div", "rft-prompt", g.prompt);
    pr.title = "click to expand";
    pr.addEventListener("click", function () { pr.classList.toggle("rft-expanded"); });
    c.appendChild(pr);
    var ans = el("div", "rft-answer");
    ans.appendChild(el("span", "rft-muted", "answer "));
    ans.appendChild(el("span", null, g.answer));
    c.appendChild(ans);

    var cols = rowColumns(g), t = el("table", "rft-rows"), hr = el("tr");
    ["row", "reward", "advantage", "length", "cut"].forEach(function (h) { hr.appendChild(el("th", null, h)); });
    cols.forEach(function (col) {
      var th = el("th", col.cfg && col.cfg !== "recorded" ? "rft-cf" : null);
      th.appendChild(el("span", null, col.label));
      if (col.cfg) { th.appendChild(el("br")); th.appendChild(el("span", "rft-cfg", col.cfg)); }
      if (col.cfg === S.cf) th.classList.add("rft-selcol");
      hr.appendChild(th);
    });
    t.appendChild(hr);
    var order = g.rows.map(function (r, i) { return i; });
    order.sort(function (a, b) {
      var x = g.rows[a].advantage, y = g.rows[b].advantage;
      x = typeof x === "number" ? x : -Infinity; y = typeof y === "number" ? y : -Infinity;
      return y - x || a - b;
    });
    order.forEach(function (ri) {
      var r = g.rows[ri], tr = el("tr", "rft-row" + (r.skipped ? " rft-skipped" : ""));
      tr.dataset.row = ri;
      var id = el("td", "rft-rowid", String(r.row === null ? ri : r.row));
      if (r.rank !== null && r.rank !== undefined) id.title = "rank " + r.rank;
      tr.appendChild(id);
      var rw = el("td", "rft-reward", fmt(r.reward));
      if (r.components.length) rw.title = r.components.map(function (kv) { return kv[0] + ": " + fmt(kv[1]); }).join("\n");
      tr.appendChild(rw);
      var adv = el("td", null, fmt(r.advantage));
      if (typeof r.advantage === "number") adv.className = r.advantage > 0 ? "rft-pos" : r.advantage < 0 ? "rft-neg" : "";
      tr.appendChild(adv);
      tr.appendChild(el("td", null, String(r.length)));
      tr.appendChild(el("td", null, r.truncated ? "cut" : r.skipped ? "skipped" : ""));
      cols.forEach(function (col) {
        var td = el("td", col.cfg && col.cfg !== "recorded" ? "rft-cf" : null, fmt(colValue(col, r)));
        if (col.cfg === S.cf) td.classList.add("rft-selcol");
        tr.appendChild(td);
      });
      t.appendChild(tr);
      if (open) {
        var tt = el("tr", "rft-toks-tr"), td = el("td");
        td.colSpan = 5 + cols.length;
        var box = el("div", "rft-toks");
        box.dataset.group = g.group; box.dataset.row = ri;
        if (r.length > 4 * P.edge) td.appendChild(minimap(g, ri, r));
        fillTokens(box, g, ri, r);
        td.appendChild(box);
        tt.appendChild(td);
        t.appendChild(tt);
      }
    });
    c.appendChild(t);
    return c;
  }
  function chipText(a, r, s, e, scale) {
    var mx = 0, sum = 0;
    for (var t = s; t < e; t++) { var v = a ? a[r.off + t] : NaN; if (v === v) { mx = Math.max(mx, interest(v, scale)); sum += v; } }
    var q = S.color, txt = "\u22ef " + (e - s) + " tokens \u00b7 max|" + (scale === "log1" ? "log " + q : q) + "| " + fmt1(mx);
    if (scale === "diverging") txt += " \u00b7 \u03a3" + q + " " + fmt1(sum);
    return txt + " \u22ef";
  }
  function envSet(r) {  // a multi-turn row's environment token positions, as a lookup
    if (!r._env) { r._env = {}; (r.env || []).forEach(function (j) { r._env[j] = true; }); }
    return r._env;
  }
  function fillTokens(box, g, ri, r) {
    while (box.firstChild) box.removeChild(box.firstChild);
    var a = colourArray(S), nm = norm(S), scale = colourScale(S);
    var runs = planFor(r, S).filter(function (x) { return !EXPANDED[g.group + "." + ri + "." + x[0]]; });
    var k = 0, t = 0;
    var envAt = envSet(r);
    function tok(t) {
      var s = el("span", envAt[t] ? "rft-tok rft-env" : "rft-tok");
      s.dataset.t = t;
      appendPiece(s, r.pieces[t]);
      if (envAt[t]) s.title = "environment token (tool output or turn boundary): not sampled, not in the loss";
      else if (a) { var bg = colour(a[r.off + t], nm); if (bg) s.style.backgroundColor = bg; }
      for (var j = 0; j < CLIPS.length; j++) if (CLIPS[j][r.off + t] !== 0 && CLIPS[j][r.off + t] === CLIPS[j][r.off + t]) { s.classList.add("rft-clipped"); break; }
      if (S.pin && S.pin[0] === g.group && S.pin[1] === ri && S.pin[2] === t) s.classList.add("rft-pinned");
      return s;
    }
    while (t < r.length) {
      if (k < runs.length && runs[k][0] === t) {
        var run = runs[k], chip = el("button", "rft-chip", chipText(a, r, run[0], run[1], scale));
        chip.dataset.a = run[0]; chip.dataset.b = run[1];
        chip.title = "tokens " + run[0] + "\u2013" + (run[1] - 1) + ": click to show";
        chip.addEventListener("click", (function (s) { return function () { EXPANDED[g.group + "." + ri + "." + s] = true; fillTokens(box, g, ri, r); }; })(run[0]));
        box.appendChild(chip);
        t = run[1]; k++;
        continue;
      }
      box.appendChild(tok(t));
      t++;
    }
  }
  function minimap(g, ri, r) {
    var cv = el("canvas", "rft-minimap"), a = colourArray(S), scale = colourScale(S), nm = norm(S);
    cv.width = r.length; cv.height = 1;
    cv.title = "where the mass is (one column per token): click to go there";
    var ctx = cv.getContext && cv.getContext("2d");
    if (ctx && a && nm && nm.top > 0) {
      var img = ctx.createImageData(r.length, 1), envAt = envSet(r);
      for (var t = 0; t < r.length; t++) {
        if (envAt[t]) { img.data[4 * t] = 156; img.data[4 * t + 1] = 163; img.data[4 * t + 2] = 175; img.data[4 * t + 3] = 90; continue; }
        var v = a[r.off + t], x = Math.min(1, interest(v, scale) / nm.top), neg = scale !== "categorical" && scale !== "sequential" && (scale === "log1" ? v < 1 : v < 0);
        img.data[4 * t] = neg ? 31 : 214; img.data[4 * t + 1] = neg ? 119 : 39; img.data[4 * t + 2] = neg ? 180 : 40;
        img.data[4 * t + 3] = Math.round(255 * Math.sqrt(x));
      }
      ctx.putImageData(img, 0, 0);
    }
    cv.addEventListener("click", function (ev) {
      var rect = cv.getBoundingClientRect(), t = Math.max(0, Math.min(r.length - 1, Math.floor((ev.clientX - rect.left) / rect.width * r.length)));
      pinToken(g.group, ri, t, true);
    });
    return cv;
  }

  // ---- tooltip ----------------------------------------------------------------------------------
  var tip = el("div", "rft-tip");
  tip.id = "rft-tip";
  tip.hidden = true;
  function tipFor(g, ri, t) {
    var r = g.rows[ri];
    while (tip.firstChild) tip.removeChild(tip.firstChild);
    var p = el("div", "rft-tip-piece"), ps = el("span", "rft-piece");
    appendPiece(ps, r.pieces[t]);
    p.appendChild(el("span", "rft-muted", "\u201c")); p.appendChild(ps); p.appendChild(el("span", "rft-muted", "\u201d"));
    tip.appendChild(p);
    tip.appendChild(el("div", "rft-muted", "group " + g.group + " \u00b7 row " + (r.row === null ? ri : r.row) + " \u00b7 token " + t + " of " + r.length));
    if (envSet(r)[t]) tip.appendChild(el("div", "rft-muted", "environment token: the model did not sample it; no loss term reads it"));
    var tb = el("table"), hr = el("tr");
    hr.appendChild(el("th"));
    D.configs.forEach(function (cf) { hr.appendChild(el("th", null, cf)); });
    tb.appendChild(hr);
    D.quantities.forEach(function (q) {
      var tr = el("tr");
      tr.appendChild(el("th", null, q.key));
      tr.title = q.label;
      if (q.per_config) D.configs.forEach(function (cf) { var a = ARR[q.key + "/" + cf]; tr.appendChild(el("td", cf === S.cf ? "rft-selcol" : null, a ? fmt(a[r.off + t]) : "\u2014")); });
      else { var a = ARR[q.key], td = el("td", null, a ? fmt(a[r.off + t]) : "\u2014"); td.colSpan = D.configs.length; tr.appendChild(td); }
      tb.appendChild(tr);
    });
    tip.appendChild(tb);
  }
  function placeTip(span) {
    tip.hidden = false;
    var b = span.getBoundingClientRect(), w = tip.offsetWidth, x = Math.min(window.innerWidth - w - 8, Math.max(4, b.left));
    tip.style.left = (x + window.scrollX) + "px";
    tip.style.top = (b.bottom + window.scrollY + 4) + "px";
  }
  function findGroup(gid) { return D.groups.filter(function (g) { return g.group === gid; })[0]; }
  function tokenAt(target) {
    var s = target.closest && target.closest(".rft-tok");
    if (!s) return null;
    var box = s.closest(".rft-toks");
    return [findGroup(Number(box.dataset.group)), Number(box.dataset.row), Number(s.dataset.t), s];
  }
  root.addEventListener("mouseover", function (ev) {
    if (S.pin) return;
    var h = tokenAt(ev.target);
    if (!h) return;
    tipFor(h[0], h[1], h[2]); placeTip(h[3]);
  });
  root.addEventListener("mouseout", function (ev) {
    if (!S.pin && tokenAt(ev.target)) tip.hidden = true;
  });
  root.addEventListener("click", function (ev) {
    var h = tokenAt(ev.target);
    if (!h) return;
    if (S.pin && S.pin[0] === h[0].group && S.pin[1] === h[1] && S.pin[2] === h[2]) { S.pin = null; update(); tip.hidden = true; return; }
    pinToken(h[0].group, h[1], h[2], false);
  });
  function pinToken(gid, ri, t, scroll) {
    S.pin = [gid, ri, t];
    var cur = openSet(sortedGroups(S));
    if (cur.indexOf(gid) < 0) S.open = cur.concat([gid]);
    var g = findGroup(gid);
    if (g) planFor(g.rows[ri], S).forEach(function (run) { if (run[0] <= t && t < run[1]) EXPANDED[gid + "." + ri + "." + run[0]] = true; });
    update();
    if (scroll) { var s = pinnedSpan(); if (s && s.scrollIntoView) s.scrollIntoView({block: "center"}); showPin(); }
  }
  function pinnedSpan() {
    if (!S.pin) return null;
    return root.querySelector('.rft-toks[data-group="' + S.pin[0] + '"][data-row="' + S.pin[1] + '"] .rft-tok[data-t="' + S.pin[2] + '"]');
  }
  function showPin() {
    var s = pinnedSpan(), g = S.pin && findGroup(S.pin[0]);
    tip.classList.toggle("rft-pinned-tip", !!s);
    if (!s || !g) { tip.hidden = true; return; }
    tipFor(g, S.pin[1], S.pin[2]);
    placeTip(s);
  }

  // ---- the page ---------------------------------------------------------------------------------
  function update() {
    writeState();
    while (root.firstChild) root.removeChild(root.firstChild);
    root.appendChild(header());
    root.appendChild(configTable());
    root.appendChild(controls());
    root.appendChild(legend());
    root.appendChild(topTokens());
    var order = sortedGroups(S), open = openSet(order), list = el("div", "rft-groups");
    order.forEach(function (g) { list.appendChild(card(g, open.indexOf(g.group) >= 0)); });
    root.appendChild(list);
    root.appendChild(tip);
    showPin();
    root.dataset.ready = "1";
  }
  window.addEventListener("hashchange", function () { S = readState(); update(); });
  if (S.pin) {
    // a pinned token inside a chip is shown: open its run
    var pg = findGroup(S.pin[0]);
    if (pg && pg.rows[S.pin[1]]) planFor(pg.rows[S.pin[1]], S).forEach(function (run) {
      if (run[0] <= S.pin[2] && S.pin[2] < run[1]) EXPANDED[S.pin.slice(0, 2).join(".") + "." + run[0]] = true;
    });
  }
  update();
})();
