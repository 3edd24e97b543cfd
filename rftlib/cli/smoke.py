"""``rft smoke [--model M] [--lines single,zero3,vllm]``: one step per set-up (GPU, else CPU forms): run it first."""

from __future__ import annotations

from rftlib.smoke import LINES, run_smoke, table, verdict


def add_arguments(sm) -> None:
    sm.add_argument("--model", default="smollm2-135m", help="the model every line trains (tiny: the test's quick form)")
    sm.add_argument("--lines", default="single,zero3,vllm", help="which lines, comma-separated")
    sm.add_argument("--runs-root", default=None, help="where the lines' attempts go (default: <runs root>/smoke)")
    sm.add_argument("--timeout", type=float, default=480, help="seconds one line may take")


def run(args) -> int:
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
