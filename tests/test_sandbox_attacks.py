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
SLACK_S = 1.0  # "ends within timeout + 1 s"
ADD = "def add(a, b):\n    return a + b\n"
ADD_TESTS = (Call((1, 2)), Call(("x", "y")))


def _require_bwrap() -> None:
    ok, why = check_available()
    if not ok:
        pytest.fail(f"the sandbox is unavailable here ({why}): run `bash scripts/setup_sandbox.sh`")


@pytest.fixture(scope="module")
def sb():
    _require_bwrap()
    with Sandbox(num_workers=2, timeout_s=TIMEOUT_S) as box:
        yield box


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


def test_killing_the_parent_hurts_nobody(sb):
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
