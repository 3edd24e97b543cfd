"""A recorded step as the token inspector shows it (issue 33): every completion's tokens with what the loss did to
each, under the recorded configuration and each counterfactual of a replay.

:func:`build_view` turns ``records/step_N`` (rftlib.monitor.records) and, when one was run, a replay's result
(rftlib.train.replay) into the inspector's *view* (a plain dict; rftlib.report.inspect renders it):

- per token, for each configuration: the gradient weight c_t = dL/dlogp_t (rftlib.algo.token_view.grad_weights,
  by autograd through the trainer's own ``grpo_loss`` call with the optimizer batch's recorded totals), the ratio
  the loss clips and the side it clipped on (``token_view``); and once: the entropy and the trainer - behaviour
  logprob gap. These are computed from the *recorded* logprobs (no model: milliseconds), so they are the exact
  quantities of the recorded update for its configuration, and a counterfactual's at the recorded weights;
- per completion: reward (and its components), advantage, length, truncation, whether the update ran it;
- per group: the prompt and the answer; the replay's table (loss, grad norm, cosine with the recorded gradient)
  in the header.

The token pieces are decoded here, not during training: ``decode(ids[t-8 : t+1])`` less ``decode(ids[t-8 : t])``
(a piece is what the token adds to the text, byte-fallback and multi-token characters included), cached in the
record as ``pieces.json``. Also the notebook's views (replay.ipynb): :func:`verdict`, :func:`table`,
:func:`inspector` (its replay runs through rftlib.report.replay_views.run).
"""

from __future__ import annotations

import html
import json
import math
import os
import warnings
from pathlib import Path
from typing import Any

import torch

from rftlib.algo.correction import tis_weights
from rftlib.algo.kl import kl_penalty
from rftlib.attempts import runs_root
from rftlib.algo.token_view import grad_weights, token_view
from rftlib.models.loading import load_tokenizer
from rftlib.monitor import records
from rftlib.report.inspect import view_in_notebook, write_page
from rftlib.report.live import clean_text
from rftlib.train import steps
from rftlib.train.record import unhex
from rftlib.train.replay import counterfactual_config, format_control, label, replay_config

WINDOW = 8  # tokens of left context a piece is decoded with (a multi-byte character spans up to 4 byte tokens)


# ---- token pieces ---------------------------------------------------------------------------------------------
def token_pieces(tok, ids: list[int], *, readable: bool = True) -> list[str]:
    """What each token of ``ids`` adds to the decoded text (one string per token); joined (``readable=False``) they
    are ``tok.decode(ids)`` exactly. A character split over byte tokens (byte-level BPE: "日" is 3 bytes) is given to
    the token that completes it, and the tokens before it get "": a window decode ending inside a character ends
    in U+FFFD, which is not text yet. A byte that never completes stays U+FFFD, on the token after it (or the last).
    ``readable`` passes each piece through rftlib.report.live.clean_text (control characters escaped)."""
    windows = [ids[max(0, t - WINDOW):t + 1] for t in range(len(ids))]
    prefixes = [ids[max(0, t - WINDOW):t] for t in range(len(ids))]
    full = tok.batch_decode(windows, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    pre = tok.batch_decode(prefixes, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    out = []
    for t, (f, p) in enumerate(zip(full, pre)):
        f_done = f if t == len(ids) - 1 else f.rstrip("\ufffd")  # a character still open at the end is not text yet
        p_done = p.rstrip("\ufffd")
        piece = f_done[len(p_done):] if f_done.startswith(p_done) else tok.decode([ids[t]], skip_special_tokens=False)
        out.append(clean_text(piece) if readable else piece)
    return out


def pieces_for(rec: records.Record, tok) -> list[list[list[str]]]:
    """[rank][row] -> the row's completion pieces (up to its length), cached in the record's pieces.json."""
    cache = rec.dir / "pieces.json"
    if cache.exists():
        try:
            return json.loads(cache.read_text())
        except json.JSONDecodeError:
            pass
    out = []
    for r in range(rec.world_size):
        t = rec.rank(r)
        ids, lens = t["completion_ids"], t["completion_mask"].sum(-1).long()
        out.append([token_pieces(tok, ids[i, :int(lens[i])].tolist()) for i in range(ids.shape[0])])
    tmp = cache.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(out))
    os.replace(tmp, cache)
    return out


# ---- per-token quantities -------------------------------------------------------------------------------------
def token_quantities(rec: records.Record, configs: list[tuple[str, Any]]) -> list[dict[str, torch.Tensor]]:
    """Per rank, {"<quantity>/<config>": (N, T)} for c, ratio and clip (epoch 0: the first pass over the rollout),
    plus "entropy", "gap" and "ran" (bool, (N,): the update ran the row). Each optimizer step's rows get its
    recorded totals (a counterfactual that changes a normaliser recomputes them over the step's rows, every rank's)."""
    m = rec.manifest
    out = []
    for r in range(rec.world_size):
        t = rec.rank(r)
        lp_all = t["trainer_logprobs"][0]  # (N, T) epoch 0, NaN where the row was not run
        N, T = lp_all.shape
        ran = ~torch.isnan(lp_all).all(-1)  # (N,)
        lp = torch.nan_to_num(lp_all, nan=0.0)  # rows not run: masked out of every loss
        old = t["old_logprobs"] if "old_logprobs" in t else lp  # on-policy: the forward's own, detached
        adv, lmask, beh = t["advantages"], t["loss_mask"].float(), t["behaviour_logprobs"]
        ref = t.get("ref_logprobs")
        q: dict[str, torch.Tensor] = {"entropy": t["entropy"], "gap": torch.where(
            torch.isnan(lp_all), lp_all, lp_all - beh), "ran": ran}
        if ref is not None:  # per-token KL to the reference, the recorded estimator's (NaN where the row did not run)
            q["kl"] = torch.where(torch.isnan(lp_all), lp_all, kl_penalty(configs[0][1].kl_estimator, lp, ref).float())
        for name, cfg in configs:
            c, ratio, clip = torch.zeros(N, T), torch.ones(N, T), torch.zeros(N, T, dtype=torch.int8)
            isw_all = torch.ones(N, T)  # the TIS weight each token's policy term carried (1: none, an HF engine)
            kw = steps.loss_kwargs(cfg)
            for k, o in enumerate(m["opt_steps"]):
                if o["epoch"] != 0:
                    continue
                rows_k = torch.tensor([row for mb in m["micro"][r] if mb["k"] == k for row in mb["rows"]], dtype=torch.long)
                if rows_k.numel() == 0:
                    continue
                totals = {"num_seqs": torch.tensor(o["num_seqs"]), "num_tokens": torch.tensor(o["num_tokens"]),
                          "norm_const": cfg.loss_norm_const if cfg.loss_norm_const is not None else float(cfg.max_new_tokens)}
                if name != "recorded" and (cfg.loss_seq_norm != configs[0][1].loss_seq_norm):
                    ns = nt = 0.0
                    for rr in range(rec.world_size):
                        rows_all = torch.tensor(m["opt_rows"][rr][k], dtype=torch.long)
                        a, b = steps.loss_totals(cfg, rec.rank(rr)["loss_mask"][rows_all].float())
                        ns, nt = ns + float(a), nt + float(b)
                    totals.update(num_seqs=torch.tensor(max(ns, 1.0)), num_tokens=torch.tensor(max(nt, 1.0)))
                isw = None
                if not m["engine_shares_trainer_module"]:
                    isw, _ = tis_weights(old[rows_k], beh[rows_k], lmask[rows_k], cap=cfg.tis_cap, level=cfg.tis_level)
                g = grad_weights(lp[rows_k], old[rows_k], adv[rows_k], lmask[rows_k], loss_kwargs=kw, totals=totals,
                                 ref=None if ref is None else ref[rows_k], is_weights=isw)
                v = token_view(lp[rows_k], old[rows_k], adv[rows_k], lmask[rows_k], loss_kwargs=kw, is_weights=isw)
                c[rows_k], ratio[rows_k], clip[rows_k] = g["c"].float(), v["ratio"].float(), v["clip"]
                isw_all[rows_k] = v["is_weight"].float()
            q[f"c/{name}"], q[f"ratio/{name}"], q[f"clip/{name}"] = c, ratio, clip
            q[f"isw/{name}"] = isw_all
        out.append(q)
    return out


# ---- the view -------------------------------------------------------------------------------------------------
def _f(x) -> float | None:
    x = float(x)
    return None if math.isnan(x) else x


def latest_replay(rec: records.Record) -> dict[str, Any] | None:
    """The newest replay written into the record (records/step_N/replays/*.json), or None."""
    d = rec.dir / "replays"
    files = sorted(d.glob("*.json"), key=lambda p: p.stat().st_mtime) if d.is_dir() else []
    return json.loads(files[-1].read_text()) if files else None


def build_view(run_dir: str | Path, step: int, replay_result: dict[str, Any] | None = None, *, tok=None,
               use_latest_replay: bool = True) -> dict[str, Any]:
    """The inspector's view of recorded step ``step`` (the dict rftlib.report.inspect renders), with the columns of
    ``replay_result`` (a ReplayResult.to_json(); by default the record's newest replay) when there is one."""
    rec = records.read_record(run_dir, step)
    m = rec.manifest
    res = replay_result if replay_result is not None else (latest_replay(rec) if use_latest_replay else None)
    cfg = replay_config(m, world_size=1)
    configs = [("recorded", cfg)] + [(label(o), counterfactual_config(cfg, o))
                                     for o in (res or {}).get("counterfactuals", [])]
    tok = tok or load_tokenizer(cfg.model)
    pieces = pieces_for(rec, tok)
    qs = token_quantities(rec, configs)
    names = [n for n, _ in configs]
    groups = []
    for r in range(rec.world_size):
        t, texts, q = rec.rank(r), rec.texts["ranks"][r], qs[r]
        G = texts["group_size"]
        lens = t["completion_mask"].sum(-1).long()
        lmask = t["loss_mask"].float()
        for g, ex in enumerate(texts["examples"]):
            rows = []
            for i in range(g * G, (g + 1) * G):
                n = int(lens[i])
                valid = lmask[i, :n] > 0
                vals = {"entropy": [_f(x) for x in t["entropy"][i, :n]], "gap": [_f(x) for x in q["gap"][i, :n]]}
                if "kl" in q:
                    vals["kl"] = [_f(x) for x in q["kl"][i, :n]]
                totals = {}
                for name in names:
                    c, ratio, clip = q[f"c/{name}"][i, :n], q[f"ratio/{name}"][i, :n], q[f"clip/{name}"][i, :n]
                    vals[f"c/{name}"] = [float(x) for x in c]
                    vals[f"ratio/{name}"] = [float(x) for x in ratio]
                    vals[f"clip/{name}"] = [int(x) for x in clip]
                    vals[f"isw/{name}"] = [float(x) for x in q[f"isw/{name}"][i, :n]]
                    totals[f"sum c/{name}"] = float(c.sum())
                    totals[f"clip_frac/{name}"] = float((clip[valid] != 0).float().mean()) if valid.any() else 0.0
                    totals[f"max ratio/{name}"] = float(ratio[valid].max()) if valid.any() else 1.0
                diag = texts["diags"][i] if i < len(texts["diags"]) else {}
                # a multi-turn record's environment tokens (model mask 0): the page greys them, the loss never read them
                env = ((t["model_mask"][i, :n] == 0).nonzero().flatten().tolist() if "model_mask" in t else [])
                rows.append({"row": i, "rank": r, "reward": float(t["rewards"][i]), "env": env,
                             "components": {k: v for k, v in diag.items() if isinstance(v, (int, float))},
                             "advantage": float(t["advantages"][i]), "length": n, "truncated": bool(t["truncated"][i]),
                             "skipped": not bool(q["ran"][i]), "pieces": pieces[r][i], "values": vals,
                             "totals": totals})
            groups.append({"group": len(groups), "prompt": ex["prompt"], "answer": str(ex["answer"]), "rows": rows})
    opt = m["opt_steps"]
    header = {"attempt": m["attempt"], "step": m["step"], "recorded because": m["reason"],
              "policy version (sampled)": m["policy_version"], "optimizer steps": len(opt), "ranks": m["world_size"],
              "policy_loss": m["config"]["policy_loss"], "loss_agg_mode": m["config"]["loss_agg_mode"],
              "on-policy": m["on_policy"]}
    for k, o in enumerate(opt):
        header[f"opt step {k}: loss"] = unhex(o["loss"])
        header[f"opt step {k}: grad_norm"] = unhex(o["grad_norm"])
    verdict = None
    if res is not None:
        verdict = {"faithful": res.get("faithful"), "text": res.get("verdict", "")}
        header["replay weights"] = res.get("weights")
    table = [{("config" if k == "config" else k): v for k, v in row.items()} for row in (res or {}).get("table", [])]
    return {"schema": 1, "title": f"{m['attempt']} · step {m['step']}", "attempt": m["attempt"], "step": m["step"],
            "header": header, "verdict": verdict, "configs": names, "table": table,
            "quantities": {
                "c": {"label": "gradient weight dL/dlogp", "scale": "diverging", "per_config": True},
                "ratio": {"label": "importance ratio the loss clips", "scale": "log1", "per_config": True},
                "clip": {"label": "clipped (-1 low, +1 high)", "scale": "categorical", "per_config": True},
                "isw": {"label": "TIS weight pi_old / pi_behaviour, capped (1: the trainer's module sampled)",
                        "scale": "log1", "per_config": True},
                "entropy": {"label": "entropy (nats)", "scale": "sequential", "per_config": False},
                "gap": {"label": "trainer - behaviour logprob", "scale": "diverging", "per_config": False},
                **({"kl": {"label": f"KL to the reference ({m['config']['kl_estimator']})", "scale": "sequential",
                           "per_config": False}} if "kl" in qs[0] else {})},
            "groups": groups}


def write_pages(run_dir: str | Path, out_dir: str | Path) -> list[Path]:
    """``<out_dir>/step-N.html`` for every recorded step of the attempt (with its latest replay's columns); a page
    that cannot be built is skipped with a warning naming the step and why (the report is written anyway)."""
    out = []
    tok = None
    for step in records.list_records(run_dir):
        try:
            if tok is None:
                tok = load_tokenizer(replay_config(records.read_record(run_dir, step).manifest, world_size=1).model)
            p = Path(out_dir) / f"step-{step}.html"
            write_page(build_view(run_dir, step, tok=tok), p)
            out.append(p)
        except Exception as e:  # a damaged record must not cost the researcher the report
            warnings.warn(f"{run_dir}/records/step_{step}: no inspector page ({type(e).__name__}: {e})")
    return out


# ---- the notebook's calls (replay.ipynb) ----------------------------------------------------------------------
def newest_recorded_attempt() -> Path:
    """The most recently modified attempt under the runs root that has a recorded step (replay.ipynb's default)."""
    root = runs_root()
    cands = [p for p in root.glob("attempt-*") if (p / "records").is_dir() and records.list_records(p)] \
        if root.is_dir() else []
    if not cands:
        raise FileNotFoundError(f"no attempt under {root} has a recorded step: set run_dir (record_batches sets which "
                                f"steps an attempt records)")
    return max(cands, key=lambda p: p.stat().st_mtime)


def verdict(res) -> "HTMLText":
    """The replay's verdict as a coloured line."""
    ok = res.faithful
    colour = "#1a7f37" if ok else ("#9a6700" if ok is None else "#cf222e")
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in res.notes)
    control = format_control(res)  # another environment: the control's own gap to the record, per optimizer step
    return HTMLText(f"<p style='font-weight:600;color:{colour}'>{html.escape(res.verdict)}</p>"
                    + (f"<pre>{html.escape(control)}</pre>" if control else "")
                    + (f"<ul>{notes}</ul>" if notes else ""))


def table(res) -> "HTMLText":
    """The replay's table: per optimizer step and configuration, loss, grad norm, cosine with the recorded gradient
    and the loss's own metrics."""
    cols = ["opt_step", "config", "loss", "grad_norm", "cos_rec"] + sorted(
        {k for r in res.table for k in r} - {"opt_step", "config", "loss", "grad_norm", "cos_rec"})
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)

    def cell(v):
        return f"{v:.5g}" if isinstance(v, float) else html.escape(str(v))
    body = "".join("<tr>" + "".join(f"<td>{cell(r.get(c, ''))}</td>" for c in cols) + "</tr>" for r in res.table)
    return HTMLText(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")


def inspector(res_or_run, step: int | None = None, *, write: bool = True):
    """The inspector of a replay (or of ``run_dir``, ``step``) in the notebook: the same page the report links,
    in a sandboxed iframe; ``write`` also writes it beside the record as inspector.html."""
    if hasattr(res_or_run, "table"):
        view = build_view(res_or_run.run_dir, res_or_run.step, res_or_run.to_json())
        run_dir, step = res_or_run.run_dir, res_or_run.step
    else:
        run_dir = res_or_run
        view = build_view(run_dir, step)
    if write:
        write_page(view, records.record_dir(run_dir, step) / "inspector.html")
    return view_in_notebook(view)


class HTMLText(str):
    """A string a notebook displays as HTML."""

    def _repr_html_(self) -> str:
        return str(self)
