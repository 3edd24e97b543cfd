"""``rft eval`` scores checkpoints on the trainer's own held-out set, in its precision.

``eval_checkpoints.py`` rebuilt the task without its ``task_args``: for ``code-cpu`` 120 problems of 10
families where the trainer's held-out set was 100 of 5, for ``arithmetic-boxed`` prompts without their
``\\boxed{}`` instruction; and it reused the trainer's evals whatever set or precision they were on, so one
curve mixed two sets.
"""

from __future__ import annotations

import json

import pytest

from rftlib.eval_checkpoints import eval_checkpoints
from rftlib.train.loop import Trainer

INSTRUCTION = "Put the final answer in \\boxed{}."


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 2-step tiny attempt whose task_args change the held-out prompts; checkpoints at steps 1 and 2."""
    from rftlib.config import make_config

    runs = tmp_path_factory.mktemp("ckpt") / "runs"
    cfg = make_config("tiny", {"runs_root": str(runs), "num_steps": 2, "save_steps": 1,
                               "task_args": {"instruction": INSTRUCTION}})
    tr = Trainer(cfg, progress=False)
    try:
        tr.train()
    finally:
        tr.close()
    return tr.run_dir


def _doc(run_dir, name):
    return json.loads((run_dir / "eval" / name).read_text())


def test_checkpoint_evals_use_the_attempts_task_args(trained):
    res = eval_checkpoints(trained, log=lambda s: None, recompute=True, reuse_training_evals=False)
    step0 = _doc(trained, "step_0.json")  # the trainer's own held-out eval
    assert sorted(res) == [1, 2]
    for s, d in res.items():
        assert d["source"].startswith("rftlib.eval_checkpoints")  # scored here, not copied
        assert [r["prompt"] for r in d["results"]] == [r["prompt"] for r in step0["results"]]
        assert all(r["prompt"].endswith(INSTRUCTION) for r in d["results"])
        assert d["examples_digest"] == step0["examples_digest"] and d["n_problems"] == step0["n_problems"] == 16
        assert d["task_args"] == {"instruction": INSTRUCTION} and d["precision"] == step0["precision"]


def test_the_trainers_eval_is_reused_only_when_it_scored_the_same_set_in_the_same_precision(trained):
    (trained / "eval" / "ckpt_step_2.json").unlink(missing_ok=True)
    res = eval_checkpoints(trained, log=lambda s: None)
    assert res[2]["source"].startswith("eval/step_2.json")  # the trainer's eval of the same weights, reused
    own = _doc(trained, "step_2.json")

    other_set = dict(own, examples_digest="0" * 16)  # an eval on other problems (an older rft eval's task)
    (trained / "eval" / "step_2.json").write_text(json.dumps(other_set))
    (trained / "eval" / "ckpt_step_2.json").unlink()
    res = eval_checkpoints(trained, log=lambda s: None)
    assert res[2]["source"].startswith("rftlib.eval_checkpoints")
    assert res[2]["greedy_pass@1"] == own["greedy_pass@1"]  # same weights, same set, same precision

    other_precision = dict(own, precision="bfloat16" if own["precision"] != "bfloat16" else "float32")
    (trained / "eval" / "step_2.json").write_text(json.dumps(other_precision))
    (trained / "eval" / "ckpt_step_2.json").write_text(json.dumps({**other_precision, "step": 2}))  # a stale cache
    res = eval_checkpoints(trained, log=lambda s: None)
    assert res[2]["source"].startswith("rftlib.eval_checkpoints") and res[2]["precision"] == own["precision"]
    (trained / "eval" / "step_2.json").write_text(json.dumps(own))


def test_the_code_task_is_rebuilt_with_its_families(tmp_path, monkeypatch, tiny_dir):
    """code-cpu trains on 5 families x 20 held-out problems; rft eval scored 10 x 12 = 120 (five families the base
    model already solves added). The checkpoint evaluator is handed the trainer's 100, family for family."""
    import torch

    from rftlib.attempts import create_attempt
    from rftlib.config import make_config
    from rftlib.models.loading import load_model_and_tokenizer
    from rftlib import eval_checkpoints as checkpoints
    from rftlib.train.build import build_task

    cfg = make_config("code-cpu", {"runs_root": str(tmp_path / "runs")})
    run_dir = create_attempt(cfg)
    (run_dir / "training_state" / "step_5").mkdir(parents=True)
    torch.save({}, run_dir / "training_state" / "step_5" / "trainable.pt")
    scored = []

    def greedy_eval(engine, tok, task, examples, **kw):  # what would be scored, without generating
        scored.append(examples)
        return {"mode": "greedy_pass@1", "greedy_pass@1": 0.0, "n_problems": len(examples), "results": []}

    monkeypatch.setattr(checkpoints, "greedy_eval", greedy_eval)
    monkeypatch.setattr(checkpoints, "load_model_and_tokenizer", lambda name, dtype="float32":
                        load_model_and_tokenizer("tiny", dtype))  # the model does not matter here: the set does
    checkpoints.eval_checkpoints(run_dir, log=lambda s: None)
    (examples,) = scored
    trainer_set = build_task(cfg).eval
    assert len(examples) == len(trainer_set) == 100
    assert [e.prompt for e in examples] == [e.prompt for e in trainer_set]
