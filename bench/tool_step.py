"""A multi-turn GRPO step with a calculator tool: rftlib's Trainer beside TRL 1.16's ``GRPOTrainer(tools=[...])``.

Issue 40 item 8. Two long-lived worker processes, one per side, driven step by step and interleaved (rftlib step,
TRL step, ...): ``--warmup`` steps each, then ``--reps`` measured steps each. Both sides get:
- the same model (the preset's, default calc-cpu's SmolLM2-135M-Instruct) in float32 on CPU, the same torch
  thread count, and the same starting LoRA: ``--adapter`` (an ``rft sft -p sft-calc-cpu`` adapter: the warm
  start that makes the model call its tool; without one both sides start from a fresh LoRA of the preset's
  r/alpha/targets and the untrained model calls in ~1% of episodes, so the step is mostly single-turn);
- the same prompts: the calculator environment's opening messages (rftlib.envs.calculator.CalculatorEnv.reset:
  its system prompt, then the problem) for the multiply task's training problems, in order;
- the same tool: rftlib's calculator (ast-walked arithmetic, no exec); on the TRL side a typed, documented
  function TRL dispatches by name, returning what rftlib's environment returns (the number, or ``error: <why>``);
- B x G from the preset, beta 0, one optimizer step per rollout, temperature and top-p from the preset;
- the same turn limit: rftlib ``max_turns`` model turns; TRL ``max_tool_calling_iterations = max_turns - 1``
  rounds of tool calls (each round one more model turn);
- the same reward: the task's reward of the model's last turn (the tool's output never reaches it).

The token budget is the same on both sides: rftlib's ``max_trajectory_tokens`` and TRL's ``max_completion_length``
both count every token after the prompt, the model's and the tool's.

Not identical, and what each side does about it:
- the chat template: SmolLM2's own renders only ``content``, so TRL's gate (``supports_tool_calling``) refuses
  it. TRL gets :data:`TEMPLATE`, which renders every message as SmolLM2's does and an assistant's ``tool_calls``
  in Qwen's ``<tool_call>`` form, with TRL's ``qwen3_template`` response parser; the worker checks that it
  renders the prompts and a tool turn to the same tokens as SmolLM2's template (what rftlib renders), so both
  sides train on the same token sequences for the same text;
- a malformed call: rftlib answers it with an error message and the episode goes on; TRL's parser falls back to
  "no tool call" and the episode ends (its documented behaviour);
- rows: rftlib leaves out rows whose advantage is 0 (their gradient is exactly 0), TRL runs every row.

Per step, each side reports: wall seconds, rollout seconds (generation + tool calls + reward), update seconds
(the rest: old logprobs, loss, backward, optimizer), peak RSS (each worker resets its peak before a step and
reads VmHWM after it), model tokens trained on, and the tool-call rate (calls per trajectory) and failure rate
(failed calls / calls) as each library counts them. Ratios rftlib/TRL of the medians end the run.

    .venv/bin/python bench/tool_step.py --adapter runs/<rft sft -p sft-calc-cpu attempt>/adapter
    .venv/bin/python bench/tool_step.py --model tiny --reps 1 --warmup 0 -B 2 -G 2   # plumbing only
Needs the bench extra (trl==1.16.0): pip install -e ".[bench]".
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grpo_step import (REPO_ROOT, Worker, _emit, _reset_peak, _set_threads, _status_mb,  # noqa: E402
                       timed, torch_equal, trl_driver)

TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') }}"
    "{% if message.tool_calls %}{% for tc in message.tool_calls %}"
    "{% set f = tc.function if tc.function is defined else tc %}"
    "{{ '<tool_call>\\n{\"name\": \"' + f.name + '\", \"arguments\": ' + (f.arguments | tojson) + '}\\n</tool_call>' }}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""SmolLM2-135M-Instruct's chat template (its ``chat_template.jinja``: ``<|im_start|>role\\ncontent<|im_end|>\\n``,
a default system turn when there is none) plus an assistant's ``tool_calls`` in Qwen's form, which TRL's
``supports_tool_calling`` gate needs to see rendered; the model's own turns are never re-rendered (TRL keeps
their ids), so only the prompts and tool turns go through it, and the worker checks those render as SmolLM2's
template renders them"""

PHASES = ("rollout", "update")


def _config(args):
    from rftlib.config import make_config
    over = {"dtype": "float32", "autocast": "none", "beta": 0.0, "num_steps": args.warmup + args.reps,
            "eval_steps": 0, "save_steps": 0, "seed": 0, "log_samples": 0}
    if args.model:
        over["model"] = args.model
    if args.adapter:
        over["init_adapter"] = str(Path(args.adapter).resolve())
    for k in ("rollout_batch_size", "n_samples_per_prompt", "max_trajectory_tokens"):
        if getattr(args, k) is not None:
            over[k] = getattr(args, k)
    cfg = make_config(args.preset)
    rows = over.get("rollout_batch_size", cfg.rollout_batch_size) * over.get("n_samples_per_prompt",
                                                                             cfg.n_samples_per_prompt)
    if rows % cfg.micro_batch_size:  # a smaller B x G than the preset's: one micro-batch of all rows
        over["micro_batch_size"] = rows
    return make_config(args.preset, over)


def _prompts(cfg, task, n: int) -> list[list[dict]]:
    """The calculator environment's opening messages for the first ``n`` training problems (what rftlib's source
    renders as each episode's prompt)."""
    from rftlib.envs.base import make_env
    return [make_env(cfg.env, task, **cfg.env_args).reset(ex, 0) for ex in task.train[:n]]


# ---- workers ------------------------------------------------------------------------------------
def worker_rftlib(args) -> None:
    """rftlib's Trainer on the preset (env calculator: the multi_turn source); one step per 'go' line."""
    sys.path.insert(0, str(REPO_ROOT))
    _set_threads(args.threads)
    from rftlib.train.loop import Trainer

    cfg = _config(args)
    tr = Trainer(cfg, run_dir=tempfile.mkdtemp(prefix="bench-tools-rft-"), progress=False)
    before = {n: p.detach().clone() for n, p in tr.model.named_parameters() if p.requires_grad}
    _emit({"ready": True})
    for line in sys.stdin:
        if line.strip() != "go":
            break
        base = _reset_peak()
        t = time.perf_counter()
        row = tr.step()
        wall = time.perf_counter() - t
        changed = sum(int(not torch_equal(p, before[n])) for n, p in tr.model.named_parameters() if n in before)
        rollout = row.get("timing/generate", 0.0) + row.get("timing/reward", 0.0)
        calls = row.get("tool_calls", 0.0)
        n_rows = cfg.rollout_batch_size * cfg.n_samples_per_prompt
        _emit({"wall": wall, "rollout": rollout, "update": wall - rollout, "peak_mb": _status_mb("VmHWM"),
               "base_mb": base, "model_tokens": row.get("tokens/model", 0.0) * n_rows, "rows": n_rows,
               "turns": row.get("turns", 1.0), "call_rate": calls,
               "failure_rate": (1.0 - row.get("tool_ok", 0.0) / calls) if calls else 0.0,
               "reward": row.get("reward_mean", 0.0), "params_changed": changed})


def worker_trl(args) -> None:
    """TRL's GRPOTrainer(tools=[calculator]) on the same model, adapter, prompts and limits; a callback holds each
    optimizer step until a 'go' line arrives on stdin and reports the step when it ends."""
    sys.path.insert(0, str(REPO_ROOT))
    _set_threads(args.threads)
    import torch
    from datasets import Dataset
    from peft import LoraConfig, PeftModel
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import is_chat_template_prefix_preserving, qwen3_template, supports_tool_calling

    from rftlib.data.base import build_task
    from rftlib.envs.calculator import CalcError, evaluate, format_number
    from rftlib.envs.chat import render_ids
    from rftlib.models.loading import load_model_and_tokenizer

    cfg = _config(args)
    task = build_task(cfg.task, eval_size=cfg.eval_size, **cfg.task_args)
    model, tok = load_model_and_tokenizer(cfg.model, "float32")
    B, G, mb = cfg.rollout_batch_size, cfg.n_samples_per_prompt, cfg.micro_batch_size  # rftlib checked mb | B*G
    n_prompts = min(len(task.train), 512)
    prompts = _prompts(cfg, task, n_prompts)

    # the template TRL needs, checked against the model's own on what it will render
    own = [render_ids(tok, m, add_generation_prompt=True) for m in prompts[:16]]
    tool_turn = prompts[0] + [{"role": "assistant", "content": "x"}, {"role": "tool", "name": "calculator",
                                                                     "content": "56088"}]
    own_tool = render_ids(tok, tool_turn, add_generation_prompt=True)
    tok.chat_template = TEMPLATE
    mine = [render_ids(tok, m, add_generation_prompt=True) for m in prompts[:16]]
    if mine != own or render_ids(tok, tool_turn, add_generation_prompt=True) != own_tool:
        raise SystemExit("bench/tool_step.py: TEMPLATE does not render this model's prompts or tool turns as its own "
                         f"chat template does ({cfg.model}); the two sides would not see the same tokens")
    tok.response_template = qwen3_template
    if not (supports_tool_calling(tok) and is_chat_template_prefix_preserving(tok)):
        raise SystemExit("bench/tool_step.py: TRL refuses TEMPLATE (supports_tool_calling / prefix-preserving)")
    prompt_len = statistics.median(len(x) for x in own)
    budget = cfg.max_trajectory_tokens or cfg.max_new_tokens  # rftlib's rule (settings.max_trajectory_tokens)

    def calculator(expression: str) -> str:
        """
        Evaluates an arithmetic expression with + - * / // % ** and parentheses.

        Args:
            expression: The arithmetic expression, for example "123 * 456".

        Returns:
            The result, or "error: <why>".
        """
        try:
            return format_number(evaluate(expression))
        except CalcError as e:
            return f"error: {e}"

    def reward(prompts, completions, ex_idx, **kw):  # the task's reward of the model's last turn
        out = []
        for c, i in zip(completions, ex_idx):
            last = next((m.get("content") or "" for m in reversed(c) if m.get("role") == "assistant"), "")
            out.append(float(task.reward(last, task.train[i], False)[0]))
        return out

    ds = Dataset.from_list([{"prompt": m, "ex_idx": i} for i, m in enumerate(prompts)])
    if args.adapter:
        model = PeftModel.from_pretrained(model, str(Path(args.adapter).resolve()), is_trainable=True)
        peft = None
    else:
        peft = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                          target_modules=list(cfg.lora_target_modules), task_type="CAUSAL_LM")
    targs = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="bench-tools-trl-"), use_cpu=True, bf16=False, fp16=False,
        gradient_checkpointing=False, per_device_train_batch_size=mb, gradient_accumulation_steps=B * G // mb,
        num_generations=G, max_completion_length=budget, max_tool_calling_iterations=cfg.max_turns - 1,
        generation_kwargs={"top_k": 0}, temperature=cfg.temperature, top_p=cfg.top_p, beta=0.0, num_iterations=1,
        loss_type="grpo", learning_rate=cfg.lr, lr_scheduler_type="constant", warmup_steps=0,
        max_grad_norm=cfg.max_grad_norm, weight_decay=cfg.weight_decay, adam_beta1=cfg.adam_beta1,
        adam_beta2=cfg.adam_beta2, max_steps=args.warmup + args.reps, logging_steps=1, save_strategy="no",
        report_to="none", disable_tqdm=True, dataloader_num_workers=0, seed=cfg.seed, log_completions=False)
    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=targs, train_dataset=ds, processing_class=tok,
                          peft_config=peft, tools=[calculator])
    torch.set_num_threads(args.threads)  # accelerate may have set its own
    acc = {"score": 0.0, "rollout": 0.0, "model_tokens": 0.0, "rows": 0}

    def count(out):  # the model tokens TRL trains on: completion mask x tool mask (tool tokens masked out)
        m = out["completion_mask"] * out["tool_mask"] if out.get("tool_mask") is not None else out["completion_mask"]
        acc["model_tokens"] += float(m.sum())
        acc["rows"] += int(m.shape[0])

    trainer._generate = timed(acc, "rollout", trainer._generate)  # generation, the tool loop, the rewards' inputs
    trainer._calculate_rewards = timed(acc, "rollout", trainer._calculate_rewards)
    trainer._generate_and_score_completions = timed(acc, "score", trainer._generate_and_score_completions, count)

    def last_metric(key: str) -> float:
        vals = getattr(trainer, "_metrics", {}).get("train", {}).get(key) or [0.0]
        return float(vals[-1])

    def report(wall: float, base_mb: float, changed: int) -> dict:
        return {"wall": wall, "rollout": acc["rollout"], "update": wall - acc["rollout"],
                "peak_mb": _status_mb("VmHWM"), "base_mb": base_mb, "model_tokens": acc["model_tokens"],
                "rows": acc["rows"], "turns": float("nan"), "call_rate": last_metric("tools/call_frequency"),
                "failure_rate": last_metric("tools/failure_frequency"), "reward": last_metric("reward"),
                "params_changed": changed}

    trainer.add_callback(trl_driver(trainer, acc, args.threads, report))
    _emit({"ready": True, "budget": budget, "prompt_len": prompt_len})
    trainer.train()


# ---- driver -------------------------------------------------------------------------------------
def _argv(args) -> list[str]:
    """A worker's arguments: the driver's settings it must share."""
    argv = ["--preset", args.preset, "--threads", str(args.threads), "--reps", str(args.reps), "--warmup",
            str(args.warmup)]
    for flag, v in (("--model", args.model), ("--adapter", args.adapter), ("-B", args.rollout_batch_size),
                    ("-G", args.n_samples_per_prompt), ("--max-trajectory-tokens", args.max_trajectory_tokens)):
        if v is not None:
            argv += [flag, str(v)]
    return argv


def run(args) -> dict:
    cfg = _config(args)
    B, G = cfg.rollout_batch_size, cfg.n_samples_per_prompt
    print(f"model={cfg.model} env={cfg.env} B={B} G={G} max_turns={cfg.max_turns} max_trajectory_tokens="
          f"{cfg.max_trajectory_tokens} adapter={args.adapter or '(fresh LoRA)'} beta=0 threads={args.threads} fp32 "
          f"CPU; warm-up {args.warmup}, reps {args.reps}, interleaved", flush=True)
    workers, steps = {}, {s: [] for s in ("rftlib", "trl")}
    try:
        for side in steps:
            workers[side] = Worker(side, _argv(args), threads=args.threads, script=__file__)
        print(f"TRL: max_completion_length {workers['trl'].info['budget']} (rftlib's max_trajectory_tokens); median "
              f"prompt {workers['trl'].info['prompt_len']:.0f} tokens", flush=True)
        for i in range(args.warmup + args.reps):
            for side, w in workers.items():
                r = w.step()
                r["warmup"] = i < args.warmup
                steps[side].append(r)
                print(f"  step {i} {side:6s} {r['wall']:7.2f} s (rollout {r['rollout']:6.2f}, update "
                      f"{r['update']:6.2f})  model tokens {r['model_tokens']:.0f} in {r['rows']} rows  tool calls "
                      f"{r['call_rate']:.2f}/trajectory, failed {r['failure_rate']:.0%}  reward {r['reward']:.2f}  "
                      f"peak RSS {r['peak_mb']:.0f} MiB  LoRA tensors changed {r['params_changed']}"
                      f"{'  (warm-up)' if r['warmup'] else ''}", flush=True)
    finally:
        for w in workers.values():
            w.close()
    res = {"config": {"B": B, "G": G, "max_turns": cfg.max_turns, "budget": cfg.max_trajectory_tokens}, "sides": {}}
    print(f"{'':8s}{'step s':>9s}" + "".join(f"{p + ' s':>12s}" for p in PHASES)
          + f"{'peak RSS':>10s}{'model tok':>10s}{'calls/traj':>11s}{'failed':>8s}")
    for side in workers:
        meas = [r for r in steps[side] if not r["warmup"]]
        med = {k: statistics.median(r[k] for r in meas)
               for k in ("wall", *PHASES, "peak_mb", "model_tokens", "call_rate", "failure_rate")}
        res["sides"][side] = {"median": med, "steps": steps[side]}
        print(f"{side:8s}{med['wall']:9.2f}" + "".join(f"{med[p]:12.2f}" for p in PHASES)
              + f"{med['peak_mb']:9.0f}M{med['model_tokens']:10.0f}{med['call_rate']:11.2f}{med['failure_rate']:8.0%}")
    a, b = res["sides"]["rftlib"]["median"], res["sides"]["trl"]["median"]
    res["ratios"] = {k: a[k] / b[k] if b[k] else float("nan") for k in ("wall", *PHASES, "peak_mb")}
    res["ratios"]["seconds_per_model_token"] = ((a["wall"] / a["model_tokens"]) / (b["wall"] / b["model_tokens"])
                                                if a["model_tokens"] and b["model_tokens"] else float("nan"))
    print("ratios rftlib/TRL (median): " + "  ".join(f"{'step' if k == 'wall' else k} {v:.2f}"
                                                     for k, v in res["ratios"].items()))
    return res


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="calc-cpu", help="params/ preset (a tool environment's: env calculator)")
    p.add_argument("--model", default=None, help="override the preset's model (tiny: plumbing only)")
    p.add_argument("--adapter", default=None, help="the LoRA both sides start from (rft sft -p sft-calc-cpu's)")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    p.add_argument("-B", dest="rollout_batch_size", type=int, default=None, help="prompts per step")
    p.add_argument("-G", dest="n_samples_per_prompt", type=int, default=None, help="samples per prompt")
    p.add_argument("--max-trajectory-tokens", dest="max_trajectory_tokens", type=int, default=None,
                   help="the preset's trajectory budget (model and tool tokens after the prompt)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker == "rftlib":
        worker_rftlib(args)
        return {}
    if args.worker == "trl":
        worker_trl(args)
        return {}
    try:
        import trl  # noqa: F401
    except ImportError:
        p.error("trl is not installed: pip install -e '.[bench]' (trl==1.16.0)")
    return run(args)


if __name__ == "__main__":
    main()
