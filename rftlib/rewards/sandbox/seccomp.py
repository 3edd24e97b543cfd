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
"""

from __future__ import annotations

import errno
import functools
import os
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


@functools.lru_cache(maxsize=1)
def filter_bpf() -> bytes:
    """The compiled filter (struct sock_filter[]), built once per process."""
    try:
        import pyseccomp as sc
    except (ImportError, RuntimeError, OSError) as e:  # RuntimeError: "Unable to find libseccomp"
        raise SeccompUnavailable(
            f"seccomp filter unavailable ({e}); run `bash scripts/setup_sandbox.sh` "
            "(pip pyseccomp==0.1.2, apt libseccomp2)"
        ) from e
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
