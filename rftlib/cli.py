"""``rft``: the notebook verbs from a shell.

    rft demo                               the embedded default, via notebooks/train.ipynb + papermill
    rft train [-p default] [--set k=v ...] one attempt through the notebook (headless); writes its report
    rft train --nproc 2 -p P --set backend=ddp   2 ranks under torchrun (ddp or deepspeed)
    torchrun --nproc_per_node N [--nnodes ...] -m rftlib.cli train -p P ...   the same, multi-node
    rft resume RUN_DIR --additional-steps K
    rft preflight [-p preset] [--set k=v]  the LR schedule of a config, then its memory (GPU, load, host RAM)
    rft validate [-p seed002-...-cpu]      seed 002's loop validation through notebooks/validate.ipynb
    rft eval RUN_DIR [--limit N]           every checkpoint of an attempt, "final" included (resumable)
    rft report RUN_DIR [--baseline DIR]    notebooks/analysis.ipynb for the attempt -> reports/<id>.html
    rft compare RUN_A RUN_B [...]          notebooks/compare.ipynb -> reports/compare-<A>-vs-<B>.html
    rft ab -p P --vary policy_loss=ppo_clip,gspo,cispo [--set k=v]   one attempt per value, then compare
    rft index [--runs runs] [--out reports] reports/index.html, rebuilt from the run directories
    rft note RUN_DIR "text" [--no-report]  append a dated conclusion to an attempt; its report and the index show it
    rft sft [-p sft-arithmetic-boxed] [--set k=v]  SFT (TRL SFTTrainer + LoRA) via notebooks/sft.ipynb -> adapter/ for init_adapter
    rft launch -p P [--set k=v] [--dry-run]   a detached multi-process attempt (trainer ranks + vLLM engines)
    rft launch --resume RUN_DIR            relaunch a stopped/crashed attempt from its step_latest
    rft attach RUN_DIR                     stream a launched attempt's progress (Ctrl-C detaches)
    rft stop RUN_DIR [--timeout S]         checkpoint and stop it (terminates what is left after S;
                                           default: twice its longest step + eval, at least 300 s)
    rft status [--runs runs]               attempts with step, reward, held-out, health, state; GPUs
    rft smoke [--model M] [--lines single,zero3,vllm]   one step per set-up (GPU, else CPU forms): run it first

Attempts go to ``<project root>/runs/`` (or ``$RFTLIB_RUNS``, or ``--set runs_root=...``; a relative
path is from the project root), whatever the working directory: the same rule as a notebook's kernel
(rftlib.attempts.runs_root). Reports go to ``reports/`` beside the runs root unless ``--out`` (or
``$RFTLIB_REPORTS``) says otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from papermill.exceptions import PapermillExecutionError

from rftlib.ab import parse_vary, run_ab
from rftlib.attempts import (AttemptLockedError, claim_attempt_dir, create_attempt, ensure_unlocked, run_dir_path,
                             runs_root as resolve_runs, write_json)
from rftlib.config import ConfigError, make_config, value_from_text
from rftlib.launch.plan import LaunchError
from rftlib.launch.status import attach, status_text
from rftlib.launch.supervise import launch, stop
from rftlib.preflight.memory import memory_preflight_text
from rftlib.report import publish, register_tasks
from rftlib.report.attempt import add_note, list_attempts
from rftlib.report.checkpoints import eval_checkpoints
from rftlib.report.compare import load_all, summary_text
from rftlib.report.index import reports_dir_for, write_index
from rftlib.report.live import TextView
from rftlib.report.publish import write_compare, write_report
from rftlib.report.templates import NOTEBOOK_PARAMS
from rftlib.sft import check_sft_data, sft_result_text
from rftlib.smoke import LINES, run_smoke, table, verdict
from rftlib.train.dist import exit_rank, init_dist, shutdown_dist
from rftlib.train.launch import run_ranks
from rftlib.train.loop import Trainer, lr_schedule_preview, resume_config
from rftlib.workbench import lr_preflight, result_text

REPO = Path(__file__).resolve().parent.parent
TRAIN_NB = REPO / "notebooks" / "train.ipynb"
DEMO_GOAL_POINTS = 15.0  # the demo's goal: +15 points of held-out accuracy ...
DEMO_GOAL_MINUTES = 10.0  # ... within 10 minutes of training on the 2-core machine


def _parse_sets(items: list[str]) -> dict[str, Any]:
    """NAME=VALUE pairs, each value typed as the field wants (rftlib.config.value_from_text)."""
    out = {}
    for it in items:
        if "=" not in it:
            raise SystemExit(f"--set expects NAME=VALUE, got {it!r}")
        k, v = it.split("=", 1)
        out[k.strip()] = value_from_text(k.strip(), v)
    return out


def config_overrides(params: dict[str, Any]) -> dict[str, Any]:
    """The RunConfig fields among ``--set`` values: train.ipynb's own parameters (NOTEBOOK_PARAMS: preset,
    skip_preflight, nproc, ...) go to the notebook, not the config, so ``--set skip_preflight=True`` (the LR
    preflight's advice) works from the shell as it does in the notebook and with papermill's ``-p``."""
    return {k: v for k, v in params.items() if k not in NOTEBOOK_PARAMS}


def run_notebook(parameters: dict[str, Any], *, runs_root: str | None = None) -> tuple[Path, dict]:
    """Execute notebooks/train.ipynb with papermill into the attempt's run directory."""
    params = dict(parameters)
    params.setdefault("live_view", False)
    if params.get("resume"):
        run_dir = run_dir_path(params["resume"])
        params["resume"] = str(run_dir)
        out_nb = run_dir / f"notebook-resume-{time.strftime('%Y%m%d-%H%M%S')}.ipynb"
    else:
        # resolve now (fails fast on a bad parameter, before a kernel starts) to name the run dir
        cfg = make_config(params.get("preset", "default"), config_overrides(params))
        root = resolve_runs(runs_root or cfg.runs_root)
        params["runs_root"] = str(root)  # the kernel resolves the same root (explicit beats $RFTLIB_RUNS)
        if params.get("attempt_id"):
            run_dir = root / params["attempt_id"]
            run_dir.mkdir(parents=True, exist_ok=False)
        else:  # the next number, this process's alone (two rft train at once get two directories)
            run_dir = claim_attempt_dir(root, cfg.name)
            params["attempt_id"] = run_dir.name
        out_nb = run_dir / "notebook.ipynb"
    with headless_env():
        publish.run_papermill(TRAIN_NB, out_nb, params, log_output=True, stdout_file=sys.stdout,
                              stderr_file=sys.stderr)
    summary = json.loads((run_dir / "summary.json").read_text())
    return run_dir, summary


def headless_env():
    """RFTLIB_HEADLESS=1 for the kernels papermill starts from here: the notebook takes the text path
    (one line per step, static figures) without having to guess (rftlib.workbench.headless_kernel)."""

    @contextlib.contextmanager
    def _env():
        old = os.environ.get("RFTLIB_HEADLESS")
        os.environ["RFTLIB_HEADLESS"] = "1"
        try:
            yield
        finally:
            if old is None:
                os.environ.pop("RFTLIB_HEADLESS", None)
            else:
                os.environ["RFTLIB_HEADLESS"] = old

    return _env()


def cmd_demo(args) -> int:
    t = time.time()
    print("[rft demo] GRPO on SmolLM2-135M-Instruct (embedded), arithmetic task, preset params/default.yaml,"
          " via papermill notebooks/train.ipynb", flush=True)
    run_dir, summary = run_notebook({"preset": "default", **_parse_sets(args.set)})
    print(f"\n[rft demo] attempt {run_dir.name} ({time.time() - t:.0f} s wall in all, model load included)")
    print(f"[rft demo] executed notebook: {run_dir / 'notebook.ipynb'}")
    print(f"[rft demo] metrics: {run_dir / 'logs' / 'metrics.jsonl'}")
    print("[rft demo] " + result_text(summary, DEMO_GOAL_POINTS, DEMO_GOAL_MINUTES))
    samples = sorted((run_dir / "logs" / "samples").glob("*.jsonl"))
    print(f"[rft demo] sample completions: {len(samples)} file(s) in {run_dir / 'logs' / 'samples'}")
    return 0


def _report_line(run_dir: Path) -> str:
    html = reports_dir_for(run_dir.resolve().parent) / f"{run_dir.name}.html"
    return f"[rft] report: {html}" if html.exists() else ""


def _under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or ("LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ)


def cmd_train_rank(args) -> int:
    """This process is one rank of a torchrun job: train in-process (no notebook); rank 0 reports."""
    if args.run_dir:  # launched by rft train --nproc / the notebook: the attempt and its config exist
        cfg = resume_config(args.run_dir)
    else:  # torchrun -m rftlib.cli train -p PRESET --set ...: rank 0 creates the attempt
        cfg = make_config(args.preset, config_overrides(_parse_sets(args.set)))
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


def cmd_train(args) -> int:
    if _under_torchrun():
        exit_rank(cmd_train_rank(args))  # a rank process: skip the teardown that can abort (see exit_rank)
    if args.nproc > 1 or args.run_dir:
        if args.run_dir:
            run_dir = Path(args.run_dir)
        else:
            run_dir = create_attempt(make_config(args.preset, config_overrides(_parse_sets(args.set))))
        return run_ranks(run_dir, args.nproc, resume=args.resume)
    params = {"preset": args.preset, **_parse_sets(args.set)}
    try:
        run_dir, summary = run_notebook(params)
    except PapermillExecutionError as e:
        if e.ename != ConfigError.__name__:
            raise
        # a refusal in the kernel (the LR preflight, a bad combination): its message, not papermill's traceback
        print(f"rft: error: {e.evalue}", file=sys.stderr)
        return 2
    print(f"[rft] {run_dir}: " + result_text(summary))
    if line := _report_line(run_dir):
        print(line)
    return 0


def cmd_resume(args) -> int:
    try:
        ensure_unlocked(run_dir_path(args.run_dir))  # say so before a kernel starts
        run_dir, summary = run_notebook({"resume": str(args.run_dir), "additional_steps": args.additional_steps})
    except (AttemptLockedError, PapermillExecutionError) as e:
        # refused before a kernel started, or by the kernel's Trainer (another one took the attempt in between)
        if isinstance(e, PapermillExecutionError) and e.ename != AttemptLockedError.__name__:
            raise
        print(f"rft: error: {e if isinstance(e, AttemptLockedError) else e.evalue}", file=sys.stderr)
        return 2
    print(f"[rft] {run_dir}: " + result_text(summary))
    if line := _report_line(run_dir):
        print(line)
    return 0


def cmd_validate(args) -> int:
    """notebooks/validate.ipynb under papermill; the executed notebook lands in the attempt's run dir."""
    register_tasks()
    sets = _parse_sets(args.set)
    cfg = make_config(args.preset, sets)  # fails fast, before a kernel starts
    root = resolve_runs(sets.get("runs_root") or cfg.runs_root)
    attempt_id = claim_attempt_dir(root, cfg.name).name
    named = ("model", "task", "num_steps", "notes")  # the notebook's own parameters; every other --set is an override
    params = {"preset": args.preset, "runs_root": str(root), "attempt_id": attempt_id,
              **{k: v for k, v in sets.items() if k in named},
              "overrides": {k: v for k, v in sets.items() if k not in named and k != "runs_root"}}
    if args.control_steps is not None:
        params["control_steps"] = args.control_steps
    out_nb = root / attempt_id / "notebook.ipynb"
    try:
        with headless_env():
            publish.run_papermill(publish.NOTEBOOKS / "validate.ipynb", out_nb, params, log_output=True,
                                  stdout_file=sys.stdout, stderr_file=sys.stderr)
    finally:
        print(f"[rft] executed notebook: {out_nb}")
    if not args.no_report:  # the executed validation notebook is this attempt's report

        out = Path(args.out) if args.out else reports_dir_for(root)
        html = publish.to_html(out_nb, out / f"{attempt_id}.html", title=f"{attempt_id} loop validation")
        write_index(root, out)
        print(f"[rft] report: {html}")
    return 0


def cmd_eval(args) -> int:
    res = eval_checkpoints(args.run_dir, limit=args.limit, max_new_tokens=args.max_new_tokens,
                           batch_size=args.batch_size, recompute=args.recompute)
    for s, d in res.items():
        print(f"[rft] step {s}{' (final)' if d.get('final') else ''}: {d['mode']} {d[d['mode']]:.3f} "
              f"({d.get('precision', 'precision unrecorded')}) on {d['n_problems']} problems -> eval/ckpt_step_{s}.json")
    return 0 if res else 1


def cmd_report(args) -> int:
    for run_dir in args.run_dir:
        print(f"[rft] report: {write_report(run_dir, args.out, baseline_attempt=args.baseline)}")
    return 0


def cmd_compare(args) -> int:
    print(summary_text(load_all(args.run_dirs)))
    print(f"[rft] comparison: {write_compare(args.run_dirs, args.out)}")
    return 0


def cmd_ab(args) -> int:
    """One attempt per variant (same preset, same seed), then the compare notebook over them."""
    def train(params: dict[str, Any]) -> Path:
        run_dir, summary = run_notebook(params)
        print(f"[rft ab] {run_dir}: " + result_text(summary), flush=True)
        return run_dir

    def compare(run_dirs: list) -> Path:
        print(summary_text(load_all(run_dirs)))
        html = write_compare(run_dirs, args.out)
        print(f"[rft ab] comparison: {html}")
        return html

    _, html, failed = run_ab(args.preset, _parse_sets(args.set), parse_vary(args.vary), train=train,
                             compare=compare, write=lambda s: print(s, flush=True))
    return 0 if html is not None and not failed else 1


def cmd_index(args) -> int:
    runs = resolve_runs(args.runs)
    path = write_index(runs, args.out, baseline=args.baseline)
    print(f"[rft] index of {len(list_attempts(runs))} attempt(s) in {runs}: {path}")
    return 0


def cmd_sft(args) -> int:
    """notebooks/sft.ipynb under papermill into a new attempt directory; prints before/after and the next step."""
    sets = _parse_sets(args.set)
    cfg = make_config(args.preset, sets)
    check_sft_data(cfg)  # fails fast (the file, held-out problems, prompt forms), before a kernel starts
    root = resolve_runs(cfg.runs_root)
    attempt_id = claim_attempt_dir(root, cfg.name).name
    out_nb = root / attempt_id / "notebook.ipynb"
    params = {"preset": args.preset, "overrides": {k: v for k, v in sets.items() if k != "runs_root"},
              "runs_root": str(root), "attempt_id": attempt_id}
    with headless_env():
        publish.run_papermill(REPO / "notebooks" / "sft.ipynb", out_nb, params, log_output=True,
                              stdout_file=sys.stdout, stderr_file=sys.stderr)
    print(sft_result_text(json.loads((root / attempt_id / "summary.json").read_text())))
    if line := _report_line(root / attempt_id):
        print(line)
    return 0


def cmd_note(args) -> int:
    """Append the conclusion, then rebuild the index (and the attempt's report when it has one)."""
    run_dir = run_dir_path(args.run_dir)
    note = add_note(run_dir, args.text)
    print(f"[rft] note {note['date']} -> {run_dir / 'notes.jsonl'}")
    out = Path(args.out) if args.out else reports_dir_for(run_dir.parent)
    if not args.no_report and (out / f"{run_dir.name}.html").exists():
        print(f"[rft] report: {write_report(run_dir, out)}")
    else:
        print(f"[rft] index: {write_index(run_dir.parent, out)}")
    return 0


def cmd_preflight(args) -> int:
    cfg = make_config(args.preset, _parse_sets(args.set))
    lrs = lr_schedule_preview(cfg)
    print(f"{len(lrs)} optimizer steps; lr {cfg.lr:g}, warmup_ratio {cfg.warmup_ratio}, min_lr_ratio {cfg.min_lr_ratio}")
    print("  step k = the k-th optimizer step, as the trainer logs it (step 1 trains at the warmup's LR 0)")
    for i in sorted(i for i in {0, 1, 2, len(lrs) // 4, len(lrs) // 2, 3 * len(lrs) // 4, len(lrs) - 1}
                    if 0 <= i < len(lrs)):
        print(f"  step {i + 1:5d}  lr {lrs[i]:.3e}  ({100 * lrs[i] / cfg.lr:5.1f}% of target)")

    pre = lr_preflight(cfg)
    print(f"  preflight: {pre.verdict.upper()} - {pre.message}")

    print(memory_preflight_text(cfg))
    return 0


def cmd_launch(args) -> int:
    try:
        launch(args.preset, _parse_sets(args.set), resume=args.resume, dry_run=args.dry_run,
               machine_gpus=args.machine_gpus)
    except LaunchError as e:
        print(f"rft launch: refused: {e}", file=sys.stderr)
        return 2
    return 0


def cmd_attach(args) -> int:
    st = attach(args.run_dir, timeout=args.timeout)
    return 1 if st.get("state") in ("crashed", "killed") else 0


def cmd_stop(args) -> int:
    st = stop(args.run_dir, timeout=args.timeout)
    return 0 if st.get("state") in ("stopped", "finished") else 1


def cmd_status(args) -> int:
    print(status_text(args.runs))
    return 0


def cmd_smoke(args) -> int:
    """One step per set-up (bf16 single GPU, ZeRO-3 one rank, TP-1 vLLM server + LoRA sync + probe), then the table."""
    lines = tuple(x.strip() for x in args.lines.split(",") if x.strip())
    if bad := [x for x in lines if x not in LINES]:
        raise ValueError(f"--lines {','.join(bad)}: choose from {','.join(LINES)}")
    rows = run_smoke(lines, model=args.model, runs_root=args.runs_root, timeout=args.timeout)
    print(table(rows))
    ok = verdict(rows)
    print(f"[rft smoke] {'PASS' if ok else 'FAIL'}"
          + ("" if any(r.status == "not run" for r in rows) is False else "; the GPU lines were not run (no CUDA GPU)"))
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="rft", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="the embedded default run (README's first command)")
    d.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    t = sub.add_parser("train", help="one attempt through notebooks/train.ipynb")
    t.add_argument("-p", "--preset", default="default")
    t.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    t.add_argument("--nproc", type=int, default=1,
                   help="ranks on this machine: > 1 starts torchrun (set backend ddp or deepspeed)")
    t.add_argument("--run-dir", default=None, help="an attempt directory made already (what the ranks are given)")
    t.add_argument("--resume", action="store_true", help="with --run-dir: continue from its step_latest")
    r = sub.add_parser("resume", help="continue an attempt from step_latest")
    r.add_argument("run_dir")
    r.add_argument("--additional-steps", type=int, required=True)
    f = sub.add_parser("preflight", help="print a config's LR schedule")
    f.add_argument("-p", "--preset", default="default")
    f.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    v = sub.add_parser("validate", help="seed 002's loop validation through notebooks/validate.ipynb")
    v.add_argument("-p", "--preset", default="seed002-fizzbuzz-rtx3080-cpu")
    v.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="model, task, num_steps, notes or runs_root")
    v.add_argument("--control-steps", type=int, default=None)
    v.add_argument("--out", default=None, help="reports directory (default: reports/ beside the runs root)")
    v.add_argument("--no-report", action="store_true", help="skip reports/<attempt-id>.html and the index")
    e = sub.add_parser("eval", help="evaluate every checkpoint of an attempt (eval/ckpt_step_N.json)")
    e.add_argument("run_dir")
    e.add_argument("--limit", type=int, default=None, help="only the first N held-out problems")
    e.add_argument("--max-new-tokens", type=int, default=None)
    e.add_argument("--batch-size", type=int, default=None)
    e.add_argument("--recompute", action="store_true", help="ignore results already in eval/")
    rp = sub.add_parser("report", help="an attempt's HTML report via notebooks/analysis.ipynb")
    rp.add_argument("run_dir", nargs="+")
    rp.add_argument("--baseline", default=None, help="a run directory to diff the config against")
    rp.add_argument("--out", default=None, help="reports directory (default: reports/ beside the runs root)")
    c = sub.add_parser("compare", help="A/B report of two or more attempts via notebooks/compare.ipynb")
    c.add_argument("run_dirs", nargs="+")
    c.add_argument("--out", default=None)
    ab = sub.add_parser("ab", help="A/B of variants: one attempt per --vary value, then the compare report")
    ab.add_argument("-p", "--preset", default="default")
    ab.add_argument("--vary", action="append", default=[], metavar="NAME=V1,V2[,...]",
                    help="a RunConfig field and its values (baseline first); several --vary take the product")
    ab.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="the same for every variant")
    ab.add_argument("--out", default=None, help="reports directory (default: reports/ beside the runs root)")
    i = sub.add_parser("index", help="reports/index.html from the run directories")
    i.add_argument("--runs", default=None, help="runs root (default: $RFTLIB_RUNS, else <project root>/runs)")
    i.add_argument("--out", default=None, help="default: reports/ beside --runs")
    i.add_argument("--baseline", default=None, help="attempt id the config differences are taken against")
    sf = sub.add_parser("sft", help="SFT stage (TRL SFTTrainer + LoRA) through notebooks/sft.ipynb: an adapter for init_adapter")
    sf.add_argument("-p", "--preset", default="sft-arithmetic-boxed")
    sf.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    no = sub.add_parser("note", help="append a dated conclusion (lessons learned, next step) to an attempt")
    no.add_argument("run_dir", help="the attempt's run directory (e.g. runs/attempt-03-default)")
    no.add_argument("text", help="what the attempt taught you and what to try next")
    no.add_argument("--out", default=None, help="reports directory (default: reports/ beside the runs root)")
    no.add_argument("--no-report", action="store_true", help="only rebuild the index, not the attempt's report")
    la = sub.add_parser("launch", help="start an attempt detached: trainer ranks and vLLM engines (plan.json)")
    la.add_argument("-p", "--preset", default="default")
    la.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    la.add_argument("--resume", default=None, metavar="RUN_DIR", help="relaunch this attempt from its step_latest")
    la.add_argument("--dry-run", action="store_true", help="print the GPU map and the commands; start nothing")
    la.add_argument("--machine-gpus", type=int, default=None, help="GPUs to assume on this machine (default: detect)")
    at = sub.add_parser("attach", help="stream a launched attempt's progress; Ctrl-C detaches, never stops")
    at.add_argument("run_dir")
    at.add_argument("--timeout", type=float, default=None, help="detach after this many seconds")
    so = sub.add_parser("stop", help="stop a launched attempt cleanly (checkpoint first)")
    so.add_argument("run_dir")
    so.add_argument("--timeout", type=float, default=None,
                    help="seconds to wait before terminating what is left (default: twice the attempt's longest "
                         "step + eval, at least 300)")
    st = sub.add_parser("status", help="running and finished attempts at a glance, and the GPUs")
    st.add_argument("--runs", default=None, help="runs root (default: $RFTLIB_RUNS, else <project root>/runs)")
    sm = sub.add_parser("smoke", help="one step per set-up (GPU forms, else CPU forms) and a pass/fail table: run it first")
    sm.add_argument("--model", default="smollm2-135m", help="the model every line trains (tiny: the test's quick form)")
    sm.add_argument("--lines", default="single,zero3,vllm", help="which lines, comma-separated")
    sm.add_argument("--runs-root", default=None, help="where the lines' attempts go (default: <runs root>/smoke)")
    sm.add_argument("--timeout", type=float, default=480, help="seconds one line may take")
    args = p.parse_args(argv)

    verbs = {"demo": cmd_demo, "train": cmd_train, "resume": cmd_resume, "preflight": cmd_preflight,
             "validate": cmd_validate, "eval": cmd_eval, "report": cmd_report, "compare": cmd_compare,
             "ab": cmd_ab, "note": cmd_note, "sft": cmd_sft,
             "index": cmd_index, "launch": cmd_launch, "attach": cmd_attach, "stop": cmd_stop,
             "status": cmd_status, "smoke": cmd_smoke}
    try:
        return verbs[args.cmd](args)
    except (ConfigError, FileNotFoundError, ValueError) as e:
        print(f"rft: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
