"""One GRPO step through rftlib's Trainer and through TRL's GRPOTrainer, same configuration, same run.

Mode ``step`` (default): two long-lived worker processes, one per side, driven step by step and
interleaved (rftlib step, TRL step, rftlib step, ...): a warm-up step each, then ``--reps`` measured
steps each. Both sides get the same model (``--model``, default the embedded SmolLM2-135M-Instruct
that rftlib resolves; ``tiny`` for the tiny random model), the arithmetic task's chat-formatted
prompts, B x G and LoRA (r, alpha, target modules) from the preset, beta 0, one optimizer step per
rollout (TRL: num_iterations 1, steps_per_generation = gradient_accumulation_steps), fp32 on CPU,
the same torch thread count, and completions forced to max_new_tokens on both sides
(min_new_tokens = max_new_tokens: rftlib's sampling config is patched in its worker, TRL gets it
through generation_kwargs), so both generate and train on exactly B*G*max_new_tokens completion tokens.
Not the same update work, though: rftlib leaves out rows whose advantage is 0 (skip_zero_advantage_rows:
their gradient is exactly 0), TRL runs every row, so rftlib's update seconds follow how many groups
had a reward spread that step (24/64 rows at one step, 40/64 two steps later, as the policy learns).
Each step's line says how many rows the update ran and its seconds per row: compare steps (and sides)
per row, not per step (bench/long_run_flat.py: per row the update is flat over a 50-step run).

Phases. rftlib: the ``timing/*`` keys its Trainer returns per step (generate, reward, reference,
update). TRL: its own methods are wrapped: ``_generate`` (generation), ``_calculate_rewards``
(reward), the rest of ``_generate_and_score_completions`` (tokenising, old/reference logprobs if
any, advantages: "reference" column), and update = step wall time - _generate_and_score_completions
(compute_loss, backward, optimizer step). Peak RSS: each worker resets its peak before each step
(/proc/self/clear_refs "5") and reads VmHWM after it; printed as the step's peak and its rise above
the resident size when the step began.

Mode ``update``: the update alone on a large vocabulary: a random-initialised 2-layer Qwen2 (hidden
256) with Qwen's 151,936-token vocabulary, the same token ids, advantages and LoRA; rftlib's forward
(completion_logprobs: chunked LM head) + grpo_loss + backward vs TRL's compute_loss + backward, each
in a fresh process: peak RSS above the resident size after a warm-up, and seconds.

Efficiency (machine-independent figures). A GEMM benchmark in the same run (torch.matmul, fp32, the
same threads, shapes like the model's: (B*G*(P+T)/4, H) x (H, I)) gives the machine's matmul FLOP/s;
a large tensor copy gives its memory bandwidth (read + write bytes / s).
  update model FLOPs = 2*N*tok (forward) + 2*N*tok (backward through the activations; the frozen
      weights get no gradient) + 4*N_lora*tok (LoRA weight gradients and their input gradients, ~)
      where N = the matmul parameters of the base model (every Linear incl. the LM head; not the
      embedding lookup), N_lora the LoRA parameters, tok = the real (unpadded) prompt + completion
      tokens the update ran forward and backward (rftlib leaves out rows whose advantage is 0: they
      are not counted, since their FLOPs are not spent), plus 2*N per token of any forward-only pass
      inside the update. Attention's T^2 terms and any recompute are left out (model FLOPs, not
      hardware FLOPs), so padding and recompute count as inefficiency.
  update efficiency = update model FLOPs / update seconds / GEMM FLOP/s.
  generation: each decode step reads every weight once (fp32: 4 bytes x all parameters); decode
      bytes/s = max_new_tokens * weight bytes / generation seconds, against the copy bandwidth; and
      its FLOPs (2 * N * rows per decode step) against the GEMM figure -- whichever bound is nearer
      is the one that limits it.

    .venv/bin/python bench/grpo_step.py                      # embedded default, reps 3
    .venv/bin/python bench/grpo_step.py --model tiny --reps 1
    .venv/bin/python bench/grpo_step.py --mode update
Needs the bench extra (trl==1.16.0): pip install -e ".[bench]".
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_logprobs import _reset_peak_rss, _status_mb, child_env  # noqa: E402  (one peak-RSS reader for bench/)

RESULT = "@@RESULT "  # worker stdout lines carrying a JSON result (libraries print to stdout too)


# ---- memory -------------------------------------------------------------------------------------
def _reset_peak() -> float:
    """Reset VmHWM to the current RSS (Linux >= 4.0) and return that RSS in MiB."""
    _reset_peak_rss()
    return _status_mb("VmRSS") or 0.0


# ---- shared set-up ------------------------------------------------------------------------------
def _config(args):
    from rftlib.config import make_config
    over = {"dtype": "float32", "autocast": "none", "beta": 0.0, "num_steps": args.warmup + args.reps,
            "eval_steps": 0, "save_steps": 0, "seed": 0}
    if args.model:
        over["model"] = args.model
    for k in ("rollout_batch_size", "n_samples_per_prompt", "max_new_tokens", "micro_batch_size"):
        if getattr(args, k) is not None:
            over[k] = getattr(args, k)
    return make_config(args.preset, over)


def _emit(obj: dict) -> None:
    print(RESULT + json.dumps(obj), flush=True)


def _set_threads(n: int) -> None:
    import torch
    torch.set_num_threads(n)
    torch.set_num_interop_threads(1)


def _weights_info(model) -> dict:
    """Parameter counts: all (weight bytes read per decode step), matmul (Linear incl. LM head), LoRA."""
    import torch
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    seen, total, matmul, lora = set(), 0, 0, 0
    for name, p in base.named_parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel()
        if "lora_" in name:
            lora += p.numel()
    for name, m in base.named_modules():
        if isinstance(m, torch.nn.Linear) and "lora_" not in name:
            matmul += m.weight.numel()
    out_emb = base.get_output_embeddings()
    if out_emb is not None and not any(n.endswith("lm_head") for n, _ in base.named_modules()):
        matmul += out_emb.weight.numel()
    c = base.config
    return {"params": total - lora, "matmul_params": matmul, "lora_params": lora, "hidden": c.hidden_size,
            "intermediate": getattr(c, "intermediate_size", 4 * c.hidden_size)}


# ---- step-mode workers --------------------------------------------------------------------------
def worker_rftlib(args) -> None:
    """Build rftlib's Trainer, then run one step per 'go' line on stdin, reporting each."""
    sys.path.insert(0, str(REPO_ROOT))
    _set_threads(args.threads)
    import torch

    import rftlib.rollout.hf as hf
    from rftlib.train.loop import Trainer

    orig = hf.sampling_config

    def forced(**kw):  # completions forced to max_new_tokens: EOS suppressed until then
        c = orig(**kw)
        c.min_new_tokens = kw["max_new_tokens"]
        return c

    hf.sampling_config = forced
    cfg = _config(args)
    tr = Trainer(cfg, run_dir=tempfile.mkdtemp(prefix="bench-rft-"), progress=False)
    seen = {}

    def observe(phase, seconds, res):  # the trainer's phases (rftlib.train.phases), as they end
        if phase == "advantages":  # the update's batch; (N, T) loss mask: the tokens trained on
            seen.update(tokens=float(res.loss_mask.sum()), prompt_tokens=float(res.rollout.prompt_mask.sum()),
                        rows=int(res.rollout.num_rows), fb_tokens=0.0, f_tokens=0.0, fb_rows=0)
        elif phase == "forward" and "fb_tokens" in seen:  # the forwards of the update (it runs next): the real
            # tokens each runs, with grad (fwd+bwd) or without (fwd); the no-grad reference/old passes came before
            seen["fb_tokens" if res.grad else "f_tokens"] += res.tokens
            seen["fb_rows"] += int(res.rows["prompt_mask"].shape[0]) if res.grad else 0

    tr.hooks.append(observe)
    before = {n: p.detach().clone() for n, p in tr.model.named_parameters() if p.requires_grad}
    _emit({"ready": True, **_weights_info(tr.model), "load_s": tr.load_seconds})
    for line in sys.stdin:
        if line.strip() != "go":
            break
        base = _reset_peak()
        t = time.perf_counter()
        row = tr.step()
        wall = time.perf_counter() - t
        changed = sum(int(not torch_equal(p, before[n])) for n, p in tr.model.named_parameters() if n in before)
        _emit({"wall": wall, "generate": row.get("timing/generate", 0.0), "reward": row.get("timing/reward", 0.0),
               "reference": row.get("timing/reference", 0.0), "update": row.get("timing/update", 0.0),
               "peak_mb": _status_mb("VmHWM"), "base_mb": base, "tokens": seen["tokens"],
               "prompt_tokens": seen["prompt_tokens"], "rows": seen["rows"], "params_changed": changed,
               "fb_tokens": seen["fb_tokens"], "f_tokens": seen["f_tokens"], "fb_rows": seen["fb_rows"]})


def timed(acc: dict, name: str, fn, after=None):
    """``fn`` wrapped to add its seconds to ``acc[name]`` at each call (then ``after(result)``, if given): how a
    TRL worker times the trainer's own methods."""
    def wrapper(*a, **kw):
        t = time.perf_counter()
        out = fn(*a, **kw)
        acc[name] += time.perf_counter() - t
        if after:
            after(out)
        return out
    return wrapper


def trl_driver(trainer, acc: dict, threads: int, report):
    """A TrainerCallback that holds each of ``trainer``'s optimizer steps until a 'go' line arrives on stdin (any
    other line ends the worker), zeroes ``acc``, the thread count and the peak RSS before the step, and emits
    ``report(wall seconds, RSS at its start in MiB, LoRA tensors changed since the start)`` after it."""
    import torch
    from transformers import TrainerCallback

    state = {}
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}

    class Driver(TrainerCallback):
        def on_step_begin(self, a, s, c, **kw):
            if sys.stdin.readline().strip() != "go":
                raise SystemExit(0)
            for k in acc:
                acc[k] = 0
            torch.set_num_threads(threads)  # accelerate may have set its own
            state["base"] = _reset_peak()
            state["t"] = time.perf_counter()

        def on_step_end(self, a, s, c, **kw):
            wall = time.perf_counter() - state["t"]
            changed = sum(int(not torch_equal(p, before[n])) for n, p in trainer.model.named_parameters()
                          if n in before)
            _emit(report(wall, state["base"], changed))

    return Driver()


def torch_equal(a, b) -> bool:
    import torch
    return bool(torch.equal(a.detach(), b))


def worker_trl(args) -> None:
    """Build TRL's GRPOTrainer on the same model, prompts and LoRA; a callback holds each optimizer
    step until a 'go' line arrives on stdin and reports the step when it ends."""
    sys.path.insert(0, str(REPO_ROOT))
    _set_threads(args.threads)
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    from rftlib.data.base import build_task
    from rftlib.eval import format_prompts
    from rftlib.models.loading import load_model_and_tokenizer

    cfg = _config(args)
    task = build_task(cfg.task, eval_size=cfg.eval_size, **cfg.task_args)
    model, tok = load_model_and_tokenizer(cfg.model, "float32")
    B, G, L, mb = cfg.rollout_batch_size, cfg.n_samples_per_prompt, cfg.max_new_tokens, cfg.micro_batch_size
    if (B * G) % mb:
        raise SystemExit(f"B*G={B * G} must be a multiple of micro_batch_size={mb}")
    n_prompts = min(len(task.train), 512)
    texts = format_prompts(tok, task.train[:n_prompts], task.system_prompt)
    ds = Dataset.from_dict({"prompt": texts, "ex_idx": list(range(n_prompts))})

    def reward(prompts, completions, ex_idx, **kw):  # the task's own reward, as rftlib scores it
        # truncated=True: forced to max_new_tokens, no completion ends in EOS (rftlib's engine says the same)
        return [float(task.reward(c, task.train[i], True)[0]) for c, i in zip(completions, ex_idx)]

    targs = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="bench-trl-"), use_cpu=True, bf16=False, fp16=False,
        per_device_train_batch_size=mb, gradient_accumulation_steps=B * G // mb, num_generations=G,
        max_completion_length=L, generation_kwargs={"min_new_tokens": L, "top_k": 0},
        temperature=cfg.temperature, top_p=cfg.top_p, beta=0.0, num_iterations=1, loss_type="grpo",
        learning_rate=cfg.lr, lr_scheduler_type="constant", warmup_steps=0, max_grad_norm=cfg.max_grad_norm,
        weight_decay=cfg.weight_decay, adam_beta1=cfg.adam_beta1, adam_beta2=cfg.adam_beta2,
        max_steps=args.warmup + args.reps, logging_steps=1, save_strategy="no", report_to="none",
        disable_tqdm=True, dataloader_num_workers=0, seed=cfg.seed, log_completions=False)
    peft = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                      target_modules=list(cfg.lora_target_modules), task_type="CAUSAL_LM")
    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=targs, train_dataset=ds,
                          processing_class=tok, peft_config=peft)
    torch.set_num_threads(args.threads)  # accelerate may have set its own
    acc = {"generate": 0.0, "reward": 0.0, "score": 0.0, "tokens": 0.0, "prompt_tokens": 0.0, "rows": 0}

    def count(out):  # the tokens TRL trains on this step: its completion mask (no truncation mask)
        acc["tokens"] += float(out["completion_mask"].sum())
        acc["prompt_tokens"] += float(out["prompt_mask"].sum())
        acc["rows"] += int(out["completion_mask"].shape[0])

    trainer._generate = timed(acc, "generate", trainer._generate)
    trainer._calculate_rewards = timed(acc, "reward", trainer._calculate_rewards)
    trainer._generate_and_score_completions = timed(acc, "score", trainer._generate_and_score_completions, count)

    def report(wall: float, base_mb: float, changed: int) -> dict:
        return {"wall": wall, "generate": acc["generate"], "reward": acc["reward"],
                "reference": acc["score"] - acc["generate"] - acc["reward"], "update": wall - acc["score"],
                "peak_mb": _status_mb("VmHWM"), "base_mb": base_mb, "tokens": acc["tokens"],
                "prompt_tokens": acc["prompt_tokens"], "rows": acc["rows"], "params_changed": changed,
                "fb_tokens": acc["tokens"] + acc["prompt_tokens"], "f_tokens": 0.0, "fb_rows": acc["rows"]}

    trainer.add_callback(trl_driver(trainer, acc, args.threads, report))
    _emit({"ready": True, **_weights_info(trainer.model), "load_s": 0.0})
    trainer.train()


# ---- machine figures ----------------------------------------------------------------------------
def machine_figures(threads: int, m: int, k: int, n: int) -> dict:
    """Measured fp32 matmul FLOP/s for (m, k) x (k, n) and copy bandwidth (bytes read + written / s)."""
    import torch
    _set_threads(threads)
    a, b = torch.randn(m, k), torch.randn(k, n)
    for _ in range(2):
        a @ b
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    flops = 2.0 * m * k * n / best
    x = torch.randn(64 * 2**20)  # 256 MiB fp32, far above any cache
    y = torch.empty_like(x)
    y.copy_(x)
    bw = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        y.copy_(x)
        bw = min(bw, time.perf_counter() - t)
    return {"gemm_flops": flops, "gemm_shape": [m, k, n], "copy_bytes_s": 2 * x.numel() * 4 / bw}


# ---- step-mode driver ---------------------------------------------------------------------------
def _step_argv(args) -> list[str]:
    """A step-mode worker's arguments: the driver's settings it must share."""
    argv = ["--preset", args.preset, "--threads", str(args.threads), "--reps", str(args.reps),
            "--warmup", str(args.warmup)]
    for k in ("model", "rollout_batch_size", "n_samples_per_prompt", "max_new_tokens", "micro_batch_size"):
        if getattr(args, k) is not None:
            argv += [f"--{k.replace('_', '-')}", str(getattr(args, k))]
    return argv


class Worker:
    """One side's long-lived worker process, ``SCRIPT --worker SIDE ARGV...``, driven one step per 'go' line on
    its stdin; every answer is a RESULT line on its stdout (its first: what it built). bench/tool_step.py drives
    its workers with it too (``script``)."""

    def __init__(self, side: str, argv: list[str], *, threads: int, script: str | Path = __file__):
        cmd = [sys.executable, str(Path(script).resolve()), "--worker", side, *argv]
        env = child_env(OMP_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false")
        self.side = side
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT,
                                  env=env)
        self.info = self._read()

    def _read(self) -> dict:
        for line in self.p.stdout:
            if line.startswith(RESULT):
                return json.loads(line[len(RESULT):])
        raise RuntimeError(f"{self.side} worker exited (rc {self.p.wait()}) without a result; its stderr is above")

    def step(self) -> dict:
        self.p.stdin.write("go\n")
        self.p.stdin.flush()
        return self._read()

    def close(self) -> None:
        try:
            self.p.stdin.close()
        except OSError:
            pass
        try:
            self.p.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.p.kill()


PHASES = ("generate", "reward", "reference", "update")


def run_steps(args) -> dict:
    cfg = _config(args)
    B, G, L = cfg.rollout_batch_size, cfg.n_samples_per_prompt, cfg.max_new_tokens
    print(f"model={cfg.model} B={B} G={G} max_new_tokens=min_new_tokens={L} micro_batch={cfg.micro_batch_size} "
          f"LoRA r={cfg.lora_rank} alpha={cfg.lora_alpha} {','.join(cfg.lora_target_modules)} beta=0 "
          f"threads={args.threads} fp32 CPU; warm-up {args.warmup}, reps {args.reps}, interleaved", flush=True)
    workers = {}
    steps = {s: [] for s in ("rftlib", "trl")}
    try:
        for side in steps:
            workers[side] = Worker(side, _step_argv(args), threads=args.threads)
        for i in range(args.warmup + args.reps):
            for side, w in workers.items():
                r = w.step()
                r["warmup"] = i < args.warmup
                steps[side].append(r)
                print(f"  step {i} {side:6s} {r['wall']:7.2f} s  tokens {r['tokens']:.0f}  update ran {r['fb_rows']}/"
                      f"{r['rows']} rows ({1e3 * r['update'] / max(r['fb_rows'], 1):.0f} ms/row)  "
                      f"peak RSS {r['peak_mb']:.0f} MiB  LoRA tensors changed {r['params_changed']}{'  (warm-up)' if r['warmup'] else ''}", flush=True)
    finally:
        for w in workers.values():
            w.close()
    mach = machine_figures(args.threads, max(256, B * G * 16), workers["rftlib"].info["hidden"],
                           workers["rftlib"].info["intermediate"])
    res = {"config": {"B": B, "G": G, "L": L}, "machine": mach, "sides": {}}
    print(f"machine: fp32 GEMM {mach['gemm_flops'] / 1e9:.1f} GFLOP/s {tuple(mach['gemm_shape'])}, "
          f"copy bandwidth {mach['copy_bytes_s'] / 1e9:.1f} GB/s (threads={args.threads})")
    print(f"{'':8s}{'step s':>9s}" + "".join(f"{p + ' s':>12s}" for p in PHASES)
          + f"{'peak RSS':>10s}{'rise':>8s}{'tokens':>8s}{'upd tok':>8s}{'upd eff':>9s}{'gen BW':>8s}{'gen FLOP':>9s}")
    for side, w in workers.items():
        meas = [r for r in steps[side] if not r["warmup"]]
        med = {k: statistics.median(r[k] for r in meas) for k in ("wall", *PHASES, "peak_mb")}
        med["rise_mb"] = statistics.median(r["peak_mb"] - r["base_mb"] for r in meas)
        info, last = w.info, meas[-1]
        # the real tokens the update ran: forward + backward (rows skipped for a zero advantage are not
        # run, so not counted) and forward only (an old-logprob pass inside the update, if any)
        fb, f = statistics.median(r["fb_tokens"] for r in meas), statistics.median(r["f_tokens"] for r in meas)
        upd_flops = 4.0 * info["matmul_params"] * fb + 2.0 * info["matmul_params"] * f + 4.0 * info["lora_params"] * fb
        med["update_tokens"] = fb + f
        med["update_eff"] = upd_flops / med["update"] / mach["gemm_flops"]
        gen_bytes = L * 4.0 * info["params"]  # every weight read once per decode step
        med["gen_bw_frac"] = gen_bytes / med["generate"] / mach["copy_bytes_s"]
        med["gen_flop_frac"] = 2.0 * info["matmul_params"] * last["rows"] * L / med["generate"] / mach["gemm_flops"]
        med["tokens"], med["params_changed"] = last["tokens"], last["params_changed"]
        res["sides"][side] = {"median": med, "steps": steps[side], "info": info}
        print(f"{side:8s}{med['wall']:9.2f}" + "".join(f"{med[p]:12.2f}" for p in PHASES)
              + f"{med['peak_mb']:9.0f}M{med['rise_mb']:7.0f}M{med['tokens']:8.0f}{med['update_tokens']:8.0f}{med['update_eff']:9.1%}"
              f"{med['gen_bw_frac']:8.1%}{med['gen_flop_frac']:9.1%}")
    a, b = res["sides"]["rftlib"]["median"], res["sides"]["trl"]["median"]
    ratios = {k: a[k] / b[k] if b[k] else float("nan") for k in ("wall", *PHASES, "peak_mb")}
    res["ratios"] = ratios
    print("tokens = completion tokens trained on; upd tok = real tokens the update ran (prompt + completion of "
          "the rows it ran); upd eff = update model FLOP/s / GEMM FLOP/s; gen BW = decode weight bytes/s / copy bandwidth; "
          "gen FLOP = decode FLOP/s / GEMM FLOP/s")
    print("ratios rftlib/TRL (median): " + "  ".join(f"{'step' if k == 'wall' else k} {v:.2f}"
                                                     for k, v in ratios.items()))
    return res


# ---- update mode --------------------------------------------------------------------------------
def _qwen_tiny(vocab: int):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(0)
    c = Qwen2Config(vocab_size=vocab, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                    max_position_embeddings=2048)
    return Qwen2ForCausalLM(c).float()


def _update_batch(args):
    import torch
    g = torch.Generator().manual_seed(0)
    N, P, T = args.rows, args.prompt_len, args.completion_len
    prompt_ids = torch.randint(0, args.vocab, (N, P), generator=g)  # (N, P)
    completion_ids = torch.randint(0, args.vocab, (N, T), generator=g)  # (N, T)
    adv = torch.randn(N, generator=g)  # (N,)
    return dict(prompt_ids=prompt_ids, prompt_mask=torch.ones(N, P), completion_ids=completion_ids,
                completion_mask=torch.ones(N, T), advantages=adv)


def worker_update(side: str, args) -> None:
    """One forward + loss + backward on the shared batch; peak RSS rise after a warm-up, seconds."""
    sys.path.insert(0, str(REPO_ROOT))
    _set_threads(args.threads)
    import torch
    model = _qwen_tiny(args.vocab)
    batch = _update_batch(args)
    lora = dict(rank=16, alpha=32, targets=["q_proj", "k_proj", "v_proj", "o_proj"])
    if side == "rftlib":
        from rftlib.algo.losses import grpo_loss
        from rftlib.models.loading import apply_lora
        from rftlib.models.forward import completion_logprobs
        from rftlib.algo.logprobs import auto_chunk_size, recompute_needed
        chunk = args.chunk_size or auto_chunk_size(args.vocab)  # 0: the Trainer's default (logprob_chunk_size 0)
        recompute = recompute_needed(args.rows * args.completion_len, args.vocab, chunk)
        pm = apply_lora(model, rank=lora["rank"], alpha=lora["alpha"], dropout=0.0, target_modules=lora["targets"])
        pm.train()

        def run(b):
            logp, _ = completion_logprobs(pm, b["prompt_ids"], b["prompt_mask"], b["completion_ids"],
                                          b["completion_mask"], chunk_size=chunk, with_entropy=False,
                                          checkpoint_chunks=recompute)  # as the Trainer's logprob_recompute auto
            loss, _ = grpo_loss(logp, logp.detach(), b["advantages"], b["completion_mask"],
                                num_seqs=float(len(b["advantages"])), num_tokens=b["completion_mask"].sum(),
                                norm_const=float(b["completion_mask"].shape[1]))
            loss.backward()
    else:
        from datasets import Dataset
        from peft import LoraConfig
        from transformers import PreTrainedTokenizerFast
        from trl import GRPOConfig, GRPOTrainer
        from tokenizers import Tokenizer, models
        tk = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"<pad>": 0, "<unk>": 1},
                                                                                 unk_token="<unk>")),
                                     pad_token="<pad>", eos_token="<pad>", padding_side="left")
        targs = GRPOConfig(output_dir=tempfile.mkdtemp(prefix="bench-trl-"), use_cpu=True, bf16=False,
                           per_device_train_batch_size=args.rows, num_generations=args.rows,
                           max_completion_length=args.completion_len, beta=0.0, loss_type="grpo",
                           report_to="none", save_strategy="no", disable_tqdm=True)
        peft = LoraConfig(r=lora["rank"], lora_alpha=lora["alpha"], lora_dropout=0.0,
                          target_modules=lora["targets"], task_type="CAUSAL_LM")
        trainer = GRPOTrainer(model=model, reward_funcs=[lambda completions, **k: [0.0] * len(completions)],
                              args=targs, train_dataset=Dataset.from_dict({"prompt": ["a"] * 8}),
                              processing_class=tk, peft_config=peft)
        torch.set_num_threads(args.threads)
        trainer.current_gradient_accumulation_steps = 1  # set by Trainer.train's loop; one micro-batch here
        pm = trainer.model
        pm.train()

        def run(b):
            inputs = {**b, "prompt_mask": b["prompt_mask"].long(), "completion_mask": b["completion_mask"].long(),
                      "num_items_in_batch": b["completion_mask"].sum(), "old_per_token_logps": None,
                      "importance_sampling_ratio": None}
            loss = trainer.compute_loss(pm, inputs)
            loss.backward()
    small = {k: v[:1, :8] if v.dim() == 2 else v[:1] for k, v in batch.items()}
    run(small)  # warm-up: first-call module loads and thread pools are not the memory being compared
    pm.zero_grad(set_to_none=True)
    base = _reset_peak()
    t = time.perf_counter()
    run(batch)
    sec = time.perf_counter() - t
    grads = sum(int(p.grad is not None and bool(p.grad.abs().sum() > 0)) for p in pm.parameters() if p.requires_grad)
    _emit({"side": side, "seconds": sec, "base_mb": base, "peak_mb": _status_mb("VmHWM"),
           "rise_mb": (_status_mb("VmHWM") or 0.0) - base, "params_with_grad": grads})


def run_update(args) -> dict:
    N, P, T, V = args.rows, args.prompt_len, args.completion_len, args.vocab
    print(f"update alone: Qwen2 random init (2 layers, hidden 256, tied), V={V}, {N} rows x ({P} prompt + {T} "
          f"completion) tokens, LoRA r16 attention, fp32, threads={args.threads}; one fp32 (N*T, V) logits "
          f"tensor = {N * T * V * 4 / 2**20:.0f} MiB; each side in a fresh process", flush=True)
    from rftlib.algo.logprobs import auto_chunk_size, recompute_needed
    chunk = args.chunk_size or auto_chunk_size(V)
    print(f"  rftlib LM-head chunk: {chunk} token rows{'' if args.chunk_size else ' (the default: sized from the vocabulary)'}"
          f", recompute in backward: {recompute_needed(N * T, V, chunk)} (logprob_recompute auto)", flush=True)
    out = {}
    for side in ("rftlib", "trl"):
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", f"update-{side}", "--threads",
               str(args.threads), "--rows", str(N), "--prompt-len", str(P), "--completion-len", str(T),
               "--vocab", str(V), "--chunk-size", str(args.chunk_size)]
        env = child_env(OMP_NUM_THREADS=str(args.threads))
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO_ROOT, env=env)
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith(RESULT)]
        if p.returncode or not lines:
            raise RuntimeError(f"update-{side} worker failed (rc {p.returncode}):\n{p.stderr[-3000:]}")
        r = out[side] = json.loads(lines[-1][len(RESULT):])
        print(f"  {side:6s} fwd+loss+bwd {r['seconds']:7.2f} s  peak RSS above baseline {r['rise_mb']:8.0f} MiB "
              f"(baseline {r['base_mb']:.0f}, peak {r['peak_mb']:.0f})  LoRA tensors with grad {r['params_with_grad']}",
              flush=True)
    out["ratios"] = {"seconds": out["rftlib"]["seconds"] / out["trl"]["seconds"],
                     "peak_rise": out["rftlib"]["rise_mb"] / max(out["trl"]["rise_mb"], 1e-9)}
    print(f"ratios rftlib/TRL: seconds {out['ratios']['seconds']:.2f}  peak memory above baseline "
          f"{out['ratios']['peak_rise']:.2f}")
    return out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=["step", "update"], default="step")
    p.add_argument("--preset", default="default", help="params/ preset the configuration comes from")
    p.add_argument("--model", default=None, help="override the preset's model (e.g. tiny)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    p.add_argument("--rollout-batch-size", dest="rollout_batch_size", type=int, default=None, help="B")
    p.add_argument("--n-samples-per-prompt", dest="n_samples_per_prompt", type=int, default=None, help="G")
    p.add_argument("--max-new-tokens", dest="max_new_tokens", type=int, default=None)
    p.add_argument("--micro-batch-size", dest="micro_batch_size", type=int, default=None)
    p.add_argument("--rows", type=int, default=8, help="update mode: rows")
    p.add_argument("--prompt-len", type=int, default=32, help="update mode: prompt tokens per row")
    p.add_argument("--completion-len", type=int, default=128, help="update mode: completion tokens per row")
    p.add_argument("--vocab", type=int, default=151936, help="update mode: vocabulary (Qwen's)")
    p.add_argument("--chunk-size", type=int, default=0,
                   help="update mode: rftlib's LM-head chunk rows (0: the Trainer's default, sized from the vocabulary)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker == "rftlib":
        worker_rftlib(args)
        return {}
    if args.worker == "trl":
        worker_trl(args)
        return {}
    if args.worker in ("update-rftlib", "update-trl"):
        worker_update(args.worker.split("-", 1)[1], args)
        return {}
    try:
        import trl  # noqa: F401
    except ImportError:
        p.error("trl is not installed: pip install -e '.[bench]' (trl==1.16.0)")
    return run_update(args) if args.mode == "update" else run_steps(args)


if __name__ == "__main__":
    main()
