"""Sandboxed execution of untrusted (model-generated) code.

Seed 002 ran completions with a bare ``exec`` in the trainer's process. Here generated code never
runs in the trainer's process or as root: it runs in a pre-started bubblewrap sandbox per worker
(own uid, all namespaces unshared, read-only /usr, a capped tmpfs, seccomp, Landlock, rlimits),
one process per job forked from a state that never held another job, killed with all its
descendants when its wall clock runs out; a seccomp filter per job keeps its signals, prlimit and
scheduling calls off the other jobs' processes, whatever the kernel's Landlock. The tests run in a separate supervisor process that
calls into it; outputs come back as plain builtin data, and expected values are compared in the
trainer (see ``_zygote``'s docstring for the processes).

    with Sandbox(num_workers=2, timeout_s=5) as sb:
        res = sb.run(Job(code, entry_point="f", tests=(Call((1, 2)),)))
        res.tests[0].value            # the decoded output of f(1, 2)

``python -m rftlib.rewards.sandbox --selftest`` reports the layers active on this machine.
"""

from .jobs import Call, Exec, Job, RunResult, TestRun
from .pool import Sandbox, SandboxUnavailable, check_available

__all__ = ["Call", "Exec", "Job", "RunResult", "Sandbox", "SandboxUnavailable", "TestRun",
           "check_available"]
