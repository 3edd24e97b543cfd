"""Labelled eval modes over scripted completions: the estimators' plumbing, by hand."""

import pytest
import torch

from rftlib.data.tasks import Example, Task, math_em_reward
from rftlib.eval import compare, evaluate
from rftlib.rollout.base import Rollout


class ScriptedEngine:
    def __init__(self, texts):
        self.texts = list(texts)
        self.calls = []

    def generate(self, prompts, *, group_size, max_new_tokens, temperature, top_p=1.0, greedy=False):
        self.calls.append((len(prompts), group_size, temperature, greedy))
        n = len(prompts) * group_size
        out, self.texts = self.texts[:n], self.texts[n:]
        z = torch.zeros(n, 1)
        return Rollout(prompt_ids=z.long(), prompt_mask=z, completion_ids=z.long(), completion_mask=z + 1,
                       behaviour_logprobs=z, truncated=torch.zeros(n, dtype=torch.bool), texts=out, group_size=group_size)


class Tok:
    def apply_chat_template(self, msgs, tokenize, add_generation_prompt):
        return msgs[-1]["content"]


TASK = Task("t", train=[Example("a", "Calculate 1 + 2.", "3")], eval=[], reward=math_em_reward)
EXAMPLES = [Example("p1", "Calculate 1 + 2.", "3"), Example("p2", "Calculate 2 + 3.", "5")]


def test_sampling_pass_at_k_pass1_and_majority():
    # p1: 3 of 4 right (answers 3,3,4,3): pass@4 = 1, pass@1 = 3/4, majority "3" right
    # p2: 0 of 4 right (1,2,2,7): pass@4 = 0, pass@1 = 0, majority "2" wrong
    eng = ScriptedEngine(["3", "It is 3", "4", "so 3", "1", "2", "2", "7"])
    res = evaluate(eng, Tok(), TASK, EXAMPLES, mode="sampling_pass@k", n=4, max_new_tokens=8)
    assert res["mode"] == "sampling_pass@4" and res["temperature"] == 0.6 and res["n_samples"] == 4
    assert res["sampling_pass@4"] == pytest.approx(0.5)  # (1 + 0) / 2
    assert res["pass@1"] == pytest.approx(0.375)  # (3/4 + 0) / 2
    assert res["maj@4"] == pytest.approx(0.5)
    assert eng.calls == [(2, 4, 0.6, False)]


def test_temperature_zero_with_n_above_one_refused_unless_nondet_proxy():
    with pytest.raises(ValueError, match="temperature 0"):
        evaluate(ScriptedEngine([]), Tok(), TASK, EXAMPLES, mode="sampling_pass@k", n=4, temperature=0.0,
                 max_new_tokens=8)
    eng = ScriptedEngine(["3"] * 4 + ["5"] * 3 + ["6"])
    res = evaluate(eng, Tok(), TASK, EXAMPLES, mode="nondet_proxy_pass@k", n=4, max_new_tokens=8)
    assert res["mode"] == "nondet_proxy_pass@4" and res["temperature"] == 0.0 and eng.calls[0][3] is True
    assert res["pass@1"] == pytest.approx((1 + 0.75) / 2)


def test_compare_refuses_across_modes():
    a = {"mode": "greedy_pass@1", "dataset": "ood", "n_samples": 1, "max_new_tokens": 8, "greedy_pass@1": 0.5}
    b = dict(a, **{"greedy_pass@1": 0.6})
    assert compare(a, b) == pytest.approx(0.1)
    c = {"mode": "sampling_pass@8", "dataset": "ood", "n_samples": 8, "max_new_tokens": 8, "sampling_pass@8": 0.9}
    with pytest.raises(ValueError, match="different mode"):
        compare(a, c)


def test_sft_decision_from_boxed_rate():
    from rftlib.eval import sft_decision

    # 19 of 20 boxed = 95%: not needed; 18 of 20 = 90%: needed (seed 003 section 12)
    ex = [Example(f"p{i}", "Calculate 1 + 2.", "3") for i in range(20)]
    ok = sft_decision(ScriptedEngine(["\\boxed{3}"] * 19 + ["3"]), Tok(), TASK, ex, max_new_tokens=8)
    assert ok["has_boxed_rate"] == pytest.approx(0.95) and ok["verdict"] == "SFT not needed"
    bad = sft_decision(ScriptedEngine(["\\boxed{3}"] * 18 + ["3", "3"]), Tok(), TASK, ex, max_new_tokens=8)
    assert bad["verdict"] == "SFT needed" and "90%" in bad["message"]


# ---- issue 30 item 10: seed 003's names keep seed 003's meanings ---------------------------------------
def test_sampling_pass_at_8_is_the_majority_vote_and_any_of_8_has_its_own_name():
    """Seed 003 section 7: sampling_pass@8 is "majority-vote accuracy" at temperature 0.6, n 8. A problem whose
    8 samples are right 3 times (the majority answer wrong) counts 0 there, 1 for any-of-8."""
    p1 = ["3", "3", "3", "4", "4", "4", "4", "7"]  # 3 right, majority "4" wrong
    p2 = ["5"] * 5 + ["6"] * 3  # majority "5" right
    res = evaluate(ScriptedEngine(p1 + p2), Tok(), TASK, EXAMPLES, mode="sampling_pass@k", n=8, max_new_tokens=8)
    assert res["mode"] == "sampling_pass@8" and res["temperature"] == 0.6
    assert res["sampling_pass@8"] == pytest.approx(0.5) == res["maj@8"]  # (0 + 1) / 2
    assert res["any_correct@8"] == pytest.approx(1.0)  # (1 + 1) / 2
    assert res["pass@1"] == pytest.approx((3 / 8 + 5 / 8) / 2)


def test_majority_vote_normalises_answers_as_the_reward_does():
    """8 of 8 \\boxed{042} for gold 42: the reward scores each right (leading zeros go), so the vote does too."""
    ex = [Example("p", "Calculate 40 + 2.", "42")]
    res = evaluate(ScriptedEngine(["\\boxed{042}"] * 8), Tok(), TASK, ex, mode="sampling_pass@k", n=8, max_new_tokens=8)
    assert res["maj@8"] == 1.0 and res["sampling_pass@8"] == 1.0 and res["pass@1"] == 1.0
    # "$1,000$." and "1000" are one answer to the reward, so one vote block: 3 of them beat 2 x "999" + 2 x "7"
    ex = [Example("q", "Calculate 999 + 1.", "1000")]
    texts = ["\\boxed{$1,000$.}", "999", "the answer is 1000", "7", "\\boxed{1000}", "999", "7", "no idea"]
    assert evaluate(ScriptedEngine(texts), Tok(), TASK, ex, mode="sampling_pass@k", n=8, max_new_tokens=8)["maj@8"] == 1.0


def test_nondet_proxy_keeps_any_of_k_under_its_name():
    eng = ScriptedEngine(["3"] + ["4"] * 7 + ["6"] * 8)
    res = evaluate(eng, Tok(), TASK, EXAMPLES, mode="nondet_proxy_pass@k", n=8, max_new_tokens=8)
    assert res["nondet_proxy_pass@8"] == pytest.approx(0.5) == res["any_correct@8"]  # p1 once right, p2 never
    assert res["maj@8"] == 0.0


def test_the_trainer_logs_the_seeds_name_with_the_seeds_meaning(tmp_path):
    """A sampled probe's metrics row: sampling_pass@8 is the majority vote, any-of-8 and maj@8 are logged beside
    it under their own names (the trainer once logged any-of-8 as sampling_pass@8 and never logged maj@8)."""
    from types import SimpleNamespace

    from rftlib.config import make_config
    from rftlib.train.dist import Dist
    from rftlib.train.loop import Trainer
    from rftlib.train.state import TrainerState

    p1 = ["3", "3", "3", "4", "4", "4", "4", "7"]
    p2 = ["5"] * 5 + ["6"] * 3
    tr = object.__new__(Trainer)  # the eval alone: no model is needed to score scripted completions
    tr.cfg = make_config("tiny", {"eval_probes": ["ood"], "eval_temperature": {"ood": 0.6},
                                  "eval_n_samples": {"ood": 8}, "runs_root": str(tmp_path)})
    tr.dist, tr.run_dir, tr.state = Dist(), tmp_path, TrainerState()
    tr.engine, tr.tok, tr.eval_precision = ScriptedEngine(p1 + p2), Tok(), None
    tr.task = SimpleNamespace(eval_set=lambda probe: EXAMPLES, system_prompt=None, reward=math_em_reward, name="t")
    row = tr.evaluate().metrics
    assert row["eval/ood/sampling_pass@8"] == pytest.approx(0.5)
    assert row["eval/ood/maj@8"] == pytest.approx(0.5)
    assert row["eval/ood/any_correct@8"] == pytest.approx(1.0)
    assert row["eval/ood/pass@1"] == pytest.approx(0.5)
