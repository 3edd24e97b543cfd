"""Held-out evaluation during and after training, labelled with its mode (seed 003 section 7).

The trainer's built-in eval is ``greedy_pass@1`` (temperature 0, n 1): deterministic and cheap,
the seed's primary checkpoint signal. Every result records its mode, dataset, n, temperature and
max tokens, so results from different modes are never compared by accident.

**One declared precision, whatever engine sampled the rollouts.** The same checkpoint scored 0.40
held-out through the HF engine (bf16 autocast, this workplace's avx512_bf16 CPUs) and 0.47 through
vLLM (float32): greedy decoding amplifies a logit's rounding into a different token, then a
different answer. Every eval therefore runs in ``eval_dtype`` (:func:`eval_precision`; auto: the
dtype the weights are held in, which is the dtype a vLLM engine is given, so HF and vLLM agree),
and every result records it as ``precision``; ``rft compare`` / ``rft ab`` warn when two attempts
were evaluated in different precisions.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from dataclasses import dataclass
from typing import Any

import torch

from rftlib.data.tasks import Example, Task
from rftlib.evalmath import EVAL_MODES, _base_mode, check_eval_mode, majority_correct, pass_at_k
from rftlib.models.loading import resolve_dtype
from rftlib.rewards.math import extract_answer, normalize_answer
from rftlib.rollout.base import format_prompts, transcript_spans  # noqa: F401  (moved to the rollout layer; importers of eval keep it)
from rftlib.rollout.multi_turn import multi_turn
from rftlib.rollout.sources import Sampling


EVAL_DTYPES = ("auto", "float32", "bfloat16", "float16")


def eval_dtypes(dtype: str, eval_dtype: str, device: torch.device) -> tuple[str, str]:
    """The one precision rule of every held-out eval (the trainer's, ``rft eval``'s, the SFT stage's):
    (the dtype the weights are held in, the dtype the eval computes in) for a config's ``dtype`` and
    ``eval_dtype`` on ``device`` (the device the eval runs on: cuda for ``device: auto`` on a GPU machine).
    The weights' dtype is :func:`rftlib.models.loading.resolve_dtype`'s (auto: bfloat16 on a CUDA device that
    supports it, else float32; float16 only on CUDA), the eval's is :func:`eval_precision` of it. Every eval
    file records the result as ``precision`` and every report shows it beside the number."""
    weights = resolve_dtype(dtype, device)
    return weights, eval_precision(eval_dtype, weights)


def eval_precision(eval_dtype: str, weights_dtype: str, engine=None) -> str:
    """The dtype held-out evals compute in: ``eval_dtype``, or for ``auto`` the dtype the weights are held
    in (``weights_dtype``, the resolved ``dtype``: float32 on a CPU, bfloat16 on a GPU), which is the
    dtype a vLLM engine serves by default on a GPU (rftlib.rollout.vllm.engine_dtype), so HF and vLLM evals
    agree. An ``engine`` that evaluates and cannot switch precision (vLLM serves the dtype it started with:
    bf16 on a CPU rehearsal with native bf16) makes ``auto`` its precision, and the results say so."""
    if eval_dtype == "auto" and engine is not None and getattr(engine, "use_precision", None) is None \
            and engine_precision(engine) in EVAL_DTYPES[1:]:
        return engine_precision(engine)
    if eval_dtype not in EVAL_DTYPES:
        raise ValueError(f"eval_dtype='{eval_dtype}': choose one of {', '.join(EVAL_DTYPES)}")
    if weights_dtype not in EVAL_DTYPES[1:]:
        raise ValueError(f"weights dtype '{weights_dtype}' is not resolved: pass float32, bfloat16 or float16")
    return weights_dtype if eval_dtype == "auto" else eval_dtype


def engine_precision(engine) -> str:
    """The dtype ``engine`` computes in now: its own ``precision`` (HF: the autocast dtype, else the weights'
    dtype; vLLM: the dtype it serves), or "unknown" for an engine that does not say."""
    return str(getattr(engine, "precision", "unknown"))


def check_precision(engine, precision: str) -> None:
    """Refuse, before any eval, an ``engine`` that cannot compute in ``precision``: one that cannot switch
    (vLLM serves the one dtype it was started with) must already compute in it. An engine that does not
    say what it computes in (a test's stand-in) is taken as it is, and its evals record "unknown"."""
    if engine_precision(engine) not in (precision, "unknown") and getattr(engine, "use_precision", None) is None:
        raise ValueError(f"eval_dtype={precision}, but the {type(engine).__name__} rollout engine computes in "
                         f"{engine_precision(engine)} and cannot switch: set eval_dtype to "
                         f"{engine_precision(engine)} (or auto), or give the engine that dtype (dtype)")


@contextlib.contextmanager
def eval_numerics(engine, precision: str | None):
    """Run the block's generate calls in ``precision`` (None: as the engine is). An engine that can switch
    (HF: its autocast dtype) switches for the block and back; one that cannot must already compute in
    it (:func:`check_precision`), else the eval is refused rather than recorded under a wrong label."""
    if precision is None or engine_precision(engine) in (precision, "unknown"):
        yield
        return
    check_precision(engine, precision)
    with engine.use_precision(precision):
        yield


def examples_digest(examples: list[Example]) -> str:
    """A short fingerprint of an eval set (every example's id, prompt and gold answer, in order): two evals with
    the same digest scored the same problems. Eval files record it; ``rft eval`` reuses a result only when it
    matches the set the attempt's own task gives (rftlib.eval_checkpoints)."""
    h = hashlib.sha256()
    for e in examples:
        h.update(json.dumps([e.id, e.prompt, e.answer]).encode())
    return h.hexdigest()[:16]


def scored_on(cfg) -> dict[str, Any]:
    """What an eval of the attempt with RunConfig ``cfg`` was scored on, recorded in its eval file beside the
    examples' digest and the precision: the task as the attempt builds it (name, task_args, eval_size)."""
    return {"task": cfg.task, "task_args": dict(cfg.task_args), "eval_size": cfg.eval_size}


def vote_key(completion: str) -> str | None:
    """The answer a completion votes for in a majority vote: extracted and normalised exactly as the math
    reward does it (rftlib.rewards.math: last \\boxed{}, else the last number; normalize_answer), so
    ``\\boxed{042}`` and ``42`` are one answer. None when nothing is extracted (no vote)."""
    answer = extract_answer(completion)[0]
    key = normalize_answer(answer) if answer is not None else ""
    return key or None


FIRST_ATTEMPT_KEY = "correctness_first_attempt"
"""the info key an environment with retries sets on its last step: whether its first answer was right (the eval's
greedy_pass@1; rftlib.envs.code_feedback)"""


@dataclass(frozen=True)
class EnvEval:
    """An eval through an environment (issue 40): the attempt's ``env`` and its episode limits, so held-out
    problems are played as training plays them (the tool available, the same turns and token budget), greedily."""

    env: str
    env_args: dict
    max_turns: int
    max_trajectory_tokens: int
    max_observation_tokens: int = 512

    @staticmethod
    def of(cfg) -> "EnvEval | None":
        """The eval environment of RunConfig ``cfg``; None for ``single_turn`` (the batched single-turn eval)."""
        if cfg.env == "single_turn":
            return None
        # no episode clock: a greedy eval's score must not depend on how busy the machine is
        return EnvEval(cfg.env, dict(cfg.env_args), cfg.max_turns, cfg.max_trajectory_tokens or cfg.max_new_tokens,
                       cfg.max_observation_tokens)


@torch.no_grad()
def greedy_eval(engine, tokenizer, task: Task, examples: list[Example], *, max_new_tokens: int,
                batch_size: int = 64, dataset: str = "heldout", precision: str | None = None,
                env: EnvEval | None = None) -> dict[str, Any]:
    """greedy_pass@1 over examples, with per-example completions and rewards, computed in ``precision``
    (:func:`eval_precision`; None: the engine's current dtype), which the result records. ``env``: each problem
    is one greedy episode in that environment (the completion is the transcript; ``tool_call_rate``, the share
    of episodes with a tool call, and ``tool_ok_rate``, of calls that ran, beside the accuracy)."""
    results = []
    with eval_numerics(engine, precision):
        used = engine_precision(engine)
        for i in range(0, len(examples), batch_size):
            batch = examples[i:i + batch_size]
            results += (_greedy_batch(engine, tokenizer, task, batch, max_new_tokens) if env is None else
                        _env_greedy_batch(engine, tokenizer, task, batch, env))
    n = len(results)
    acc = sum(r["correct"] for r in results) / max(n, 1)
    out = {"mode": "greedy_pass@1", "dataset": dataset, "task": task.name, "n_problems": n,
           "examples_digest": examples_digest(examples), "n_samples": 1, "temperature": 0.0,
           "max_new_tokens": max_new_tokens, "precision": used, "greedy_pass@1": acc,
           "mean_length": sum(r["length"] for r in results) / max(n, 1), "results": results}
    if env is not None:
        calls = sum(r["tool_calls"] for r in results)
        out.update(env=env.env, max_turns=env.max_turns, max_trajectory_tokens=env.max_trajectory_tokens,
                   tool_call_rate=sum(r["tool_calls"] > 0 for r in results) / max(n, 1),
                   tool_ok_rate=sum(r["tool_ok"] for r in results) / calls if calls else 0.0,
                   mean_turns=sum(r["turns"] for r in results) / max(n, 1),
                   correct_final=sum(r["correct_final"] for r in results) / max(n, 1))
    return out


def _env_greedy_batch(engine, tokenizer, task: Task, batch: list[Example], env: EnvEval) -> list[dict[str, Any]]:
    """One greedy episode per example in ``env`` (the multi-turn rollout source, group size 1): per-example results
    as :func:`_greedy_batch` gives them, the transcript as the completion, ``length`` its model tokens."""
    device = next(engine.model.parameters()).device if hasattr(engine, "model") else torch.device("cpu")
    got = multi_turn(batch, engine=engine, tok=tokenizer, system_prompt=None, reward=None,
                     sampling=Sampling(max_new_tokens=env.max_trajectory_tokens, temperature=1.0, top_p=1.0,
                                       greedy=True),
                     group_size=1, device=device, task=task, env=env.env, env_args=env.env_args,
                     max_turns=env.max_turns, max_trajectory_tokens=env.max_trajectory_tokens,
                     max_observation_tokens=env.max_observation_tokens)
    ro = got.rollout
    spans = transcript_spans(tokenizer, ro.completion_ids, ro.completion_mask, ro.model_mask,
                             getattr(engine, "stop_ids", ()))
    results = []
    for i, ex in enumerate(batch):
        d, r = got.diags[i], got.rewards[i]
        stop = next((k.split("/", 1)[1] for k in d if k.startswith("stop/")), None)
        # pass@1 is the first answer's: an environment that gives feedback and retries (code_feedback) reports the
        # first attempt's correctness (FIRST_ATTEMPT_KEY) beside the final one's, kept as correct_after_feedback
        first = d.get(FIRST_ATTEMPT_KEY, d.get("correctness", r))
        results.append({"id": ex.id, "prompt": ex.prompt, "answer": ex.answer, "completion": got.rollout.texts[i],
                        "reward": r, "correct": float(first), "correct_final": float(d.get("correctness", r)),
                        "length": int(d["tokens/model"]),
                        "has_boxed": float(d.get("has_boxed", 0.0)), "turns": int(d["turns"]),
                        "tool_calls": int(d.get("tool_calls", 0)), "tool_ok": int(d.get("tool_ok", 0)),
                        "stop": stop, "transcript": spans[i]})
    return results


def _greedy_batch(engine, tokenizer, task: Task, batch: list[Example], max_new_tokens: int) -> list[dict[str, Any]]:
    """One generate call's per-example greedy results."""
    results = []
    ro = engine.generate(format_prompts(tokenizer, batch, task.system_prompt), group_size=1,
                         max_new_tokens=max_new_tokens, temperature=0.0, greedy=True)
    for ex, text, trunc, length in zip(batch, ro.texts, ro.truncated.tolist(), ro.lengths().tolist()):
        r, diag = task.reward(text, ex, bool(trunc))
        results.append({"id": ex.id, "prompt": ex.prompt, "answer": ex.answer, "completion": text,
                        "reward": r, "correct": float(diag.get("correctness", r)), "length": int(length),
                        "has_boxed": float(diag.get("has_boxed", 0.0))})
    return results


@torch.no_grad()
def evaluate(engine, tokenizer, task: Task, examples: list[Example], *, mode: str = "greedy_pass@1", n: int = 1,
             temperature: float | None = None, max_new_tokens: int, batch_size: int = 64,
             dataset: str = "heldout", precision: str | None = None) -> dict[str, Any]:
    """One labelled eval (seed 003 section 7): greedy_pass@1, sampling_pass@k (n samples at 0.6 by
    default) or nondet_proxy_pass@k (n greedy samples, diagnostics).

    Every sampled mode reports, each under its own name: ``maj@n`` (majority vote over the n answers, keyed as
    the math reward normalises them: :func:`vote_key`; the winner is right when the reward scored its samples
    right), ``any_correct@n`` (at least one of the n is right: Chen et al.'s unbiased pass@k at k = n) and
    ``pass@1`` (the mean per-sample accuracy). The mode's own name is seed 003's definition
    (rftlib.evalmath.EVAL_MODES): ``sampling_pass@8`` is the majority-vote accuracy, ``nondet_proxy_pass@8``
    the any-of-8 accuracy of greedy samples (its gap over greedy_pass@1 shows fragile solutions).

    Temperature 0 with n > 1 is refused unless the mode is the nondet proxy (rftlib.evalmath).
    Computed in ``precision`` (None: the engine's current dtype), which the result records.
    """
    base = _base_mode(mode)
    if base == "greedy_pass@1":
        return greedy_eval(engine, tokenizer, task, examples, max_new_tokens=max_new_tokens, batch_size=batch_size,
                           dataset=dataset, precision=precision)
    temp = EVAL_MODES[base].temperature if temperature is None else temperature
    label = check_eval_mode(mode, temp, n)
    greedy = temp == 0.0
    per_problem = []
    rows = max(1, batch_size // n)
    with eval_numerics(engine, precision):
        used = engine_precision(engine)
        for i in range(0, len(examples), rows):
            batch = examples[i:i + rows]
            ro = engine.generate(format_prompts(tokenizer, batch, task.system_prompt), group_size=n,
                                 max_new_tokens=max_new_tokens, temperature=max(temp, 1e-6), greedy=greedy)
            for j, ex in enumerate(batch):
                texts = ro.texts[j * n:(j + 1) * n]
                scored = [task.reward(t, ex, bool(ro.truncated[j * n + q])) for q, t in enumerate(texts)]
                correct = [float(diag.get("correctness", r)) >= 1.0 for r, diag in scored]  # fully right
                votes = [vote_key(t) for t in texts]
                per_problem.append({"id": ex.id, "answer": ex.answer, "n": n, "c": sum(correct),
                                    "completions": texts, "sample_correct": correct, "votes": votes,
                                    "maj": majority_correct(votes, correct)})
    npb = max(len(per_problem), 1)
    scores = {f"maj@{n}": sum(p["maj"] for p in per_problem) / npb,
              f"any_correct@{n}": sum(pass_at_k(p["n"], p["c"], n) for p in per_problem) / npb,
              "pass@1": sum(p["c"] / p["n"] for p in per_problem) / npb}
    return {"mode": label, "dataset": dataset, "task": task.name, "n_problems": len(per_problem),
            "examples_digest": examples_digest(examples), "n_samples": n, "temperature": temp,
            "max_new_tokens": max_new_tokens, "precision": used, **scores,
            label: scores[f"{EVAL_MODES[base].score}@{n}"], "results": per_problem}


def compare(a: dict[str, Any], b: dict[str, Any]) -> float:
    """b's score minus a's, refused unless both are the same mode on the same dataset (seed 003:
    never compare metrics across modes)."""
    for key in ("mode", "dataset", "n_samples", "max_new_tokens"):
        if a.get(key) != b.get(key):
            raise ValueError(f"refusing to compare evals with different {key}: {a.get(key)!r} vs {b.get(key)!r}")
    return b[a["mode"]] - a[a["mode"]]


def sft_decision(engine, tokenizer, task: Task, examples: list[Example], *, max_new_tokens: int,
                 threshold: float = 0.95, batch_size: int = 64) -> dict[str, Any]:
    """Seed 003 section 12: SFT is needed only if the base model's format compliance (the \\boxed{}
    rate, greedy, on a probe) is below 95%. Returns the rate, the verdict and the eval it came from."""
    res = greedy_eval(engine, tokenizer, task, examples, max_new_tokens=max_new_tokens, batch_size=batch_size,
                      dataset="format_probe")
    rate = sum(r["has_boxed"] for r in res["results"]) / max(len(res["results"]), 1)
    verdict = "SFT needed" if rate < threshold else "SFT not needed"
    return {"has_boxed_rate": rate, "threshold": threshold, "verdict": verdict, "n": len(res["results"]),
            "message": f"{verdict}: boxed-answer rate {rate:.0%} on {len(res['results'])} problems "
                       f"({'<' if rate < threshold else '>='} {threshold:.0%}, seed 003 section 12)",
            "eval": res}
