"""``rft stop RUN_DIR [--timeout S]``: checkpoint and stop an attempt: a launched one (terminates what is left after
S), or one a trainer holds (``rft train``, a notebook kernel: asks it to stop and waits, kills nothing)."""

from __future__ import annotations

from rftlib.launch.supervise import stop


def add_arguments(so) -> None:
    so.add_argument("run_dir")
    so.add_argument("--timeout", type=float, default=None,
                    help="seconds to wait before terminating what is left (default: twice the attempt's longest "
                         "step + eval, at least 300)")


def run(args) -> int:
    st = stop(args.run_dir, timeout=args.timeout)
    return 0 if st.get("state") in ("stopped", "finished") else 1
