"""``rft train``: one attempt through notebooks/train.ipynb; with ``--nproc N`` (or under torchrun) its ranks."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from papermill.exceptions import PapermillExecutionError

from rftlib.attempts import create_attempt, write_json
from rftlib.cli.common import add_preset_and_sets, config_overrides, parse_sets, report_line, run_notebook
from rftlib.config import ConfigError, make_config
from rftlib.report.live import TextView
from rftlib.train.dist import exit_rank, init_dist, shutdown_dist, started_as_a_rank
from rftlib.train.torchrun import run_ranks
from rftlib.train.loop import Trainer, resume_config
from rftlib.workbench import result_text


def add_arguments(t) -> None:
    add_preset_and_sets(t)
    t.add_argument("--nproc", type=int, default=1,
                   help="ranks on this machine: > 1 starts torchrun (set backend ddp or deepspeed)")
    t.add_argument("--run-dir", default=None, help="an attempt directory made already (what the ranks are given)")
    t.add_argument("--resume", action="store_true", help="with --run-dir: continue from its step_latest")


def run_rank(args) -> int:
    """This process is one rank of a torchrun job: train in-process (no notebook); rank 0 reports."""
    if args.run_dir:  # launched by rft train --nproc / the notebook: the attempt and its config exist
        cfg = resume_config(args.run_dir)
    else:  # torchrun -m rftlib.cli train -p PRESET --set ...: rank 0 creates the attempt
        cfg = make_config(args.preset, config_overrides(parse_sets(args.set)))
    dist = init_dist(cfg)
    callbacks = []
    if dist.is_main:
        callbacks.append(TextView(cfg, every=1, write=print, health=False).update)
    t0 = time.time()
    trainer = Trainer(cfg, args.run_dir, resume=args.resume, progress=False, callbacks=callbacks, dist=dist)
    t1 = time.time()
    try:
        summary = trainer.train()
    finally:
        trainer.close()
    if dist.is_main:
        summary.update(load_seconds=round(t1 - t0, 1), train_seconds=round(time.time() - t1, 1))
        write_json(trainer.run_dir / "summary.json", summary)
        print(f"[rft] {trainer.run_dir}: " + result_text(summary))
    shutdown_dist()
    return 0


def run(args) -> int:
    if started_as_a_rank():
        exit_rank(run_rank(args))  # a rank process: skip the teardown that can abort (see exit_rank)
    if args.nproc > 1 or args.run_dir:
        if args.run_dir:
            run_dir = Path(args.run_dir)
        else:
            run_dir = create_attempt(make_config(args.preset, config_overrides(parse_sets(args.set))))
        return run_ranks(run_dir, args.nproc, resume=args.resume)

    params = {"preset": args.preset, **parse_sets(args.set)}
    try:
        run_dir, summary = run_notebook(params)
    except PapermillExecutionError as e:
        if e.ename != ConfigError.__name__:
            raise
        # a refusal in the kernel (the LR preflight, a bad combination): its message, not papermill's traceback
        print(f"rft: error: {e.evalue}", file=sys.stderr)
        return 2
    print(f"[rft] {run_dir}: " + result_text(summary))
    if line := report_line(run_dir):
        print(line)
    return 0
