"""``rft status [--runs runs]``: attempts with step, reward, held-out, health, state; GPUs. Reads files only:
no torch (tests/test_cli_light.py)."""

from __future__ import annotations

from rftlib.launch.status import status_text


def add_arguments(st) -> None:
    st.add_argument("--runs", default=None, help="runs root (default: $RFTLIB_RUNS, else <project root>/runs)")


def run(args) -> int:
    print(status_text(args.runs))
    return 0
