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
