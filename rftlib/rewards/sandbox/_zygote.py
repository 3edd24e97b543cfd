"""The program that runs INSIDE the sandbox: a pre-started worker that forks one child per job.

It is standard-library only and runs under the system interpreter (``/usr/bin/python3 -I -S -B
-c <this file's source> <config json>``), because the sandbox uid cannot read the trainer's venv.
The trainer also imports this module, but only for :func:`encode_value` / :func:`decode_value`, so
both ends share one wire format.

Protocol (frames are a 4-byte big-endian length, then UTF-8 JSON):
    zygote -> parent   {"ready": 1, ...facts about the sandbox}           once, at start
    parent -> zygote   {"code", "setup", "entry_point", "tests", "guard", "timeout_s"}  per job
    zygote -> parent   {"status", "exit", "results", "stdout", "stderr", ...}          per job
    zygote -> parent   {"dead": "why"}       the zygote cannot go on (then it exits)

A spare child is always forked ahead, already under the limits (setsid, Landlock, rlimits, fds
0-4 only); a job is handed to it over a pipe (fd 4). The child streams one JSON array per line
on fd 3:
    [i, "v", <encoded value>]  test i (a call) returned this value
    [i, "ok"]                  test i (statements) raised nothing
    [i, "e", "Type: msg"]      test i raised
    ["load", "Type: msg"]      the setup or the solution raised while loading
    ["done"]                   the harness reached the end (after flushing stdout and stderr)
Those lines come from the process that runs the untrusted code, so the parent treats them as
claims: it decodes them strictly and compares against expected values that never enter the sandbox.
When the child is done, exits, or runs out of time, every process left in the job is SIGKILLed
and reaped, then the reply goes out; emptying the work dir and forking the next spare follow.
"""

import json
import os
import resource
import select
import signal
import sys
import time

# ----------------------------------------------------------------------------------------------
# Wire format for values: JSON, with the non-JSON builtins tagged as one-key objects. A JSON
# object is therefore always a tag, so decoding is unambiguous and can only build builtins.
#   tuple {"t": [...]}  set {"s": [...]}  frozenset {"f": [...]}  dict {"d": [[k, v], ...]}
#   bytes {"b": "hex"}  complex {"c": [re, im]}
# ----------------------------------------------------------------------------------------------

MAX_DEPTH = 64  # nesting deeper than this is refused (it is never a sane test output)


import collections as _collections

_DICT_LIKE = (_collections.Counter, _collections.OrderedDict, _collections.defaultdict)


def encode_value(value, _depth=0):
    """A JSON-able form of a value made only of exact builtin types; TypeError otherwise.

    Exact types (``type(x) is str``), so a str subclass with a rigged ``__eq__`` is refused.
    """
    if _depth > MAX_DEPTH:
        raise TypeError("value nested deeper than %d" % MAX_DEPTH)
    t = type(value)
    if value is None or t is bool or t is int or t is float or t is str:
        return value
    d = _depth + 1
    if t is list:
        return [encode_value(v, d) for v in value]
    if t is tuple:
        return {"t": [encode_value(v, d) for v in value]}
    if t is set:
        return {"s": [encode_value(v, d) for v in value]}
    if t is frozenset:
        return {"f": [encode_value(v, d) for v in value]}
    if t is dict or t in _DICT_LIKE:
        # exact stdlib mappings compare equal to dicts (MBPP references return Counter); a user
        # subclass is still refused, and items are read through dict's own method
        return {"d": [[encode_value(k, d), encode_value(v, d)] for k, v in dict.items(value)]}
    if t is bytes:
        return {"b": value.hex()}
    if t is complex:
        return {"c": [value.real, value.imag]}
    raise TypeError("not a plain builtin value: %s" % t.__name__)


def _decode_tag(pairs):
    if len(pairs) != 1:
        raise ValueError("malformed tagged value")
    tag, body = pairs[0]
    if tag == "t" and type(body) is list:
        return tuple(body)
    if tag == "s" and type(body) is list:
        return set(body)
    if tag == "f" and type(body) is list:
        return frozenset(body)
    if tag == "d" and type(body) is list:
        if not all(type(kv) is list and len(kv) == 2 for kv in body):
            raise ValueError("malformed dict")
        return {k: v for k, v in body}
    if tag == "b" and type(body) is str:
        return bytes.fromhex(body)
    if tag == "c" and type(body) is list and len(body) == 2:
        return complex(float(body[0]), float(body[1]))
    raise ValueError("unknown tag %r" % (tag,))


def decode_value(obj_json):
    """Inverse of :func:`encode_value` applied to ``json.dumps`` text; ValueError on anything else.

    Only builtins can come out (json plus the tag table), so no code from the text runs here.
    """
    return json.loads(obj_json, object_pairs_hook=_decode_tag)


def decode_lines(text):
    """Parse the child's result stream: a list of records, each a decoded JSON array."""
    records = []
    for line in text.splitlines():
        try:
            rec = json.loads(line, object_pairs_hook=_decode_tag)
        except (ValueError, TypeError, RecursionError):
            records.append(None)  # a malformed line (a forged or cut-off record) counts as nothing
            continue
        records.append(rec if type(rec) is list and rec else None)
    return records


# ----------------------------------------------------------------------------------------------
# Landlock (https://docs.kernel.org/userspace-api/landlock.html), through raw syscalls.
# ----------------------------------------------------------------------------------------------

_SYS_LANDLOCK_CREATE_RULESET = 444  # same number on every architecture (added in 5.13)
_SYS_LANDLOCK_ADD_RULE = 445
_SYS_LANDLOCK_RESTRICT_SELF = 446
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_DUMPABLE = 4
_PR_SET_CHILD_SUBREAPER = 36
_FS_READ = (1 << 0) | (1 << 2) | (1 << 3)  # EXECUTE | READ_FILE | READ_DIR
_FS_FILE_RW = (1 << 1) | (1 << 2) | (1 << 15)  # WRITE_FILE | READ_FILE | IOCTL_DEV (/dev/null...)
_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1}  # 5+: 16 bits
_NET_TCP = (1 << 0) | (1 << 1)  # BIND_TCP | CONNECT_TCP (ABI 4+), handled with no rule: denied
_SCOPE = (1 << 0) | (1 << 1)  # ABSTRACT_UNIX_SOCKET | SIGNAL (ABI 6+): no signal leaves the job


_LIBC = []


def _libc():
    import ctypes

    if not _LIBC:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        libc.prctl.restype = ctypes.c_int
        _LIBC.append(libc)
    return ctypes, _LIBC[0]


def landlock_abi():
    """The kernel's Landlock ABI version, or 0 when it has none (or it is disabled)."""
    try:
        ctypes, libc = _libc()
        v = libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
        return max(int(v), 0)
    except Exception:
        return 0


def landlock_ruleset(abi, read_paths, rw_paths, file_rw_paths):
    """A ruleset fd: read+exec under ``read_paths``, everything under ``rw_paths``, read/write of
    the files ``file_rw_paths``; all else on the filesystem (and TCP, and signals out) denied."""
    ctypes, libc = _libc()
    fs = _FS_BY_ABI.get(abi, (1 << 16) - 1)
    attr = (ctypes.c_uint64 * 3)(fs, _NET_TCP if abi >= 4 else 0, _SCOPE if abi >= 6 else 0)
    size = 8 if abi < 4 else (16 if abi < 6 else 24)
    fd = libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if fd < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")

    class PathBeneath(ctypes.Structure):
        _pack_ = 1
        _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

    file_bits = (1 << 0) | (1 << 1) | (1 << 2) | (1 << 14) | (1 << 15)  # rights valid on a file
    for paths, access in ((read_paths, _FS_READ), (rw_paths, fs), (file_rw_paths, _FS_FILE_RW)):
        for path in paths:
            try:
                pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # a path this system lacks needs no rule
            try:
                rights = access & fs
                if not os.path.isdir(path):
                    rights &= file_bits
                rule = PathBeneath(rights, pfd)
                if libc.syscall(_SYS_LANDLOCK_ADD_RULE, ctypes.c_int(fd), ctypes.c_int(1), ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
                    raise OSError(ctypes.get_errno(), "landlock_add_rule failed for %s" % path)
            finally:
                os.close(pfd)
    return fd


def landlock_restrict(ruleset_fd):
    ctypes, libc = _libc()
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(NO_NEW_PRIVS) failed")
    if libc.syscall(_SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset_fd), ctypes.c_uint32(0)) != 0:
        raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")


def load_seccomp(bpf):
    """Install a classic-BPF seccomp filter (bytes of struct sock_filter) on this process."""
    ctypes, libc = _libc()

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    buf = ctypes.create_string_buffer(bpf, len(bpf))
    prog = Prog(len(bpf) // 8, ctypes.cast(buf, ctypes.c_void_p))
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(NO_NEW_PRIVS) failed")
    if libc.prctl(22, 2, ctypes.byref(prog), 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")


# ----------------------------------------------------------------------------------------------
# The child: limits first, then (once a job arrives) the harness. Never returns.
# ----------------------------------------------------------------------------------------------

RESULT_FD = 3  # the child's result stream
JOB_FD = 4  # the child reads its job here (then closes it)
SETUP_FD = 5  # "ok", or why the set-up failed; closed before any untrusted code runs, so that
# a sandbox_error can only ever mean the sandbox failed, never that the job said so


def _emit(rec):
    data = (json.dumps(rec) + "\n").encode()
    while data:
        data = data[os.write(RESULT_FD, data):]


def _describe(exc):
    try:
        msg = str(exc)
    except BaseException:
        msg = "<unprintable>"
    name = getattr(type(exc), "__name__", "Exception")
    return ("%s: %s" % (name, msg) if msg else name)[:500]


def _guard(fn):
    """The entry point as the tests see it: a non-builtin return value raises TypeError."""

    def candidate(*args, **kwargs):
        out = fn(*args, **kwargs)
        encode_value(out)
        return out

    return candidate


def _harness(job):
    import builtins

    ns = {"__name__": "__sandbox__", "__builtins__": builtins}  # not __main__: main blocks stay off
    entry = job.get("entry_point")
    try:
        if job.get("setup"):
            exec(compile(job["setup"], "<setup>", "exec"), ns)
        exec(compile(job["code"], "<solution>", "exec"), ns)
        fn = ns.get(entry) if entry else None
        if entry and not callable(fn):
            raise NameError("the solution defines no function %r" % entry)
    except BaseException as e:  # SystemExit and KeyboardInterrupt included: the load failed
        _emit(["load", _describe(e)])
        return
    if entry and job.get("guard", True):
        ns[entry] = _guard(fn)
    for i, test in enumerate(job.get("tests", [])):
        try:
            if test[0] == "call":
                out = fn(*decode_value(test[1]))
                _emit([i, "v", encode_value(out)])
            else:
                exec(compile(test[1], "<test %d>" % i, "exec"), ns)
                _emit([i, "ok"])
        except BaseException as e:
            _emit([i, "e", _describe(e)])


def _spare_child(cfg, fds, ruleset_fd):
    """Set up the limits that do not depend on the job, then wait for the job."""
    try:
        os.setsid()
        os.chdir(cfg["work_dir"])
        if ruleset_fd is not None:
            landlock_restrict(ruleset_fd)
        out_w, err_w, res_w, job_r, setup_w, nul = fds
        moves = ((nul, 0), (out_w, 1), (err_w, 2), (res_w, RESULT_FD), (job_r, JOB_FD), (setup_w, SETUP_FD))
        for fd, target in moves:
            os.dup2(fd, target)
        os.closerange(SETUP_FD + 1, 1 << 16)
        mem = cfg["memory_mb"] << 20
        for res, lim in (
            (resource.RLIMIT_AS, (mem, mem)),
            (resource.RLIMIT_FSIZE, (cfg["file_size_mb"] << 20,) * 2),
            (resource.RLIMIT_NOFILE, (cfg["max_open_files"],) * 2),
            (resource.RLIMIT_NPROC, (cfg["max_procs"],) * 2),
            (resource.RLIMIT_CORE, (0, 0)),
            (resource.RLIMIT_MEMLOCK, (0, 0)),
            (resource.RLIMIT_MSGQUEUE, (0, 0)),
        ):
            resource.setrlimit(res, lim)
        job = recv_frame(JOB_FD)
        os.close(JOB_FD)
        if job is None:
            os._exit(0)
        used = resource.getrusage(resource.RUSAGE_SELF)
        cpu = int(used.ru_utime + used.ru_stime + float(job.get("timeout_s") or cfg["timeout_s"])) + 2
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # the wall clock usually ends it first
        os.write(SETUP_FD, b"ok")
        os.close(SETUP_FD)
    except BaseException as e:
        try:
            os.write(SETUP_FD, ("sandbox set-up failed: " + _describe(e)).encode())
        finally:
            os._exit(70)
    try:
        _harness(job)
    except BaseException:
        pass  # only reachable if the job broke the harness: what it reported so far stands
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except BaseException:
            pass
    try:  # "done" last, then close every pipe: the zygote replies without waiting for our exit
        _emit(["done"])
        os.closerange(0, JOB_FD)
    finally:
        os._exit(0)


# ----------------------------------------------------------------------------------------------
# The zygote: one job at a time, forever; a spare child is always forked and waiting.
# ----------------------------------------------------------------------------------------------


def _read_exact(fd, n):
    chunks = []
    while n:
        b = os.read(fd, n)
        if not b:
            return None
        chunks.append(b)
        n -= len(b)
    return b"".join(chunks)


def recv_frame(fd):
    head = _read_exact(fd, 4)
    if head is None:
        return None
    body = _read_exact(fd, int.from_bytes(head, "big"))
    return None if body is None else json.loads(body.decode())


def send_frame(fd, obj):
    body = json.dumps(obj).encode()
    data = len(body).to_bytes(4, "big") + body
    while data:
        data = data[os.write(fd, data):]


class Spare:
    """A forked child waiting for its job, with the parent's ends of its pipes."""

    def __init__(self, cfg, ruleset_fd):
        pipes = [os.pipe() for _ in range(3)]  # stdout, stderr, results: child writes
        job_r, self.job_w = os.pipe()
        self.setup_r, setup_w = os.pipe()
        nul = os.open("/dev/null", os.O_RDWR)
        pid = os.fork()
        if pid == 0:
            fds = (pipes[0][1], pipes[1][1], pipes[2][1], job_r, setup_w, nul)
            _spare_child(cfg, fds, ruleset_fd)
        for fd in (nul, job_r, setup_w) + tuple(w for _r, w in pipes):
            os.close(fd)
        self.pid = pid
        self.reads = [r for r, _w in pipes]


def run_job(job, cfg, spare):
    """Hand ``job`` to the spare child, collect its output until it is done, dies or runs out
    of time. Killing what it left is the caller's next step (``_kill_everything_else``)."""
    t0 = time.monotonic()
    timeout = float(job.get("timeout_s") or cfg["timeout_s"])
    pid = spare.pid
    try:
        send_frame(spare.job_w, job)
    except OSError:
        pass  # the spare died; its status says why
    os.close(spare.job_w)
    caps = [cfg["max_output_bytes"], cfg["max_output_bytes"], cfg["max_result_bytes"]]
    bufs = [bytearray(), bytearray(), bytearray()]
    seen = [0, 0, 0]  # bytes the job wrote to each, kept or not
    open_fds = {r: k for k, r in enumerate(spare.reads)}
    poller = select.poll()
    for r in open_fds:
        os.set_blocking(r, False)
        poller.register(r, select.POLLIN)
    try:
        pidfd = os.pidfd_open(pid)
        poller.register(pidfd, select.POLLIN)
    except (AttributeError, OSError):
        pidfd = None
    status = None
    timed_out = False
    deadline = t0 + timeout

    def read_some(r):
        k = open_fds[r]
        try:
            b = os.read(r, 1 << 16)
        except BlockingIOError:
            return
        if not b:
            poller.unregister(r)
            del open_fds[r]
            return
        seen[k] += len(b)
        room = caps[k] - len(bufs[k])
        if room > 0:
            bufs[k] += b[:room]

    while True:
        if not open_fds and (status is not None or bufs[2].endswith(b'["done"]\n')):
            break  # all output is in, and the harness finished (or the child is gone)
        if status is None:
            done, st = os.waitpid(pid, os.WNOHANG)
            if done:
                status = st
                if pidfd is not None:
                    poller.unregister(pidfd)
                # the child is gone; descendants holding its pipes get a short grace, then die
                deadline = min(deadline, time.monotonic() + 0.05)
                continue
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = status is None and not bufs[2].endswith(b'["done"]\n')
            break
        wait_ms = left * 1000 if pidfd is not None else min(left * 1000, 10)
        for fd, _ev in poller.poll(max(1, int(wait_ms))):
            if fd in open_fds:
                read_some(fd)
    elapsed = time.monotonic() - t0
    if pidfd is not None:
        os.close(pidfd)
    if status is None and timed_out:
        try:  # our unreaped child: neither its pid nor its group's can have been recycled
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
        os.kill(pid, signal.SIGKILL)
    for r in list(open_fds):  # what is already in the pipes (writers may still be alive)
        while r in open_fds and select.select([r], [], [], 0)[0]:
            read_some(r)
    for r in spare.reads:
        os.close(r)
    os.set_blocking(spare.setup_r, False)
    try:
        setup = os.read(spare.setup_r, 4096).decode("utf-8", "replace")
    except BlockingIOError:
        setup = ""
    os.close(spare.setup_r)
    finished = bufs[2].endswith(b'["done"]\n')
    if status is None:
        exit_code, sig = (0, None) if finished else (None, 9)
    else:
        exit_code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
        sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
    return {
        "status": "timeout" if timed_out else "exited",
        "exit_code": exit_code,
        "signal": sig,
        "results": bufs[2].decode("utf-8", "replace"),
        "results_truncated": seen[2] > caps[2],
        "stdout": bufs[0].decode("utf-8", "replace"),
        "stdout_bytes": seen[0],
        "stderr": bufs[1].decode("utf-8", "replace"),
        "stderr_bytes": seen[1],
        "elapsed_s": elapsed,
        "setup": setup or "sandbox set-up did not finish",
    }


def _kill_everything_else(pid1):
    """SIGKILL every process the job left behind and reap them all.

    As PID 1 of the sandbox's PID namespace, kill(-1) reaches every other process in it
    (setsid and double forks included), and orphans are re-parented to us, so waiting until
    ECHILD proves none is left. Outside a PID namespace (unsandboxed mode) we are a child
    subreaper instead: orphans still come back to us, and /proc/self/task/*/children lists them
    (only our own unreaped children, so no pid we signal can have been recycled).
    """
    while True:
        if pid1:
            try:
                os.kill(-1, signal.SIGKILL)
            except ProcessLookupError:
                pass
        else:
            for pid in _children():
                for kill in (os.killpg, os.kill):
                    try:
                        kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def _children():
    pids = []
    try:
        for tid in os.listdir("/proc/self/task"):
            with open("/proc/self/task/%s/children" % tid) as f:
                pids += [int(p) for p in f.read().split()]
    except OSError:
        pass
    return pids


def _clean_work_dir(path):
    """Empty the work dir (the job may have chmod-ed things shut: we own them, so reopen first)."""
    os.chmod(path, 0o700)
    for name in os.listdir(path):
        p = os.path.join(path, name)
        if os.path.isdir(p) and not os.path.islink(p):
            for root, dirs, _files in os.walk(p):
                for d in dirs:
                    dp = os.path.join(root, d)
                    if not os.path.islink(dp):
                        os.chmod(dp, 0o700)
            os.chmod(p, 0o700)
            import shutil

            shutil.rmtree(p)
        else:
            os.unlink(p)


def main():
    cfg = json.loads(sys.argv[1])
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # PID 1 ignores signals it has no handler for
    proto_in, proto_out = os.dup(0), os.dup(1)
    nul = os.open("/dev/null", os.O_RDWR)
    os.dup2(nul, 0)
    os.dup2(nul, 1)
    os.close(nul)
    pid1 = os.getpid() == 1
    ctypes, libc = _libc()
    libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)  # no /proc/<pid>/mem or ptrace into the zygote
    if not pid1:
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # orphans come back to us for the kill
    if cfg.get("seccomp_bpf_hex"):
        load_seccomp(bytes.fromhex(cfg["seccomp_bpf_hex"]))
    os.makedirs(cfg["work_dir"], mode=0o700, exist_ok=True)
    abi = landlock_abi() if cfg.get("landlock", True) else 0
    ruleset_fd = None
    if abi:
        ruleset_fd = landlock_ruleset(abi, cfg["read_paths"], [cfg["work_dir"]], cfg["file_rw_paths"])
    spare = Spare(cfg, ruleset_fd)
    send_frame(proto_out, {
        "ready": 1,
        "pid": os.getpid(),
        "uid": os.getuid(),
        "landlock_abi": abi,
        "python": sys.version.split()[0],
    })
    while True:
        job = recv_frame(proto_in)
        if job is None:
            os._exit(0)
        reply = run_job(job, cfg, spare)
        _kill_everything_else(pid1)  # before the reply: when the trainer has it, nothing is left
        send_frame(proto_out, reply)
        try:  # off the job's clock: the parent already has its reply
            _clean_work_dir(cfg["work_dir"])
        except OSError as e:  # never reuse a work dir we cannot empty: the parent starts afresh
            send_frame(proto_out, {"dead": "cannot empty the work dir: " + _describe(e)})
            os._exit(3)
        spare = Spare(cfg, ruleset_fd)


if __name__ == "__main__":
    main()
