"""``rft ab -p P --vary policy_loss=ppo_clip,gspo [--set k=v]``: one attempt per value, then the compare report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rftlib.ab import parse_vary, run_ab
from rftlib.cli.common import parse_sets, run_notebook
from rftlib.report.compare import load_all, summary_text
from rftlib.report.publish import write_compare
from rftlib.workbench import result_text


def add_arguments(ab) -> None:
    ab.add_argument("-p", "--preset", default="default")
    ab.add_argument("--vary", action="append", default=[], metavar="NAME=V1,V2[,...]",
                    help="a RunConfig field and its values (baseline first); several --vary take the product")
    ab.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="the same for every variant")
    ab.add_argument("--out", default=None, help="reports directory (default: reports/ beside the runs root)")


def run(args) -> int:
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

    _, html, failed = run_ab(args.preset, parse_sets(args.set), parse_vary(args.vary), train=train,
                             compare=compare, write=lambda s: print(s, flush=True))
    return 0 if html is not None and not failed else 1
