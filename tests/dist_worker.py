"""One training run of the tiny model on a signal that trains, as a standalone script, so the
same run can be compared in one process and under ``torchrun --nproc_per_node 2`` (DDP, ZeRO-3).

Rollouts are made a function of (prompt, step, weights) -- every prompt sampled on its own with a
seed from its text -- so how the prompts are sharded over ranks does not change what is sampled,
and the runs differ only in how the update is computed. Writes result.pt: per-step metrics, the
final trainable weights, the optimizer's Adam moments and (ZeRO-3) each rank's partition sizes.

    python -m torch.distributed.run --nproc_per_node 2 tests/dist_worker.py OUT_DIR --backend ddp

``--plan PLAN.json`` (``{"NAME": [worker arguments], ...}``) makes the runs one after another in this one process
(or torchrun job), each into OUT_DIR/NAME as if started alone: a run costs its steps, not another interpreter,
torch, transformers and DeepSpeed import and rendezvous (issue 41: about 5 s a process, 8 s a 2-rank job, on 2
cores). Every run seeds itself (train.build seeds torch from the config; rollouts are seeded per prompt), so a
run's numbers do not depend on the runs before it.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import json
import sys
from pathlib import Path

import torch

from toy_rewards import letter_a_share  # tests/toy_rewards.py: this script's directory is on sys.path


class PerPromptSeededEngine:
    """The HF engine, one prompt at a time, each seeded from (prompt, call number)."""

    shares_trainer_module = True

    def __init__(self, inner):
        self.inner, self.calls = inner, 0

    def sync_weights(self, model, *args, **kw) -> dict:
        return self.inner.sync_weights(model, *args, **kw)

    def close(self) -> None:
        self.inner.close()

    def generate(self, prompts, *, group_size, max_new_tokens, temperature, top_p=1.0, greedy=False):
        from rftlib.rollout.base import Rollout

        if greedy:
            return self.inner.generate(prompts, group_size=group_size, max_new_tokens=max_new_tokens,
                                       temperature=temperature, top_p=top_p, greedy=True)
        self.calls += 1
        outs = []
        for p in prompts:
            seed = int(hashlib.md5(f"{self.calls}|{p}".encode()).hexdigest()[:8], 16)
            with torch.random.fork_rng():
                torch.manual_seed(seed)
                outs.append(self.inner.generate([p], group_size=group_size, max_new_tokens=max_new_tokens,
                                                temperature=temperature, top_p=top_p))
        P = max(o.prompt_ids.shape[1] for o in outs)
        T = max_new_tokens
        pad = self.inner.tok.pad_token_id

        def left(x, w, v):  # (n, k) -> (n, w), padded on the left
            return torch.nn.functional.pad(x, (w - x.shape[1], 0), value=v)

        def right(x, w, v):
            return torch.nn.functional.pad(x, (0, w - x.shape[1]), value=v)

        return Rollout(prompt_ids=torch.cat([left(o.prompt_ids, P, pad) for o in outs]),
                       prompt_mask=torch.cat([left(o.prompt_mask, P, 0) for o in outs]),
                       completion_ids=torch.cat([right(o.completion_ids, T, pad) for o in outs]),
                       completion_mask=torch.cat([right(o.completion_mask, T, 0) for o in outs]),
                       behaviour_logprobs=torch.cat([right(o.behaviour_logprobs, T, 0) for o in outs]),
                       truncated=torch.cat([o.truncated for o in outs]), texts=[t for o in outs for t in o.texts],
                       group_size=group_size)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--plan", default=None, help="JSON file {name: [worker arguments]}: the runs, one after another")
    ap.add_argument("--backend", default="single")
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--stop-after", type=int, default=None)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--oracle", action="store_true", help="train with tests/sync_oracle.py's synchronous step")
    ap.add_argument("--copy-engine", action="store_true",
                    help="rollout_engine copy (tests/toy_engines.py, off the trainer's module) instead of the seeded HF")
    ap.add_argument("--set", action="append", default=[], help="NAME=VALUE (YAML) overrides")
    a = ap.parse_args(argv)
    from rftlib.train.dist import exit_rank, shutdown_dist

    if a.plan:
        plan = json.loads(Path(a.plan).read_text())
        for name, extra in plan.items():
            run(ap.parse_args([str(Path(a.out) / name), "--backend", a.backend, *extra]))
    else:
        run(a)
    shutdown_dist()
    exit_rank(0)  # skip the interpreter teardown that once aborted a ZeRO-3 rank after its results were written


@functools.cache
def _register_copy_engine_once() -> None:
    """``rollout_engine: copy`` registered once a process: a plan's second copy-engine run finds it there."""
    from toy_engines import register_copy_engine

    register_copy_engine()


def run(a: argparse.Namespace) -> None:
    """One training run as the arguments say; writes OUT/result.pt (rank 0)."""
    import yaml

    from rftlib.config import make_config
    from rftlib.models.tiny import tiny_model_dir  # noqa: F401  (builds it once, before ranks race)
    from rftlib.rollout.hf import HFEngine
    from rftlib.train.build import build_task
    from rftlib.train.dist import init_dist
    from rftlib.train.loop import Trainer

    out = Path(a.out)
    overrides = dict(model=a.model, backend=a.backend, num_steps=a.steps, stop_after_steps=a.stop_after,
                     runs_root=str(out / "runs"), rollout_batch_size=4, n_samples_per_prompt=4, micro_batch_size=2,
                     max_new_tokens=8, eval_steps=0, eval_size=5, save_steps=0, lr=5e-3, warmup_ratio=0.0,
                     autocast="none", name="dist", lora_dropout=0.0, beta=0.0,
                     # several ranks never skip zero-advantage rows (DDP needs the same micro-batches on
                     # every rank); one process would, and its entropy_mean would then cover fewer rows
                     skip_zero_advantage_rows=False)
    overrides.update({k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in a.set)})
    if a.copy_engine:
        _register_copy_engine_once()
        overrides["rollout_engine"] = "copy"
    cfg = make_config("tiny", overrides)
    dist = init_dist(cfg)
    run_dir = out / "runs" / "attempt-01-dist" if a.resume else None  # the first session's attempt
    task = dataclasses.replace(build_task(cfg), reward=letter_a_share)  # the config's task, scored by the test's reward
    tr = Trainer(cfg, run_dir=run_dir, resume=a.resume, progress=False, task=task, dist=dist)
    init = tr.backend.trainable_state()  # the weights before this session's first update (a resume: restored)
    if not a.copy_engine:
        tr.engine = PerPromptSeededEngine(HFEngine(tr.model, tr.tok, amp=None, synced_gpus=tr.engine.synced_gpus))
        if a.resume:
            tr.engine.calls = tr.step_num
    if a.oracle:
        from sync_oracle import synchronous_step

        tr.step = lambda: synchronous_step(tr)
    tr.train()
    weights = tr.backend.trainable_state()  # gathered under ZeRO-3: every rank takes part
    state = {"rows": None, "weights": weights, "init": init, "step": tr.step_num}
    # Adam moments, full: a ZeRO-3 rank holds only its partition of them
    if cfg.backend == "deepspeed":
        opt = tr.backend.engine.optimizer
        local = sum(p.ds_tensor.numel() for p in tr.model.parameters() if hasattr(p, "ds_tensor"))
        full = sum(p.ds_numel for p in tr.model.parameters() if hasattr(p, "ds_numel"))
        state["partition"] = dist.gather_objects((local, full))
        # which parameters ZeRO-3 releases after each use (gathered again on the next) rather than keeping
        # whole: those above stage3_param_persistence_threshold elements (DeepSpeed's default 1e5)
        state["persistence_threshold"] = tr.backend.engine.zero_param_persistence_threshold()
        state["released"] = {n: p.ds_numel for n, p in tr.model.named_parameters()
                             if hasattr(p, "ds_persist") and not p.ds_persist}
        sd = opt.state_dict()
        state["adam_local"] = {k: v for k, v in sd.items() if k in ("optimizer_state_dict",)}
    else:
        state["adam"] = {i: {k: v.detach().cpu().clone() for k, v in s.items() if torch.is_tensor(v)}
                         for i, s in tr.optimizer.state_dict()["state"].items()}
    if dist.is_main:
        from rftlib.monitor.metrics import read_metrics

        state["rows"] = read_metrics(tr.run_dir)
        state["run_dir"] = str(tr.run_dir)
        torch.save(state, out / "result.pt")
    tr.close()


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    main()
