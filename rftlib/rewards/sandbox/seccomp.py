"""The seccomp filter every sandboxed process runs under, compiled to classic BPF by libseccomp.

Default: allow. Refused with EPERM (so Python raises a clean ``PermissionError``):
    - sockets of any family but AF_UNIX (the network namespace is empty too: two layers);
    - io_uring (its SOCKET/CONNECT ops would bypass the socket rule), SysV IPC and memfd_create
      (memory that outlives the job or escapes RLIMIT_AS), userfaultfd, bpf, perf_event_open;
    - ptrace, process_vm_readv/writev, kcmp, pidfd_getfd (reaching into another process);
    - new namespaces, mounts, keyrings, module / kexec / reboot / swap / clock / acct calls.
``clone3`` answers ENOSYS (its flags sit behind a pointer seccomp cannot read) so glibc falls
back to ``clone``, whose namespace flags are checked. Syscalls of a foreign architecture kill
the process. pyseccomp (ctypes over the system's libseccomp) only builds the program here, in
the trainer; bwrap loads it (``--seccomp FD``), or the zygote does when running unsandboxed.

Every solution process also adds :func:`job_filter` (filters stack: a call must pass both), which
keeps what a job does to other processes inside the job; the notes above it say how and why.
"""

from __future__ import annotations

import errno
import functools
import os
import struct
import sys
import tempfile

AF_UNIX = 1
_CLONE_NS_FLAGS = 0x7E020000  # NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET, and NEWTIME below
_CLONE_NEWTIME = 0x00000080

DENIED = (
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    "shmget", "shmat", "shmctl", "shmdt", "msgget", "msgsnd", "msgrcv", "msgctl",
    "semget", "semop", "semtimedop", "semctl",
    "memfd_create", "memfd_secret", "userfaultfd", "bpf", "perf_event_open",
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
    "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "open_tree", "move_mount",
    "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
    "add_key", "request_key", "keyctl",
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load",
    "reboot", "swapon", "swapoff", "acct", "settimeofday", "clock_settime", "clock_adjtime",
    "adjtimex", "syslog", "quotactl", "lookup_dcookie", "personality", "uselib", "vhangup",
    "name_to_handle_at", "open_by_handle_at", "fanotify_init", "iopl", "ioperm",
)


class SeccompUnavailable(RuntimeError):
    """pyseccomp or the system's libseccomp is missing."""


def _pyseccomp():
    try:
        import pyseccomp  # lazy on purpose: it needs the system's libseccomp, which may be missing
    except (ImportError, RuntimeError, OSError) as e:  # RuntimeError: "Unable to find libseccomp"
        raise SeccompUnavailable(
            f"seccomp filter unavailable ({e}); run `bash scripts/setup_sandbox.sh` "
            "(pip pyseccomp==0.1.2, apt libseccomp2)"
        ) from e
    return pyseccomp


@functools.lru_cache(maxsize=1)
def filter_bpf() -> bytes:
    """The compiled filter (struct sock_filter[]), built once per process."""
    sc = _pyseccomp()
    f = sc.SyscallFilter(sc.ALLOW)
    f.set_attr(sc.Attr.ACT_BADARCH, sc.KILL_PROCESS)
    eperm = sc.ERRNO(errno.EPERM)
    f.add_rule(eperm, "socket", sc.Arg(0, sc.NE, AF_UNIX))
    f.add_rule(eperm, "socketpair", sc.Arg(0, sc.NE, AF_UNIX))
    f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    for flag in _bits(_CLONE_NS_FLAGS | _CLONE_NEWTIME):
        f.add_rule(eperm, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    for name in DENIED:
        try:
            f.add_rule(eperm, name)
        except (OSError, ValueError, RuntimeError):
            pass  # not a syscall on this architecture (e.g. iopl on arm64)
    with tempfile.TemporaryFile() as fh:
        f.export_bpf(fh)
        fh.seek(0)
        return fh.read()


def _bits(mask: int) -> list[int]:
    return [1 << i for i in range(32) if mask >> i & 1]


def bpf_fd() -> int:
    """A readable fd holding the filter, for ``bwrap --seccomp FD`` (the caller closes it)."""
    data = filter_bpf()
    r, w = os.pipe()
    if len(data) > 65536:  # larger than a pipe buffer: not the case for this small filter
        os.close(r)
        os.close(w)
        raise SeccompUnavailable("seccomp filter too large for a pipe")
    os.write(w, data)
    os.close(w)
    return r


# ----------------------------------------------------------------------------------------------
# The job filter. A solution's process and everything it forks may act on the job's processes
# only: the supervisor, the zygote and the spare processes already forked for the next jobs run
# as the same uid in the same PID namespace, and a job that stopped, killed, niced or starved its
# siblings would make them time out or fail (games group-relative rewards). Landlock ABI 6
# (Linux 6.12+) scopes signals, but older kernels lack it, and it never covered prlimit,
# setpriority or the sched_ calls. seccomp compares integer arguments (never what a pointer holds),
# so calls that name a process by pid pass only for the job's own pid P, as written into the
# program when its process installs it (after setsid, so P is also its process group and session):
#     kill                          0 (own group), P, -P (the job's group, which only it can join)
#     tkill, tgkill,                P: the job's main process and its threads (a thread's tid is
#     rt_sigqueueinfo, rt_tgsigq.   checked against the thread group by the kernel)
#     prlimit64, sched_setaffinity, 0 or P (0 is the caller: any of the job's processes may set its
#     _setscheduler, _setparam,     own limits and scheduling)
#     _setattr
#     setpriority, ioprio_set       0 or P, by process or process group; never by user (all the
#                                   worker's processes share the uid)
#     fcntl F_SETOWN                0, P, -P: whom SIGIO (F_SETSIG: any signal) is sent to
#     fcntl F_SETOWN_EX, ioctl      refused (the owner sits behind a pointer)
#     FIOSETOWN, SIOCSPGRP
#     pidfd_send_signal             refused (a pidfd's target cannot be read; pidfd_open is allowed:
#                                   it only names a process, and the calls that act through a pidfd
#                                   are refused here or need ptrace rights, which the non-dumpable
#                                   processes outside the job do not grant)
# So a solution may signal itself, its threads and its process group (its children, unless they
# leave the group), and a child may signal the main process; a job's processes are never signalled
# by pid otherwise: subprocess's Popen.kill and multiprocessing's terminate get PermissionError
# (``os.killpg(0, sig)`` reaches the children). Refusals are EPERM, what the kernel answers for a
# process one may not signal. Why not a uid per job, or a PID namespace per job: both need more than
# one uid mapped, or a nested user namespace, inside bubblewrap's unprivileged one (Ubuntu 24.04's
# AppArmor profile for bwrap denies the latter); seccomp works unprivileged, on every kernel the
# sandbox supports, and in the unsandboxed mode, where it also keeps jobs off the trainer.
# ----------------------------------------------------------------------------------------------

_LD, _JEQ, _JGE, _RET = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JGE|K, BPF_RET|K
_ALLOW, _KILL_PROCESS, _EPERM = 0x7FFF0000, 0x80000000, 0x00050000 | errno.EPERM  # SECCOMP_RET_*
_NR, _ARCH = 0, 4  # offsets in struct seccomp_data; args[i] at 16 + 8 i
_X32_BIT = 0x40000000  # x86_64's x32 ABI: same arch token, other numbers (refused outright)
_AUDIT_ARCH_X86_64 = 0xC000003E
_F_SETOWN, _F_SETOWN_EX = 8, 15
_FIOSETOWN, _SIOCSPGRP = 0x8901, 0x8902
_PRIO_USER, _IOPRIO_WHO_USER = 2, 3  # setpriority / ioprio_set: every process of a uid
P, MINUS_P = "P", "-P"  # placeholders for the job's pid in the program


def _arg(i: int) -> int:
    """Offset of args[i]'s low 32 bits: the int a pid is (the kernel ignores the high half)."""
    return 16 + 8 * i + (0 if sys.byteorder == "little" else 4)


@functools.lru_cache(maxsize=1)
def job_filter() -> tuple[bytes, tuple[tuple[int, int], ...]]:
    """The job filter with the pid left 0, and where it goes: (instruction index, sign) pairs
    (``_zygote.job_filter`` writes ``sign * pid`` there). Built once per process."""
    sc = _pyseccomp()
    arch = sc.system_arch()
    member = {  # label -> (arg, the values that pass); anything else is EPERM
        "pid_or_group": (0, (0, P, MINUS_P)), "pid": (0, (P,)), "self": (0, (0, P)),
        "who": (1, (0, P)), "owner": (2, (0, P, MINUS_P)),
    }
    calls = {"kill": "pid_or_group", "pidfd_send_signal": "deny", "fcntl": "fcntl", "fcntl64": "fcntl",
             "ioctl": "ioctl", "setpriority": "setpriority", "ioprio_set": "ioprio_set"}
    calls.update(dict.fromkeys(("tkill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo"), "pid"))
    calls.update(dict.fromkeys(("prlimit64", "sched_setaffinity", "sched_setscheduler",
                                "sched_setparam", "sched_setattr"), "self"))
    prog: list[tuple] = [(_LD, 0, 0, _ARCH), (_JEQ, 0, "foreign_arch", arch), (_LD, 0, 0, _NR)]
    if arch == _AUDIT_ARCH_X86_64:
        prog.append((_JGE, "deny", 0, _X32_BIT))
    for name, label in calls.items():
        nr = sc.resolve_syscall(sc.Arch.NATIVE, name)
        if nr >= 0:  # negative: not a syscall of this architecture (fcntl64 on 64-bit ones)
            prog.append((_JEQ, label, 0, nr))
    prog.append((_RET, 0, 0, _ALLOW))
    blocks = {
        "fcntl": [(_LD, 0, 0, _arg(1)), (_JEQ, "deny", 0, _F_SETOWN_EX), (_JEQ, "owner", "allow", _F_SETOWN)],
        "ioctl": [(_LD, 0, 0, _arg(1)), (_JEQ, "deny", 0, _FIOSETOWN), (_JEQ, "deny", "allow", _SIOCSPGRP)],
        "setpriority": [(_LD, 0, 0, _arg(0)), (_JGE, "deny", "who", _PRIO_USER)],
        "ioprio_set": [(_LD, 0, 0, _arg(0)), (_JGE, "deny", "who", _IOPRIO_WHO_USER)],
    }
    for label, (i, values) in member.items():
        blocks[label] = [(_LD, 0, 0, _arg(i))] + [
            (_JEQ, "allow", 0 if k + 1 < len(values) else "deny", v) for k, v in enumerate(values)]
    blocks.update(allow=[(_RET, 0, 0, _ALLOW)], deny=[(_RET, 0, 0, _EPERM)],
                  foreign_arch=[(_RET, 0, 0, _KILL_PROCESS)])
    at = {}
    for label, block in blocks.items():
        at[label] = len(prog)
        prog += block
    out, slots = bytearray(), []
    for i, (code, jt, jf, k) in enumerate(prog):
        jt, jf = (at[j] - i - 1 if isinstance(j, str) else j for j in (jt, jf))
        assert 0 <= jt < 256 and 0 <= jf < 256, "a jump past 255 instructions"
        if k in (P, MINUS_P):
            slots.append((i, 1 if k == P else -1))
            k = 0
        out += struct.pack("=HBBI", code, jt, jf, k)  # struct sock_filter
    return bytes(out), tuple(slots)
