"""The calculator environment's python tool (issue 40 item 5): model-written code runs in the sandbox only,
a hanging call is killed at its clock and the episode goes on, a flood is capped, and one call cannot read what
another wrote."""

from __future__ import annotations

import json

import pytest

from rftlib.data.multiply import multiply_task
from rftlib.envs.calculator import CalculatorEnv, parse_tool_calls
from rftlib.rewards.sandbox import Sandbox, check_available

pytestmark = pytest.mark.skipif(not check_available()[0], reason=f"no sandbox here: {check_available()[1]}")


@pytest.fixture(scope="module")
def box():
    with Sandbox(num_workers=1, timeout_s=5) as sb:
        yield sb


def _call(code: str) -> str:
    return "<tool_call>\n" + json.dumps({"name": "python", "arguments": {"code": code}}) + "\n</tool_call>"


def _env(box, **kw):
    env = CalculatorEnv(multiply_task(), python=True, sandbox=box, **kw)
    env.reset(multiply_task().eval[0], 0)
    return env


def test_python_is_a_tool_only_when_offered():
    (c,) = parse_tool_calls(_call("print(1)"))
    assert c.error == "unknown tool 'python'; the only tool is 'calculator'"
    (c,) = parse_tool_calls(_call("print(1)"), ("calculator", "python"))
    assert c.error is None and c.tool == "python" and c.code == "print(1)"
    assert "python" in CalculatorEnv(multiply_task(), python=True).system_prompt
    assert "python" not in CalculatorEnv(multiply_task()).system_prompt


def test_a_python_call_returns_what_it_printed(box):
    step = _env(box).step("Let me compute. " + _call("import math\nprint(37 * 412, math.factorial(5))"))
    assert not step.done and step.messages == [{"role": "tool", "name": "python", "content": "15244 120\n"}]
    assert step.info["tool_ok"] == 1 and step.info["tool_calls"] == 1


def test_a_hanging_call_is_killed_at_its_clock_and_the_episode_goes_on(box):
    env = _env(box, python_timeout_s=1.0)
    step = env.step(_call("print('started', flush=True)\nwhile True:\n    pass"))
    assert not step.done
    (msg,) = step.messages
    assert msg["content"].startswith("error: timed out") and "started" in msg["content"]
    assert step.info["tool_timeouts"] == 1 and step.info["tool_exec_errors"] == 1
    again = env.step(_call("print(6 * 7)"))  # the episode goes on: the next call runs
    assert again.messages[0]["content"] == "42\n"


def test_an_error_comes_back_as_text(box):
    (msg,) = _env(box).step(_call("1 / 0")).messages
    assert msg["content"].startswith("error:") and "ZeroDivisionError" in msg["content"]


def test_one_call_cannot_read_what_another_wrote(box):
    env = _env(box)
    wrote = env.step(_call("open('/tmp/secret.txt', 'w').write('s3cret'); print('written')"))
    assert wrote.messages[0]["content"] == "written\n"
    read = env.step(_call("print(open('/tmp/secret.txt').read())")).messages[0]["content"]
    assert "s3cret" not in read and read.startswith("error:")


def test_a_flood_is_cut_by_the_sandbox_and_said(box):
    (msg,) = _env(box).step(_call("print('x' * 10_000_000)")).messages
    assert len(msg["content"]) < 2_000_000 and msg["content"].endswith("[output truncated by the sandbox]")
