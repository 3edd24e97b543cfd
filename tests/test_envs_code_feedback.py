"""``code_feedback`` (issue 40 item 5): a failing program gets its failing test back and may try again; the
reward is the passing attempt's code reward, discounted per extra attempt."""

from __future__ import annotations

import pytest

from rftlib.data.base import Example, Task
from rftlib.envs.base import make_env
from rftlib.rewards.code import CodeProblem
from rftlib.rewards.sandbox import Sandbox, check_available

pytestmark = pytest.mark.skipif(not check_available()[0], reason=f"no sandbox here: {check_available()[1]}")

PROBLEM = CodeProblem(entry_point="double", tests=(((1,), 2), ((5,), 10), ((-3,), -6)))
EX = Example(id="double", prompt="Write double(x).", answer="", meta={"problem": PROBLEM})
TASK = Task(name="t", train=[EX], eval=[Example(id="e", prompt="other", answer="", meta={"problem": PROBLEM})],
            reward=lambda *a: (0.0, {}))
WRONG = "```python\ndef double(x):\n    return x + 2\n```"
CRASH = "```python\ndef double(x):\n    raise ValueError('no ' + str(x))\n```"
RIGHT = "```python\ndef double(x):\n    return 2 * x\n```"


@pytest.fixture(scope="module")
def box():
    with Sandbox(num_workers=1, timeout_s=5) as sb:
        yield sb


def test_a_first_time_pass_ends_with_the_full_reward(box):
    env = make_env("code_feedback", TASK, sandbox=box)
    assert env.reset(EX, 0) == [{"role": "user", "content": "Write double(x)."}]
    step = env.step(RIGHT)
    assert step.done and step.reward == 1.0 and step.info["correctness"] == 1.0 and step.info["attempts"] == 1.0
    assert step.info["correctness_first_attempt"] == 1.0


def test_a_failure_gets_its_failing_test_back_and_a_fix_is_discounted(box):
    env = make_env("code_feedback", TASK, sandbox=box, discount=0.5)
    env.reset(EX, 0)
    first = env.step(WRONG)
    assert not first.done and first.reward == 0.0 and first.info == {"feedback_turns": 1.0}
    (msg,) = first.messages
    # double(1) = 3 happens to be wrong too: the first failing test is test 1, what came back and what was expected
    assert msg["role"] == "user" and "passed 0 of 3 tests" in msg["content"]
    assert "Test 1 failed: double(1): wrong answer: got 3, expected 2" in msg["content"]
    assert "2 attempts left" in msg["content"]
    second = env.step(RIGHT)
    assert second.done and second.reward == 0.5 and second.info["attempts"] == 2.0
    # right in the end, not at first: an eval's pass@1 reads the first attempt (rftlib.eval.FIRST_ATTEMPT_KEY)
    assert second.info["correctness"] == 1.0 and second.info["correctness_first_attempt"] == 0.0


def test_an_error_shows_its_stderr_and_the_last_attempt_ends_with_its_partial_reward(box):
    env = make_env("code_feedback", TASK, sandbox=box, max_attempts=2)
    env.reset(EX, 0)
    first = env.step(CRASH)
    assert "ValueError" in first.messages[0]["content"] and "1 attempt left" in first.messages[0]["content"]
    # f(x) = x + 1 passes none; f(x) = x * 2 if x > 0 else 0 passes 2 of 3: seed 002's partial credit 0.5 * 2/3
    last = env.step("```python\ndef double(x):\n    return 2 * x if x > 0 else 0\n```")
    assert last.done and last.info["attempts"] == 2.0 and last.info["correctness"] == 0.0
    assert last.reward == pytest.approx(0.5 * 2 / 3 * 0.8)


def test_a_cut_turn_ends_the_episode_and_an_example_without_a_problem_is_refused(box):
    env = make_env("code_feedback", TASK, sandbox=box)
    env.reset(EX, 0)
    cut = env.step("```python\ndef double(x):\n    return 2 *", truncated=True)
    assert cut.done and cut.info["stop"] == "length"
    with pytest.raises(ValueError, match="has no meta\\['problem'\\]"):
        env.reset(Example(id="x", prompt="p", answer="1"), 0)
