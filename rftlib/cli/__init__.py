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
    rft replay RUN_DIR --step N [--vary policy_loss=gspo,cispo] [--set k=v]   a recorded step's update again
    rft smoke [--model M] [--lines single,zero3,vllm]   one step per set-up (GPU, else CPU forms): run it first

Attempts go to ``<project root>/runs/`` (or ``$RFTLIB_RUNS``, or ``--set runs_root=...``; a relative
path is from the project root), whatever the working directory: the same rule as a notebook's kernel
(rftlib.attempts.runs_root). Reports go to ``reports/`` beside the runs root unless ``--out`` (or
``$RFTLIB_REPORTS``) says otherwise.

Each verb is a module of this package (``add_arguments(parser)``, ``run(args) -> exit code``), listed once
in ``VERBS``; ``rft --help`` prints the table without importing any of them and ``main`` imports only the
verb asked for, so ``rft status`` or ``rft note`` answer without torch, papermill or an engine loading.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from rftlib.config import ConfigError  # torch-free (tests/test_config_light.py)

VERBS: dict[str, tuple[str, str]] = {
    "demo": ("rftlib.cli.demo", "the embedded default run (README's first command)"),
    "train": ("rftlib.cli.train", "one attempt through notebooks/train.ipynb"),
    "resume": ("rftlib.cli.resume", "continue an attempt from step_latest"),
    "preflight": ("rftlib.cli.preflight", "print a config's LR schedule"),
    "validate": ("rftlib.cli.validate", "seed 002's loop validation through notebooks/validate.ipynb"),
    "eval": ("rftlib.cli.eval", "evaluate every checkpoint of an attempt (eval/ckpt_step_N.json)"),
    "report": ("rftlib.cli.report", "an attempt's HTML report via notebooks/analysis.ipynb"),
    "compare": ("rftlib.cli.compare", "A/B report of two or more attempts via notebooks/compare.ipynb"),
    "ab": ("rftlib.cli.ab", "A/B of variants: one attempt per --vary value, then the compare report"),
    "index": ("rftlib.cli.index", "reports/index.html from the run directories"),
    "sft": ("rftlib.cli.sft", "SFT stage (TRL SFTTrainer + LoRA) through notebooks/sft.ipynb: an adapter for init_adapter"),
    "note": ("rftlib.cli.note", "append a dated conclusion (lessons learned, next step) to an attempt"),
    "launch": ("rftlib.cli.launch", "start an attempt detached: trainer ranks and vLLM engines (plan.json)"),
    "attach": ("rftlib.cli.attach", "stream a launched attempt's progress; Ctrl-C detaches, never stops"),
    "stop": ("rftlib.cli.stop", "stop an attempt cleanly (checkpoint first): launched, rft train or a notebook"),
    "status": ("rftlib.cli.status", "running and finished attempts at a glance, and the GPUs"),
    "replay": ("rftlib.cli.replay", "replay a recorded step's update, and under other losses (records/step_N)"),
    "smoke": ("rftlib.cli.smoke", "one step per set-up (GPU forms, else CPU forms) and a pass/fail table: run it first"),
}
"""verb -> (the module holding its parser and handler: ``add_arguments(parser)``, ``run(args)``, its one-line help)"""


def verb_module(verb: str):
    """The module of ``verb`` (its add_arguments and run), imported now."""
    return importlib.import_module(VERBS[verb][0])


def _chosen(argv: list[str]) -> str | None:
    """The verb in ``argv``: its first word that is not an option (rft takes no options before the verb)."""
    return next((a for a in argv if not a.startswith("-")), None)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    p = argparse.ArgumentParser(prog="rft", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    parsers = {verb: sub.add_parser(verb, help=help_) for verb, (_, help_) in VERBS.items()}
    verb = _chosen(argv)
    module = verb_module(verb) if verb in VERBS else None
    if module is not None:
        module.add_arguments(parsers[verb])
    args = p.parse_args(argv)
    try:
        return module.run(args)
    except (ConfigError, FileNotFoundError, ValueError) as e:
        print(f"rft: error: {e}", file=sys.stderr)
        return 2
