"""The program that runs INSIDE the sandbox: a zygote that never holds a job, and per job a
supervisor (trusted, runs the tests) and the solution's process (untrusted).

It is standard-library only and runs under the system interpreter (``/usr/bin/python3 -I -S -B
-c <this file's source> <config json>``), because the sandbox uid cannot read the trainer's venv.
The trainer also imports this module, but only for :func:`encode_value` / :func:`decode_value`, so
both ends share one wire format.

Processes (inside the sandbox; the zygote is PID 1 of the sandbox's PID namespace):

    zygote       never reads a job, a result or an output: it forks a fresh supervisor per job.
                 Every job therefore starts from a process image that has never held another
                 job's code, tests or results (a job may search its whole memory, freed heap
                 included, and find only its own).
    supervisor   one per job, then it exits. Forks the solution's spare process before any job
                 exists, reads one job from the trainer, hands the spare the code (never the
                 tests) and runs the tests itself: a ``Call`` test calls the entry point in the
                 solution's process and reports the value; an ``Exec`` test (an assert line, a
                 HumanEval ``check`` program) runs here, with the solution's functions as proxies
                 that call into its process. Only plain builtin values cross back (objects a test
                 builds stay there as opaque handles), so every verdict is computed in a process
                 the untrusted code cannot write, read, ptrace or signal (seccomp, the job filter,
                 Landlock's scopes, no /proc), and only the supervisor speaks to the trainer. Then it kills
                 every process of the job, replies, empties the work dir and exits.
    solution     (untrusted; setsid, the job filter, Landlock, rlimits, only its own pipes) loads
                 the setup and the solution, then serves calls: call a function, read or set an
                 attribute. The job filter (seccomp, by pid) keeps its signals, prlimit, priority
                 and scheduling calls off every process outside the job: the zygote, supervisors,
                 and the spares waiting for the next jobs.

Protocol with the trainer (frames are a 4-byte big-endian length, then UTF-8 JSON):
    zygote     -> trainer  {"ready": 1, ...facts about the sandbox}           once, at start
    trainer    -> super.   {"code", "setup", "entry_point", "tests", "guard", "timeout_s"}  per job
    super.     -> trainer  {"status", "exit_code", "results", "stdout", "stderr", ...}    per job
    super.     -> trainer  {"dead": "why"}       the worker cannot go on (then it exits)

The reply's "results" (one JSON array per line, written by the supervisor):
    [i, "v", <encoded value>]  Call test i returned this value (compared in the trainer)
    [i, "ok"]                  Exec test i raised nothing
    [i, "e", "Type: msg"]      test i raised (in the solution's process, or a failed assert)
    ["load", "Type: msg"]      the setup or the solution raised while loading
    ["lost", "why"]            the solution's process died or broke the call protocol
    ["done"]                   the tests ran to the end
Between supervisor and solution, one JSON array per line: requests [seq, "call", name or handle,
[args, kwargs, strict]], [seq, "getattr", handle, name], [seq, "setattr", handle, [name, value]];
replies ["ready", names] or ["load", "Type: msg"] first, then [seq, "v", value] or
[seq, "e", "Type", "Type: msg"].
"""
import builtins
import fcntl
import json
import os
import resource
import select
import signal
import struct
import sys
import time

# ----------------------------------------------------------------------------------------------
# Wire format for values: JSON, with the non-JSON builtins tagged as one-key objects. A JSON
# object is therefore always a tag, so decoding is unambiguous and can only build builtins.
#   tuple {"t": [...]}  set {"s": [...]}  frozenset {"f": [...]}  dict {"d": [[k, v], ...]}
#   bytes {"b": "hex"}  complex {"c": [re, im]}
# Between the checker and the solution only, {"r": k} is handle k: an object that lives in the
# solution's process (a tree node the tests build); the checker can pass it back, read and set
# its attributes and call it, never compare it by value.
# ----------------------------------------------------------------------------------------------

MAX_DEPTH = 64  # nesting deeper than this is refused (it is never a sane test output)


import collections as _collections

_DICT_LIKE = (_collections.Counter, _collections.OrderedDict, _collections.defaultdict)


def encode_value(value, _depth=0, ref=None):
    """A JSON-able form of a value made only of exact builtin types; TypeError otherwise, or
    ``{"r": ref(x)}`` for each other object ``x`` when ``ref`` is given.

    Exact types (``type(x) is str``), so a str subclass with a rigged ``__eq__`` is refused.
    """
    if _depth > MAX_DEPTH:
        raise TypeError("value nested deeper than %d" % MAX_DEPTH)
    t = type(value)
    if value is None or t is bool or t is int or t is float or t is str:
        return value
    d = _depth + 1
    if t is list:
        return [encode_value(v, d, ref) for v in value]
    if t is tuple:
        return {"t": [encode_value(v, d, ref) for v in value]}
    if t is set:
        return {"s": [encode_value(v, d, ref) for v in value]}
    if t is frozenset:
        return {"f": [encode_value(v, d, ref) for v in value]}
    if t is dict or t in _DICT_LIKE:
        # exact stdlib mappings compare equal to dicts (MBPP references return Counter); a user
        # subclass is still refused, and items are read through dict's own method
        return {"d": [[encode_value(k, d, ref), encode_value(v, d, ref)] for k, v in dict.items(value)]}
    if t is bytes:
        return {"b": value.hex()}
    if t is complex:
        return {"c": [value.real, value.imag]}
    if ref is not None:
        return {"r": ref(value)}
    raise TypeError("not a plain builtin value: %s" % t.__name__)


def _tag_decoder(ref=None):
    def decode_tag(pairs):
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
        if tag == "r" and ref is not None and type(body) is int:
            return ref(body)
        raise ValueError("unknown tag %r" % (tag,))

    return decode_tag


_decode_tag = _tag_decoder()


def decode_value(obj_json, ref=None):
    """Inverse of :func:`encode_value` applied to ``json.dumps`` text; ValueError on anything else.

    Only builtins can come out (json plus the tag table; handles only through ``ref``), so no
    code from the text runs here.
    """
    return json.loads(obj_json, object_pairs_hook=_tag_decoder(ref) if ref else _decode_tag)


def decode_lines(text):
    """Parse the checker's result stream: a list of records, each a decoded JSON array."""
    records = []
    for line in text.splitlines():
        try:
            rec = json.loads(line, object_pairs_hook=_decode_tag)
        except (ValueError, TypeError, RecursionError):
            records.append(None)  # a malformed or cut-off record counts as nothing
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
_PR_SET_SECCOMP = 22
_PR_SET_DUMPABLE = 4
_PR_SET_CHILD_SUBREAPER = 36
_FS_READ = (1 << 0) | (1 << 2) | (1 << 3)  # EXECUTE | READ_FILE | READ_DIR
_FS_FILE_RW = (1 << 1) | (1 << 2) | (1 << 15)  # WRITE_FILE | READ_FILE | IOCTL_DEV (/dev/null...)
_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1}  # 5+: 16 bits
_NET_TCP = (1 << 0) | (1 << 1)  # BIND_TCP | CONNECT_TCP (ABI 4+), handled with no rule: denied
_SCOPE = (1 << 0) | (1 << 1)  # ABSTRACT_UNIX_SOCKET | SIGNAL (ABI 6+): no signal leaves the job


_LIBC = []


def _libc():
    """(ctypes, libc); the first call (the zygote's, before it forks) also makes the ctypes type
    ``load_seccomp`` needs, so that each spare does not pay for it."""
    import ctypes  # sandbox child, on first use: the trainer imports this file for the wire format only

    if not _LIBC:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        libc.prctl.restype = ctypes.c_int

        class SockFprog(ctypes.Structure):  # struct sock_fprog
            _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

        _LIBC.extend((libc, SockFprog))
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


class JobFilter:
    """The job filter (``seccomp.job_filter``: what a job may do to other processes), made ready
    by the zygote before it forks, so that a spare only writes its pid into its copy and loads it
    (70 us; decoding and wrapping it in each spare took 0.3 ms, 8% of a job's CPU)."""

    def __init__(self, spec):
        ctypes, libc = _libc()
        bpf = bytes.fromhex(spec["bpf_hex"])
        self.buf = ctypes.create_string_buffer(bpf, len(bpf))  # struct sock_filter[]
        self.prog = ctypes.byref(_LIBC[1](len(bpf) // 8, ctypes.cast(self.buf, ctypes.c_void_p)))
        self.slots = tuple((8 * i + 4, sign) for i, sign in spec["pid_at"])  # sock_filter.k offsets
        self.pack_into = struct.Struct("=I").pack_into
        self.prctl = libc.prctl

    def load(self, pid):
        """Install the filter for the process ``pid`` (this one): ``sign * pid`` into each slot."""
        for offset, sign in self.slots:
            self.pack_into(self.buf, offset, (sign * pid) & 0xFFFFFFFF)
        if (self.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                or self.prctl(_PR_SET_SECCOMP, 2, self.prog, 0, 0) != 0):  # SECCOMP_MODE_FILTER
            raise OSError(_libc()[0].get_errno(), "loading the job filter failed")


def landlock_restrict(ruleset_fd):
    ctypes, libc = _libc()
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(NO_NEW_PRIVS) failed")
    if libc.syscall(_SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset_fd), ctypes.c_uint32(0)) != 0:
        raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")


def load_seccomp(bpf):
    """Install a classic-BPF seccomp filter (bytes of struct sock_filter) on this process."""
    ctypes, libc = _libc()
    buf = ctypes.create_string_buffer(bpf, len(bpf))
    prog = _LIBC[1](len(bpf) // 8, ctypes.cast(buf, ctypes.c_void_p))
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(NO_NEW_PRIVS) failed")
    if libc.prctl(_PR_SET_SECCOMP, 2, ctypes.byref(prog), 0, 0) != 0:  # SECCOMP_MODE_FILTER
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")


# ----------------------------------------------------------------------------------------------
# The solution's process: limits first (before the job exists), then load and serve calls.
# ----------------------------------------------------------------------------------------------

JOB_FD = 4  # the solution's process reads its part of the job here (then closes it)
SETUP_FD = 5  # "ok", or why the set-up failed; closed before any job code runs, so that a
# sandbox_error can only ever mean the sandbox failed, never that the job said so
CALLS_FD = 6  # requests from the supervisor
REPLIES_FD = 7  # replies to the supervisor
EXIT_EOF = 10  # supervisor's exit status when the trainer closed the pipe: the zygote exits too
EXIT_DEAD = 3  # supervisor's exit status after it sent {"dead": ...}


def _describe(exc):
    if isinstance(exc, SolutionError):
        return str(exc)[:500]
    try:
        msg = str(exc)
    except BaseException:
        msg = "<unprintable>"
    name = getattr(type(exc), "__name__", "Exception")
    return ("%s: %s" % (name, msg) if msg else name)[:500]


def _flush_std():
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except BaseException:
            pass


def _write_all(fd, data):
    while data:
        data = data[os.write(fd, data):]


def _limit_self(limits, moves, ruleset_fd):
    """setsid, the job filter, the work dir, Landlock, exactly the fds in ``moves`` (src ->
    target), rlimits."""
    os.setsid()
    if limits.get("job_filter"):  # after setsid: our pid is now also our process group's id
        limits["job_filter"].load(os.getpid())
    os.chdir(limits["work_dir"])
    if ruleset_fd is not None:
        landlock_restrict(ruleset_fd)
    high = [(fcntl.fcntl(src, fcntl.F_DUPFD, 256), target) for src, target in moves]  # above every target
    for fd, target in high:
        os.dup2(fd, target)
    low = 0
    for target in sorted(t for _fd, t in moves):  # every other fd closes (the trainer's pipes too)
        if low < target:  # closerange(n, n) would close everything from n up (close_range(n, ~0))
            os.closerange(low, target)
        low = target + 1
    os.closerange(low, 1 << 16)
    mem = limits["memory_mb"] << 20
    for res, lim in (
        (resource.RLIMIT_AS, (mem, mem)),
        (resource.RLIMIT_FSIZE, (limits["file_size_mb"] << 20,) * 2),
        (resource.RLIMIT_NOFILE, (limits["max_open_files"],) * 2),
        (resource.RLIMIT_NPROC, (limits["max_procs"],) * 2),
        (resource.RLIMIT_CORE, (0, 0)),
        (resource.RLIMIT_MEMLOCK, (0, 0)),
        (resource.RLIMIT_MSGQUEUE, (0, 0)),
    ):
        resource.setrlimit(res, lim)


def _solution_process(limits, moves, ruleset_fd):
    """The spare: set up the limits that do not depend on the job, wait for the job, serve it.
    Never returns."""
    try:
        _limit_self(limits, moves, ruleset_fd)
        job = recv_frame(JOB_FD)
        os.close(JOB_FD)
        if job is None:
            os._exit(0)
        used = resource.getrusage(resource.RUSAGE_SELF)
        cpu = int(used.ru_utime + used.ru_stime + float(job.get("timeout_s") or limits["timeout_s"])) + 2
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # the wall clock usually ends it first
        os.write(SETUP_FD, b"ok")
        os.close(SETUP_FD)
    except BaseException as e:
        try:
            os.write(SETUP_FD, ("sandbox set-up failed: " + _describe(e)).encode())
        finally:
            os._exit(70)
    try:
        _serve(job)
    except BaseException:
        pass  # the solution broke its own harness: the supervisor sees a protocol error
    _flush_std()
    os._exit(0)


def _serve(job):
    """Load the setup and the solution, say which callables they define, then serve calls until
    the supervisor closes the pipe. The tests never reach this process."""
    ns = {"__name__": "__sandbox__", "__builtins__": builtins}  # not __main__: main blocks stay off
    entry = job.get("entry_point")

    def reply(rec):  # at once, not batched: a test that finished counts even if the next one hangs
        _flush_std()  # what the call printed is in its pipe before the supervisor hears back
        _write_all(REPLIES_FD, (json.dumps(rec) + "\n").encode())

    try:
        if job.get("setup"):
            exec(compile(job["setup"], "<setup>", "exec"), ns)
        exec(compile(job["code"], "<solution>", "exec"), ns)
        if entry and not callable(ns.get(entry)):
            raise NameError("the solution defines no function %r" % entry)
    except BaseException as e:  # SystemExit and KeyboardInterrupt included: the load failed
        reply(["load", _describe(e)])
        return
    reply(["ready", [k for k, v in list(ns.items()) if type(k) is str and callable(v)]])
    objs, index = [], {}  # handles: objects the tests refer to by number

    def handle(obj):
        k = index.get(id(obj))
        if k is None:
            k = index[id(obj)] = len(objs)
            objs.append(obj)
        return k

    buf = b""
    while True:
        while b"\n" not in buf:
            chunk = os.read(CALLS_FD, 1 << 16)
            if not chunk:
                return
            buf += chunk
        line, buf = buf.split(b"\n", 1)
        seq, op, target, rest = json.loads(line, object_pairs_hook=_tag_decoder(objs.__getitem__))
        try:
            if op == "call":
                args, kwargs, strict = rest
                out = (ns[target] if type(target) is str else target)(*args, **kwargs)
                rec = [seq, "v", encode_value(out, ref=None if strict else handle)]
            elif op == "getattr":
                rec = [seq, "v", encode_value(getattr(target, rest), ref=handle)]
            else:  # setattr
                setattr(target, rest[0], rest[1])
                rec = [seq, "v", None]
        except BaseException as e:  # the call raised; SystemExit included
            rec = [seq, "e", getattr(type(e), "__name__", "Exception"), _describe(e)]
        reply(rec)


# ----------------------------------------------------------------------------------------------
# The supervisor's side: it runs the tests, calling into the solution's process.
# ----------------------------------------------------------------------------------------------


class SolutionError(Exception):
    """An exception of a type the tests have no builtin for, raised in the solution's process."""


class _Lost(BaseException):
    """The solution's process died or broke the call protocol (not an Exception: a test's
    ``except Exception`` must not swallow it)."""


class _LoadFailed(BaseException):
    """The setup or the solution raised while loading (the message says what)."""


class _Timeout(BaseException):
    """The job's wall clock ran out while waiting on the solution."""


class Spare:
    """The solution's process, forked before the job exists, and the supervisor's ends of its
    pipes."""

    def __init__(self, limits, ruleset_fd):
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        calls_r, self.calls = os.pipe()
        self.replies, replies_w = os.pipe()
        job_r, self.job = os.pipe()
        self.setup, setup_w = os.pipe()
        nul = os.open("/dev/null", os.O_RDWR)
        self.pid = os.fork()
        if self.pid == 0:
            _solution_process(limits, ((nul, 0), (out_w, 1), (err_w, 2), (job_r, JOB_FD), (setup_w, SETUP_FD),
                                    (calls_r, CALLS_FD), (replies_w, REPLIES_FD)), ruleset_fd)
        for fd in (nul, out_w, err_w, calls_r, replies_w, job_r, setup_w):
            os.close(fd)
        self.outputs = [out_r, err_r]


class _Wire:
    """The supervisor's pipes to one solution process: requests out, replies in (each at most
    ``cap`` bytes), its stdout and stderr drained into capped buffers all the while, and the
    job's wall clock (``_Timeout``)."""

    def __init__(self, spare, limits, deadline):
        self.spare, self.deadline = spare, deadline
        self.cap = limits["max_result_bytes"]
        self.out_cap = limits["max_output_bytes"]
        self.bufs, self.seen = [bytearray(), bytearray()], [0, 0]
        self.open = {fd: k for k, fd in enumerate(spare.outputs)}
        for fd in spare.outputs + [spare.calls, spare.replies]:
            os.set_blocking(fd, False)
        try:
            self.pidfd = os.pidfd_open(spare.pid)  # our unreaped child: its pid cannot be recycled
        except (AttributeError, OSError):
            self.pidfd = None
        self.inbox = bytearray()
        self.exited = self.timed_out = False

    def drain(self, fd):
        k = self.open[fd]
        try:
            b = os.read(fd, 1 << 16)
        except BlockingIOError:
            return
        if not b:
            del self.open[fd]
            return
        self.seen[k] += len(b)
        room = self.out_cap - len(self.bufs[k])
        if room > 0:
            self.bufs[k] += b[:room]

    def _wait(self, read=None, write=None):
        """Until ``read`` is readable / ``write`` writable (True), or the solution has exited
        (False: a process it left may hold the pipe, but it no longer speaks for the solution),
        draining its output meanwhile; _Timeout once the wall clock has run out."""
        while True:
            left = self.deadline - time.monotonic()
            if left <= 0:
                self.timed_out = True
                raise _Timeout()
            rs = list(self.open) + ([read] if read is not None else [])
            if self.pidfd is not None and not self.exited:
                rs.append(self.pidfd)
            ws = [write] if write is not None else []
            r, w, _x = select.select(rs, ws, [], 0 if self.exited else left)
            for fd in r:
                if fd in self.open:
                    self.drain(fd)
            if (read is not None and read in r) or w:
                return True
            if self.exited or (self.pidfd is not None and self.pidfd in r):
                self.exited = True
                return False

    def send(self, data):
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self.spare.calls, view):]
            except BlockingIOError:
                if not self._wait(write=self.spare.calls):
                    raise BrokenPipeError("the solution's process exited")

    def readline(self):
        """The next line from the solution; None when it has ended (ValueError if over cap)."""
        while True:
            i = self.inbox.find(b"\n")
            if i >= 0:
                line = bytes(self.inbox[:i])
                del self.inbox[:i + 1]
                return line
            if len(self.inbox) > self.cap:
                raise ValueError("a reply of more than %d bytes" % self.cap)
            try:
                chunk = os.read(self.spare.replies, 1 << 16)
            except BlockingIOError:
                if self._wait(read=self.spare.replies):
                    continue
                return None
            if not chunk:
                return None
            self.inbox += chunk

    @staticmethod
    def _ready(fd):
        return bool(select.select([fd], [], [], 0)[0])

    def finish(self):
        """Drain what is already in the output pipes (writers may still be alive)."""
        for fd in list(self.open):
            while fd in self.open and self._ready(fd):
                self.drain(fd)
        if self.pidfd is not None:
            os.close(self.pidfd)


class _Peer:
    """The tests' end of the call protocol. Requests carry a sequence number and replies come
    back in order; the solution's first line (its hello: loaded, or why not) is read before any."""

    def __init__(self, wire):
        self.wire = wire
        self.seq = 0
        self.lost = None  # why the solution's process is gone (then every request raises)
        self.names = None  # the callables the solution defines, once its hello is in
        self.remotes = {}

    def hello(self):
        """The solution's callables' names; _LoadFailed if it did not load."""
        if self.names is None:
            rec = self._read()
            if type(rec) is list and len(rec) == 2 and rec[0] == "load" and type(rec[1]) is str:
                raise _LoadFailed(rec[1])
            if not (type(rec) is list and len(rec) == 2 and rec[0] == "ready" and type(rec[1]) is list):
                self._fail("it sent %.80r before loading" % (rec,))
            self.names = [n for n in rec[1] if type(n) is str]
        return self.names

    def encode(self, op, target, rest):
        """A request, less its sequence number (TypeError for an argument that cannot cross)."""
        try:
            return json.dumps(encode_value([op, target, rest], ref=self._handle_of))
        except (TypeError, ValueError, RecursionError) as e:
            raise TypeError("cannot pass this to the solution: %s" % e) from None

    def send(self, *lines):
        """Send encoded requests (in one write) under the next sequence numbers; the last one."""
        if self.lost:
            raise _Lost(self.lost)
        wire = []
        for line in lines:
            self.seq += 1
            wire.append("[%d, %s\n" % (self.seq, line[1:]))
        try:
            self.wire.send("".join(wire).encode())
        except OSError:
            # Call tests are sent before the hello is read: a solution that failed to load has said
            # so and exited, and its closed pipe must not turn that load error into a crash
            if self.names is None:
                self.hello()  # _LoadFailed when its first line says why; _Lost if it said nothing
            self._fail("its process is gone")
        return self.seq

    def collect(self, seq):
        """The reply to request ``seq`` (all earlier ones collected): its value, or raise its error."""
        self.hello()
        rec = self._read()
        if type(rec) is list and len(rec) >= 3 and rec[0] == seq:
            if rec[1] == "v" and len(rec) == 3:
                return rec[2]
            if rec[1] == "e" and len(rec) == 4 and type(rec[2]) is str and type(rec[3]) is str:
                raise _as_exception(rec[2], rec[3])
        self._fail("malformed reply %.80r" % (rec,))

    def request(self, op, target, rest):
        return self.collect(self.send(self.encode(op, target, rest)))

    def _read(self):
        if self.lost:
            raise _Lost(self.lost)
        try:
            line = self.wire.readline()
        except (ValueError, MemoryError) as e:
            self._fail(str(e))
        if line is None:
            self._fail("its process ended")
        try:
            return json.loads(line, object_pairs_hook=_tag_decoder(self._remote))
        except (ValueError, TypeError, RecursionError, MemoryError):
            self._fail("unreadable reply")

    def _fail(self, why):
        self.lost = "the solution's process failed the protocol: " + why
        raise _Lost(self.lost)

    def _remote(self, k):
        r = self.remotes.get(k)
        if r is None:
            r = self.remotes[k] = Remote(self, k)
        return r

    @staticmethod
    def _handle_of(x):
        if type(x) is Remote:
            return object.__getattribute__(x, "_k")
        raise TypeError("not a plain builtin value: %s" % type(x).__name__)

    def function(self, name, strict):
        peer = self

        def remote(*args, **kwargs):
            return peer.request("call", name, [list(args), kwargs, strict])

        remote.__name__ = remote.__qualname__ = name
        return remote


class Remote:
    """An object in the solution's process, as the tests see it: attributes and calls go there;
    comparisons, hashing and truth are by identity here, so it can never pass for a value."""

    __slots__ = ("_peer", "_k")

    def __init__(self, peer, k):
        object.__setattr__(self, "_peer", peer)
        object.__setattr__(self, "_k", k)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return object.__getattribute__(self, "_peer").request("getattr", self, name)

    def __setattr__(self, name, value):
        object.__getattribute__(self, "_peer").request("setattr", self, [name, value])

    def __call__(self, *args, **kwargs):
        return object.__getattribute__(self, "_peer").request("call", self, [list(args), kwargs, False])

    def __repr__(self):
        return "<object %d of the solution>" % object.__getattribute__(self, "_k")


def _as_exception(name, msg):
    """The exception the tests see for one raised in the solution's process: the builtin of that
    name where there is one (so ``except ValueError`` in a test works), else SolutionError."""
    cls = getattr(builtins, name, None)
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            e = cls(msg.split(": ", 1)[1] if ": " in msg else "")
            if _describe(e) == msg:
                return e
        except Exception:
            pass
    return SolutionError(msg)


PIPELINE_BYTES = 16 << 10  # Call requests in flight at once: well under a pipe's 64 KiB


def _run_tests(job, peer, emit):
    """Run every test of ``job`` against the solution (through ``peer``), ``emit``-ting records."""
    import io  # sandbox child: only a supervisor running tests needs it, not the zygote's image

    ns = {"__name__": "__sandbox__", "__builtins__": builtins}
    entry, tests = job.get("entry_point"), job.get("tests", [])
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = io.StringIO(), io.StringIO()  # what the tests print joins the job's
    try:
        try:
            if job.get("setup"):
                exec(compile(job["setup"], "<setup>", "exec"), ns)
        except Exception as e:
            raise _LoadFailed(_describe(e)) from None
        _call_tests(peer, tests, entry, emit)
        strict = bool(job.get("guard", True))
        for name in peer.hello():  # the solution's functions, bar builtins' names it shadows (say `set`)
            if name.isidentifier() and not name.startswith("__") and name not in ns and (
                    name == entry or not hasattr(builtins, name)):
                ns[name] = peer.function(name, strict and name == entry)
        for i, test in enumerate(tests):
            if test[0] == "call":
                continue
            try:
                exec(compile(test[1], "<test %d>" % i, "exec"), ns)
                rec = [i, "ok"]
            except _Timeout:
                raise
            except BaseException as e:  # a failed assert, an error from the solution, _Lost
                rec = [i, "e", _describe(e)]
            if peer.wire.timed_out:  # a test that swallowed the timeout passes nothing either
                raise _Timeout()
            if peer.lost:  # whatever the test made of it, a dead solution passes nothing
                raise _Lost(peer.lost)
            emit(rec)
    except _LoadFailed as e:
        emit(["load", str(e)])
    except _Lost as e:
        emit(["lost", str(e)])
    finally:
        printed = sys.stdout.getvalue(), sys.stderr.getvalue()
        sys.stdout, sys.stderr = saved
    return printed


def _call_tests(peer, tests, entry, emit):
    """The Call tests, pipelined: each is a call of the entry point whose plain value is reported
    (the trainer compares it with the expected value, which never enters the sandbox). Requests
    go out in batches of at most PIPELINE_BYTES in flight, so neither side blocks on a full pipe."""
    batch, inflight, used = [], [], 0  # batch: (test index, request) not yet sent; in flight:
    # (test index, sequence number, request bytes); used: bytes of both

    def send_batch():
        if batch:
            last = peer.send(*[line for _i, line in batch])
            first = last - len(batch) + 1
            inflight.extend((i, first + k, len(line)) for k, (i, line) in enumerate(batch))
            batch.clear()

    def settle():
        nonlocal used
        i, seq, n = inflight.pop(0)
        used -= n
        try:
            rec = [i, "v", encode_value(peer.collect(seq))]
        except (_Lost, _LoadFailed, _Timeout):
            raise
        except BaseException as e:
            rec = [i, "e", _describe(e)]
        emit(rec)

    for i, test in enumerate(tests):
        if test[0] != "call":
            continue
        try:
            line = peer.encode("call", entry, [list(decode_value(test[1])), {}, True])
        except Exception as e:
            emit([i, "e", _describe(e)])
            continue
        if used + len(line) > PIPELINE_BYTES:
            send_batch()
            while inflight and used + len(line) > PIPELINE_BYTES:
                settle()
        batch.append((i, line))
        used += len(line)
    send_batch()
    while inflight:
        settle()


# ----------------------------------------------------------------------------------------------
# The supervisor: one job, then exit.
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
    _write_all(fd, len(body).to_bytes(4, "big") + body)


def run_job(job, limits, spare):
    """Hand the solution's process its part of ``job`` (never the tests), run the tests against
    it until they end or the wall clock runs out. Killing what is left is the caller's next step."""
    t0 = time.monotonic()
    deadline = t0 + float(job.get("timeout_s") or limits["timeout_s"])
    part = {"code": job.get("code") or "", "setup": job.get("setup") or "",
            "entry_point": job.get("entry_point"), "timeout_s": job.get("timeout_s")}
    try:
        send_frame(spare.job, part)  # it is waiting for exactly this, so the pipe drains
    except OSError:
        pass  # it died; its set-up pipe says why
    os.close(spare.job)
    wire = _Wire(spare, limits, deadline)
    results, size = [], [0]

    def emit(rec):
        line = json.dumps(rec)
        size[0] += len(line) + 1
        if size[0] <= limits["max_result_bytes"]:
            results.append(line)

    timed_out = False
    printed = ("", "")
    try:
        printed = _run_tests(job, _Peer(wire), emit)
        emit(["done"])
    except _Timeout:
        timed_out = True
    elapsed = time.monotonic() - t0
    wire.finish()
    for k, text in enumerate(printed):  # the tests' own prints, after the solution's
        room = wire.out_cap - len(wire.bufs[k])
        data = text.encode()
        wire.seen[k] += len(data)
        if room > 0:
            wire.bufs[k] += data[:room]
    os.set_blocking(spare.setup, False)
    try:
        setup = os.read(spare.setup, 4096).decode("utf-8", "replace")
    except BlockingIOError:
        setup = ""
    for fd in wire.spare.outputs + [spare.calls, spare.replies, spare.setup]:
        os.close(fd)
    status = None  # the solution's exit status, where it has ended (a dying one gets a moment)
    lost = any(line.startswith('["lost", ') for line in results)
    until = min(deadline, time.monotonic() + 0.25) if lost else 0
    while True:
        pid, st = os.waitpid(spare.pid, os.WNOHANG)
        if pid or time.monotonic() >= until:
            status = st if pid else None
            break
        time.sleep(0.005)
    return {
        "status": "timeout" if timed_out else "exited",
        "exit_code": os.WEXITSTATUS(status) if status is not None and os.WIFEXITED(status) else None,
        "signal": os.WTERMSIG(status) if status is not None and os.WIFSIGNALED(status) else None,
        "results": "".join(line + "\n" for line in results),
        "results_truncated": size[0] > limits["max_result_bytes"],
        "stdout": wire.bufs[0].decode("utf-8", "replace"),
        "stdout_bytes": wire.seen[0],
        "stderr": wire.bufs[1].decode("utf-8", "replace"),
        "stderr_bytes": wire.seen[1],
        "elapsed_s": elapsed,
        "setup": setup or "sandbox set-up did not finish",
    }


def _kill_everything_else(pid1):
    """SIGKILL every process of the job and reap them all.

    The supervisor is a child subreaper, so orphans of the job (setsid and double forks
    included) are re-parented to it, and waiting until ECHILD proves none is left. Inside the
    sandbox's PID namespace kill(-1) reaches every process but PID 1 (the zygote, which holds
    nothing of the job) and the supervisor itself. Outside one (unsandboxed mode)
    /proc/self/task/*/children lists them (only our own unreaped children, so no pid we signal
    can have been recycled).
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
            import shutil  # sandbox child: a rare path (a job left a directory), kept out of the zygote

            shutil.rmtree(p)
        else:
            os.unlink(p)


SPARES = 4  # jobs per supervisor: all their solution processes are forked before the first job


def _supervise(limits, ruleset_fd, proto_in, proto_out, pid1, go_r, clear_w):
    """Up to SPARES jobs, then exit. Never returns.

    The solution's spares are all forked at once, before any job exists (so each is a clean copy
    of the zygote: the supervisor holds earlier jobs' data by the time a later spare runs, but no
    spare is forked after that). Jobs are read only once the zygote says go (the previous
    supervisor has exited: the work dir is empty and the trainer's pipe is ours). After each job
    every process of it is killed but the idle spares, found through /proc (a setsid double fork
    is re-parented to us: we are a child subreaper); without /proc, one spare and kill(-1). Once
    the last job's processes are dead, "clear" tells the zygote it may fork the next supervisor:
    nothing here signals a process after that, so it is safe from our kill(-1).
    """
    went = cleared = False  # before go, the previous supervisor may still be replying: no kill(-1)
    try:
        _, libc = _libc()
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # the job's orphans come back to us
        count = SPARES if os.path.isdir("/proc/self/task") else 1
        spares = [Spare(limits, ruleset_fd) for _ in range(count)]
        went = os.read(go_r, 1) == b"g"
        for k, spare in enumerate(spares):
            job = recv_frame(proto_in) if went else None
            if job is None:  # the trainer (or, without go, the zygote) is gone; so are the spares
                if went:  # once we exit and close their job pipes
                    _kill_everything_else(pid1)
                os._exit(EXIT_EOF)
            reply = run_job(job, limits, spare)
            # before the reply: when the trainer has it, nothing of the job is left
            if k + 1 < len(spares):
                _kill_job([s.pid for s in spares[k + 1:]])
            else:
                _kill_everything_else(pid1)
                os.write(clear_w, b"c")
                cleared = True
            send_frame(proto_out, reply)
            _clean_work_dir(limits["work_dir"])  # off the job's clock: the trainer already has its reply
    except BaseException as e:
        if went and not cleared:
            _kill_everything_else(pid1)
        try:  # a work dir we cannot empty is never reused: the trainer starts a fresh worker
            send_frame(proto_out, {"dead": "job supervisor failed: " + _describe(e)})
        finally:
            os._exit(EXIT_DEAD)
    os._exit(0)


def _kill_job(idle):
    """SIGKILL every child of ours but the ``idle`` spares, and reap them, until none is left
    (what a killed process leaves is re-parented to us and found on the next round)."""
    idle = set(idle)
    while True:
        kids = [pid for pid in _children() if pid not in idle]
        if not kids:
            return
        for pid in kids:  # our unreaped children: no pid here can have been recycled
            for kill in (os.killpg, os.kill):
                try:
                    kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        for pid in kids:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass


# ----------------------------------------------------------------------------------------------
# The zygote: forks a supervisor per job, forever; never reads from the trainer.
# ----------------------------------------------------------------------------------------------


def _fork_supervisor(limits, ruleset_fd, proto_in, proto_out, pid1):
    """(pid, go fd, clear fd) of a fresh supervisor, forked from a process that never held a job."""
    go_r, go_w = os.pipe()
    clear_r, clear_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(go_w)
        os.close(clear_r)
        _supervise(limits, ruleset_fd, proto_in, proto_out, pid1, go_r, clear_w)
    os.close(go_r)
    os.close(clear_w)
    return pid, go_w, clear_r


def main():
    limits = json.loads(sys.argv[1])
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # PID 1 ignores signals it has no handler for
    proto_in, proto_out = os.dup(0), os.dup(1)
    nul = os.open("/dev/null", os.O_RDWR)
    os.dup2(nul, 0)
    os.dup2(nul, 1)
    os.close(nul)
    pid1 = os.getpid() == 1
    ctypes, libc = _libc()
    libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)  # no /proc/<pid>/mem or ptrace into us (inherited)
    if limits.get("seccomp_bpf_hex"):
        load_seccomp(bytes.fromhex(limits["seccomp_bpf_hex"]))
    if limits.get("job_seccomp"):  # made ready here, once: each spare only writes its pid into it
        limits["job_filter"] = JobFilter(limits["job_seccomp"])
    os.makedirs(limits["work_dir"], mode=0o700, exist_ok=True)
    abi = landlock_abi() if limits.get("landlock", True) else 0
    ruleset_fd = None
    if abi:
        ruleset_fd = landlock_ruleset(abi, limits["read_paths"], [limits["work_dir"]], limits["file_rw_paths"])
    send_frame(proto_out, {
        "ready": 1,
        "pid": os.getpid(),
        "uid": os.getuid(),
        "landlock_abi": abi,
        "python": sys.version.split()[0],
    })
    import gc  # sandbox child: just before the zygote freezes its heap and forks

    gc.freeze()  # what the zygote holds is never collected: forks share those pages for longer
    args = (limits, ruleset_fd, proto_in, proto_out, pid1)
    following = _fork_supervisor(*args)
    while True:
        pid, go_w, clear_r = following
        os.write(go_w, b"g")
        os.close(go_w)
        cleared = os.read(clear_r, 1) == b"c"  # empty: it ended without a job, or failed
        os.close(clear_r)
        following = _fork_supervisor(*args) if cleared else None  # starts while this one replies
        while True:  # as PID 1, also reap whatever else is re-parented to us
            done, status = os.waitpid(-1, 0)
            if done == pid:
                break
        if not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0 or following is None:
            os._exit(0 if os.WIFEXITED(status) and os.WEXITSTATUS(status) == EXIT_EOF else 3)


if __name__ == "__main__":
    main()
