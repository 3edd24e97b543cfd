"""One sandbox worker: a zygote process inside bubblewrap, seen from the trainer.

Start-up, as the trainer (often root) runs it:
    Popen(user=<worker uid>)  ->  bwrap --unshare-all --as-pid-1 --seccomp FD ...  ->
        /usr/bin/python3 -I -S -B -c <_zygote.py> <config>        (PID 1 of its own namespaces)
The uid is dropped BEFORE bwrap runs: bwrap started by root maps back to uid 0 whatever ``--uid``
says, and RLIMIT_NPROC does not bind root. The sandbox sees only /usr (read-only, with the
/bin /lib /lib64 /sbin links), two files of /etc, a minimal /dev, its own /proc (for the
supervisor to find a job's processes; Landlock keeps the job's code out of it), and a
size-capped tmpfs /tmp;
/ and /dev are remounted read-only so that tmpfs writes cannot go anywhere but the capped one.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import _zygote
from .seccomp import bpf_fd

ZYGOTE_SOURCE = Path(_zygote.__file__).read_text()
WORK_DIR = "/tmp"  # inside the sandbox: the capped tmpfs, the only writable place, emptied after each job
READ_PATHS = ["/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32", "/etc"]
FILE_RW_PATHS = ["/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom"]
ETC_FILES = ["/etc/ld.so.cache", "/etc/localtime"]  # all of /etc the interpreter may want


class WorkerDied(RuntimeError):
    """The zygote is gone or broke protocol; the pool starts a fresh one."""


@dataclass(frozen=True)
class WorkerSpec:
    """Everything needed to start one worker (the pool builds it once)."""

    bwrap: str | None  # path to bwrap, or None for the unsandboxed mode
    python: str  # the interpreter inside the sandbox
    uid: int | None  # the uid to drop to before bwrap (None: keep ours; we are not root)
    config: dict  # handed to the zygote as argv[1]
    tmpfs_bytes: int  # size cap of the sandbox's /tmp
    seccomp_bpf: bytes | None  # None only when the seccomp layer is off


def bwrap_argv(spec: WorkerSpec, seccomp_fd: int | None) -> list[str]:
    """The bwrap command line (mounts in order; later ones stack on earlier ones)."""
    a = [spec.bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent",
         "--new-session", "--as-pid-1", "--clearenv", "--hostname", "sandbox",
         "--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32"):
        if os.path.islink(top):
            a += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            a += ["--ro-bind", top, top]
    for f in ETC_FILES:
        a += ["--ro-bind-try", f, f]
    a += ["--dev", "/dev", "--proc", "/proc", "--size", str(spec.tmpfs_bytes), "--tmpfs", "/tmp",
          "--remount-ro", "/dev", "--remount-ro", "/", "--chdir", "/tmp"]
    if seccomp_fd is not None:
        a += ["--seccomp", str(seccomp_fd)]
    return a + ["--", *python_argv(spec)]


def python_argv(spec: WorkerSpec) -> list[str]:
    return [spec.python, "-I", "-S", "-B", "-c", ZYGOTE_SOURCE, json.dumps(spec.config)]


class Worker:
    """One zygote process and its pipes: ``send`` a job frame, ``pump`` for the reply frame."""

    def __init__(self, spec: WorkerSpec):
        self.spec = spec
        self.proc: subprocess.Popen | None = None
        self.info: dict[str, Any] = {}
        self._buf = bytearray()

    # -- life cycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Spawn the process; ``wait_ready`` collects its hello."""
        spec = self.spec
        config = dict(spec.config)
        fds: list[int] = []
        if spec.bwrap is None:
            if spec.seccomp_bpf is not None:
                config["seccomp_bpf_hex"] = spec.seccomp_bpf.hex()
            argv = python_argv(WorkerSpec(**{**spec.__dict__, "config": config}))
        else:
            sfd = None
            if spec.seccomp_bpf is not None:
                sfd = bpf_fd()
                fds.append(sfd)
            argv = bwrap_argv(spec, sfd)
        kw: dict[str, Any] = {}
        if spec.uid is not None:
            kw = {"user": spec.uid, "group": spec.uid, "extra_groups": []}
        try:
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                env={}, cwd="/", pass_fds=fds, start_new_session=True, **kw)
        finally:
            for fd in fds:
                os.close(fd)
        os.set_blocking(self.proc.stdout.fileno(), False)
        os.set_blocking(self.proc.stderr.fileno(), False)
        self._buf.clear()

    def wait_ready(self, timeout_s: float) -> dict:
        hello = self.read_frame(time.monotonic() + timeout_s)
        if hello is None or not hello.get("ready"):
            raise WorkerDied(f"sandbox worker did not start: {self.stderr_tail() or 'no output'}")
        self.info = hello
        return hello

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the bwrap process group; bwrap's --die-with-parent takes the sandbox's PID 1
        down with it, and the kernel kills every process in a PID namespace whose init dies."""
        p = self.proc
        if p is None:
            return
        for sig_target in (lambda: os.killpg(p.pid, signal.SIGKILL), lambda: p.kill()):
            try:
                sig_target()
            except OSError:
                pass
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        for f in (p.stdin, p.stdout, p.stderr):
            try:
                f.close()
            except OSError:
                pass
        self.proc = None

    def close(self) -> None:
        """Ask the zygote to exit (EOF on its stdin), then make sure."""
        p = self.proc
        if p is None:
            return
        try:
            p.stdin.close()
            p.wait(timeout=2)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.kill()

    # -- protocol -----------------------------------------------------------------------------

    def send(self, obj: dict) -> None:
        body = json.dumps(obj).encode()
        try:
            self.proc.stdin.write(len(body).to_bytes(4, "big") + body)
            self.proc.stdin.flush()
        except (OSError, ValueError) as e:
            raise WorkerDied(f"sandbox worker is gone ({e})") from e

    def fileno(self) -> int:
        return self.proc.stdout.fileno()

    def pump(self) -> dict | None:
        """Read what is available; return a complete frame if one arrived (None otherwise).

        Raises WorkerDied on EOF or an impossible frame length.
        """
        fd = self.fileno()
        while True:
            frame = self._take_frame()
            if frame is not None:
                return frame
            try:
                chunk = os.read(fd, 1 << 20)
            except BlockingIOError:
                return None
            if not chunk:
                raise WorkerDied(f"sandbox worker exited: {self.stderr_tail() or 'no output'}")
            self._buf += chunk

    def _take_frame(self) -> dict | None:
        if len(self._buf) < 4:
            return None
        n = int.from_bytes(self._buf[:4], "big")
        if n > self.spec.config["max_frame_bytes"]:
            raise WorkerDied(f"sandbox worker sent an oversized frame ({n} bytes)")
        if len(self._buf) < 4 + n:
            return None
        body = bytes(self._buf[4:4 + n])
        del self._buf[:4 + n]
        try:
            return json.loads(body)
        except ValueError as e:
            raise WorkerDied(f"sandbox worker sent a malformed frame ({e})") from e

    def read_frame(self, deadline: float) -> dict | None:
        """Block until a frame or the deadline (None)."""
        while True:
            frame = self.pump()
            if frame is not None:
                return frame
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            select.select([self.fileno()], [], [], left)

    def stderr_tail(self) -> str:
        if self.proc is None or self.proc.stderr is None:
            return ""
        try:
            data = os.read(self.proc.stderr.fileno(), 1 << 16)
        except (BlockingIOError, OSError, ValueError):
            return ""
        return data.decode("utf-8", "replace").strip()[-2000:]
