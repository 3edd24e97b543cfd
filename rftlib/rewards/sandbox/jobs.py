"""What a sandbox runs (``Job``) and what comes back (``RunResult``).

A job is a program plus tests of two kinds:
    ``Call(args)``     call the entry point with ``args``; the output comes back as data, and the
                       caller compares it against the expected value, which never enters the sandbox.
    ``Exec(source)``   run statements (an ``assert`` line, a HumanEval ``check`` program);
                       passing means raising nothing. They run in the sandbox's checker process,
                       never in the untrusted program's: the program's functions are proxies
                       there that call into its process and bring back plain builtin values, so
                       the program never sees the tests and cannot write the verdict.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Union

from ._zygote import decode_lines, encode_value


@dataclass(frozen=True)
class Call:
    """Test: call the entry point with ``args`` (a tuple of plain builtin values)."""

    args: tuple


@dataclass(frozen=True)
class Exec:
    """Test: run ``source`` (trusted) where the solution's functions are callable by name; it
    passes when nothing is raised. Values cross from the solution as plain builtins; other
    objects (a tree node the test builds) stay in the solution's process as opaque handles."""

    source: str


Test = Union[Call, Exec]


@dataclass(frozen=True)
class Job:
    """One untrusted program and its tests, run in one sandboxed process."""

    code: str
    """the untrusted program (e.g. a model completion's code)"""
    entry_point: str | None = None
    """the function ``Call`` tests call; with ``guard``, the name ``Exec`` tests see is wrapped"""
    tests: tuple[Test, ...] = ()
    setup: str = ""
    """trusted code run before ``code`` in the same namespace (imports, helpers), and before the
    ``Exec`` tests in theirs"""
    guard: bool = True
    """``Exec`` tests see an entry point whose non-builtin return values raise TypeError (off:
    they come back as opaque handles, which compare by identity only)"""
    timeout_s: float | None = None
    """wall clock for the whole job; None: the sandbox's ``timeout_s``"""

    def to_wire(self) -> dict:
        tests = []
        for t in self.tests:
            if isinstance(t, Call):
                tests.append(["call", json.dumps(encode_value(tuple(t.args)))])
            elif isinstance(t, Exec):
                tests.append(["exec", t.source])
            else:
                raise TypeError(f"a test is Call or Exec, not {type(t).__name__}")
        if any(isinstance(t, Call) for t in self.tests) and not self.entry_point:
            raise ValueError("Call tests need an entry_point")
        return {"code": self.code, "setup": self.setup, "entry_point": self.entry_point,
                "tests": tests, "guard": self.guard, "timeout_s": self.timeout_s}


@dataclass
class TestRun:
    """The fate of one test. ``ok``: it ran to completion without raising (for a ``Call``,
    ``value`` holds the decoded output); otherwise ``error`` says why (``"timeout"``...)."""

    ok: bool
    value: Any = None
    error: str | None = None


@dataclass
class RunResult:
    """What came back from one job. Every field was produced by or about untrusted code:
    ``tests`` values are plain builtins decoded here, never objects built by the sandbox."""

    status: str
    """"ok" (every test ran), "load_error" (setup or solution raised), "timeout", "crashed" (the
    program's process died or broke protocol before the tests finished: exit, signal, memory),
    "sandbox_error" (the worker broke)"""
    tests: list[TestRun] = field(default_factory=list)
    error: str | None = None
    """a one-line summary when ``status`` is not "ok" """
    stdout: str = ""
    stderr: str = ""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    exit_code: int | None = None
    """the untrusted program's exit status where it had ended by the end of the job (None: it was
    still serving calls, and was killed with the rest)"""
    signal: int | None = None
    elapsed_s: float = 0.0
    """wall time of the job inside the sandbox (fork to exit or kill)"""

    @property
    def timed_out(self) -> bool:
        return self.status == "timeout"


def parse_reply(job: Job, reply: dict) -> RunResult:
    """Turn the supervisor's reply into a RunResult. The result stream is the checker's (the
    untrusted program cannot write it); it is still decoded strictly, as plain builtins only."""
    n = len(job.tests)
    runs: list[TestRun | None] = [None] * n
    load_error = lost = None
    done = False
    for rec in decode_lines(str(reply.get("results", ""))):
        if rec is None:
            continue
        head = rec[0]
        if head == "done" and len(rec) == 1:
            done = True
        elif head == "load" and len(rec) == 2:
            load_error = _text(rec[1])
        elif head == "lost" and len(rec) == 2:
            lost = _text(rec[1])
        elif type(head) is int and 0 <= head < n and runs[head] is None:
            runs[head] = _test_run(job.tests[head], rec)
    exit_code, sig = reply.get("exit_code"), reply.get("signal")
    timed_out = reply.get("status") == "timeout"
    setup = reply.get("setup")
    if setup != "ok":  # from a pipe closed before the job's code ran: the job cannot fake it
        status, error = "sandbox_error", _text(setup)
    elif load_error is not None:
        status, error = "load_error", load_error
    elif timed_out:
        status, error = "timeout", f"timed out after {float(reply.get('elapsed_s', 0)):.2f}s"
    elif lost is not None or not done:
        status, error = "crashed", _crash_reason(reply, lost)
    else:
        status, error = "ok", None
    missing = "not run: " + (error or "no result")
    if reply.get("results_truncated"):
        missing = "not run or result too large: " + (error or "result stream capped")
    tests = [r if r is not None else TestRun(False, error=missing) for r in runs]
    return RunResult(
        status=status, tests=tests, error=error,
        stdout=str(reply.get("stdout", "")), stderr=str(reply.get("stderr", "")),
        stdout_truncated=int(reply.get("stdout_bytes", 0)) > len(str(reply.get("stdout", "")).encode()),
        stderr_truncated=int(reply.get("stderr_bytes", 0)) > len(str(reply.get("stderr", "")).encode()),
        exit_code=exit_code if type(exit_code) is int else None,
        signal=sig if type(sig) is int else None,
        elapsed_s=float(reply.get("elapsed_s", 0.0)))


def _test_run(test: Test, rec: list) -> TestRun:
    kind = rec[1] if len(rec) > 1 else None
    if kind == "e" and len(rec) == 3:
        return TestRun(False, error=_text(rec[2]))
    if isinstance(test, Call) and kind == "v" and len(rec) == 3:
        return TestRun(True, value=rec[2])
    if isinstance(test, Exec) and kind == "ok" and len(rec) == 2:
        return TestRun(True)
    return TestRun(False, error="malformed result record")


def _text(x: Any) -> str:
    return (x if type(x) is str else repr(x))[:500]


def _crash_reason(reply: dict, lost: str | None) -> str:
    sig, code = reply.get("signal"), reply.get("exit_code")
    if sig:
        name = {9: "SIGKILL (memory or CPU limit?)", 24: "SIGXCPU (CPU limit)", 11: "SIGSEGV",
                6: "SIGABRT", 25: "SIGXFSZ (file size limit)",
                31: "SIGSYS (a syscall the seccomp filter forbids)"}.get(sig, f"signal {sig}")
        return f"process killed by {name}"
    if code is not None:
        return f"process exited (status {code}) before the tests finished"
    return lost or "the checker did not finish (killed?)"
