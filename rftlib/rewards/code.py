"""Seed 002's code reward: run the problem's tests on the completion's code, in the sandbox.

    reward = 1.0                         if every test passes
           = 0.5 * passed / total        otherwise (partial credit capped at 0.5, seed 002)

Extraction (``extract_code``), first rule that applies:
    1. fenced blocks tagged python (```python, ```py, ```python3): the LAST one that defines the
       entry point, else the last one. A model's final answer follows its drafts, and example-usage
       blocks that come after the solution do not define the function.
    2. the same rule over fenced blocks with any other tag or none;
    3. an opening fence never closed (the completion was cut at max tokens): the text after it;
    4. the whole completion.

Three test forms, all in one ``CodeProblem`` (each assert, pair, or check program is one test):
    ``tests``    (args, expected) pairs of plain builtin values: the child sends back outputs as
                 data and they are compared HERE; expected values never enter the sandbox.
    ``asserts``  MBPP-style ``assert`` lines. ``assert f(<literals>) == <literal>`` is lifted into
                 an (args, expected) pair; any other assert runs inside the sandbox.
    ``check``    a HumanEval-style program defining ``check(candidate)``, run inside the sandbox
                 as ``check(<entry_point>)``.
Asserts and check programs run in the sandbox's supervisor, never in the process that runs the
completion: the completion's functions are proxies there that bring back plain builtin values (the
entry point's non-builtin return values raise TypeError, so a str subclass with an always-true
``__eq__`` fails), and the completion never sees the tests nor writes a verdict.
"""

from __future__ import annotations

import ast
import atexit
import builtins
import re
import threading
from dataclasses import dataclass, field
from typing import Any, Sequence

from rftlib.rewards.sandbox import Call, Exec, Job, RunResult, Sandbox, SandboxUnavailable
from rftlib.rewards.sandbox.pool import SETUP_HINT
from rftlib.rewards.sandbox._zygote import encode_value

PARTIAL_CREDIT_CAP = 0.5  # reward when some but not all tests pass: 0.5 * fraction passed (seed 002)
PYTHON_TAGS = ("python", "py", "python3")  # fence tags taken as Python (case-insensitive)
_FENCE = re.compile(r"```[ \t]*([^\n`]*)\n(.*?)```", re.DOTALL)  # (tag line, body) of closed blocks
_OPEN_FENCE = re.compile(r"```[ \t]*([^\n`]*)\n")


@dataclass(frozen=True)
class CodeProblem:
    """A function to write and the tests it must pass."""

    entry_point: str
    """the name of the function the tests call"""
    tests: tuple[tuple[tuple, Any], ...] = ()
    """(args, expected) pairs of plain builtin values; compared outside the sandbox"""
    setup: str = ""
    """trusted code run before the solution (e.g. the imports a HumanEval prompt carries)"""
    asserts: tuple[str, ...] = ()
    """MBPP-style assert lines, one test each; names the solution defines are callable in them"""
    check: str | None = None
    """HumanEval-style program defining ``check(candidate)``; one test"""
    timeout_s: float | None = None
    """wall clock for the whole run; None: the sandbox's default"""

    def __post_init__(self):
        if not self.entry_point.isidentifier():
            raise ValueError(f"entry_point must be a function name, got {self.entry_point!r}")
        pairs = []
        for k, pair in enumerate(self.tests):
            if len(pair) != 2:
                raise ValueError(f"tests[{k}] must be an (args, expected) pair, got {pair!r}")
            args, expected = tuple(pair[0]), pair[1]
            try:
                encode_value(args)
                encode_value(expected)
            except TypeError as e:
                raise ValueError(f"tests[{k}] must hold plain builtin values only ({e})") from None
            pairs.append((args, expected))
        object.__setattr__(self, "tests", tuple(pairs))
        object.__setattr__(self, "asserts", tuple(self.asserts))
        if not (self.tests or self.asserts or self.check):
            raise ValueError("a CodeProblem needs tests, asserts or a check program")

    @property
    def num_tests(self) -> int:
        return len(self.tests) + len(self.asserts) + (1 if self.check else 0)

    @classmethod
    def from_humaneval(cls, record: dict) -> "CodeProblem":
        """From a HumanEval record (``prompt``, ``test``, ``entry_point``); the prompt's imports
        become the setup, so a completion that restates the function needs no imports of its own."""
        return cls(entry_point=record["entry_point"], check=record["test"],
                   setup=_imports_of(record.get("prompt", "")))

    @classmethod
    def from_mbpp(cls, record: dict) -> "CodeProblem":
        """From an MBPP record (``test_list``, optional ``test_setup_code``); the entry point is
        the function the first assert calls."""
        asserts = tuple(record["test_list"])
        return cls(entry_point=_called_name(asserts[0]), asserts=asserts,
                   setup=record.get("test_setup_code", "") or "")

    def to_job(self, code: str) -> tuple[Job, list[Any]]:
        """The sandbox job for ``code``, and per test the expected value (``_INSIDE`` for tests
        judged inside the sandbox)."""
        tests: list[Call | Exec] = []
        expected: list[Any] = []
        for args, exp in self.tests:
            tests.append(Call(args))
            expected.append(exp)
        for line in self.asserts:
            lifted = lift_assert(line, self.entry_point)
            tests.append(Call(lifted[0]) if lifted else Exec(line))
            expected.append(lifted[1] if lifted else _INSIDE)
        if self.check:
            tests.append(Exec(f"{self.check}\ncheck({self.entry_point})"))
            expected.append(_INSIDE)
        job = Job(code=code, entry_point=self.entry_point, tests=tuple(tests), setup=self.setup,
                  timeout_s=self.timeout_s)
        return job, expected


_INSIDE = object()  # marker: this test's verdict comes from the sandbox's supervisor


@dataclass
class CodeReward:
    """One completion's code reward and how it came about."""

    reward: float
    """1.0 when all tests pass, else 0.5 * passed / total"""
    passed: int
    total: int
    per_test: list[bool | str]
    """per test: True when it passed, else a string saying why not ("wrong answer: ...")"""
    extracted_code: str
    extraction: str
    """which rule of ``extract_code`` applied: "python_fence", "fence", "open_fence", "raw" """
    run: RunResult | None = field(default=None, repr=False)
    """the sandbox's raw result (stdout, stderr, status, timing)"""

    def diagnostics(self) -> dict[str, float]:
        """Floats for logging: ``correctness`` (all tests pass, as math's), the pass fraction,
        how the run ended, and ``test_<i>`` per test."""
        status = self.run.status if self.run else "sandbox_error"
        d = {
            "correctness": 1.0 if self.total and self.passed == self.total else 0.0,
            "pass_frac": self.passed / self.total if self.total else 0.0,
            "tests_passed": float(self.passed),
            "tests_total": float(self.total),
            "has_code_fence": 0.0 if self.extraction == "raw" else 1.0,
            "load_error": float(status == "load_error"),
            "timeout": float(status == "timeout"),
            "crashed": float(status == "crashed"),
            "sandbox_error": float(status == "sandbox_error"),
            "exec_s": self.run.elapsed_s if self.run else 0.0,
        }
        d.update({f"test_{i}": 1.0 if r is True else 0.0 for i, r in enumerate(self.per_test)})
        return d


def extract_code(completion: str, entry_point: str | None = None) -> tuple[str, str]:
    """(code, rule): the code to run from a completion; rule is "python_fence", "fence",
    "open_fence" or "raw" (see the module docstring for the order)."""
    blocks = [(tag.strip().lower(), body) for tag, body in _FENCE.findall(completion)]
    python = [b for t, b in blocks if t.split()[:1] and t.split()[0] in PYTHON_TAGS]
    for rule, bodies in (("python_fence", python), ("fence", [b for _t, b in blocks])):
        if bodies:
            defining = [b for b in bodies if entry_point and _defines(b, entry_point)]
            return (defining or bodies)[-1], rule
    m = _OPEN_FENCE.search(completion)
    if m:
        return completion[m.end():], "open_fence"
    return completion, "raw"


def _defines(code: str, name: str) -> bool:
    return re.search(rf"^\s*(?:async\s+)?def\s+{re.escape(name)}\s*\(", code, re.MULTILINE) is not None


def score(problem: CodeProblem, run: RunResult, expected: Sequence[Any]) -> tuple[int, list[bool | str]]:
    """(passed, per_test) from a sandbox result, comparing Call outputs here."""
    per_test: list[bool | str] = []
    for t, exp in zip(run.tests, expected):
        if not t.ok:
            per_test.append(t.error or "failed")
        elif exp is _INSIDE or _equal(exp, t.value):
            per_test.append(True)
        else:
            per_test.append(f"wrong answer: got {_short(t.value)}, expected {_short(exp)}")
    return sum(r is True for r in per_test), per_test


def _equal(expected: Any, actual: Any) -> bool:
    """Python's ``==``, as an ``assert f(x) == y`` would use, on plain builtins decoded here (no
    object from the sandbox reaches this comparison)."""
    try:
        return bool(expected == actual)
    except Exception:  # e.g. RecursionError on absurdly nested values
        return False


def _short(v: Any, limit: int = 80) -> str:
    s = repr(v)
    return s if len(s) <= limit else s[:limit] + "..."


def reward_from(passed: int, total: int) -> float:
    """1.0 if all pass, else PARTIAL_CREDIT_CAP * passed / total (seed 002)."""
    if total <= 0:
        return 0.0
    return 1.0 if passed == total else PARTIAL_CREDIT_CAP * passed / total


def code_reward(completion: str, problem: CodeProblem, *, sandbox: Sandbox | None = None) -> CodeReward:
    """Extract the code from ``completion``, run ``problem``'s tests in ``sandbox`` (default: a
    shared 2-worker ``Sandbox`` started on first use), and score it."""
    return batch_code_reward([completion], [problem], sandbox=sandbox)[0]


def batch_code_reward(completions: Sequence[str], problems: Sequence[CodeProblem], *,
                      sandbox: Sandbox | None = None) -> list[CodeReward]:
    """``code_reward`` of each (completion, problem) row, run in parallel over the sandbox's
    workers (N rows, prompt-major)."""
    if len(completions) != len(problems):
        raise ValueError(f"got {len(completions)} completions but {len(problems)} problems")
    sb = sandbox or default_sandbox()
    prepared = []
    for text, problem in zip(completions, problems):
        code, rule = extract_code(text, problem.entry_point)
        job, expected = problem.to_job(code)
        prepared.append((code, rule, job, expected, problem))
    runs = sb.map([p[2] for p in prepared])
    out = []
    for (code, rule, _job, expected, problem), run in zip(prepared, runs):
        passed, per_test = score(problem, run, expected)
        out.append(CodeReward(reward=reward_from(passed, problem.num_tests), passed=passed,
                              total=problem.num_tests, per_test=per_test, extracted_code=code,
                              extraction=rule, run=run))
    return out


_DEFAULT: list[Sandbox] = []
_DEFAULT_LOCK = threading.Lock()


def default_sandbox() -> Sandbox:
    """The process-wide Sandbox used when none is passed (default settings; closed at exit). Where it cannot be
    made (no bubblewrap, no seccomp) the refusal names the remedy that works from a training run: the set-up
    script; the Python-level ``allow_unsandboxed`` switch is not reachable from a config, a notebook or rft."""
    with _DEFAULT_LOCK:
        if not _DEFAULT:
            try:
                box = Sandbox()
            except SandboxUnavailable as e:
                raise SandboxUnavailable(f"no sandbox for the code reward: {e.why}. rftlib runs model-written code "
                                         f"only in isolation; {SETUP_HINT}, then start the attempt again", e.why) from None
            _DEFAULT.append(box)
            atexit.register(_DEFAULT[0].close)
        return _DEFAULT[0]


# ---------------------------------------------------------------------------------------------
# test-form helpers


def lift_assert(line: str, entry_point: str) -> tuple[tuple, Any] | None:
    """``assert entry_point(<literals>) == <literal>`` -> (args, expected); None otherwise."""
    try:
        tree = ast.parse(line.strip())
    except SyntaxError:
        return None
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Assert):
        return None
    test = tree.body[0].test
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return None
    call, rhs = test.left, test.comparators[0]
    if isinstance(rhs, ast.Call) and not isinstance(call, ast.Call):
        call, rhs = rhs, call  # `assert y == f(x)`
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
            and call.func.id == entry_point and not call.keywords):
        return None
    try:
        args = tuple(ast.literal_eval(a) for a in call.args if not isinstance(a, ast.Starred))
        expected = ast.literal_eval(rhs)
        if len(args) != len(call.args):
            return None
        encode_value(args)
        encode_value(expected)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    return args, expected


def _called_name(assert_line: str) -> str:
    for node in ast.walk(ast.parse(assert_line.strip())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not hasattr(builtins, node.func.id):
            return node.func.id
    raise ValueError(f"cannot find the tested function in {assert_line!r}")


def _imports_of(source: str) -> str:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return ""
    return "\n".join(ast.unparse(n) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom)))
