"""``rft replay RUN --step N [--set k=v ...] [--vary k=v1,v2]``: replay a recorded step's update (issue 33).

Runs the trainer's own update again on the recorded batch from the weights it started from, checks that it
reproduces the recorded logprobs, losses and grad norms (bit for bit in the recorded environment), and runs each
counterfactual loss on the same weights and rows (rftlib.train.replay). ``--set`` gathers one counterfactual
(several settings at once); ``--vary NAME=V1,V2`` adds one counterfactual per value. In another environment
(threads, CPU kernels, device) the recorded configuration runs first as the control: refused when its logprobs
are further from the record than this precision's noise allows, else every counterfactual is read as its
difference from it. Exit codes: 0 faithful, 3 not reproduced (or the weights are not the update's), 2 refused,
4 controlled or not checked (no bit-for-bit equality claimed), 1 the replay's ranks crashed.
"""

from __future__ import annotations

import argparse
import json
import sys

from rftlib.attempts import existing_attempt
from rftlib.monitor.records import list_records
from rftlib.report.replay_views import replay_and_refresh
from rftlib.train.replay import (ReplayCrash, ReplayError, ReplayMismatch, format_control, format_table, parse_overrides,
                                 rank_worker)


def add_arguments(p) -> None:
    p.add_argument("run_dir", help="the attempt directory (or its name under the runs root)")
    p.add_argument("--step", type=int, default=None, help="the recorded step (default: the latest recorded)")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="one counterfactual of these loss settings together (repeatable)")
    p.add_argument("--vary", action="append", default=[], metavar="NAME=V1,V2",
                   help="one counterfactual per value (repeatable)")
    p.add_argument("--weights", default="auto", help="auto (snapshot, else the step-before checkpoint), snapshot, "
                                                      "or ckpt:M (a checkpoint by step, checked like the others)")
    p.add_argument("--nproc", type=int, default=None, help="ranks (default: as recorded)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--rank-worker", default=None, help=argparse_hidden())
    p.add_argument("--cf-json", action="append", default=[], help=argparse_hidden())


def argparse_hidden():
    return argparse.SUPPRESS


def counterfactuals(sets: list[str], vary: list[str]) -> list[dict]:
    """--set items -> one dict; each --vary NAME=V1,V2 -> one dict per value."""
    out = [parse_overrides(sets)] if sets else []
    for it in vary:
        if "=" not in it:
            raise ReplayError(f"--vary {it!r}: expected NAME=V1,V2")
        name, vals = it.split("=", 1)
        for v in (x.strip() for x in vals.split(",") if x.strip()):
            out.append(parse_overrides([f"{name.strip()}={v}"]))
    return out


def run(args) -> int:
    try:
        run_dir = existing_attempt(args.run_dir)
    except FileNotFoundError as e:
        print(f"rft replay: {e}", file=sys.stderr)
        return 2
    if args.rank_worker:
        rank_worker(str(run_dir), args.step, args.weights, [json.loads(c) for c in args.cf_json], args.rank_worker)
        return 0
    step = args.step
    if step is None:
        have = list_records(run_dir)
        if not have:
            print(f"rft replay: {run_dir} has no recorded step (records/ is empty; record_batches sets which steps "
                  f"are recorded)", file=sys.stderr)
            return 2
        step = have[-1]
    try:
        res = replay_and_refresh(run_dir, step, counterfactuals(args.set, args.vary), weights=args.weights,
                                 nproc=args.nproc)
    except ReplayMismatch as e:
        print(f"rft replay: {e}", file=sys.stderr)
        return 3
    except (ReplayError, FileNotFoundError, ValueError) as e:
        print(f"rft replay: {e}", file=sys.stderr)
        return 2
    except ReplayCrash as e:
        print(f"rft replay: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(res.to_json(), indent=1, default=str))
    else:
        print(f"step {res.step} of {run_dir.name}, weights: {res.weights}")
        print(res.verdict)
        for n in res.notes:
            print(f"note: {n}")
        if res.control is not None:
            print(format_control(res))
        print(format_table(res))
        print(f"written: {res.path}")
    return 0 if res.faithful else (4 if res.faithful is None else 3)
