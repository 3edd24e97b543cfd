"""``rft sft [-p sft-arithmetic-boxed] [--set k=v]``: SFT (TRL SFTTrainer + LoRA) via notebooks/sft.ipynb ->
adapter/ for init_adapter."""

from __future__ import annotations

import json
import sys

from rftlib.attempts import claim_attempt_dir, runs_root as resolve_runs
from rftlib.cli.common import REPO, add_preset_and_sets, headless_env, parse_sets, report_line
from rftlib.config import make_config
from rftlib.report import publish
from rftlib.sft import check_sft_data, sft_result_text


def add_arguments(sf) -> None:
    add_preset_and_sets(sf, "sft-arithmetic-boxed")


def run(args) -> int:
    """notebooks/sft.ipynb under papermill into a new attempt directory; prints before/after and the next step."""
    sets = parse_sets(args.set)
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
    if line := report_line(root / attempt_id):
        print(line)
    return 0
