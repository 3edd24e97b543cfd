"""calc-cpu's pieces (issue 40 item 6): the multiply task, its warm-start rows, the calculator's prompt shown
once, greedy continuation from token ids, and the held-out eval played through an environment."""

from __future__ import annotations

import pytest
import torch

from rftlib.data.multiply import multiply_task, sft_rows
from rftlib.envs.calculator import SYSTEM_PROMPT, CalculatorEnv, evaluate, parse_tool_calls


def test_the_multiply_task_is_split_and_its_answers_are_the_products():
    t = multiply_task()
    assert len(t.eval) == 100 and len(t.train) == 1900
    assert not {e.prompt for e in t.eval} & {e.prompt for e in t.train}
    for e in t.eval + t.train[:50]:
        a, b = e.meta["a"], e.meta["b"]
        assert 10 <= a <= 99 and 100 <= b <= 999 and e.answer == str(a * b) and e.prompt == f"Calculate {a} * {b}."
    assert multiply_task().eval == t.eval  # a fixed draw: attempts compare
    assert t.reward(f"so \\boxed{{{t.eval[0].answer}}}", t.eval[0], False)[0] == 1.0
    assert t.system_prompt is None and multiply_task(tool_prompt=True).system_prompt == SYSTEM_PROMPT


def test_the_warm_start_rows_are_training_problems_each_answered_by_its_call():
    """Two rows per training problem, the episode the environment plays: the call (its expression evaluates to
    the answer), then, after that call and the calculator's result as the environment renders it, the boxed
    answer the task's reward scores 1 and the environment ends the episode on."""
    from rftlib.envs.calculator import CalculatorEnv

    t = multiply_task()
    train = {e.prompt: e for e in t.train}
    rows = sft_rows(40)
    assert len(rows) == 80 and len({r["input"] for r in rows}) == 40
    for first, second in zip(rows[::2], rows[1::2]):
        ex = train[first["input"]]  # a KeyError is a held-out problem (or none of the task's)
        assert second["input"] == first["input"] and "context" not in first
        (call,) = parse_tool_calls(first["output"])
        assert call.error is None and str(evaluate(call.expression)) == ex.answer
        env = CalculatorEnv(t)
        env.reset(ex, 0)
        got = env.step(first["output"])  # what the environment answers the call with
        (result,) = got.messages
        assert second["context"] == [{"role": "assistant", "content": first["output"]},
                                     {"role": result["role"], "content": result["content"]}]
        end = env.step(second["output"])
        assert end.done and end.reward == 1.0 and end.info["stop"] == "answer"


def test_a_direct_share_of_the_warm_start_answers_without_the_tool():
    """--direct-share 0.75 (sft-calc-cpu's rows): 30 of 40 problems get one row boxing the product, no call, the
    answer the environment ends on with reward 1; the other 10 their call and answer as above; the draw of
    problems is the same as without the share, so only the form of each row changes."""
    t = multiply_task()
    train = {e.prompt: e for e in t.train}
    rows = sft_rows(40, direct_share=0.75)
    direct = [r for r in rows if "<tool_call>" not in r["output"] and "context" not in r]
    calls = [r for r in rows if "<tool_call>" in r["output"]]
    assert (len(direct), len(calls), len(rows)) == (30, 10, 50)
    assert [r["input"] for r in rows if "context" not in r] == [r["input"] for r in sft_rows(40)[::2]]
    for r in direct:
        ex = train[r["input"]]
        env = CalculatorEnv(t)
        env.reset(ex, 0)
        end = env.step(r["output"])
        assert end.done and end.reward == 1.0 and end.info["stop"] == "answer" and ex.answer in r["output"]
    assert sft_rows(40, direct_share=0.0) == sft_rows(40)
    with pytest.raises(ValueError, match="direct_share"):
        sft_rows(4, direct_share=1.0)


def test_the_calculator_prompt_is_shown_once():
    t = multiply_task(tool_prompt=True)
    ex = t.eval[0]
    assert CalculatorEnv(t).reset(ex, 0)[0] == {"role": "system", "content": SYSTEM_PROMPT}
    plain = multiply_task()
    assert CalculatorEnv(plain).reset(ex, 0)[0]["content"] == SYSTEM_PROMPT
    from dataclasses import replace
    own = replace(plain, system_prompt="Be brief.")
    assert CalculatorEnv(own).reset(ex, 0)[0]["content"] == "Be brief.\n\n" + SYSTEM_PROMPT


def test_greedy_continuation_from_ids_is_the_argmax_generate_gives(tiny_dir):
    """generate_ids(greedy=True) continues each context by argmax, as generate(greedy=True) does from the same
    prompt: the same tokens (an independent path: text prompts, right-padded batch of two lengths)."""
    from rftlib.models.loading import load_model_and_tokenizer
    from rftlib.rollout.hf import HFEngine

    model, tok = load_model_and_tokenizer(str(tiny_dir))
    eng = HFEngine(model, tok)
    prompts = ["Calculate 12 * 345.", "Hi"]
    ro = eng.generate(prompts, group_size=1, max_new_tokens=12, temperature=1.0, greedy=True)
    ctx = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    out = eng.generate_ids(ctx, max_new_tokens=[12, 12], temperature=1.0, greedy=True)
    for i, (ids, lp, cut) in enumerate(out):
        n = int(ro.completion_mask[i].sum())
        assert ids == ro.completion_ids[i, :n].tolist() and lp == [0.0] * len(ids) and cut == bool(ro.truncated[i])
    assert out == eng.generate_ids(ctx, max_new_tokens=[12, 12], temperature=1.0, greedy=True)


class _OneCallEnv:
    """Scripted: turn 1 gets a tool result; turn 2 ends, right (correctness 1) on even-indexed problems."""

    def __init__(self, task):
        self.turn, self.ex = 0, None

    def reset(self, example, seed):
        self.ex = example
        return [{"role": "user", "content": example.prompt}]

    def step(self, text, *, truncated=False):
        from rftlib.envs.base import Step

        self.turn += 1
        if self.turn == 1 and not truncated:
            return Step([{"role": "user", "content": "42"}], 0.0, False, {"tool_calls": 1.0, "tool_ok": 1.0})
        right = float(int(self.ex.meta["a"]) % 2 == 0)
        return Step([], right, True, {"correctness": right, "stop": "answer"})


class _ScriptedEngine:
    """An engine whose every turn is "ok" and its stop token, asked greedily (what the eval must ask for)."""

    def __init__(self, tok):
        self.tok, self.stop_ids, self.calls = tok, (tok.eos_token_id,), 0

    def generate_ids(self, contexts, *, max_new_tokens, temperature, top_p=1.0, greedy=False):
        assert greedy, "an eval through an environment samples greedily"
        self.calls += 1
        ids = self.tok("ok", add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
        return [(ids, [0.0] * len(ids), False) for _ in contexts]


def test_a_held_out_eval_is_played_in_the_environment(tiny_dir, monkeypatch):
    """greedy_eval with an EnvEval: one greedy episode per problem, scored by the environment (its correctness,
    not the task's reward of the text: "ok" holds no number), the tool rates beside the accuracy, the transcript
    as the completion; all rows of a batch advance together (one engine call a turn)."""
    from rftlib.envs.base import ENVS
    from rftlib.eval import EnvEval, greedy_eval
    from rftlib.models.loading import load_model_and_tokenizer

    monkeypatch.setattr(ENVS, "_table", dict(ENVS._table))
    ENVS.register("one_call_test", _OneCallEnv)
    _, tok = load_model_and_tokenizer(str(tiny_dir))
    t = multiply_task()
    exs = t.eval[:8]
    want = sum(e.meta["a"] % 2 == 0 for e in exs) / len(exs)
    assert 0 < want < 1
    eng = _ScriptedEngine(tok)
    env = EnvEval("one_call_test", {}, max_turns=3, max_trajectory_tokens=60)
    res = greedy_eval(eng, tok, t, exs, max_new_tokens=60, env=env)
    assert res["n_problems"] == 8 and res["env"] == "one_call_test" and eng.calls == 2
    assert res["greedy_pass@1"] == pytest.approx(want)
    assert res["tool_call_rate"] == 1.0 and res["tool_ok_rate"] == 1.0 and res["mean_turns"] == 2.0
    ok = len(tok("ok", add_special_tokens=False)["input_ids"])
    for r in res["results"]:
        assert r["turns"] == 2 and r["stop"] == "answer" and r["length"] == 2 * (ok + 1)  # two turns, each + stop
        assert r["completion"].count("ok") == 2 and "42" in r["completion"]
        # the transcript the report shows: the model's two turns as written (their stop token dropped, as in the
        # completion text), the environment's span between them as the template renders it
        assert r["transcript"] == [{"who": "model", "text": "ok"},
                                   {"who": "env", "text": "\n<|im_start|>user\n42<|im_end|>\n<|im_start|>assistant\n"},
                                   {"who": "model", "text": "ok"}], r["transcript"]


def test_a_sampled_eval_through_an_environment_is_refused_by_the_config(tiny_cfg):
    """At config time, not when the first eval runs (after eval_steps of training); the eval refuses it too."""
    from rftlib.config import ConfigError
    from rftlib.train.evaluation import evaluate_probes

    with pytest.raises(ConfigError, match=r"probe\(s\) \['heldout'\] with env='calculator': evals through an "
                                          r"environment are greedy"):
        tiny_cfg(env="calculator", eval_n_samples={"heldout": 4}, eval_temperature={"heldout": 0.6})
    cfg = tiny_cfg(env="calculator")
    cfg.eval_n_samples, cfg.eval_temperature = {"heldout": 4}, {"heldout": 0.6}  # past the config's check
    D = type("D", (), {"rank": 0, "world_size": 1, "is_main": False, "distributed": False})()
    with pytest.raises(ValueError, match="sampled evals in an environment are not built yet"):
        evaluate_probes(cfg, None, None, multiply_task(), D, None, 0, None)


def test_the_config_refuses_what_multi_turn_cannot_do_yet(tiny_cfg):
    from rftlib.config import ConfigError

    with pytest.raises(ConfigError, match=r"multi-turn\) with zero_stage 3"):
        tiny_cfg(env="calculator", backend="deepspeed", zero_stage=3)
    with pytest.raises(ConfigError, match="filter_void_turns with dynamic_sampling='mask'"):
        tiny_cfg(env="calculator", filter_void_turns=True, dynamic_sampling="mask")
    with pytest.raises(ConfigError, match="max_attempts 5 > max_turns 4"):
        tiny_cfg(env="code_feedback", env_args={"max_attempts": 5}, max_turns=4)
    assert tiny_cfg(env="code_feedback", env_args={"max_attempts": 4}, max_turns=4).max_turns == 4


def test_with_the_python_tool_the_prompt_still_shows_once():
    t = multiply_task(tool_prompt=True)
    (system, _) = CalculatorEnv(t, python=True).reset(t.eval[0], 0)
    assert system["content"].count(SYSTEM_PROMPT) == 1 and system["content"].count('"name": "python"') == 1


class _RetryEnv:
    """Scripted retries: wrong first, right second (correctness 1 at the end, 0 at the first attempt)."""

    def __init__(self, task):
        self.turn = 0

    def reset(self, example, seed):
        return [{"role": "user", "content": example.prompt}]

    def step(self, text, *, truncated=False):
        from rftlib.envs.base import Step

        self.turn += 1
        if self.turn == 1:
            return Step([{"role": "user", "content": "test 1 failed"}], 0.0, False, {"feedback_turns": 1.0})
        return Step([], 0.8, True, {"correctness": 1.0, "correctness_first_attempt": 0.0, "stop": "answer"})


def test_an_eval_with_retries_scores_the_first_attempt_as_pass_at_1(tiny_dir, monkeypatch):
    from rftlib.envs.base import ENVS
    from rftlib.eval import EnvEval, greedy_eval
    from rftlib.eval_checkpoints import _same_settings
    from rftlib.models.loading import load_model_and_tokenizer

    monkeypatch.setattr(ENVS, "_table", dict(ENVS._table))
    ENVS.register("retry_test", _RetryEnv)
    _, tok = load_model_and_tokenizer(str(tiny_dir))
    env = EnvEval("retry_test", {}, max_turns=3, max_trajectory_tokens=60)
    res = greedy_eval(_ScriptedEngine(tok), tok, multiply_task(), multiply_task().eval[:4], max_new_tokens=60, env=env)
    assert res["greedy_pass@1"] == 0.0 and res["correct_final"] == 1.0
    # a checkpoint re-eval reuses only an eval played the same way (never a single-turn score in a multi-turn curve)
    same = dict(max_new_tokens=60, digest=res["examples_digest"], precision=res["precision"])
    assert _same_settings(res, **same, env=env) and not _same_settings(res, **same, env=None)
    single = {k: v for k, v in res.items() if k not in ("env", "max_turns", "max_trajectory_tokens")}
    assert _same_settings(single, **same) and not _same_settings(single, **same, env=env)


def test_the_report_shows_a_transcript_with_the_environment_greyed():
    """A samples or eval row with a ``transcript``: the model's runs as written, the environment's greyed and
    labelled, escaped; the cut at max_chars counts every run; a row without one is the plain completion."""
    from rftlib.report.analysis import ENV_STYLE, completion_cell

    row = {"completion": "call<x>", "transcript": [{"who": "model", "text": "call <calc>12*3</calc>"},
                                                   {"who": "env", "text": "\n<|im_start|>tool\n36<|im_end|>\n"},
                                                   {"who": "model", "text": "The answer is 36"}]}
    html = completion_cell(row, 1000)
    assert "2 model turns" in html
    assert f'<span style="{ENV_STYLE}" title="environment tokens (mask 0: not in the loss)">\n&lt;|im_start|&gt;tool' \
           "\n36&lt;|im_end|&gt;\n</span>" in html
    assert '<span title="model tokens">call &lt;calc&gt;12*3&lt;/calc&gt;</span>' in html
    cut = completion_cell(row, 25)  # 22 model characters, 3 of the environment's 31, not the 16 after: 69 - 25 left
    assert "[44 more chars]" in cut and "The answer" not in cut
    assert completion_cell({"completion": "plain <b>"}, 100).count("plain &lt;b&gt;") == 1
