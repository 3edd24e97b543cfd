"""``rft preflight [-p preset] [--set k=v]``: a config's LR schedule, the LR preflight, its precision's risk
(float16), then its memory."""

from __future__ import annotations

from rftlib.cli.common import add_preset_and_sets, parse_sets
from rftlib.config import make_config
from rftlib.models.precision import float16_note
from rftlib.preflight.memory_check import memory_preflight_text
from rftlib.train.loop import lr_schedule_preview
from rftlib.workbench import lr_preflight


def add_arguments(f) -> None:
    add_preset_and_sets(f)


def run(args) -> int:
    cfg = make_config(args.preset, parse_sets(args.set))
    lrs = lr_schedule_preview(cfg)
    print(f"{len(lrs)} optimizer steps; lr {cfg.lr:g}, warmup_ratio {cfg.warmup_ratio}, min_lr_ratio {cfg.min_lr_ratio}")
    print("  step k = the k-th optimizer step, as the trainer logs it (step 1 trains at the warmup's LR 0)")
    for i in sorted(i for i in {0, 1, 2, len(lrs) // 4, len(lrs) // 2, 3 * len(lrs) // 4, len(lrs) - 1}
                    if 0 <= i < len(lrs)):
        print(f"  step {i + 1:5d}  lr {lrs[i]:.3e}  ({100 * lrs[i] / cfg.lr:5.1f}% of target)")

    pre = lr_preflight(cfg)
    print(f"  preflight: {pre.verdict.upper()} - {pre.message}")

    risk = float16_note(cfg.dtype, cfg.model, cfg.launch_gpu_type)
    if risk:
        print(f"  precision: {risk}")
    print(memory_preflight_text(cfg))
    return 0
