"""SFT as a stage of an attempt: TRL's SFTTrainer (with peft LoRA) on the prepared SFT split, with
completion-only loss, evaluated for format compliance and held-out accuracy before and after.

Seed 003 section 12: check the base model's format compliance (the \\boxed{} rate, greedy) first,
and run SFT on ``sft_train.jsonl`` only when it is below 95%; seed 001 starts RL from an SFT
adapter (checkpoint-156). Here an SFT attempt is a run directory like an RL one (config.yaml,
logs/metrics.jsonl, eval/step_0.json and eval/step_N.json, summary.json, the report and index)
plus ``adapter/``, the peft adapter an RL attempt starts from (``init_adapter``); that attempt's
report links back to this one.

Why TRL and not a loop of our own: SFTTrainer is the field's default for this step (the seeds'
peers use it), it already does completion-only loss on prompt-completion data through the chat
template, and it runs on transformers' Trainer (schedules, grad clipping, bf16 autocast on CPU).
rftlib only maps RunConfig onto SFTConfig and routes its log rows into the attempt's logger, so
the rows reach the same trackers (``report_to``) as an RL attempt's.

What SFT trains on is checked against the attempt's task by problem identity (the prepare pipeline's hash), not
prompt text: a row holding a held-out problem is refused whatever its wording; a bare problem (seed 003's
``sft_train.jsonl``) is shown to the model with the task's instruction, as RL and the evals show it
(``load_sft_rows``). Every row is trained whole: rows longer than the attempt's budget (``max_new_tokens`` for the
answer, ``prompt_max_len`` for the prompt) are left out and listed in ``logs/sft_dropped.json``, never cut to TRL's
default 1024 tokens (``fit_rows``). The rows trained on are kept in ``sft_rows.jsonl``, where an RL attempt
started from the adapter checks its own held-out set against them (rftlib.train.build.check_sft_ancestry).

The fields an SFT attempt reads: sft_data (rows ``{"input", "output"}``, seed 003's format, as
``python -m rftlib.data.prepare`` writes them), num_steps (optimizer steps), micro_batch_size
(sequences per step), lr / warmup_ratio / min_lr_ratio (cosine to min_lr, as RL), weight_decay,
adam_beta1/2, max_grad_norm, lora_*, model, dtype, autocast, seed; the task, eval_size,
max_new_tokens and eval_batch_size for the before/after eval; max_new_tokens and prompt_max_len as the budget.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shlex
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from matplotlib.figure import Figure
from transformers import PrinterCallback, TrainerCallback

from rftlib.algo.schedule import warmup_steps_for
from rftlib.attempts import SFT_ROWS, create_attempt, project_root, read_attempt, write_json
from rftlib.config import ConfigError, RunConfig, make_config
from rftlib.data.base import Example, Task, build_task, held_out_leaks, normalise_text
from rftlib.data.benchmarks import import_datasets
from rftlib.data.jsonl import read_jsonl
from rftlib.eval import EnvEval, eval_dtypes, greedy_eval, scored_on
from rftlib.models.loading import apply_lora, compute_dtype, load_model_and_tokenizer
from rftlib.monitor.metrics import MetricsLogger, read_metrics
from rftlib.notebooks import preset_overrides
from rftlib.report.html import Html, table
from rftlib.report.plots import Plot
from rftlib.rollout.hf import HFEngine
from rftlib.train.dist import DIST_ENV, resolve_device

FORMAT_THRESHOLD = 0.95  # seed 003 section 12: SFT first when the \boxed{} rate is below 95%
FORMAT_KEY = "eval/heldout/format_compliance"  # the \boxed{} rate of the held-out greedy completions
ACC_KEY = "eval/heldout/greedy_pass@1"


def _trl():
    """TRL's SFT classes (trl is imported here only: the ``sft`` extra) and datasets.Dataset (which TRL brings)."""
    try:
        from trl import SFTConfig, SFTTrainer
    except ImportError as e:
        raise ImportError(f"rft sft needs TRL ({e}); install it with pip install 'rftlib[sft]' "
                          "(or pip install trl==1.16.0)") from None
    datasets = import_datasets("rft sft", "TRL brings it: pip install 'rftlib[sft]'")
    return SFTConfig, SFTTrainer, datasets.Dataset


def sft_data_path(cfg: RunConfig) -> Path:
    """The SFT split of a config; a relative path is from the project root (as runs_root is)."""
    if not cfg.sft_data:
        raise ConfigError("sft_data is not set: give the SFT split, a JSONL of {\"input\", \"output\"} rows "
                          "(python -m rftlib.data.prepare writes sft_train.jsonl; data/sft/arithmetic_boxed.jsonl "
                          "is the embedded default's)")
    p = Path(cfg.sft_data).expanduser()
    p = p if p.is_absolute() else project_root() / p
    if not p.exists():
        raise ConfigError(f"sft_data={cfg.sft_data!r}: no such file ({p})")
    return p


_BOUNDARY = re.compile(r"(?<=[.?!:;])\s+|\n+")


def _split_problems(task: Task, text: str) -> list[tuple[str, str]]:
    """(problem key, the text around it) for each way ``text`` may be a problem with something else before or after
    it: every prefix ending and every suffix starting at a sentence or line boundary."""
    out = []
    for m in _BOUNDARY.finditer(text):
        a, b = m.span()
        for piece, rest in ((text[:a], text[b:]), (text[b:], text[:a])):
            if piece.strip() and rest.strip():
                out.append((task.problem_key(piece), normalise_text(rest)))
    return out


def load_sft_rows(path: Path, task: Task) -> list[dict[str, str]]:
    """The SFT rows, each with ``prompt``: its input as the task shows it (``Task.prompt_for``: a bare problem, as
    in seed 003's ``sft_train.jsonl``, gets the task's instruction), so SFT teaches the format on the prompts RL and
    the evals show. Compared with the task by problem identity (the prepare pipeline's hash), never by prompt text:

    - refused when a row holds a problem of the task's held-out set, or of a probe not drawn from its training pool
      (``held_out_leaks``: the same problem however the instruction around it is worded): the after-eval would
      measure memorisation;
    - refused when rows hold the task's training problems with the same extra text around them (an instruction
      the task does not give, in two rows or more; one row's extra sentence is a near-duplicate problem, not a
      format): the format taught would not be the one RL and the eval show the model.
    """
    rows = read_jsonl(path, required=["input", "output"])
    for i, r in enumerate(rows):
        check_context(r.get("context"), f"{path} line {i + 1}")
    leaks = held_out_leaks(task, [r["input"] for r in rows])
    if leaks:
        sets = ", ".join(f"{n} in '{k}'" for k, n in Counter(lk.eval_set for lk in leaks).items())
        lk = leaks[0]
        raise ConfigError(f"sft_data {path}: {len(leaks)} of {len(rows)} rows hold problems of task '{task.name}''s "
                          f"eval sets ({sets}; compared by problem identity, not prompt text), e.g. line "
                          f"{lk.index + 1} {lk.text!r:.120} holds held-out problem {lk.example.id} ({lk.how}); train SFT "
                          "on the training split only (prepare's sft_train.jsonl)")
    train = {task.problem_key(e.prompt): e for e in task.train}
    extra: dict[str, list[tuple[int, Example]]] = {}  # text around a training problem -> the rows that have it
    for i, r in enumerate(rows):
        if task.problem_key(r["input"]) in train:
            continue  # the problem itself (bare, or with the task's instruction): shown as the task shows it
        hit = next(((k, rest) for k, rest in _split_problems(task, r["input"]) if k in train), None)
        if hit is not None:
            extra.setdefault(hit[1], []).append((i, train[hit[0]]))
    bad = max(extra.items(), key=lambda kv: len(kv[1]), default=None)
    if bad is not None and len(bad[1]) >= 2:
        (i, ex), n = bad[1][0], len(bad[1])
        raise ConfigError(f"sft_data {path}: {n} rows hold training problems of task '{task.name}' with text the task's "
                          f"prompts do not have ({bad[0]!r:.80}), e.g. line {i + 1} would train on "
                          f"{task.prompt_for(rows[i]['input'])!r:.160} where the task shows {ex.prompt!r:.160}; match "
                          "the task's prompt (task_args, e.g. its instruction) to the SFT split's inputs")
    return [{**r, "prompt": task.prompt_for(r["input"])} for r in rows]


CONTEXT_ROLES = ("assistant", "tool", "user")
"""roles a row's ``context`` may hold: the model's earlier turns and what the environment answered"""


def check_context(context, where: str) -> None:
    """A row's optional ``context`` (a later turn of a multi-turn transcript: ReTool's cold start trains the answer
    after the tool's result too): a list of {"role", "content"} messages between the user turn and the trained
    assistant turn. ConfigError naming the row otherwise."""
    if context is None:
        return
    ok = isinstance(context, list) and all(
        isinstance(m, dict) and m.get("role") in CONTEXT_ROLES and isinstance(m.get("content"), str) for m in context)
    if not ok:
        raise ConfigError(f"sft_data {where}: 'context' must be a list of messages {{\"role\": one of "
                          f"{list(CONTEXT_ROLES)}, \"content\": text}} (the turns between the user's and the trained "
                          f"answer), got {context!r:.160}")


def row_messages(r: dict, system_prompt: str | None) -> list[dict]:
    """A row's prompt as chat messages: the system prompt, the user turn (its ``prompt``), then its ``context``
    (earlier model turns and the environment's answers, for a later turn of a transcript)."""
    sys_msg = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return sys_msg + [{"role": "user", "content": r.get("prompt", r["input"])}] + list(r.get("context") or [])


def to_dataset(rows: list[dict[str, str]], system_prompt: str | None):
    """Conversational prompt-completion rows: SFTTrainer renders them with the chat template and,
    with completion_only_loss, masks the prompt (system + user turn, and a later turn's context) out of the loss."""
    _, _, Dataset = _trl()
    return Dataset.from_list([{"prompt": row_messages(r, system_prompt),
                               "completion": [{"role": "assistant", "content": r["output"]}]} for r in rows])


def _ids(enc) -> list[int]:
    """apply_chat_template's token ids, whether it returned a list or a BatchEncoding."""
    return list(enc["input_ids"] if hasattr(enc, "keys") else enc)


def row_lengths(tok, rows: list[dict[str, str]], system_prompt: str | None) -> list[dict[str, int]]:
    """Each row's token counts as SFTTrainer builds its sequence (conversational prompt-completion: the chat
    template's prompt with the generation prompt, then the whole conversation; the completion starts where the two
    diverge): ``prompt``, ``completion`` (every token after the prompt, the template's turn end included),
    ``generated`` (the completion up to and including the first end-of-sequence token: what a rollout of the same
    answer generates, the number ``max_new_tokens`` caps) and ``total``."""
    out = []
    for r in rows:
        prompt = row_messages(r, system_prompt)
        p_ids = _ids(tok.apply_chat_template(prompt, tokenize=True, add_generation_prompt=True))
        full = _ids(tok.apply_chat_template(prompt + [{"role": "assistant", "content": r["output"]}], tokenize=True))
        n = next((i for i, (a, b) in enumerate(zip(p_ids, full)) if a != b), min(len(p_ids), len(full)))
        comp = full[n:]
        eos = tok.eos_token_id
        gen = comp.index(eos) + 1 if eos is not None and eos in comp else len(comp)
        out.append({"prompt": n, "completion": len(comp), "generated": gen, "total": len(full)})
    return out


MAX_DROPPED_SHARE = 0.5
"""more SFT rows than this share too long for the attempt's budget is refused: the budget does not fit the data
(raise max_new_tokens / prompt_max_len), and training on the short remainder would bias what SFT teaches"""


def fit_rows(rows: list[dict[str, str]], lengths: list[dict[str, int]], cfg: RunConfig,
             path) -> tuple[list, list, list, int]:
    """(kept rows, their lengths, dropped [{line, prompt, generated}], max_length): a row is kept when its completion fits the
    attempt's completion budget (``generated`` <= max_new_tokens: the RL stage would cut a longer answer, and SFT
    on a cut one teaches no \\boxed{} and no end of turn) and its prompt the prompt budget (``prompt_max_len`` when
    set: the RL stage drops longer prompts). ``max_length`` is the longest kept row (chat template included), so
    SFTTrainer cuts nothing. Refused when no row fits or more than MAX_DROPPED_SHARE do not."""
    cap_p = cfg.prompt_max_len
    keep, dropped = [], []
    for i, (r, n) in enumerate(zip(rows, lengths)):
        if n["generated"] > cfg.max_new_tokens or (cap_p and n["prompt"] > cap_p):
            dropped.append({"line": i + 1, "prompt": n["prompt"], "generated": n["generated"]})
        else:
            keep.append((r, n))
    if dropped and (not keep or len(dropped) > MAX_DROPPED_SHARE * len(rows)):
        worst = max(lengths, key=lambda n: n["generated"])
        raise ConfigError(f"sft_data {path}: {len(dropped)} of {len(rows)} rows do not fit the attempt's budget "
                          f"(completion <= max_new_tokens={cfg.max_new_tokens} tokens"
                          + (f", prompt <= prompt_max_len={cap_p}" if cap_p else "") + f"; the longest completion is "
                          f"{worst['generated']} tokens, e.g. line {dropped[0]['line']}): SFT would train on the few "
                          "rows that fit, or, cut, on answers without their end; raise max_new_tokens (and "
                          "prompt_max_len) to the data's lengths, or shorten the split")
    return [r for r, _ in keep], [n for _, n in keep], dropped, max((n["total"] for _, n in keep), default=0)


def check_not_cut(dataset, lengths: list[dict[str, int]], max_length: int) -> None:
    """Every row SFTTrainer tokenized is as long as ``row_lengths`` counted it, so nothing was cut (TRL truncates to
    its max_length without a word): a mismatch is an error, not a silently shorter example."""
    got = [len(x) for x in dataset["input_ids"]]
    want = [n["total"] for n in lengths]
    bad = [i for i, (g, w) in enumerate(zip(got, want)) if g != w]
    if len(got) != len(want) or bad:
        i = bad[0] if bad else min(len(got), len(want))
        raise RuntimeError(f"SFTTrainer's tokenized rows differ from rftlib's count (row {i}: "
                           f"{got[i] if i < len(got) else 'missing'} vs {want[i] if i < len(want) else 'none'} tokens, "
                           f"max_length {max_length}): a row would be cut or built differently")


def record_sft_rows(run_dir: Path, task: Task, rows: list[dict[str, str]], path: Path) -> None:
    """``<run_dir>/sft_rows.jsonl`` (attempts.SFT_ROWS): every row this attempt trains on, its input, the prompt it
    was shown as and its problem key, kept with the attempt, so an RL attempt started from the adapter checks its
    own held-out set against what SFT really saw even after the split file is rewritten (rftlib.train.build)."""
    with open(run_dir / SFT_ROWS, "w") as f:
        for r in rows:
            f.write(json.dumps({"input": r["input"], "prompt": r["prompt"], "problem_key": task.problem_key(r["input"]),
                                "source": str(path)}) + "\n")


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def format_eval(engine, tok, task: Task, examples: list[Example], cfg: RunConfig, step: int,
                run_dir: Path, precision: str | None = None) -> dict[str, Any]:
    """Greedy held-out eval (the trainer's greedy_pass@1) plus the \\boxed{} rate, computed in ``precision``
    (rftlib.eval.eval_dtypes: the rule every eval follows) and written as eval/step_N.json; returns the
    metrics row. With an ``env`` (a tool-using warm start: sft-calc-cpu) each problem is played greedily in that
    environment as the RL attempt's evals play it, so the row also says how often the model calls its tool
    (``eval/heldout/tool_call_rate``) and how often a call runs: what the warm start is for; a single-turn eval
    would score a transcript that stops at its tool call as wrong."""
    res = greedy_eval(engine, tok, task, examples, max_new_tokens=cfg.max_new_tokens, batch_size=cfg.eval_batch_size,
                      precision=precision, env=EnvEval.of(cfg))
    res.update(scored_on(cfg))
    n = max(len(res["results"]), 1)
    res["format_compliance"] = sum(r["has_boxed"] for r in res["results"]) / n
    write_json(run_dir / "eval" / f"step_{step}.json", res)
    row = {"step": step, ACC_KEY: res["greedy_pass@1"], FORMAT_KEY: res["format_compliance"],
           "eval/heldout/mean_length": res["mean_length"]}
    for k in ("tool_call_rate", "tool_ok_rate", "mean_turns"):
        if k in res:
            row[f"eval/heldout/{k}"] = res[k]
    return row


def _log_callback(logger: MetricsLogger, total: int, write):
    """A transformers TrainerCallback writing each of TRL's log rows as a metrics row (step-keyed),
    and one line per step (in place of transformers' PrinterCallback)."""
    names = {"learning_rate": "lr", "grad_norm": "grad_norm"}

    class ToMetrics(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "loss" in logs:  # training rows (the end-of-training totals row has train_loss)
                logger.log({"step": state.global_step, **{names.get(k, f"sft/{k}"): v for k, v in logs.items()}})
                write(f"[sft step {state.global_step}/{total}] loss {logs['loss']:.4f}  token acc "
                      f"{logs.get('mean_token_accuracy', float('nan')):.3f}  lr {logs.get('learning_rate', 0):.2e}")

    return ToMetrics()


@contextlib.contextmanager
def _one_process_env():
    """SFT runs in one process, but accelerate (under TRL) joins a process group whenever torch.distributed's
    environment variables are set: a one-rank DeepSpeed group rftlib set up earlier in the same process or
    its parent (a notebook kernel, a test run) leaves RANK/WORLD_SIZE/MASTER_PORT behind, and accelerate then
    fails to listen on a port already in use. Outside torchrun (no group, world of 1) hide them meanwhile."""
    if torch.distributed.is_initialized() or int(os.environ.get("WORLD_SIZE", "1")) > 1:
        yield
        return
    saved = {k: os.environ.pop(k) for k in DIST_ENV if k in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def sft_config(cfg: RunConfig, run_dir: Path, bf16: bool, max_length: int | None = None, *, fp16: bool = False,
               on_cpu: bool | None = None):
    """RunConfig -> TRL's SFTConfig (the same schedule shape as RL: linear warmup, cosine to min_lr). ``max_length``:
    the longest row that fits the attempt's budget (``fit_rows``), never TRL's default 1024 (which cuts a longer
    example from its end, answer and end of turn included, without a word); None: no cut at all. ``bf16`` /
    ``fp16``: the forward's half dtype (autocast; fp16 with transformers' GradScaler); ``on_cpu``: the device the
    stage resolved (None: cpu unless CUDA is there and the config does not say cpu)."""
    SFTConfig, _, _ = _trl()
    if on_cpu is None:
        on_cpu = not torch.cuda.is_available() or cfg.device == "cpu"
    return SFTConfig(max_length=max_length,
        output_dir=str(run_dir / "sft_trainer"), max_steps=cfg.num_steps, per_device_train_batch_size=cfg.micro_batch_size,
        gradient_accumulation_steps=1, learning_rate=cfg.lr, lr_scheduler_type="cosine_with_min_lr",
        lr_scheduler_kwargs={"min_lr_rate": cfg.min_lr_ratio}, warmup_steps=warmup_steps_for(cfg.num_steps, cfg.warmup_ratio),
        weight_decay=cfg.weight_decay, adam_beta1=cfg.adam_beta1, adam_beta2=cfg.adam_beta2,
        max_grad_norm=cfg.max_grad_norm, seed=cfg.seed, data_seed=cfg.seed, bf16=bf16, fp16=fp16,
        use_cpu=on_cpu, completion_only_loss=True,
        logging_steps=1, save_strategy="no", eval_strategy="no", report_to="none", disable_tqdm=True,
        dataloader_num_workers=0, gradient_checkpointing=cfg.gradient_checkpointing)


def start(preset: str, overrides: dict[str, Any] | None = None, *, notes: str | None = None,
          runs_root: str | None = None, attempt_id: str | None = None) -> tuple[RunConfig, Path]:
    """The notebook's first cell: resolve the config (the preset, ``overrides`` and the named fields by the
    notebooks' one convention, rftlib.notebooks.preset_overrides: None keeps the preset's), create the attempt."""
    cfg = make_config(preset, preset_overrides(overrides, notes=notes, runs_root=runs_root))
    check_sft_data(cfg)  # fail before the attempt is made and the model loads
    return cfg, create_attempt(cfg, attempt_id or None)


def check_sft_data(cfg: RunConfig) -> list[dict[str, str]]:
    """The SFT split of a config as ``load_sft_rows`` accepts it (held-out problems and prompt forms checked against
    the config's task): what ``rft sft`` and the notebook's first cell call before any model loads."""
    return load_sft_rows(sft_data_path(cfg), build_task(cfg.task, eval_size=cfg.eval_size, **cfg.task_args))


def run_sft(cfg: RunConfig, run_dir: str | Path | None = None, *, write=print) -> dict[str, Any]:
    """One SFT attempt: eval -> SFTTrainer -> eval -> adapter/ (or model/ when lora_rank is 0) and
    summary.json; returns the summary (its ``next`` says how an RL attempt starts from it)."""
    _, SFTTrainer, _ = _trl()

    torch.manual_seed(cfg.seed)
    task = build_task(cfg.task, eval_size=cfg.eval_size, **cfg.task_args)
    path = sft_data_path(cfg)
    rows = load_sft_rows(path, task)
    run_dir = Path(run_dir) if run_dir is not None else create_attempt(cfg)
    (run_dir / "eval").mkdir(parents=True, exist_ok=True)
    logger = MetricsLogger(run_dir)
    t0 = time.time()
    # the device the config names (auto: the GPU when there is one), and the weights' dtype and eval precision
    # by the one rule every eval follows (rftlib.eval.eval_dtypes): auto is bfloat16 on a GPU, float16 allowed there
    device = resolve_device(cfg.device)
    weights_dtype, precision = eval_dtypes(cfg.dtype, cfg.eval_dtype, device)
    model, tok = load_model_and_tokenizer(cfg.model, weights_dtype)
    model = apply_lora(model, rank=cfg.lora_rank, alpha=cfg.lora_alpha, dropout=cfg.lora_dropout,
                       target_modules=cfg.lora_target_modules)
    model.to(device)
    amp = compute_dtype(weights_dtype, cfg.autocast)  # the training forward's dtype, as the RL trainer's
    engine = HFEngine(model, tok, amp=amp)
    load_seconds = time.time() - t0
    try:
        lengths = row_lengths(tok, rows, task.system_prompt)
        rows, lengths, dropped, max_length = fit_rows(rows, lengths, cfg, path)
        if dropped:
            write_json(run_dir / "logs" / "sft_dropped.json", {"max_new_tokens": cfg.max_new_tokens,
                                                              "prompt_max_len": cfg.prompt_max_len, "rows": dropped})
            write(f"[sft] WARNING {len(dropped)} of {len(rows) + len(dropped)} SFT rows are longer than the attempt's "
                  f"budget (completion <= max_new_tokens={cfg.max_new_tokens}"
                  + (f", prompt <= prompt_max_len={cfg.prompt_max_len}" if cfg.prompt_max_len else "")
                  + f") and are left out, never cut (lines {[d['line'] for d in dropped[:10]]}"
                  + ("..." if len(dropped) > 10 else "") + f"; logs/sft_dropped.json)")
        record_sft_rows(run_dir, task, rows, path)
        before = format_eval(engine, tok, task, task.eval, cfg, 0, run_dir, precision)
        logger.log(before)
        write(f"[sft] before: held-out {before[ACC_KEY]:.2f} ({precision}), format compliance "
              f"{before[FORMAT_KEY]:.0%}{_tool_text(before)} on {len(task.eval)} problems; {len(rows)} SFT rows "
              f"from {cfg.sft_data}")
        t1 = time.time()
        with _one_process_env():
            args = sft_config(cfg, run_dir, amp == torch.bfloat16, max_length, fp16=amp == torch.float16,
                              on_cpu=device.type == "cpu")
            trainer = SFTTrainer(model=model, args=args,
                                 train_dataset=to_dataset(rows, task.system_prompt), processing_class=tok,
                                 callbacks=[_log_callback(logger, cfg.num_steps, write)])
            check_not_cut(trainer.train_dataset, lengths, max_length)
            trainer.remove_callback(PrinterCallback)
            trainer.train()
        train_seconds = time.time() - t1
        model.eval()
        after = format_eval(engine, tok, task, task.eval, cfg, cfg.num_steps, run_dir, precision)
        logger.log(after)
        out = run_dir / ("adapter" if cfg.lora_rank else "model")
        model.save_pretrained(str(out))
        if not cfg.lora_rank:
            tok.save_pretrained(str(out))
        nxt = f"--set init_adapter={out}" if cfg.lora_rank else f"--set model={out}"
        summary = {"attempt_id": run_dir.name, "run_dir": str(run_dir), "stage": "sft", "steps": cfg.num_steps,
                   "baseline": before[ACC_KEY], "final": after[ACC_KEY], "gain": after[ACC_KEY] - before[ACC_KEY],
                   "best": max(before[ACC_KEY], after[ACC_KEY]),
                   "best_step": cfg.num_steps if after[ACC_KEY] >= before[ACC_KEY] else 0,
                   "format_before": before[FORMAT_KEY], "format_after": after[FORMAT_KEY],
                   **{f"{k}_{when}": row[f"eval/heldout/{k}"] for when, row in (("before", before), ("after", after))
                      for k in ("tool_call_rate", "tool_ok_rate") if f"eval/heldout/{k}" in row},
                   "format_threshold": FORMAT_THRESHOLD, "eval_mode": "greedy_pass@1", "eval_dataset": "heldout",
                   "eval_n": len(task.eval), "eval_precision": precision, "sft_rows": len(rows),
                   "sft_rows_too_long": len(dropped), "sft_max_length": max_length, "sft_data_sha256": file_sha256(path),
                   "output": str(out),
                   "load_seconds": round(load_seconds, 1), "baseline_eval_seconds": round(t1 - t0 - load_seconds, 1),
                   "train_seconds": round(train_seconds, 1),
                   "next": f"rft train -p RL_PRESET {nxt}  (RL from this SFT {'adapter' if cfg.lora_rank else 'model'})"}
        write_json(run_dir / "summary.json", summary)  # before the logger closes: the trackers send its numbers
        if (run_dir / "sft_trainer").is_dir() and not any((run_dir / "sft_trainer").iterdir()):
            (run_dir / "sft_trainer").rmdir()  # TRL's output_dir: nothing is saved there (save_strategy no)
    finally:
        engine.close()
        logger.close(error=sys.exc_info()[1])  # a crash marks the trackers' runs failed
    write(sft_result_text(summary))
    return summary


def _tool_text(row: dict[str, Any]) -> str:
    """The eval row's tool figures as a clause of the before line (empty for a single-turn eval)."""
    if "eval/heldout/tool_call_rate" not in row:
        return ""
    return (f", tool calls in {row['eval/heldout/tool_call_rate']:.0%} of episodes "
            f"({row['eval/heldout/tool_ok_rate']:.0%} of calls ran)")


def sft_result_text(summary: dict[str, Any]) -> str:
    """Before/after format compliance and held-out accuracy in words, against the 95% threshold."""
    fb, fa, th = summary["format_before"], summary["format_after"], summary["format_threshold"]
    verdict = "meets" if fa >= th else "is still below"
    return (f"[sft] {summary['attempt_id']}: format compliance {fb:.0%} -> {fa:.0%} ({verdict} the {th:.0%} of seed 003 "
            f"section 12); held-out {summary['eval_mode']} ({summary.get('eval_precision', 'precision unrecorded')}) "
            f"{summary['baseline']:.2f} -> {summary['final']:.2f} on "
            f"{summary['eval_n']} problems"
            + (f"; tool calls in {summary['tool_call_rate_before']:.0%} -> {summary['tool_call_rate_after']:.0%} of "
               "episodes" if "tool_call_rate_after" in summary else "")
            + f"; {summary['steps']} steps in {summary['train_seconds']:.0f} s.\n"
            f"[sft] next: {summary['next']}")


def format_check(run_dir: str | Path) -> str:
    """The train notebook's format-compliance check on the attempt's step-0 held-out eval (seed 003
    section 12): below 95% it says which command runs SFT first; "not applicable" where the task does
    not ask for \\boxed{} (its health rules skip has_boxed, e.g. the plain arithmetic task)."""
    run_dir = Path(run_dir)
    cfg = read_attempt(run_dir)["config"]
    task = build_task(cfg["task"], eval_size=cfg["eval_size"], **cfg.get("task_args", {}))
    if "has_boxed" in task.health_skip:
        return f"format check: task '{task.name}' does not ask for \\boxed{{}} answers: not applicable"
    try:
        res = json.loads((run_dir / "eval" / "step_0.json").read_text()).get("results") or []
    except (OSError, json.JSONDecodeError):
        return "format check: no step-0 held-out eval in this attempt"
    rate = sum(r.get("has_boxed", 0.0) for r in res) / max(len(res), 1)
    head = f"format check: \\boxed{{}} rate {rate:.0%} on {len(res)} held-out problems at step 0"
    if rate >= FORMAT_THRESHOLD:
        return f"{head} >= {FORMAT_THRESHOLD:.0%}: SFT not needed"
    data = cfg.get("sft_data") or (f"{cfg['task_args']['data_dir']}/sft_train.jsonl" if "data_dir" in cfg.get("task_args", {})
                                   else "data/sft/arithmetic_boxed.jsonl" if cfg["task"] == "arithmetic" else "SFT_SPLIT.jsonl")
    # the RL attempt's budget: SFT rows that would not fit it are left out (fit_rows), so the SFT stage gets the same
    budget = (("max_new_tokens", cfg["max_new_tokens"]),) + ((("prompt_max_len", cfg["prompt_max_len"]),)
                                                          if cfg.get("prompt_max_len") else ())
    sets = " ".join("--set " + shlex.quote(f"{k}={v if isinstance(v, str) else json.dumps(v)}") for k, v in
                    (("model", cfg["model"]), ("task", cfg["task"]), ("task_args", cfg.get("task_args", {})),
                     ("sft_data", data), *budget))
    return (f"{head} < {FORMAT_THRESHOLD:.0%}: SFT needed first (seed 003 section 12). Run\n"
            f"  rft sft -p sft-arithmetic-boxed {sets}\n"
            f"then RL from its adapter:\n  rft train -p PRESET --set init_adapter=runs/<the SFT attempt>/adapter")


def before_after(run_dir: str | Path) -> Html:
    """Format compliance, held-out accuracy and completion length, before and after SFT."""
    rows = [r for r in read_metrics(run_dir) if ACC_KEY in r]
    if len(rows) < 2:
        return Html("<p><i>no before/after eval recorded</i></p>")
    b, a = rows[0], rows[-1]

    def pair(key: str, as_pct: bool) -> tuple[str, str]:
        return tuple(f"{100 * r[key]:.0f}%" if as_pct else f"{r[key]:.1f}" for r in (b, a))

    def precision(r) -> str:  # the eval file of that step says what it computed in (rftlib.eval.eval_dtypes)
        try:
            return json.loads((Path(run_dir) / "eval" / f"step_{r['step']}.json").read_text()).get("precision", "?")
        except (OSError, json.JSONDecodeError):
            return "?"

    acc = tuple(f"{v} ({precision(r)})" for v, r in zip(pair(ACC_KEY, True), (b, a)))
    out = [("format compliance (\\boxed{} rate)", *pair(FORMAT_KEY, True), f"{FORMAT_THRESHOLD:.0%} (seed 003 sec. 12)"),
           ("held-out greedy_pass@1 (precision)", *acc, ""),
           ("mean completion length (tokens)", *pair("eval/heldout/mean_length", False), "")]
    return table(["", f"before (step {b['step']})", f"after (step {a['step']})", "threshold"], out)


def loss_plot(run_dir: str | Path):
    """TRL's training loss and mean token accuracy (of the completion tokens) by step."""
    rows = [r for r in read_metrics(run_dir) if "sft/loss" in r]
    fig = Figure(figsize=(10, 3.2), layout="constrained")
    ax = [fig.add_subplot(1, 2, i + 1) for i in range(2)]
    ax[0].plot([r["step"] for r in rows], [r["sft/loss"] for r in rows], marker=".")
    ax[0].set(title="SFT loss (completion tokens)", xlabel="step")
    ax[1].plot([r["step"] for r in rows], [r.get("sft/mean_token_accuracy", float("nan")) for r in rows], marker=".")
    ax[1].set(title="mean token accuracy", xlabel="step", ylim=(0, 1))
    return Plot(fig, "sft", f"{Path(run_dir).name}: SFT loss and token accuracy by step")
