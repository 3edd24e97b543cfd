"""The code sandbox under a training load, in the metrics rows: executions,
executions/s, timeouts, crashes and the reward's share of the step.

The end-to-end test trains the tiny model one step on a task whose reward runs four known
programs per group in the real sandbox (one right, one that loops forever, one that kills its own
process, one wrong), so every count in the row is known in advance."""

import math

import pytest

from rftlib.config import make_config
from rftlib.data.base import Example, Task
from rftlib.data.code_problems import code_task_batch_reward
from rftlib.rewards.code import CodeProblem
from rftlib.rewards.registry import Reward
from rftlib.rewards.sandbox import check_available
from rftlib.train.step_metrics import sandbox_metrics


def test_sandbox_metrics_by_hand():
    diags = [{"exec_s": 0.01, "timeout": 0.0, "crashed": 0.0, "sandbox_error": 0.0},
             {"exec_s": 1.00, "timeout": 1.0, "crashed": 0.0, "sandbox_error": 0.0},
             {"exec_s": 0.02, "timeout": 0.0, "crashed": 1.0, "sandbox_error": 0.0},
             {"exec_s": 0.03, "timeout": 0.0, "crashed": 0.0, "sandbox_error": 1.0},
             {"correctness": 1.0}]  # a row no sandbox ran (a math component): not counted
    m = sandbox_metrics(diags, {"reward": 2.0, "step": 10.0}, world_size=1)
    assert m == {"sandbox/executions": 4.0, "sandbox/timeouts": 1.0, "sandbox/crashes": 1.0, "sandbox/errors": 1.0,
                 "sandbox/exec_s_max": 1.0, "sandbox/executions_per_s": 2.0}  # 4 jobs / 2 s
    # two ranks: the 4 rows are both ranks' (2 each), each rank's reward phase took 2 s -> 1 job/s
    assert sandbox_metrics(diags, {"reward": 2.0}, world_size=2)["sandbox/executions_per_s"] == 1.0
    assert sandbox_metrics([{"correctness": 1.0}], {"reward": 2.0}) == {}  # math: no sandbox keys at all


PROGRAMS = [  # one per row of a group of 4: right, infinite loop, kills its own process, wrong
    "def f(n):\n    return n + 1\n",
    "def f(n):\n    while True:\n        pass\n",
    "def f(n):\n    import os\n    os._exit(3)\n",
    "def f(n):\n    return 0\n",
]


def _fixed_programs_reward(completions, examples, truncated):
    """The real sandboxed reward, on PROGRAMS instead of what the tiny model wrote."""
    texts = [f"```python\n{PROGRAMS[i % 4]}```" for i in range(len(completions))]
    return code_task_batch_reward(texts, examples, truncated)


def _row(text, example, truncated):  # the row-by-row form is never used: the trainer takes the batch form
    raise AssertionError("the trainer scores a rollout with the reward's declared batch form")


_reward = Reward("fixed_programs", _row, batch=_fixed_programs_reward)


@pytest.mark.skipif(not check_available()[0], reason=f"no sandbox here: {check_available()[1]}")
def test_sandbox_metrics_in_a_training_step(tmp_path):
    from rftlib.train.loop import Trainer

    problem = CodeProblem(entry_point="f", tests=(((1,), 2), ((5,), 6)), timeout_s=1.0)
    ex = [Example(id=f"t{i}", prompt=f"Write f, number {i}.", answer="", meta={"problem": problem}) for i in range(3)]
    task = Task(name="fixed_programs", train=ex[:2], eval=ex[2:], reward=_reward)
    cfg = make_config("tiny", {"runs_root": str(tmp_path), "n_samples_per_prompt": 4, "rollout_batch_size": 2,
                               "micro_batch_size": 8, "num_steps": 1, "max_new_tokens": 4})
    trainer = Trainer(cfg, progress=False, task=task)
    try:
        row = trainer.step()
    finally:
        trainer.close()
    # 2 prompts x 4 rows: each program twice
    assert row["sandbox/executions"] == 8 and row["sandbox/timeouts"] == 2 and row["sandbox/crashes"] == 2
    assert row["sandbox/errors"] == 0
    assert row["sandbox/exec_s_max"] >= 1.0  # the loop ran to its 1 s wall clock
    assert row["sandbox/executions_per_s"] == pytest.approx(8 / row["timing/reward"], rel=1e-12)
    assert row["timing/reward"] >= 1.0  # two 1 s loops on 2 workers: at least one wall clock each
    # the share is the timeline's (rftlib.train.step_metrics.reward_share): the scoring's interval over the step's
    # window; at max_staleness 0 that interval is the reward's seconds, read by other clock calls around the same
    # scoring, so the two agree to the code between those reads (microseconds), far under a scoring second (in the
    # whole suite they differed by 1.6e-6 of the share; a 1e-12 bound held only in a fresh process)
    assert row["timing/reward_share"] == row["timing/reward_busy"]
    assert abs(row["timing/reward_share"] * row["timing/step"] - row["timing/reward"]) < 1e-2
    assert 0 < row["timing/reward_share"] < 1
    # seed 002's rewards: right 1.0, wrong-but-running 0.0 (f(1) = 0 != 2), timeout and crash 0.0
    assert row["reward_mean"] == pytest.approx(2 / 8) and math.isfinite(row["loss"])
