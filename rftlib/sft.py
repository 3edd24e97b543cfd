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

The fields an SFT attempt reads: sft_data (rows ``{"input", "output"}``, seed 003's format, as
``python -m rftlib.data.prepare`` writes them), num_steps (optimizer steps), micro_batch_size
(sequences per step), lr / warmup_ratio / min_lr_ratio (cosine to min_lr, as RL), weight_decay,
adam_beta1/2, max_grad_norm, lora_*, model, dtype, autocast, seed; the task, eval_size,
max_new_tokens and eval_batch_size for the before/after eval.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import time
from pathlib import Path
from typing import Any

import torch
from matplotlib.figure import Figure
from transformers import PrinterCallback, TrainerCallback

from rftlib.algo.schedule import warmup_steps_for
from rftlib.attempts import create_attempt, project_root, read_attempt, write_json
from rftlib.config import ConfigError, RunConfig, make_config
from rftlib.data.base import Example, Task, build_task
from rftlib.data.benchmarks import import_datasets
from rftlib.data.jsonl import read_jsonl
from rftlib.eval import eval_dtypes, greedy_eval, scored_on
from rftlib.models.loading import apply_lora, compute_dtype, load_model_and_tokenizer
from rftlib.monitor.metrics import MetricsLogger, read_metrics
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


def load_sft_rows(path: Path, task: Task) -> list[dict[str, str]]:
    """The SFT rows, refused when any prompt is also a held-out prompt of the task (the after-eval
    would then measure memorisation) or when none of them is a training prompt of the task (the
    format taught would not be the one RL and the eval show the model)."""
    rows = read_jsonl(path, required=["input", "output"])
    held = {e.prompt for e in task.eval}
    leak = [r["input"] for r in rows if r["input"] in held]
    if leak:
        raise ConfigError(f"sft_data {path}: {len(leak)} prompts are in task '{task.name}''s held-out set, e.g. "
                          f"{leak[0]!r}; train SFT on the training split only (prepare's sft_train.jsonl)")
    train = {e.prompt for e in task.train}
    if task.train and not any(r["input"] in train for r in rows[:1000]):
        raise ConfigError(f"sft_data {path}: no prompt is a training prompt of task '{task.name}' (first: "
                          f"{rows[0]['input']!r}, the task's: {task.train[0].prompt!r}); match the task's prompt "
                          "(task_args, e.g. its instruction) to the SFT split's inputs")
    return rows


def to_dataset(rows: list[dict[str, str]], system_prompt: str | None):
    """Conversational prompt-completion rows: SFTTrainer renders them with the chat template and,
    with completion_only_loss, masks the prompt (system + user turn) out of the loss."""
    _, _, Dataset = _trl()
    sys_msg = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return Dataset.from_list([{"prompt": sys_msg + [{"role": "user", "content": r["input"]}],
                               "completion": [{"role": "assistant", "content": r["output"]}]} for r in rows])


def format_eval(engine, tok, task: Task, examples: list[Example], cfg: RunConfig, step: int,
                run_dir: Path, precision: str | None = None) -> dict[str, Any]:
    """Greedy held-out eval (the trainer's greedy_pass@1) plus the \\boxed{} rate, computed in ``precision``
    (rftlib.eval.eval_dtypes: the rule every eval follows) and written as eval/step_N.json; returns the
    metrics row."""
    res = greedy_eval(engine, tok, task, examples, max_new_tokens=cfg.max_new_tokens, batch_size=cfg.eval_batch_size,
                      precision=precision)
    res.update(scored_on(cfg))
    n = max(len(res["results"]), 1)
    res["format_compliance"] = sum(r["has_boxed"] for r in res["results"]) / n
    write_json(run_dir / "eval" / f"step_{step}.json", res)
    return {"step": step, ACC_KEY: res["greedy_pass@1"], FORMAT_KEY: res["format_compliance"],
            "eval/heldout/mean_length": res["mean_length"]}


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


def sft_config(cfg: RunConfig, run_dir: Path, bf16: bool, *, fp16: bool = False, on_cpu: bool | None = None):
    """RunConfig -> TRL's SFTConfig (the same schedule shape as RL: linear warmup, cosine to min_lr). ``bf16`` /
    ``fp16``: the forward's half dtype (autocast; fp16 with transformers' GradScaler); ``on_cpu``: the device the
    stage resolved (None: cpu unless CUDA is there and the config does not say cpu)."""
    SFTConfig, _, _ = _trl()
    if on_cpu is None:
        on_cpu = not torch.cuda.is_available() or cfg.device == "cpu"
    return SFTConfig(
        output_dir=str(run_dir / "sft_trainer"), max_steps=cfg.num_steps, per_device_train_batch_size=cfg.micro_batch_size,
        gradient_accumulation_steps=1, learning_rate=cfg.lr, lr_scheduler_type="cosine_with_min_lr",
        lr_scheduler_kwargs={"min_lr_rate": cfg.min_lr_ratio}, warmup_steps=warmup_steps_for(cfg.num_steps, cfg.warmup_ratio),
        weight_decay=cfg.weight_decay, adam_beta1=cfg.adam_beta1, adam_beta2=cfg.adam_beta2,
        max_grad_norm=cfg.max_grad_norm, seed=cfg.seed, data_seed=cfg.seed, bf16=bf16, fp16=fp16,
        use_cpu=on_cpu, completion_only_loss=True,
        logging_steps=1, save_strategy="no", eval_strategy="no", report_to="none", disable_tqdm=True,
        dataloader_num_workers=0, gradient_checkpointing=cfg.gradient_checkpointing)


def start(preset: str, overrides: dict[str, Any] | None = None, *, notes: str = "", runs_root: str = "runs",
          attempt_id: str = "") -> tuple[RunConfig, Path]:
    """The notebook's first cell: resolve the config (preset <- overrides), create the attempt."""
    over = dict(overrides or {})
    if notes:
        over["notes"] = notes
    if runs_root != "runs":
        over.setdefault("runs_root", runs_root)
    cfg = make_config(preset, over)
    sft_data_path(cfg)  # fail before the model loads
    return cfg, create_attempt(cfg, attempt_id or None)


def run_sft(cfg: RunConfig, run_dir: str | Path | None = None, *, write=print) -> dict[str, Any]:
    """One SFT attempt: eval -> SFTTrainer -> eval -> adapter/ (or model/ when lora_rank is 0) and
    summary.json; returns the summary (its ``next`` says how an RL attempt starts from it)."""
    _, SFTTrainer, _ = _trl()

    torch.manual_seed(cfg.seed)
    task = build_task(cfg.task, eval_size=cfg.eval_size, **cfg.task_args)
    rows = load_sft_rows(sft_data_path(cfg), task)
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
        before = format_eval(engine, tok, task, task.eval, cfg, 0, run_dir, precision)
        logger.log(before)
        write(f"[sft] before: held-out {before[ACC_KEY]:.2f} ({precision}), format compliance "
              f"{before[FORMAT_KEY]:.0%} on {len(task.eval)} problems; {len(rows)} SFT rows from {cfg.sft_data}")
        t1 = time.time()
        with _one_process_env():
            args = sft_config(cfg, run_dir, amp == torch.bfloat16, fp16=amp == torch.float16,
                              on_cpu=device.type == "cpu")
            trainer = SFTTrainer(model=model, args=args,
                                 train_dataset=to_dataset(rows, task.system_prompt), processing_class=tok,
                                 callbacks=[_log_callback(logger, cfg.num_steps, write)])
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
                   "format_threshold": FORMAT_THRESHOLD, "eval_mode": "greedy_pass@1", "eval_dataset": "heldout",
                   "eval_n": len(task.eval), "eval_precision": precision, "sft_rows": len(rows), "output": str(out),
                   "load_seconds": round(load_seconds, 1), "baseline_eval_seconds": round(t1 - t0 - load_seconds, 1),
                   "train_seconds": round(train_seconds, 1),
                   "next": f"rft train -p RL_PRESET {nxt}  (RL from this SFT {'adapter' if cfg.lora_rank else 'model'})"}
        write_json(run_dir / "summary.json", summary)  # before the logger closes: the trackers send its numbers
        if (run_dir / "sft_trainer").is_dir() and not any((run_dir / "sft_trainer").iterdir()):
            (run_dir / "sft_trainer").rmdir()  # TRL's output_dir: nothing is saved there (save_strategy no)
    finally:
        engine.close()
        logger.close()
    write(sft_result_text(summary))
    return summary


def sft_result_text(summary: dict[str, Any]) -> str:
    """Before/after format compliance and held-out accuracy in words, against the 95% threshold."""
    fb, fa, th = summary["format_before"], summary["format_after"], summary["format_threshold"]
    verdict = "meets" if fa >= th else "is still below"
    return (f"[sft] {summary['attempt_id']}: format compliance {fb:.0%} -> {fa:.0%} ({verdict} the {th:.0%} of seed 003 "
            f"section 12); held-out {summary['eval_mode']} ({summary.get('eval_precision', 'precision unrecorded')}) "
            f"{summary['baseline']:.2f} -> {summary['final']:.2f} on "
            f"{summary['eval_n']} problems; {summary['steps']} steps in {summary['train_seconds']:.0f} s.\n"
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
    sets = " ".join("--set " + shlex.quote(f"{k}={v if isinstance(v, str) else json.dumps(v)}") for k, v in
                    (("model", cfg["model"]), ("task", cfg["task"]), ("task_args", cfg.get("task_args", {})), ("sft_data", data)))
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
