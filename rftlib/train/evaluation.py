"""The held-out evaluation a training attempt runs at step 0, every eval_steps and at its end: every
probe of RunConfig.eval_probes, sharded over ranks, each result written to ``eval/step_N[_probe].json``.
(rftlib.train.loop.Trainer.evaluate is its phase: it keeps the history.) ``eval_outcome`` reads that
history into the attempt's result."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rftlib.attempts import write_json
from rftlib.eval import EnvEval, evaluate, examples_digest, greedy_eval, scored_on

EVAL_KEY = "eval/heldout/greedy_pass@1"


def evaluate_probes(cfg, engine, tok, task, dist, run_dir: Path, step: int, precision) -> dict[str, Any]:
    """The eval row of ``step``: ``eval/<probe>/greedy_pass@1`` and ``mean_length`` for a greedy probe, the
    sampling mode's, maj@n, any_correct@n and pass@1 for a probe with eval_n_samples > 1 or eval_temperature
    > 0 (seed 003 section 9), and ``timing/eval``. Every rank calls it (equal generate calls on every rank:
    ZeRO-3 needs them); rank 0 writes the files. ``precision``: rftlib.eval.eval_precision's."""
    D = dist
    t0 = time.time()
    summary: dict[str, Any] = {"step": step}
    if D.is_main:
        (run_dir / "eval").mkdir(exist_ok=True)
    env = EnvEval.of(cfg)  # a multi-turn attempt's held-out problems are played in its environment
    for probe in cfg.eval_probes:
        exs = task.eval_set(probe)
        mine = exs[D.rank::D.world_size]
        n_mine = len(mine)
        per_rank = -(-len(exs) // D.world_size)
        mine = mine + [exs[0]] * (per_rank - n_mine)  # equal generate calls on every rank (ZeRO-3 needs them)
        n = cfg.eval_n_samples.get(probe, 1)
        temp = cfg.eval_temperature.get(probe, 0.0)
        if (n > 1 or temp > 0) and env is not None:
            raise ValueError(f"eval probe {probe!r}: eval_n_samples {n} / eval_temperature {temp} through env="
                             f"'{cfg.env}': sampled evals in an environment are not built yet (issue 40); "
                             f"greedy evals are (eval_n_samples 1, eval_temperature 0)")
        if n > 1 or temp > 0:  # seed 003 section 9: e.g. AIME at 0.6 with 8 samples, sampling_pass@8
            mode = f"sampling_pass@{n}" if temp > 0 else f"nondet_proxy_pass@{n}"
            res = evaluate(engine, tok, task, exs, mode=mode, n=n, temperature=temp,
                           max_new_tokens=cfg.max_new_tokens, batch_size=cfg.eval_batch_size,
                           dataset=probe, precision=precision)
            res.update(scored_on(cfg))
            if D.is_main:
                write_json(run_dir / "eval" / f"step_{step}_{probe}.json", res)
            # the seed's name keeps the seed's meaning (sampling_pass@8: majority vote); the others are named
            # for what they are (rftlib.eval.evaluate)
            for key in (res["mode"], f"maj@{n}", f"any_correct@{n}", "pass@1"):
                summary[f"eval/{probe}/{key}"] = res[key]
            continue
        res = greedy_eval(engine, tok, task, mine, max_new_tokens=cfg.max_new_tokens,
                          batch_size=cfg.eval_batch_size, dataset=probe, precision=precision, env=env)
        if D.distributed:
            parts = D.gather_objects(res["results"][:n_mine])
            merged = [parts[k % D.world_size][k // D.world_size] for k in range(len(exs))]
            n = max(len(merged), 1)
            res.update(results=merged, n_problems=len(merged), examples_digest=examples_digest(exs),
                       **{"greedy_pass@1": sum(r["correct"] for r in merged) / n,
                          "mean_length": sum(r["length"] for r in merged) / n})
            if env is not None:
                calls = sum(r["tool_calls"] for r in merged)
                res.update(tool_call_rate=sum(r["tool_calls"] > 0 for r in merged) / n,
                           tool_ok_rate=sum(r["tool_ok"] for r in merged) / calls if calls else 0.0,
                           mean_turns=sum(r["turns"] for r in merged) / n)
        res.update(scored_on(cfg))
        if D.is_main:
            suffix = "" if probe == "heldout" else f"_{probe}"
            write_json(run_dir / "eval" / f"step_{step}{suffix}.json", res)
        summary[f"eval/{probe}/greedy_pass@1"] = res["greedy_pass@1"]
        summary[f"eval/{probe}/mean_length"] = res["mean_length"]
        if env is not None:  # the tool's use beside the accuracy
            for key in ("tool_call_rate", "tool_ok_rate", "mean_turns"):
                summary[f"eval/{probe}/{key}"] = res[key]
    summary["timing/eval"] = time.time() - t0  # rft stop sizes its wait from this and timing/step
    return summary


def eval_outcome(eval_history: list[dict[str, Any]], step: int, eval_probes) -> dict[str, Any]:
    """What the evals of an attempt that stopped at ``step`` say. ``final`` is the held-out eval of the weights
    training ended with (the eval at the last step), else None with ``final_note`` saying why: never an earlier
    eval standing in for it (a run cut between evals would otherwise report its step-0 baseline as its result, a
    gain of 0). ``best`` is over the evals made after step 0 too (None when there is none: the baseline is not
    a result). ``probes``: baseline, final, best and best_step of every probe."""
    evals = [e for e in eval_history if EVAL_KEY in e]
    base = evals[0][EVAL_KEY] if evals and evals[0]["step"] == 0 else None
    at_end = evals[-1] if evals and evals[-1]["step"] == step else None
    last = at_end[EVAL_KEY] if at_end is not None else None
    best = max(evals, key=lambda e: (e[EVAL_KEY], -e["step"])) if len(evals) > 1 else None
    note = None
    if at_end is None:
        note = (f"not evaluated: training stopped at step {step}" +
                (f", the last held-out eval is step {evals[-1]['step']}'s" if evals else "") +
                "; `rft eval RUN_DIR` scores its last checkpoint")
    probes = {}
    for p in eval_probes:
        key = f"eval/{p}/greedy_pass@1"
        vals = [(e["step"], e[key]) for e in eval_history if key in e]
        if vals:
            bs, bv = max(vals, key=lambda x: (x[1], -x[0]))
            probes[p] = {"baseline": vals[0][1], "final": vals[-1][1] if vals[-1][0] == step else None,
                         "best": bv, "best_step": bs}
    return {"probes": probes, "baseline": base, "final": last, "final_step": step if at_end is not None else None,
            "final_note": note, "gain": None if base is None or last is None else last - base,
            "best_step": best["step"] if best else None, "best": best[EVAL_KEY] if best else None}


def early_stop_reason(cfg, eval_history: list[dict[str, Any]]) -> str | None:
    """Why to stop now (cfg.early_stop_probe's greedy_pass@1 dropped at ``early_stop_patience`` consecutive
    evals of ``eval_history``), else None (seed 003 section 12: stop when the OOD probe keeps falling)."""
    if cfg.early_stop_probe is None:
        return None
    key = f"eval/{cfg.early_stop_probe}/greedy_pass@1"
    vals = [e[key] for e in eval_history if key in e]
    k = cfg.early_stop_patience
    if len(vals) > k and all(vals[-i] < vals[-i - 1] for i in range(1, k + 1)):
        trail = " -> ".join(f"{v:.3f}" for v in vals[-k - 1:])
        return f"{key} dropped at {k} consecutive evals ({trail})"
    return None
