"""``rft attach RUN_DIR``: stream a launched attempt's progress (Ctrl-C detaches)."""

from __future__ import annotations

from rftlib.launch.status import attach


def add_arguments(at) -> None:
    at.add_argument("run_dir")
    at.add_argument("--timeout", type=float, default=None, help="detach after this many seconds")


def run(args) -> int:
    st = attach(args.run_dir, timeout=args.timeout)
    return 1 if st.get("state") in ("crashed", "killed") else 0
