"""One metrics row per rollout step, from every rank's accumulators.

The row's names are seed 003's (section 7 Tier 1-3 plus the ratio tails of its loss patch). Each
rank's lists are concatenated in rank order before anything is reduced, so a 2-rank run's row is
the row one process would have written for the same global batch.

A metric the step did not measure is absent from the row, not 0: when the update skipped every row
(every group constant, ``skip_zero_advantage_rows``) there are no ratio or entropy values, and a
logged 0 would fire the entropy-collapse verdict and dip the plots. Readers (health verdicts, plots,
the live view, the report) take a missing key as "not measured at this step".
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import numpy as np
import torch

from rftlib.algo.advantages import advantage_stats
from rftlib.algo.diagnostics import importance_ess
from rftlib.train.phases import UpdateResult


def _q(x: torch.Tensor, q: float) -> float:
    return float(torch.quantile(x.float(), q)) if x.numel() else 0.0


def step_metrics(allr: dict[str, list], upd: UpdateResult, timing: dict[str, float], *, step: int, world_size: int,
                 skipped_steps: int) -> dict[str, Any]:
    """The step's metrics row from every rank's accumulators (``allr``: lists concatenated in rank
    order) and this rank's optimizer-step values (``upd``, rftlib.train.phases.UpdateResult: its loss,
    grad norms, LRs, clip range and row counts are equal on every rank)."""
    rewards = torch.tensor(allr["rewards"])  # (N_global,)
    diags = allr["diags"]
    row: dict[str, Any] = {"step": step}
    row.update(reward_mean=float(rewards.mean()), reward_std=float(rewards.std(correction=0)),
               reward_min=float(rewards.min()), reward_max=float(rewards.max()), reward_p90=_q(rewards, 0.9))
    for k in sorted({k for d in diags for k in d}):
        row[k] = float(np.mean([d.get(k, 0.0) for d in diags]))
    row.update({k: float(v) for k, v in advantage_stats(torch.tensor(allr["advantages"])).items()})
    # per-micro-batch metrics: token-weighted means, extremes of extremes; the p99 is the
    # largest micro-batch p99 (an upper bound on the batch p99)
    n_opt = len(upd.loss)
    for k in (allr["metrics"][0] if allr["metrics"] else {}):  # none when every row was skipped
        have = [i for i, m in enumerate(allr["metrics"]) if k in m]  # entropy is only taken in epoch 0
        vals = torch.tensor([allr["metrics"][i][k] for i in have])
        w = torch.tensor([allr["tok"][i] for i in have])
        if k.endswith(("_max", "_p99")):
            row[k] = float(vals.max())
        elif k.endswith("_min"):
            row[k] = float(vals.min())
        elif k == "policy_loss":  # aggregated with global batch totals: sums per optimizer step
            row[k] = float(vals.sum()) / n_opt
        else:
            row[k] = float((vals * w).sum() / w.sum().clamp(min=1))
    # ESS of the sequence importance weights over each whole optimizer batch (all ranks), averaged
    W = world_size
    seq = [torch.cat([allr["seq_log_ratio"][r * n_opt + s] for r in range(W)]) for s in range(n_opt)]
    ess = [float(importance_ess(x.unsqueeze(-1), torch.ones(len(x), 1))) for x in seq if x.numel()]
    row["importance_ess"] = float(np.mean(ess)) if ess else 1.0  # no row run: nothing moved off-policy
    row["loss"] = float(np.mean(upd.loss))
    ent = torch.cat(allr["entropy"]) if allr["entropy"] else torch.zeros(0)  # (tokens run,)
    if ent.numel():  # absent, not 0, when no row was run (every row skipped): 0 nats would read as a collapse
        row.update(entropy_mean=float(ent.mean()), entropy_p10=_q(ent, 0.1), entropy_p90=_q(ent, 0.9))
    row.update(grad_norm=float(np.mean(upd.grad_norm)), grad_norm_max=upd.grad_norm_max)
    diff = torch.cat(allr["behaviour_diff"]) if allr["behaviour_diff"] else torch.zeros(0)  # (tokens run,)
    if diff.numel():  # absent when no row was run, like the entropy
        row["behaviour_logprob_diff_max"] = float(diff.max())
    lengths = torch.tensor(allr["lengths"], dtype=torch.float32)
    row.update(response_length_mean=float(lengths.mean()), response_length_max=float(lengths.max()),
               truncated=float(np.mean(allr["truncated"])))
    row["lr"] = float(np.mean(upd.lr)) if upd.lr else 0.0  # the LR the step(s) used
    row["eps_clip_low"], row["eps_clip_high"] = upd.clip  # what the loss was called with
    if allr["gns"]:  # single-step estimates: average gns_grad_sq and gns_trace over steps to read B_simple
        for k in allr["gns"][0]:
            row[k] = float(np.mean([g[k] for g in allr["gns"]]))
    row["skipped_steps"] = skipped_steps
    if upd.rows_seen:  # rows the update left out (zero advantage, empty loss mask), of those it was given
        row["update/skipped_row_frac"] = 1.0 - upd.rows_run / upd.rows_seen
    row.update({f"timing/{k}": v for k, v in timing.items()})
    if timing.get("step"):  # how much of the step the reward took (seed 002 logged < 1 s; a code run must know)
        row["timing/reward_share"] = reward_share(timing)
    row.update(sandbox_metrics(diags, timing, world_size))
    return row


def reward_share(timing: dict[str, float]) -> float:
    """The share of the step's wall time some batch was being scored: ``reward_busy`` from the step's timeline
    (rftlib.monitor.timeline.shares, in [0, 1]), else the reward's seconds over the step's. At max_staleness > 0
    the producer scored the step's batch during earlier steps, so its scoring seconds over this step's wall time
    exceeded 1; at k = 0 the scoring runs inside the step and the two agree."""
    if "reward_busy" in timing:
        return timing["reward_busy"]
    return timing.get("reward", 0.0) / timing["step"]


def first_group(allr: dict[str, list], G: int) -> dict[str, Any]:
    """The G completions of the step's first prompt, for the live view."""
    prompt, answer = allr["examples"][0]
    return {"prompt": prompt, "answer": answer, "completions": [
        {"text": allr["texts"][i], "reward": allr["rewards"][i], "advantage": allr["advantages"][i],
         "truncated": bool(allr["truncated"][i])} for i in range(G)]}


SANDBOX_KEY = "exec_s"
"""the diagnostic a sandboxed reward sets on every row it ran (rftlib.rewards.code.CodeReward.diagnostics)"""


def sandbox_metrics(diags: list[dict[str, float]], timing: dict[str, float], world_size: int = 1) -> dict[str, float]:
    """The code sandbox under the training load, from the reward's per-row diagnostics: jobs run
    (``sandbox/executions``, all ranks), how many timed out, crashed (the program's process died)
    or broke the worker (``sandbox/errors``), and ``sandbox/executions_per_s``: this rank's share of
    the jobs over this rank's reward wall time (extraction + sandbox + scoring: what the trainer
    waits for). Empty when no row went through a sandbox (math rewards)."""
    ran = [d for d in diags if SANDBOX_KEY in d]
    if not ran:
        return {}
    out = {"sandbox/executions": float(len(ran)),
           "sandbox/timeouts": float(sum(d.get("timeout", 0.0) for d in ran)),
           "sandbox/crashes": float(sum(d.get("crashed", 0.0) for d in ran)),
           "sandbox/errors": float(sum(d.get("sandbox_error", 0.0) for d in ran)),
           "sandbox/exec_s_max": float(max(d[SANDBOX_KEY] for d in ran))}
    if timing.get("reward", 0.0) > 0:
        out["sandbox/executions_per_s"] = len(ran) / world_size / timing["reward"]
    return out


def write_step_logs(logger, cfg, step: int, row: dict[str, Any], allr: dict[str, list], record: str | None = None) -> None:
    """Rank 0's files of a step: the spike log when grad_norm passes cfg.spike_grad_norm (or is not finite:
    seed 003 logs prompt hashes for grad_norm > 50; ``record``: the step's recorded batch, records/step_N, which
    the entry links) and, every save_steps, log_samples completions."""
    G, exs = cfg.n_samples_per_prompt, allr["examples"]
    if not math.isfinite(row["grad_norm_max"]) or row["grad_norm_max"] > cfg.spike_grad_norm:
        logger.spike({"step": step, "grad_norm": row["grad_norm_max"],
                      "prompt_hashes": [hashlib.md5(p.encode()).hexdigest() for p, _ in exs],
                      **{k: row[k] for k in row if k.startswith(("log_ratio", "ratio_"))},
                      **({"record": record} if record else {})})
    if cfg.save_steps and step % cfg.save_steps == 0:
        logger.samples(step, [
            {"prompt": exs[i // G][0], "answer": exs[i // G][1], "completion": allr["texts"][i],
             "reward": allr["rewards"][i], "advantage": allr["advantages"][i],
             "truncated": bool(allr["truncated"][i]),
             **({"transcript": allr["transcripts"][i]} if allr.get("transcripts", [None] * (i + 1))[i] else {})}
            for i in range(min(cfg.log_samples, len(allr["texts"])))])
