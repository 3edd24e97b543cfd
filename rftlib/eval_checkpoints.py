"""Evaluate every checkpoint of an attempt, the final one included (seed 001's eval_batch.py).

For each ``training_state/step_N`` the trained parameters (the LoRA adapter, or all weights under
full fine-tuning: ``trainable.pt``) are loaded into one copy of the base model and
:func:`rftlib.eval.greedy_eval` runs on the task's held-out set. Results go to
``eval/ckpt_step_N.json`` (the eval file format plus ``step``, ``final``, ``checkpoint`` and
``source``). It is resumable: a checkpoint whose file already exists with the same settings is
skipped. When the trainer already evaluated that very state (``eval/step_N.json``: the trainer
evaluates before it saves, same weights, same greedy settings) the result is reused rather than
recomputed.

Every number is on the trainer's own held-out set, in the trainer's precision: the task is built
from the attempt's config by the one builder the trainer uses (:func:`rftlib.train.build.build_task`:
task, task_args, eval_size), and the precision by the one rule (:func:`rftlib.eval.eval_dtypes`, on the
device the config names). A result is reused (cached, or the trainer's own) only when it records the
same examples (``examples_digest``), precision, mode and max_new_tokens; an older file that does not
say is recomputed. Rebuilding the task without its task_args once scored ``code-cpu`` checkpoints on
120 problems of 10 families where the trainer's held-out set was 100 of 5, and mixed both in one curve.

The final checkpoint is the one at the attempt's ``num_steps`` (seed 001's "final", which its
runner once failed to parse); it is marked ``"final": true``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable

import torch

from rftlib.attempts import read_attempt, run_dir_path, write_json
from rftlib.config import RunConfig, make_config
from rftlib.eval import EnvEval, eval_dtypes, examples_digest, greedy_eval, scored_on
from rftlib.models.loading import apply_lora, load_model_and_tokenizer, load_trainable_state
from rftlib.monitor.quiet import quiet_libraries
from rftlib.rollout.hf import HFEngine
from rftlib.train.build import build_task
from rftlib.train.checkpoint import STATE, latest_dir, list_steps
from rftlib.train.dist import resolve_device


def checkpoint_steps(run_dir: str | Path) -> list[int]:
    return list_steps(run_dir)


def _final_step(run_dir: Path, cfg: dict[str, Any]) -> int:
    """The attempt's last step: num_steps as the latest checkpoint records it (a resume with
    additional steps raises it past config.yaml's), else the config's."""
    try:
        state = json.loads((latest_dir(run_dir) / "trainer_state.json").read_text())
        return int(state.get("num_steps", cfg["num_steps"]))
    except (FileNotFoundError, ValueError, KeyError):
        return int(cfg["num_steps"])


def _same_settings(doc: dict[str, Any], *, max_new_tokens: int, digest: str, precision: str,
                   env: EnvEval | None = None) -> bool:
    """Whether an eval file scored what this eval would: greedy, the same max_new_tokens, the same examples
    (their digest: the same task, task_args, eval_size and limit) in the same precision, played the same way (a
    multi-turn attempt's evals through its environment, turns and trajectory budget: never mixed with single-turn
    scores in one curve)."""
    played = (None if env is None else [env.env, env.max_turns, env.max_trajectory_tokens])
    got = (None if doc.get("env") is None else [doc.get("env"), doc.get("max_turns"), doc.get("max_trajectory_tokens")])
    return (doc.get("mode") == "greedy_pass@1" and doc.get("max_new_tokens") == max_new_tokens
            and doc.get("examples_digest") == digest and doc.get("precision") == precision and played == got)


def attempt_config(run_dir: Path) -> RunConfig:
    """The attempt's saved config as a RunConfig (what its trainer ran with)."""
    return make_config(None, read_attempt(run_dir)["config"])


def eval_checkpoints(run_dir: str | Path, **kw) -> dict[int, dict[str, Any]]:
    """Evaluate each training_state/step_N; returns {step: result} for all checkpoints (cached ones
    included). ``limit``: only the first ``limit`` held-out problems (seed 001's --subset-frac);
    ``max_new_tokens``/``batch_size``: default to the attempt's config. transformers' warnings and
    weight-loading bars go to ``logs/library_warnings.log``, not into the notebook."""
    run_dir = run_dir_path(run_dir)
    with quiet_libraries(run_dir / "logs" / "library_warnings.log"):
        return _eval_checkpoints(run_dir, **kw)


def _eval_checkpoints(run_dir: Path, *, limit: int | None = None, max_new_tokens: int | None = None,
                      batch_size: int | None = None, recompute: bool = False, reuse_training_evals: bool = True,
                      log: Callable[[str], None] = print) -> dict[int, dict[str, Any]]:
    cfg = attempt_config(run_dir)
    steps = checkpoint_steps(run_dir)
    mnt = int(max_new_tokens or cfg.max_new_tokens)
    final_step = _final_step(run_dir, {"num_steps": cfg.num_steps})
    out_dir = run_dir / "eval"
    out_dir.mkdir(exist_ok=True)
    # the trainer's own held-out set and precision, from the attempt's config (the one builder, the one rule)
    task = build_task(cfg)
    examples = task.eval[:limit] if limit else task.eval
    digest = examples_digest(examples)
    device = resolve_device(cfg.device)
    weights_dtype, precision = eval_dtypes(cfg.dtype, cfg.eval_dtype, device)
    env = EnvEval.of(cfg)  # a multi-turn attempt is scored in its environment, as the trainer scored it
    same = {"max_new_tokens": mnt, "digest": digest, "precision": precision, "env": env}
    results: dict[int, dict[str, Any]] = {}
    todo: list[int] = []
    for s in steps:
        path = out_dir / f"ckpt_step_{s}.json"
        if path.exists() and not recompute:
            doc = json.loads(path.read_text())
            if _same_settings(doc, **same):
                if doc.get("final") != (s == final_step):  # a resume moved the end: "final" follows it
                    doc["final"] = s == final_step
                    write_json(path, doc)
                results[s] = doc
                log(f"[eval] step {s}: cached ({doc['greedy_pass@1']:.3f}, {precision})")
                continue
        train_eval = out_dir / f"step_{s}.json"
        if reuse_training_evals and not recompute and train_eval.exists():
            doc = json.loads(train_eval.read_text())
            if _same_settings(doc, **same):
                doc.update(step=s, limit=limit, final=s == final_step, checkpoint=f"training_state/step_{s}",
                           source=f"eval/step_{s}.json (the trainer's eval of the same weights)")
                write_json(path, doc)
                results[s] = doc
                log(f"[eval] step {s}: reused the in-training eval ({doc['greedy_pass@1']:.3f}, {precision})")
                continue
        todo.append(s)
    if todo:
        results.update(_evaluate(run_dir, cfg, todo, task=task, examples=examples, limit=limit, max_new_tokens=mnt,
                                 final_step=final_step, batch_size=int(batch_size or cfg.eval_batch_size),
                                 device=device, weights_dtype=weights_dtype, precision=precision, env=env,
                                 log=log))
    if not steps:
        log(f"[eval] no checkpoints under {run_dir / 'training_state'}")
    return dict(sorted(results.items()))


def _evaluate(run_dir: Path, cfg: RunConfig, steps: list[int], *, task, examples, limit: int | None,
              max_new_tokens: int, final_step: int, batch_size: int, device: torch.device, weights_dtype: str,
              precision: str, log: Callable[[str], None], env: EnvEval | None = None) -> dict[int, dict[str, Any]]:
    """Load the base model once (in the trainer's weights dtype, on its device), then each checkpoint's
    trained parameters in turn."""
    t = time.time()
    model, tok = load_model_and_tokenizer(cfg.model, weights_dtype)
    model = apply_lora(model, rank=cfg.lora_rank, alpha=cfg.lora_alpha, dropout=cfg.lora_dropout,
                       target_modules=cfg.lora_target_modules)
    model.to(device).eval()
    engine = HFEngine(model, tok)
    log(f"[eval] model {cfg.model} loaded in {time.time() - t:.1f} s; {len(examples)} held-out problems of task "
        f"{cfg.task} {cfg.task_args or ''}, greedy, max_new_tokens {max_new_tokens}, {precision} on {device}")
    out = {}
    for s in steps:
        t = time.time()
        state = torch.load(run_dir / STATE / f"step_{s}" / "trainable.pt", weights_only=True, map_location=device)
        load_trainable_state(model, state)
        res = greedy_eval(engine, tok, task, examples, max_new_tokens=max_new_tokens, batch_size=batch_size,
                          precision=precision, env=env)
        res.update(scored_on(cfg))
        res.update(step=s, limit=limit, final=s == final_step, checkpoint=f"training_state/step_{s}",
                   source="rftlib.eval_checkpoints (checkpoint reloaded)", seconds=round(time.time() - t, 2))
        write_json(run_dir / "eval" / f"ckpt_step_{s}.json", res)
        out[s] = res
        log(f"[eval] step {s}{' (final)' if s == final_step else ''}: greedy_pass@1 {res['greedy_pass@1']:.3f} "
            f"({precision}, {time.time() - t:.1f} s)")
    return out
