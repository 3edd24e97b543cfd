"""One test per attack on the sandbox, each checking the effect from OUTSIDE the sandbox.

Timing assertions are only "ends within its timeout + slack": this runs on a loaded 2-core box.
If bubblewrap is missing every test here FAILS (CI runs scripts/setup_sandbox.sh first), except
the fail-closed test, which simulates a missing bwrap itself.
"""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time
import uuid
from pathlib import Path

import pytest

from rftlib.rewards.code import CodeProblem, code_reward
from rftlib.rewards.sandbox import Call, Exec, Job, Sandbox, SandboxUnavailable, check_available

TIMEOUT_S = 1.0  # per-job wall clock used by the attack jobs
SANDBOX_TIMEOUT_S = TIMEOUT_S  # the shared sb fixture (conftest.py) reads it
SLACK_S = 1.0  # "ends within timeout + 1 s"
ADD = "def add(a, b):\n    return a + b\n"
ADD_TESTS = (Call((1, 2)), Call(("x", "y")))


def _require_bwrap() -> None:
    ok, why = check_available()
    if not ok:
        pytest.fail(f"the sandbox is unavailable here ({why}): run `bash scripts/setup_sandbox.sh`")


def _works(sb: Sandbox) -> None:
    """The pool still runs a correct job (after an attack)."""
    res = sb.run(Job(ADD, "add", ADD_TESTS))
    assert res.status == "ok", res
    assert [t.value for t in res.tests] == [3, "xy"]


def _timed(sb: Sandbox, job: Job):
    t0 = time.monotonic()
    res = sb.run(job)
    return res, time.monotonic() - t0


def _proc_cmdlines() -> list[str]:
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                out.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace"))
            except OSError:
                pass
    return out


def _children(pid: int) -> list[int]:
    kids = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        kids += [int(k) for k in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
    return kids


def _job_processes(sb: Sandbox) -> list[list[int]]:
    """For each worker, how many processes sit at each depth under its zygote, found from the
    outside through /proc. Between jobs that is at most two supervisors (one finishing, the next
    one waiting) and the solution spares they forked before any job (at most SPARES each, none
    with children); anything a job left behind adds a level or a process."""
    out = []
    for w in sb._workers:
        (zygote,) = _children(w.proc.pid)  # bwrap's one child: the zygote, PID 1 inside
        levels, level = [], [zygote]
        while level:
            level = [k for pid in level for k in _children(pid)]
            levels.append(len(level))
        out.append(levels[:-1])
    return out


def test_correct_solution_passes(sb):
    res = sb.run(Job(ADD, "add", ADD_TESTS + (Exec("assert add(2, 2) == 4"),)))
    assert res.status == "ok"
    assert [t.ok for t in res.tests] == [True, True, True]
    assert [t.value for t in res.tests[:2]] == [3, "xy"]


def test_infinite_loop_ends_within_timeout(sb):
    res, wall = _timed(sb, Job("while True:\n    pass\n" + ADD, "add", ADD_TESTS, timeout_s=TIMEOUT_S))
    assert res.status == "timeout"
    assert wall < TIMEOUT_S + SLACK_S, f"took {wall:.2f}s"
    assert not any(t.ok for t in res.tests)
    _works(sb)


def test_fork_bomb_is_bounded(sb):
    counting = (
        "import os, time\n"
        "n = 0\n"
        "for _ in range(10000):\n"
        "    try:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(30)\n"
        "            os._exit(0)\n"
        "        n += 1\n"
        "    except OSError:\n"
        "        break\n"
        "def forks():\n    return n\n"
    )
    res = sb.run(Job(counting, "forks", (Call(()),), timeout_s=5.0))
    assert res.status == "ok", res
    assert res.tests[0].value < 16, "RLIMIT_NPROC (max_procs=16) bounds the job's processes"
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    res, wall = _timed(sb, Job(bomb, timeout_s=TIMEOUT_S))
    assert res.status == "timeout"
    assert wall < TIMEOUT_S + SLACK_S + 2.0, f"took {wall:.2f}s"
    from rftlib.rewards.sandbox._zygote import SPARES

    for levels in _job_processes(sb):  # supervisors, their idle spares, and nothing below
        assert len(levels) <= 2 and levels[0] <= 2 and levels[1:] <= [SPARES], levels
    _works(sb)


def test_10gb_allocation_fails_inside(sb):
    code = "def grab():\n    x = bytearray(10 * 1024 ** 3)\n    return len(x)\n"
    res, wall = _timed(sb, Job(code, "grab", (Call(()),), timeout_s=5.0))
    assert not res.tests[0].ok
    assert "MemoryError" in res.tests[0].error
    assert wall < 5.0 + SLACK_S
    _works(sb)


def test_writes_outside_work_dir_do_not_reach_host(sb, tmp_path):
    marker = f"rft-escape-{uuid.uuid4().hex}"
    targets = [f"/tmp/{marker}", f"/dev/shm/{marker}", f"/{marker}", f"/usr/{marker}",
               f"/etc/{marker}", f"/root/{marker}", str(tmp_path / marker), str(Path.cwd() / marker)]
    code = (
        "def attack(paths):\n"
        "    done = []\n"
        "    for p in paths:\n"
        "        try:\n"
        "            with open(p, 'w') as f:\n"
        "                f.write('pwned')\n"
        "            done.append(p)\n"
        "        except OSError:\n"
        "            pass\n"
        "    with open('inside.txt', 'w') as f:\n"  # the work dir itself is writable
        "        f.write('ok')\n"
        "    return done\n"
    )
    res = sb.run(Job(code, "attack", (Call((targets,)),)))
    assert res.tests[0].ok, res
    for p in targets:
        assert not os.path.exists(p), f"{p} appeared on the host"
    assert not Path.cwd().joinpath("inside.txt").exists()


def test_filling_the_disk_is_bounded(sb):
    code = (
        "import os\n"
        "def fill(dirs):\n"  # up to 48 MB into each dir; only the 32 MB tmpfs should take any
        "    total = 0\n"
        "    chunk = b'x' * (1 << 20)\n"
        "    for d in dirs:\n"
        "        here = 0\n"
        "        for i in range(100):\n"
        "            try:\n"
        "                with open(os.path.join(d, f'fill{i}'), 'wb') as f:\n"
        "                    while here < 48 << 20:\n"
        "                        f.write(chunk)\n"
        "                        f.flush()\n"
        "                        here += len(chunk)\n"
        "                        total += len(chunk)\n"
        "            except OSError:\n"
        "                pass\n"
        "            if here >= 48 << 20:\n"
        "                break\n"
        "    return total\n"
        "def listing():\n"
        "    return os.listdir('.')\n"
    )
    dirs = [".", "/", "/dev", "/dev/shm", "/usr", "/etc"]
    free_before = shutil.disk_usage("/").free
    res, wall = _timed(sb, Job(code, "fill", (Call((dirs,)),), timeout_s=10.0))
    free_after = shutil.disk_usage("/").free
    assert res.tests[0].ok, res
    assert res.tests[0].value <= 32 << 20, "only the work dir's tmpfs is writable, and it is capped at 32 MB"
    assert free_before - free_after < 200 << 20, "the host disk was not filled"
    assert wall < 10.0 + SLACK_S
    for _ in range(2):  # the next jobs on both workers find an empty work dir
        res = sb.map([Job(code, "listing", (Call(()),))] * 2)
        assert [r.tests[0].value for r in res] == [[], []]


def test_root_only_file_and_env_secret_stay_hidden():
    _require_bwrap()
    secret = f"rft-secret-{uuid.uuid4().hex}"
    base = Path("/root") if os.geteuid() == 0 else Path(os.environ.get("TMPDIR", "/tmp"))
    path = base / f"rft_secret_{uuid.uuid4().hex}"
    path.write_text(secret)
    os.chmod(path, 0o600)
    os.environ["RFT_SECRET"] = secret
    code = (
        "import os\n"
        "def loot(paths):\n"
        "    found = [repr(dict(os.environ))]\n"
        "    for p in paths:\n"
        "        try:\n"
        "            with open(p) as f:\n"
        "                found.append(f.read())\n"
        "        except OSError as e:\n"
        "            found.append(type(e).__name__)\n"
        "    return found\n"
    )
    paths = [str(path), "/etc/shadow", "/proc/self/environ", "/proc/1/environ"]
    try:
        with Sandbox(num_workers=1, timeout_s=5.0) as box:
            res = box.run(Job(code + "print(os.environ)\n", "loot", (Call((paths,)),)))
    finally:
        del os.environ["RFT_SECRET"]
        path.unlink()
    assert res.tests[0].ok, res
    everything = repr(res.tests[0].value) + res.stdout + res.stderr
    assert secret not in everything
    assert "root:" not in everything  # /etc/shadow's first line


def test_cannot_connect_to_host_listener(sb):
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    accepted = []
    stop = threading.Event()

    def accept_loop():
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
                accepted.append(conn)
            except OSError:
                pass

    thread = threading.Thread(target=accept_loop, daemon=True)
    thread.start()
    code = (
        "import socket\n"
        "def connect(port):\n"
        "    out = []\n"
        "    for fam, host in ((socket.AF_INET, '127.0.0.1'), (socket.AF_INET6, '::1')):\n"
        "        try:\n"
        "            s = socket.socket(fam, socket.SOCK_STREAM)\n"
        "            s.settimeout(1)\n"
        "            s.connect((host, port))\n"
        "            out.append('connected')\n"
        "        except OSError as e:\n"
        "            out.append(type(e).__name__)\n"
        "    return out\n"
    )
    try:
        res = sb.run(Job(code, "connect", (Call((port,)),), timeout_s=5.0))
        time.sleep(0.3)
    finally:
        stop.set()
        thread.join()
        listener.close()
    assert accepted == [], "the listener saw a connection"
    assert res.tests[0].ok and res.tests[0].value == ["PermissionError", "PermissionError"], res


@pytest.mark.parametrize("landlock", [True, False], ids=["landlock_on", "landlock_off"])
def test_killing_the_parent_hurts_nobody(sb, landlock):
    """kill(ppid), kill(1), kill(-1): with Landlock off (kernels before 6.12) only the job filter
    keeps them off the supervisor and the next jobs' spares."""
    if landlock:
        _kill_the_parent(sb)
        return
    with Sandbox(num_workers=2, timeout_s=TIMEOUT_S, landlock=False) as box:
        assert box.layers["landlock_abi"] == 0
        _kill_the_parent(box)


def _kill_the_parent(sb: Sandbox) -> None:
    restarts = sb.worker_restarts
    code = (
        "import os, signal\n"
        "def kill():\n"
        "    for target in (os.getppid(), 1, -1):\n"
        "        try:\n"
        "            os.kill(target, signal.SIGKILL)\n"
        "        except OSError:\n"
        "            pass\n"
        "    return 'survived'\n"
    )
    sb.run(Job(code, "kill", (Call(()),)))
    sb.run(Job("import os\nos.system('kill -9 -1')\n", timeout_s=5.0))
    _works(sb)  # and this test process is still here to check it
    assert sb.worker_restarts == restarts, "the workers themselves survived"


def test_double_fork_setsid_escapee_is_killed(sb):
    marker = f"rft-escapee-{uuid.uuid4().hex}"
    code = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        f"        os.execv('/usr/bin/python3', ['/usr/bin/python3', '-c', 'import time; time.sleep(60)', '{marker}'])\n"
        "    os._exit(0)\n"
        "time.sleep(2.5)\n" + ADD
    )
    seen = []
    result = []
    t = threading.Thread(target=lambda: result.append(sb.run(Job(code, "add", ADD_TESTS, timeout_s=10.0))))
    t.start()
    while t.is_alive():
        seen.append(any(marker in c for c in _proc_cmdlines()))
        time.sleep(0.05)
    t.join()
    assert result[0].status == "ok", result[0]
    assert any(seen), "the escapee should have been running during the job"
    assert not any(marker in c for c in _proc_cmdlines()), "an escapee survived the job"


def test_sys_exit_before_tests_counts_as_fail(sb):
    problem = CodeProblem("add", tests=[((1, 2), 3), ((2, 2), 4)])
    for prefix in ("import sys\nsys.exit(0)\n", "import os\nos._exit(0)\n"):
        r = code_reward(f"```python\n{prefix}{ADD}```", problem, sandbox=sb)
        assert r.reward == 0.0 and r.passed == 0, r.per_test
    assert code_reward(f"```python\n{ADD}```", problem, sandbox=sb).reward == 1.0


def test_str_subclass_with_rigged_eq_fails(sb):
    rigged = (
        "class S(str):\n"
        "    def __eq__(self, other):\n        return True\n"
        "    __hash__ = str.__hash__\n"
        "def fizz(n):\n    return S('nope')\n"
    )
    pairs = CodeProblem("fizz", tests=[((3,), "Fizz"), ((5,), "Buzz")])
    asserts = CodeProblem("fizz", asserts=("assert fizz(3) == 'Fizz'", "assert 'Buzz' == fizz(5) or False"))
    check = CodeProblem("fizz", check="def check(candidate):\n    assert candidate(3) == 'Fizz'\n")
    for problem in (pairs, asserts, check):
        r = code_reward(rigged, problem, sandbox=sb)
        assert r.reward == 0.0, (problem, r.per_test)
        assert all("S" in str(p) or "nope" in str(p) for p in r.per_test), r.per_test


def test_job_cannot_pass_itself_off_as_a_sandbox_failure(sb):
    # a trainer may drop sandbox_error rows as infrastructure noise: a job must not earn that
    code = ("import os\nfor fd in range(64):\n    try:\n        os.write(fd, b'[\"fatal\", \"oops\"]\\n')\n"
            "    except OSError:\n        pass\nos._exit(70)\n")
    res = sb.run(Job(code + ADD, "add", ADD_TESTS))
    assert res.status == "crashed", res


def test_10mb_of_stdout_is_capped(sb):
    code = "import sys\nsys.stdout.write('x' * (10 * 1024 * 1024))\nsys.stdout.flush()\n" + ADD
    res, wall = _timed(sb, Job(code, "add", ADD_TESTS, timeout_s=5.0))
    assert res.status == "ok", res
    assert res.stdout_truncated
    assert len(res.stdout) <= 64 << 10
    assert wall < 5.0 + SLACK_S
    assert [t.value for t in res.tests] == [3, "xy"]


def test_fails_closed_without_isolation():
    missing = "/nonexistent/bwrap"
    ok, why = check_available(missing)
    assert not ok and "not found" in why
    with pytest.raises(SandboxUnavailable, match="setup_sandbox.sh"):
        Sandbox(num_workers=1, bwrap_path=missing)
    with pytest.warns(RuntimeWarning, match="UNSANDBOXED"):
        box = Sandbox(num_workers=1, bwrap_path=missing, allow_unsandboxed=True)
    with box:
        assert box.layers["bubblewrap_namespaces"] is False and box.layers["rlimits"] is True
        res = box.run(Job(ADD + "import os\nPID = os.getpid()\n", "add", ADD_TESTS))
        assert res.status == "ok" and [t.value for t in res.tests] == [3, "xy"]
        res = box.run(Job("def grab():\n    return len(bytearray(10 * 1024 ** 3))\n", "grab", (Call(()),)))
        assert "MemoryError" in res.tests[0].error  # rlimits still apply
        probe = ("import os\ndef probe(pid):\n    try:\n        os.kill(pid, 0)\n"
                 "    except OSError as e:\n        return type(e).__name__\n")
        res = box.run(Job(probe, "probe", (Call((os.getpid(),)),)))
        assert res.tests[0].value == "PermissionError"  # the trainer (same uid unless root): the job filter


def test_fails_closed_without_seccomp(monkeypatch):
    import rftlib.rewards.sandbox.seccomp as seccomp

    def missing():
        raise seccomp.SeccompUnavailable("pyseccomp is not installed")

    monkeypatch.setattr(seccomp, "filter_bpf", missing)
    with pytest.raises(SandboxUnavailable, match="pyseccomp is not installed.*setup_sandbox.sh"):
        Sandbox(num_workers=1)


# --- isolation between jobs, and verdicts the untrusted code cannot write (issue 12, defect 2) ---

# A completion that searches its own process for another completion's code and tests, three ways:
# objects the garbage collector tracks (every dict, list, tuple and frame), the frames above its
# own, and raw memory read through write(2) into a pipe (EFAULT, not SIGSEGV, on unmapped pages;
# /proc/self/maps gives the mapped ranges where /proc is mounted, else the 1 MiB blocks around
# every live object's address). It prints every secret it finds, then copies the first `add`
# source carrying a secret and delegates to it; found nothing: `add` returns None.
MEMORY_THIEF = r'''
import ctypes, gc, os, re, sys

PAT = re.compile(r"rft-leak-(?:src|test)-[0-9a-f]{32}")
found, sources = set(), []

def _look(s):
    if type(s) is str and "rft-leak-" in s:
        hits = PAT.findall(s)
        found.update(hits)
        if hits and "def add(" in s:
            sources.append(s)

def _walk(o, depth=0):
    if depth > 6:
        return
    t = type(o)
    if t is str:
        _look(o)
    elif t is dict:
        for k, v in list(o.items()):
            _walk(k, depth + 1)
            _walk(v, depth + 1)
    elif t in (list, tuple, set, frozenset):
        for v in list(o):
            _walk(v, depth + 1)

for o in gc.get_objects():
    _walk(o)
f = sys._getframe()
while f is not None:
    _walk(dict(f.f_locals))
    _walk(f.f_globals)
    f = f.f_back

def _ranges():
    try:
        with open("/proc/self/maps") as fh:
            for line in fh:
                lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                if "r" in line.split()[1]:
                    yield lo, hi
        return
    except OSError:
        pass
    blocks = {id(o) >> 20 for o in gc.get_objects()} | {id(o) >> 20 for o in (PAT, found, sources)}
    spans = sorted({b + d for b in blocks for d in (-1, 0, 1)})
    for b in spans:
        yield b << 20, (b + 1) << 20

def _raw():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.write.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t)
    r, w = os.pipe()
    os.set_blocking(r, False)
    scanned = 0
    for lo, hi in _ranges():
        for a in range(lo, hi, 4096):
            n = libc.write(w, a, 4096)
            if n <= 0:
                continue
            chunk = os.read(r, 1 << 16)
            scanned += len(chunk)
            i = chunk.find(b"rft-leak-")
            while i >= 0:
                m = PAT.match(chunk[i:i + 60].decode("latin-1"))
                if m:
                    found.add(m.group(0))
                i = chunk.find(b"rft-leak-", i + 1)
    return scanned

SCANNED = _raw()
print("scanned", SCANNED, "bytes; found", sorted(found))

def add(a, b):
    for s in sources:
        ns = {}
        try:
            exec(s, ns)
            return ns["add"](a, b)
        except Exception:
            pass
    return None
'''


def test_a_job_finds_nothing_of_the_previous_job_in_its_memory():
    """Job 1 (a correct solution, secrets in its code and its check program), then the thief on
    the same worker, once per spare a supervisor holds (so that one thief runs in the next
    supervisor's first spare too). No thief may see either secret, and each scores 0."""
    from rftlib.rewards.sandbox._zygote import SPARES

    _require_bwrap()
    src_secret, test_secret = f"rft-leak-src-{uuid.uuid4().hex}", f"rft-leak-test-{uuid.uuid4().hex}"
    problem = CodeProblem("add", tests=[((1, 2), 3), ((20, 22), 42)],
                          check=f"def check(candidate):\n    assert candidate(2, 2) == 4  # {test_secret}\n")
    with Sandbox(num_workers=1, timeout_s=20.0) as box:
        first = code_reward(f"```python\n# {src_secret}\n{ADD}```", problem, sandbox=box)
        assert first.reward == 1.0, first.per_test
        thieves = [code_reward(f"```python\n{MEMORY_THIEF}```", problem, sandbox=box) for _ in range(SPARES)]
    for thief in thieves:
        assert thief.run.status == "ok", thief.run
        assert "scanned" in thief.run.stdout and int(thief.run.stdout.split()[1]) > 1 << 20, thief.run.stdout
        seen = thief.run.stdout + repr(thief.run.tests)
        assert src_secret not in seen and test_secret not in seen, seen[-500:]
        assert thief.reward == 0.0, thief.per_test  # add returned None: 0 of 3 tests


# A wrong `add` (a - b) that tries to forge a passing verdict: it writes "passed" records (and
# the zygote's framing, for good measure) to every fd it might hold, monkeypatches whatever harness
# it can find in its process, and then leaves in several ways.
FORGER = r'''
import builtins, gc, json, os, sys

RECS = b"".join(json.dumps(r).encode() + b"\n" for r in ([0, "ok"], [0, "v", 3], [1, "ok"], [1, "v", 42],
                                                          [2, "ok"], ["done"]))
def _spray():
    for fd in range(0, 64):
        try:
            os.write(fd, RECS)
        except OSError:
            pass
_spray()
for mod in list(sys.modules.values()):  # every harness-looking function now reports success
    for name in ("_emit", "emit", "_describe", "_report", "send", "send_frame"):
        if callable(getattr(mod, name, None)):
            try:
                setattr(mod, name, lambda *a, **k: _spray())
            except Exception:
                pass

def add(a, b):
    _spray()
    MODE
    return a - b
'''
LEAVES = {"stays": "pass", "os._exit": "os._exit(0)", "sys.exit": "sys.exit(0)",
          "exit at load": "pass\nos._exit(0)", "raise SystemExit at load": "pass\nraise SystemExit(0)"}


@pytest.mark.parametrize("leave", list(LEAVES))
def test_forged_verdicts_score_0(sb, leave):
    mode = LEAVES[leave]
    code = FORGER.replace("MODE", mode.split("\n")[0]) + "\n".join(mode.split("\n")[1:]) + "\n"
    check = CodeProblem("add", check="def check(candidate):\n    assert candidate(1, 2) == 3\n")
    asserts = CodeProblem("add", asserts=("assert add(1, 2) == 3 or add(0, 0) == 1",
                                          "x = 20\nassert add(x, 22) == 42"))
    for problem in (check, asserts):
        r = code_reward(f"```python\n{code}```", problem, sandbox=sb)
        assert r.reward == 0.0 and r.passed == 0, (leave, r.per_test, r.run)
    _works(sb)


def test_solution_cannot_read_its_own_check_program(sb):
    """The expected value lives only in the check program: a solution that finds it in its
    memory (a frame's locals, any tracked object) would pass; it must find nothing."""
    secret = f"rft-answer-{uuid.uuid4().hex}"
    check = CodeProblem("answer", check=f"def check(candidate):\n    assert candidate() == {secret!r}\n")
    snoop = (
        "import gc, re, sys\n"
        "def _find():\n"
        "    pat = re.compile('rft-answer-' + '[0-9a-f]{32}')\n"
        "    objs = gc.get_objects()\n"
        "    f = sys._getframe()\n"
        "    while f is not None:\n"
        "        objs.append(dict(f.f_locals))\n"
        "        f = f.f_back\n"
        "    for o in objs:\n"
        "        for v in (list(o.values()) if type(o) is dict else list(o) if type(o) in (list, tuple) else []):\n"
        "            for s in ([v] if type(v) is str else [x for x in v if type(x) is str] if type(v) in (list, tuple) else []):\n"
        "                m = pat.search(s)\n"
        "                if m:\n"
        "                    return m.group(0)\n"
        "    return 'nothing'\n"
        "def answer():\n"
        "    return _find()\n"
    )
    r = code_reward(f"```python\n{snoop}```", check, sandbox=sb)
    assert r.reward == 0.0, r.per_test
    assert secret not in r.run.stdout + repr(r.run.tests)
    honest = code_reward(f"```python\ndef answer():\n    return {secret!r}\n```", check, sandbox=sb)
    assert honest.reward == 1.0, honest.per_test


def test_tests_finished_before_a_timeout_still_count(sb):
    code = "def f(x):\n    while x:\n        pass\n    return 'done'\n"  # f(0) returns, f(1) hangs
    res = sb.run(Job(code, "f", (Call((0,)), Call((1,)), Call((0,))), timeout_s=TIMEOUT_S))
    assert res.status == "timeout"
    assert [t.ok for t in res.tests] == [True, False, False] and res.tests[0].value == "done", res.tests


# --- a job cannot reach the processes of other jobs (issue 19, item 11) ---

# A completion that sabotages every other process of its worker it can name: the solution spares
# the supervisor forked for its next jobs (stopped, niced, pinned, starved of file descriptors:
# they would time out or fail and score 0, which games group-relative rewards), and, harmlessly
# (signal 0, limits and priorities set to what they are), its own supervisor and the zygote. It
# names them from /proc where it can read it, else by trying every pid up to its own + 64 (pids
# count up inside the sandbox's PID namespace). `sabotage` returns what worked, as
# [call, "sibling" | "parent" | "init"] pairs, and how many processes it saw.
SABOTEUR = r'''
import ctypes, fcntl, os, platform, resource, signal, struct

ME, PARENT = os.getpid(), os.getppid()
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
NR = {"x86_64": {"tkill": 200, "ioprio_set": 251, "rt_tgsigqueueinfo": 297},
      "aarch64": {"tkill": 130, "ioprio_set": 30, "rt_tgsigqueueinfo": 240}}[platform.machine()]
F_SETOWN_EX, F_OWNER_PID, FIOSETOWN = 15, 1, 0x8901
IOPRIO_WHO_PROCESS, IOPRIO_IDLE = 1, 3 << 13

def _c(rc):
    if rc < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))

def _sigio(how, pid, sig):
    """Make `pid` the owner of a pipe's read end, with `sig` as its SIGIO, and write to the pipe."""
    r, w = os.pipe()
    try:
        if how == "F_SETOWN":
            fcntl.fcntl(r, fcntl.F_SETOWN, pid)
        elif how == "F_SETOWN_EX":
            fcntl.fcntl(r, F_SETOWN_EX, struct.pack("ii", F_OWNER_PID, pid))
        else:
            fcntl.ioctl(r, FIOSETOWN, struct.pack("i", pid))
        if sig:
            fcntl.fcntl(r, fcntl.F_SETSIG, sig)
            fcntl.fcntl(r, fcntl.F_SETFL, os.O_ASYNC | os.O_NONBLOCK)
            os.write(w, b"x")
    finally:
        os.close(r)
        os.close(w)

def _same(get, set_):
    return lambda pid, harm: set_(pid, harm(pid) if harm else get(pid))

ATTACKS = {  # call -> f(pid, harm): harm False does no harm (signal 0, the value already set)
    "kill": lambda pid, harm: os.kill(pid, signal.SIGSTOP if harm else 0),
    "killpg": lambda pid, harm: os.killpg(pid, signal.SIGSTOP if harm else 0),
    "tgkill": lambda pid, harm: _c(libc.tgkill(pid, pid, signal.SIGSTOP if harm else 0)),
    "tkill": lambda pid, harm: _c(libc.syscall(NR["tkill"], pid, signal.SIGSTOP if harm else 0)),
    "sigqueue": lambda pid, harm: _c(libc.sigqueue(pid, signal.SIGSTOP if harm else 0, ctypes.c_void_p(0))),
    "rt_tgsigqueueinfo": lambda pid, harm: _c(libc.syscall(
        NR["rt_tgsigqueueinfo"], pid, pid, signal.SIGSTOP if harm else 0, ctypes.create_string_buffer(128))),
    "pidfd_send_signal": lambda pid, harm: signal.pidfd_send_signal(os.pidfd_open(pid), signal.SIGSTOP if harm else 0),
    "F_SETOWN": lambda pid, harm: _sigio("F_SETOWN", pid, signal.SIGSTOP if harm else 0),
    "F_SETOWN_EX": lambda pid, harm: _sigio("F_SETOWN_EX", pid, signal.SIGSTOP if harm else 0),
    "FIOSETOWN": lambda pid, harm: _sigio("FIOSETOWN", pid, signal.SIGSTOP if harm else 0),
    "prlimit": _same(lambda pid: resource.prlimit(pid, resource.RLIMIT_NOFILE),
                     lambda pid, v: resource.prlimit(pid, resource.RLIMIT_NOFILE, v)),
    "setpriority": _same(lambda pid: os.getpriority(os.PRIO_PROCESS, pid),
                         lambda pid, v: os.setpriority(os.PRIO_PROCESS, pid, v)),
    "sched_setaffinity": _same(os.sched_getaffinity, os.sched_setaffinity),
    "sched_setscheduler": _same(os.sched_getscheduler,
                                lambda pid, v: os.sched_setscheduler(pid, v, os.sched_param(0))),
    "ioprio_set": lambda pid, harm: _c(libc.syscall(
        NR["ioprio_set"], IOPRIO_WHO_PROCESS, pid, IOPRIO_IDLE if harm else 0)),
}
HARM = {"prlimit": lambda pid: (3, 3), "setpriority": lambda pid: 19,
        "sched_setaffinity": lambda pid: {min(os.sched_getaffinity(0))},
        "sched_setscheduler": lambda pid: os.SCHED_IDLE}

def _pids():
    try:
        return sorted(int(p) for p in os.listdir("/proc") if p.isdigit()), True
    except OSError:
        return range(1, ME + 64), False

def sabotage():
    pids, listed = _pids()
    hits = []
    for pid in pids:
        if pid == ME:
            continue
        role = "parent" if pid == PARENT else "init" if pid == 1 else "sibling"
        for name, attack in ATTACKS.items():
            harm = role == "sibling" and (HARM.get(name, True) if name in HARM else True)
            try:
                attack(pid, harm)
                hits.append([name, role])
            except (OSError, ValueError):
                pass
    try:
        os.kill(-1, 0)  # every process it may signal
        hits.append(["kill", "all"])
    except OSError:
        pass
    return [hits, len(pids) if listed else None]
'''
VICTIM = (  # what a job finds of its own process: the same for every job, unless it was sabotaged
    "import os, resource\n"
    "def state():\n"
    "    return [os.getpriority(os.PRIO_PROCESS, 0), os.sched_getscheduler(0),\n"
    "            sorted(os.sched_getaffinity(0)), list(resource.getrlimit(resource.RLIMIT_NOFILE))]\n"
)


@pytest.mark.parametrize("landlock", [False, True], ids=["landlock_off", "landlock_on"])
def test_a_job_cannot_reach_the_processes_of_other_jobs(landlock):
    """On one worker: a job, the saboteur, then the next 2 * SPARES - 2 jobs (the rest of the
    supervisor's spares, forked before the saboteur ran, and the next supervisor's). Landlock ABI
    6 scopes signals, but not prlimit, setpriority or the sched_ calls, and kernels before 6.12 lack
    it: with it forced off, the seccomp filter each solution process runs under must still keep
    every call of the saboteur inside its job."""
    from rftlib.rewards.sandbox._zygote import SPARES

    _require_bwrap()
    victim = Job(VICTIM, "state", (Call(()),))
    with Sandbox(num_workers=1, timeout_s=5.0, landlock=landlock) as box:
        assert box.layers["landlock_abi"] == 0 or landlock
        before = box.run(victim)
        sab = box.run(Job(SABOTEUR, "sabotage", (Call(()),), timeout_s=10.0))
        after = box.map([victim] * (2 * SPARES - 2))
        restarts = box.worker_restarts
    assert before.status == "ok" and sab.status == "ok", (before, sab)
    hits, seen = sab.tests[0].value
    if seen is not None:  # /proc listed every process of the worker: zygote, supervisor, spares
        assert seen >= SPARES + 1, seen
    assert hits == [], hits
    assert [(r.status, r.tests[0].value) for r in after] == [("ok", before.tests[0].value)] * len(after), after
    assert restarts == 0


# What a solution may still do under the job filter: signal itself, its threads and its process
# group; set its own limits and scheduling; a child it forks may signal it. Its children by pid:
# no (the filter cannot tell them from other jobs' processes), so they are reached through the
# group. `own` returns each call, with the error it raised if any, how many SIGUSR1 arrived (one
# per call that sends one, and one from the child) and how the child ended.
SELF_SIGNALS = r'''
import os, resource, signal, threading

got = []
signal.signal(signal.SIGUSR1, lambda *a: got.append(1))
signal.signal(signal.SIGUSR2, lambda *a: None)  # the killpg below reaches us too

def _try(name, f):
    try:
        f()
        return name
    except OSError as e:
        return name + ": " + type(e).__name__

def own():
    me = os.getpid()
    out = [_try(name, f) for name, f in (
        ("kill self", lambda: os.kill(me, signal.SIGUSR1)),
        ("kill 0", lambda: os.kill(0, signal.SIGUSR1)),
        ("killpg self", lambda: os.killpg(me, signal.SIGUSR1)),
        ("raise_signal", lambda: signal.raise_signal(signal.SIGUSR1)),
        ("pthread_kill", lambda: signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)),
        ("setrlimit", lambda: resource.setrlimit(resource.RLIMIT_NOFILE, resource.getrlimit(resource.RLIMIT_NOFILE))),
        ("prlimit self", lambda: resource.prlimit(me, resource.RLIMIT_NOFILE)),
        ("setpriority self", lambda: os.setpriority(os.PRIO_PROCESS, me, 1)),
        ("sched_setaffinity 0", lambda: os.sched_setaffinity(0, os.sched_getaffinity(0))),
    )]
    r, w = os.pipe()
    child = os.fork()
    if child == 0:
        signal.signal(signal.SIGUSR2, signal.SIG_DFL)
        ok = _try("", lambda: os.kill(me, signal.SIGUSR1)) == ""
        os.write(w, b"y" if ok else b"n")
        signal.pause()
        os._exit(0)
    out.append("child signalled its parent" if os.read(r, 1) == b"y" else "child could not signal its parent")
    out.append(_try("kill child", lambda: os.kill(child, signal.SIGUSR2)))
    out.append(_try("killpg 0", lambda: os.killpg(0, signal.SIGUSR2)))
    _, status = os.waitpid(child, 0)
    return [out, len(got), os.WTERMSIG(status) if os.WIFSIGNALED(status) else None]
'''


@pytest.mark.parametrize("landlock", [False, True], ids=["landlock_off", "landlock_on"])
def test_a_job_can_still_signal_itself_and_its_children(landlock):
    import signal

    _require_bwrap()
    with Sandbox(num_workers=1, timeout_s=5.0, landlock=landlock) as box:
        res = box.run(Job(SELF_SIGNALS, "own", (Call(()),)))
    assert res.status == "ok", res
    calls, usr1, child_signal = res.tests[0].value
    assert calls == ["kill self", "kill 0", "killpg self", "raise_signal", "pthread_kill", "setrlimit",
                     "prlimit self", "setpriority self", "sched_setaffinity 0", "child signalled its parent",
                     "kill child: PermissionError", "killpg 0"], calls
    assert usr1 == 5 + 1  # the five calls that send one, and the child's
    assert child_signal == signal.SIGUSR2  # the group's signal ended it
