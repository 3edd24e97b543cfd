"""The calculator tool environment (rftlib.envs.calculator), the single_turn environment and the ENVS registry:
pure Python, no model, no tokenizer. Values worked out by hand in the comments."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rftlib.data.base import Example, Task
from rftlib.envs.base import ENVS, make_env
from rftlib.envs.calculator import (SYSTEM_PROMPT, Bounds, CalcError, CalculatorEnv, evaluate, format_number,
                                    parse_tool_calls)
from rftlib.envs.single_turn import SingleTurnEnv
from rftlib.rewards.math import math_em_reward

ROOT = Path(__file__).resolve().parents[1]


def call(expression: str) -> str:
    """A tool call as Qwen2.5's chat template renders an assistant's tool_calls."""
    return f'<tool_call>\n{{"name": "calculator", "arguments": {{"expression": "{expression}"}}}}\n</tool_call>'


@pytest.fixture
def task():
    train = [Example("t0", "Calculate 123 * 456.", "56088")]
    held = [Example("h0", "Calculate 12 * 34.", "408")]
    return Task("calc-test", train, held, reward=math_em_reward)


@pytest.mark.parametrize("expr, value", [
    ("123 * 456", 56088),            # 123*456 = 49200 + 6150 + 738
    ("(2 + 3) * 4 - 6 / 3", 18.0),   # 5*4 - 2.0
    ("7 // 2", 3), ("7 % 3", 1), ("-7 // 2", -4),  # floor division rounds down
    ("2 ** 10", 1024), ("-3 ** 2", -9),  # ** binds tighter than unary minus
    ("7 / 2", 3.5), ("1_000 + 1", 1001),
])
def test_the_calculator_walks_arithmetic(expr, value):
    assert evaluate(expr) == value and type(evaluate(expr)) is type(value)


def test_results_are_written_as_ints_when_they_are_ints():
    assert [format_number(evaluate(e)) for e in ("6 / 3", "7 / 2", "123 * 456", "1 / 3")] == \
        ["2", "3.5", "56088", "0.333333333333"]


def test_the_calculator_runs_no_code(tmp_path):
    """An expression that would write a file if it were executed is refused, and no file appears."""
    canary = tmp_path / "ran"
    for expr in (f"open({str(canary)!r}, 'w').write('x')", "__import__('os').system('touch " + str(canary) + "')",
                 "(lambda: 1)()", "[1][0]", "x + 1", "1 < 2", "True + 1", "'a' * 3", "1j * 1"):
        with pytest.raises(CalcError, match="only numbers"):
            evaluate(expr)
    assert not canary.exists()


@pytest.mark.parametrize("expr, why", [
    ("2 ** 10 ** 9", "exponent"),          # refused before 2**(10**9) (a 300-million-digit int) is computed
    ("9 ** 999", "more than 100 digits"),  # 999 * log10(9) = 953 digits, known from the logarithm alone
    ("10 ** 100", "more than 100 digits"),  # a googol has 101 digits
    ("9" * 101, "more than 100 digits"),
    ("1e308 * 10", "not a finite"),
    ("1 / 0", "division by zero"), ("1 % 0", "division by zero"), ("0 ** -1", "zero to a negative"),
    ("(-8) ** (1 / 3)", "fractional power"),  # Python would give a complex number
    ("1 + " * 60 + "1", "longer than"), ("1+" * 60 + "1", "more than 100 parts"), ("1 +", "cannot parse"),
])
def test_the_calculator_is_bounded(expr, why):
    with pytest.raises(CalcError, match=why):
        evaluate(expr)


def test_the_bounds_are_settings():
    assert evaluate("10 ** 100", Bounds(max_digits=101)) == 10 ** 100
    with pytest.raises(CalcError, match="exponent 3 is larger than 2"):
        evaluate("2 ** 3", Bounds(max_exponent=2))


def test_tool_calls_parse_in_qwen25_format_and_errors_are_said():
    calls = parse_tool_calls("First " + call("1 + 2") + " then " + call("3 * 4"))
    assert [(c.expression, c.error) for c in calls] == [("1 + 2", None), ("3 * 4", None)]
    # arguments as a JSON string (OpenAI's wire form)
    assert parse_tool_calls('<tool_call>{"name": "calculator", "arguments": "{\\"expression\\": \\"5\\"}"}'
                            "</tool_call>")[0].expression == "5"
    bad = parse_tool_calls("<tool_call>{oops}</tool_call><tool_call>{\"name\": \"python\", \"arguments\": {}}"
                           "</tool_call><tool_call>{\"name\": \"calculator\", \"arguments\": {}}</tool_call>"
                           "<tool_call>{\"name\": \"calculator\"")
    assert [c.error.split(" (")[0] for c in bad] == [
        "the tool call is not valid JSON", "unknown tool 'python'; the only tool is 'calculator'",
        'arguments must be {"expression": "<arithmetic>"}', "<tool_call> is not closed by </tool_call>"]
    assert [c.complete for c in bad] == [True, True, True, False]
    assert parse_tool_calls("The answer is \\boxed{4}.") == []


def test_an_episode_calls_the_tool_then_answers(task):
    env = CalculatorEnv(task)
    ex = task.train[0]
    assert env.reset(ex, seed=0) == [{"role": "system", "content": SYSTEM_PROMPT},
                                     {"role": "user", "content": "Calculate 123 * 456."}]
    messages, reward, done, info = env.step("I will compute it. " + call("123 * 456"))
    assert messages == [{"role": "tool", "name": "calculator", "content": "56088"}]
    assert (reward, done) == (0.0, False)
    assert info == {"tool_calls": 1.0, "tool_ok": 1.0, "tool_parse_errors": 0.0, "tool_exec_errors": 0.0}
    messages, reward, done, info = env.step("So the product is \\boxed{56088}.")
    assert (messages, reward, done, info["stop"], info["correctness"], info["void_turns"]) == \
        ([], 1.0, True, "answer", 1.0, 0.0)


def test_tool_errors_go_back_to_the_model_as_text_and_are_counted(task):
    env = CalculatorEnv(task, max_calls_per_turn=2)
    env.reset(task.train[0], seed=0)
    turn = call("1 / 0") + call("2 +") + '<tool_call>{"name": "calc"}</tool_call>' + call("1")
    messages, reward, done, info = env.step(turn)
    assert [m["content"] for m in messages] == [
        "error: division by zero", "error: cannot parse '2 +': invalid syntax",
        "error: at most 2 calls per turn; this one was not run",
        "error: at most 2 calls per turn; this one was not run"]
    assert (reward, done) == (0.0, False)
    assert info == {"tool_calls": 4.0, "tool_ok": 0.0, "tool_parse_errors": 2.0, "tool_exec_errors": 2.0}


def test_a_number_inside_an_unclosed_call_is_not_an_answer(task):
    """A final turn with an unclosed <tool_call> is answered by its text before the tag. Session 10's calc-cpu run:
    after 10 GRPO steps every held-out success was the tool's result echoed as a new call left open,
    which the task's last-number rule read as the answer (train[0] is 123 * 456 = 56088)."""
    env = CalculatorEnv(task)
    env.reset(task.train[0], seed=0)
    echo = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "56088"}}'
    _, reward, done, info = env.step(echo)
    assert (reward, done, info["stop"], info["tool_parse_errors"]) == (0.0, True, "void", 1.0)
    env.reset(task.train[0], seed=0)  # an answer before the open tag still counts
    _, reward, _, info = env.step("The product is 56088. " + echo)
    assert (reward, info["stop"]) == (1.0, "void")
    env.reset(task.train[0], seed=0)
    _, reward, _, info = env.step("So \\boxed{56088} " + echo)
    assert (reward, info["stop"]) == (1.0, "answer")


def test_a_turn_without_a_call_or_an_answer_is_void_and_a_cut_turn_runs_no_tool(task):
    env = CalculatorEnv(task)
    env.reset(task.train[0], seed=0)
    _, reward, done, info = env.step("It is a big number, 56088")  # no \boxed: the task reads the last number
    assert (reward, done, info["stop"], info["void_turns"]) == (1.0, True, "void", 1.0)
    env.reset(task.train[0], seed=0)
    _, _, done, info = env.step("<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expr")  # open tag alone
    assert (done, info["stop"], info["void_turns"], info["tool_parse_errors"]) == (True, "void", 1.0, 1.0)
    env.reset(task.train[0], seed=0)
    messages, reward, done, info = env.step(call("123 * 456"), truncated=True)
    assert (messages, reward, done, info["stop"]) == ([], 0.0, True, "length")
    assert "tool_calls" not in info  # the cut turn's call was not run


def test_the_tools_output_never_reaches_the_reward(task):
    """The reward sees the model's last turn alone: the tool printing the right answer earns nothing."""
    seen = []

    def spy(text, example, truncated):
        seen.append(text)
        return math_em_reward(text, example, truncated)

    env = CalculatorEnv(task, reward=spy)
    env.reset(task.train[0], seed=0)
    env.step(call("123 * 456"))  # the tool answers 56088
    _, reward, done, _ = env.step("I think it is \\boxed{56000}.")
    assert (reward, done, seen) == (0.0, True, ["I think it is \\boxed{56000}."])


def test_single_turn_is_the_task_reward_unchanged(task):
    env = SingleTurnEnv(task)
    ex = task.train[0]
    assert env.reset(ex, seed=3) == [{"role": "user", "content": "Calculate 123 * 456."}]
    for text, cut in (("\\boxed{56088}", False), ("56 088 or so", True)):
        env.reset(ex, seed=3)
        messages, reward, done, info = env.step(text, truncated=cut)
        want_r, want_d = math_em_reward(text, ex, cut)
        assert (messages, reward, done) == ([], want_r, True)
        assert info == {**want_d, "stop": "length" if cut else "answer"}


def test_environments_are_declared_by_name_and_loaded_lazily(task):
    assert {"single_turn", "calculator"} <= set(ENVS.names())
    assert isinstance(make_env("calculator", task), CalculatorEnv)
    assert isinstance(make_env("single_turn", task), SingleTurnEnv)
    with pytest.raises(ValueError, match="unknown environment 'calculater'; valid: calculator, code_feedback, single_turn"):
        make_env("calculater", task)
    # importing the package and naming an environment imports no environment module, nor torch
    code = ("import sys, rftlib.envs as e; e.ENVS.decl('calculator'); "
            "print(sorted(m for m in sys.modules if m.startswith('rftlib.envs.')), 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "['rftlib.envs.base'] False"
