"""``rft launch -p P [--set k=v] [--dry-run]`` / ``rft launch --resume RUN_DIR``: a detached multi-process attempt
(trainer ranks + vLLM engines)."""

from __future__ import annotations

import sys

from rftlib.cli.common import add_preset_and_sets, parse_sets
from rftlib.launch.plan import LaunchError
from rftlib.launch.supervise import launch


def add_arguments(la) -> None:
    add_preset_and_sets(la)
    la.add_argument("--resume", default=None, metavar="RUN_DIR", help="relaunch this attempt from its step_latest")
    la.add_argument("--dry-run", action="store_true", help="print the GPU map and the commands; start nothing")
    la.add_argument("--machine-gpus", type=int, default=None, help="GPUs to assume on this machine (default: detect)")


def run(args) -> int:
    try:
        launch(args.preset, parse_sets(args.set), resume=args.resume, dry_run=args.dry_run,
               machine_gpus=args.machine_gpus)
    except LaunchError as e:
        print(f"rft launch: refused: {e}", file=sys.stderr)
        return 2
    return 0
