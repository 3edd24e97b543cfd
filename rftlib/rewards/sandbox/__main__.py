"""``python -m rftlib.rewards.sandbox --selftest``: the layers active here, and a few attacks.

``--check`` only says whether bubblewrap can start a sandbox and the seccomp filter builds (exit 1
if not).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
import uuid

from . import Call, Job, Sandbox, SandboxUnavailable, check_available
from .seccomp import filter_bpf, job_filter


def _selftest() -> int:
    try:
        sb = Sandbox(num_workers=2, timeout_s=1.0)
    except SandboxUnavailable as e:
        print(f"FAIL  {e}")
        return 1
    failures = 0

    def report(name: str, ok: bool, detail: str = "") -> None:
        nonlocal failures
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'}  {name}{': ' + detail if detail else ''}")

    with sb:
        print("layers:", ", ".join(f"{k}={v}" for k, v in sb.layers.items()))
        add = "def add(a, b):\n    return a + b\n"
        r = sb.run(Job(add, "add", (Call((1, 2)),)))
        report("a correct solution runs", r.status == "ok" and r.tests[0].value == 3, r.error or "")
        t0 = time.monotonic()
        r = sb.run(Job("while True: pass"))
        report("an infinite loop is killed", r.timed_out, f"{time.monotonic() - t0:.2f}s")
        marker = f"/tmp/rftlib-selftest-{uuid.uuid4().hex}"
        sb.run(Job(f"open({marker!r}, 'w').write('x')"))
        report("writes do not reach the host", not os.path.exists(marker))
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        code = ("import socket\ndef go(p):\n    try:\n        socket.create_connection(('127.0.0.1', p), 1)\n"
                "        return 'connected'\n    except OSError as e:\n        return type(e).__name__\n")
        r = sb.run(Job(code, "go", (Call((port,)),)))
        listener.close()
        report("no network", r.tests[0].value != "connected", str(r.tests[0].value))
        os.environ["RFT_SELFTEST_SECRET"] = secret = uuid.uuid4().hex
        r = sb.run(Job("import os\nprint(dict(os.environ))"))
        del os.environ["RFT_SELFTEST_SECRET"]
        report("the environment is cleared", secret not in r.stdout)
        r = sb.run(Job("def f():\n    return len(bytearray(10 * 1024 ** 3))\n", "f", (Call(()),)))
        report("10 GB allocation fails", "MemoryError" in (r.tests[0].error or ""))
        code = ("import os, resource\ndef reach():\n    out = []\n    for f in (lambda: os.kill(os.getppid(), 0),\n"
                "              lambda: resource.prlimit(os.getppid(), resource.RLIMIT_NOFILE)):\n"
                "        try:\n            f()\n            out.append('reached')\n"
                "        except OSError as e:\n            out.append(type(e).__name__)\n    return out\n")
        r = sb.run(Job(code, "reach", (Call(()),)))
        report("no signal or prlimit leaves the job", r.tests[0].value == ["PermissionError"] * 2,
               str(r.tests[0].value))
    print("selftest:", "PASSED" if not failures else f"{failures} FAILED")
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rftlib.rewards.sandbox", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--selftest", action="store_true", help="report layers and run a few attacks")
    g.add_argument("--check", action="store_true", help="only check that bubblewrap works here")
    args = p.parse_args(argv)
    if args.check:
        ok, why = check_available()
        try:
            why += (f"; seccomp filter ({len(filter_bpf()) // 8} BPF instructions)"
                    f" and job filter ({len(job_filter()[0]) // 8})")
        except RuntimeError as e:
            ok, why = False, f"{why}; {e}"
        print(("ok: " if ok else "unavailable: ") + why)
        return 0 if ok else 1
    return _selftest()


if __name__ == "__main__":
    sys.exit(main())
