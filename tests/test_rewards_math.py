"""Seed 003's exact-match math reward: extraction, normalisation, matching, diagnostics.

Every expected value is worked out by hand in the comment or the case next to it.
"""

from __future__ import annotations

import sys

import pytest

import rftlib.rewards.math as rm
from rftlib.rewards import (
    MathReward,
    answers_match,
    batch_math_reward,
    extract_answer,
    math_reward,
    normalize_answer,
    parse_gold,
)

# ---------------------------------------------------------------------------------------------
# normalisation: one case per rule


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("$42$", "42"),  # enclosing $...$
        ("$$42$$", "42"),  # enclosing $$...$$
        ("\\(42\\)", "42"),  # enclosing \(...\)
        ("\\[42\\]", "42"),  # enclosing \[...\]
        ("$5$ and $6$", "$5$and$6$"),  # two formulas are not one enclosing pair; only spaces go
        ("42.", "42"),  # trailing period
        ("$42$.", "42"),  # period outside the delimiters, then the delimiters
        ("\\text{42}", "42"),  # wrappers keep their content
        ("\\textbf{42}", "42"),
        ("\\mathrm{42}", "42"),
        ("\\mathbf{42}", "42"),
        ("\\text{\\mathbf{7}}", "7"),  # nested wrappers, innermost first
        ("5\\text{ cm}", "5cm"),  # content kept, then whitespace removed
        ("\\dfrac{1}{2}", "\\frac{1}{2}"),  # \dfrac -> \frac
        ("\\tfrac{3}{4}", "\\frac{3}{4}"),  # \tfrac -> \frac
        ("\\frac{1}{ 2 }", "\\frac{1}{2}"),  # whitespace removed
        ("x + 1", "x+1"),
        ("1,000", "1000"),  # thousands comma
        ("12,345,678", "12345678"),
        ("1,2", "1,2"),  # not grouped in threes: a pair, comma kept
        ("042", "42"),  # leading zeros
        ("-007", "-7"),
        ("00", "0"),
        ("0", "0"),  # a lone zero stays
        ("0.5", "0.5"),  # the zero before a decimal point stays
        ("100", "100"),  # inner zeros stay
        ("1.05", "1.05"),  # zeros after the decimal point stay
    ],
)
def test_normalize_answer_rules(raw, expected):
    assert normalize_answer(raw) == expected


def test_normalisation_is_applied_to_the_gold_too():
    # gold "$\text{1,000}$." -> drop \text{} -> "$1,000$." -> peel "." and "$" -> "1,000" -> "1000"
    r = math_reward("The total is \\boxed{1000}.", "$\\text{1,000}$.")
    assert r.correctness == 1.0 and r.pred == "1000"
    # and to the prediction: boxed "0042" -> "42" equals gold "42"
    assert math_reward("\\boxed{0042}", "42").correctness == 1.0


# ---------------------------------------------------------------------------------------------
# extraction


def test_boxed_with_nested_braces():
    assert extract_answer("so $\\boxed{\\frac{1}{\\sqrt{2}}}$.") == ("\\frac{1}{\\sqrt{2}}", 2)


def test_last_boxed_wins():
    assert extract_answer("first \\boxed{3}, on reflection \\boxed{5}.") == ("5", 2)


def test_boxed_spellings():
    assert extract_answer("\\boxed {7}") == ("7", 2)  # space before the brace
    assert extract_answer("\\fbox{8}") == ("8", 2)
    assert extract_answer("\\boxed{1} then \\fbox{9}") == ("9", 2)  # the last of either kind


def test_escaped_braces_do_not_nest():
    assert extract_answer("\\boxed{\\{1,2\\}}") == ("\\{1,2\\}", 2)
    # "\left\{" has no partner "\}": counting it would leave the box unbalanced
    assert extract_answer("\\boxed{\\left\\{ x \\right.}") == ("\\left\\{ x \\right.", 2)


def test_unbalanced_boxed_is_not_a_match():
    # the last \boxed{ never closes: the earlier, balanced one is used
    assert extract_answer("\\boxed{3} then \\boxed{5") == ("3", 2)
    # the only \boxed{ never closes: no boxed; the last number is "12"
    r = math_reward("so the answer is \\boxed{12", "12")
    assert (r.has_boxed, r.parse_method, r.correctness) == (0.0, 1.0, 1.0)


def test_blank_boxed_is_not_a_match():
    assert extract_answer("the value is 7 so \\boxed{ }") == ("7", 1)


def test_last_number_fallback():
    assert extract_answer("The answer is -5.") == ("-5", 1)  # negative
    assert extract_answer("we get 12, done") == ("12", 1)  # token "12," loses its trailing comma
    assert extract_answer("x = 3.25 and y = 2") == ("2", 1)  # the last number, not the first
    assert extract_answer("a total of 1,000 apples") == ("1,000", 1)
    r = math_reward("a total of 1,000 apples", "1000")
    assert (r.correctness, r.parse_method, r.pred) == (1.0, 1.0, "1000")


def test_empty_response_has_no_answer():
    r = math_reward("", "42")
    assert (r.reward, r.has_answer, r.has_boxed, r.parse_method, r.pred) == (0.0, 0.0, 0.0, 0.0, None)
    assert (r.boxed_in_final, r.truncated_response) == (0.0, 0.0)
    assert extract_answer("no digits here") == (None, 0)


# ---------------------------------------------------------------------------------------------
# Harmony (gpt-oss) responses


ANALYSIS = "<|channel|>analysis<|message|>Try \\boxed{3}? No, 4 works.<|end|>"


def test_harmony_final_channel_only():
    resp = ANALYSIS + "<|start|>assistant<|channel|>final<|message|>The answer is \\boxed{5}.<|return|>"
    assert extract_answer(resp) == ("5", 2)  # the analysis' \boxed{3} is ignored
    # text after the final message's <|return|> is not part of it
    assert extract_answer(resp + "junk 99") == ("5", 2)
    # a final message cut off before <|return|> runs to the end of the text
    assert extract_answer(ANALYSIS + "<|start|>assistant<|channel|>final<|message|>It is 9") == ("9", 1)


def test_harmony_without_final_channel_uses_last_message():
    resp = "<|channel|>analysis<|message|>we get 12<|end|><|start|>assistant<|channel|>commentary<|message|>then 13"
    assert extract_answer(resp) == ("13", 1)
    # content before the first token is a message too (the prompt opened it)
    assert extract_answer("thinking about 6<|end|>") == ("6", 1)


def test_harmony_empty_final_message_has_no_answer():
    resp = ANALYSIS + "<|start|>assistant<|channel|>final<|message|><|return|>"
    assert extract_answer(resp) == (None, 0)  # the final channel wins even empty; "4" is not read


# ---------------------------------------------------------------------------------------------
# matching


@pytest.mark.parametrize(
    "pred, gold, expected",
    [
        ("0.5", "\\frac{1}{2}", True),  # 0.5 == 1/2
        ("1/2", "0.5", True),
        ("\\frac{1}{2}", "1/2", True),
        ("\\dfrac12", "0.5", True),  # \frac12 shorthand
        ("-\\frac{3}{4}", "-0.75", True),
        ("0.5000001", "0.5", True),  # |diff| = 1e-7 <= 1e-6
        ("0.501", "0.5", False),  # |diff| = 1e-3 > 1e-6
        ("1/0", "1/0", True),  # equal strings; the numeric path (division by 0) is never reached
        ("1/0", "2/0", False),  # no value for either
        ("12345678901234567", "12345678901234568", False),  # ints compared exactly, not as floats
        ("x+1", "1+x", False),  # exact mode has no algebra
        ("", "", False),  # an empty answer never matches
    ],
)
def test_answers_match(pred, gold, expected):
    assert answers_match(pred, gold) is expected


def test_wrong_answer_scores_zero():
    r = math_reward("Therefore \\boxed{41}.", "42")
    assert (r.reward, r.correctness, r.has_answer, r.has_boxed, r.pred) == (0.0, 0.0, 1.0, 1.0, "41")


def test_reward_is_correctness_and_diagnostics_names():
    r = math_reward("Therefore \\boxed{42}.", "42")
    assert isinstance(r, MathReward) and r.reward == r.correctness == 1.0
    assert r.diagnostics() == {
        "correctness": 1.0,
        "has_answer": 1.0,
        "has_boxed": 1.0,
        "parse_method": 2.0,
        "boxed_in_final": 0.0,  # boxed starts at 10 of 23 characters, 10 < 0.8 * 23 = 18.4
        "truncated_response": 0.0,  # ends in "."
    }


# ---------------------------------------------------------------------------------------------
# boxed_in_final and truncation


def test_boxed_in_final():
    # 80 + 9 + 11 = 100 characters; the boxed starts at 80 >= 0.8 * 100
    assert math_reward("a" * 80 + "\\boxed{5}" + "b" * 11, "5").boxed_in_final == 1.0
    # 79 + 9 + 12 = 100 characters; starts at 79 < 80
    assert math_reward("a" * 79 + "\\boxed{5}" + "b" * 12, "5").boxed_in_final == 0.0
    assert math_reward("a" * 100 + " 5", "5").boxed_in_final == 0.0  # no boxed at all
    # positions are in the raw response: a short final message after a long analysis is "final"
    resp = (
        "<|channel|>analysis<|message|>" + "x" * 500 + "<|end|>"
        "<|start|>assistant<|channel|>final<|message|>\\boxed{5}<|return|>"
    )
    assert math_reward(resp, "5").boxed_in_final == 1.0


def test_truncated_heuristic():
    assert math_reward("The answer is \\boxed{5}.", "5").truncated_response == 0.0
    assert math_reward("so we compute 3 +", "5").truncated_response == 1.0  # ends on "+"
    assert math_reward("the answer is 42", "42").truncated_response == 1.0  # ends on a digit, no period
    assert math_reward("", "5").truncated_response == 0.0
    long_text = "Step. " * 2000  # 12,000 characters >= 8,000, ends in "." but has no boxed
    assert math_reward(long_text, "5").truncated_response == 1.0
    assert math_reward(long_text + "\\boxed{5}.", "5").truncated_response == 0.0
    assert math_reward("a." * 3999, "5").truncated_response == 0.0  # 7,998 characters: not long
    # Harmony: <|return|> is the model's own stop token; <|end|> is stripped before the check
    assert math_reward("<|channel|>final<|message|>we get<|return|>", "5").truncated_response == 0.0
    assert math_reward("<|channel|>analysis<|message|>we get<|end|>", "5").truncated_response == 1.0


def test_explicit_truncated_flag_overrides_heuristic():
    assert math_reward("The answer is \\boxed{5}.", "5", truncated=True).truncated_response == 1.0
    assert math_reward("so we compute 3 +", "5", truncated=False).truncated_response == 0.0


# ---------------------------------------------------------------------------------------------
# gold formats


def test_gsm8k_gold():
    gold = "She sold 1,000 + 234 = <<1000+234=1234>>1,234 clips.\n#### 1,234"
    assert parse_gold(gold) == "1234"  # after "####", commas stripped
    assert math_reward("\\boxed{1234}", gold).correctness == 1.0
    assert math_reward("In total 1,234 clips.", gold).correctness == 1.0  # last number "1,234" -> "1234"


def test_math_gold_with_boxed():
    gold = "Divide: $\\frac{6}{8} = \\boxed{\\dfrac{3}{4}}$."
    assert parse_gold(gold) == "\\dfrac{3}{4}"
    # "\frac34" and "\frac{3}{4}" differ as strings; both are 0.75
    assert math_reward("so \\boxed{\\frac34}", gold).correctness == 1.0
    assert parse_gold("  17 ") == "17"  # a plain answer


# ---------------------------------------------------------------------------------------------
# batch and modes


def test_batch_matches_single_calls():
    responses = ["\\boxed{1}", "it is 2", "no idea"]
    golds = ["1", "3", "4"]
    out = batch_math_reward(responses, golds, truncated=[False, True, False])
    assert [r.correctness for r in out] == [1.0, 0.0, 0.0]
    assert [r.parse_method for r in out] == [2.0, 1.0, 0.0]
    assert [r.truncated_response for r in out] == [0.0, 1.0, 0.0]
    assert batch_math_reward(responses, golds) == [math_reward(r, g) for r, g in zip(responses, golds)]
    with pytest.raises(ValueError, match="golds"):
        batch_math_reward(responses, golds[:2])
    with pytest.raises(ValueError, match="truncated"):
        batch_math_reward(responses, golds, truncated=[True])


def test_unknown_mode_lists_valid_ones():
    with pytest.raises(ValueError, match="exact, math_verify"):
        math_reward("\\boxed{1}", "1", mode="sympy")


def test_math_verify_missing_gives_clear_error(monkeypatch):
    monkeypatch.setattr(rm, "_math_verify_module", None)
    monkeypatch.setitem(sys.modules, "math_verify", None)  # makes "import math_verify" fail
    with pytest.raises(ImportError, match="pip install 'math-verify"):
        math_reward("\\boxed{1}", "1", mode="math_verify")


def test_math_verify_mode_adds_symbolic_equivalence():
    pytest.importorskip("math_verify", reason="math-verify not installed (pip install math-verify)")
    # 2*sqrt(2) == sqrt(8): no string or numeric rule sees it, sympy does
    assert math_reward("\\boxed{2\\sqrt{2}}", "\\sqrt{8}").correctness == 0.0
    assert math_reward("\\boxed{2\\sqrt{2}}", "\\sqrt{8}", mode="math_verify").correctness == 1.0
    assert math_reward("\\boxed{3}", "4", mode="math_verify").correctness == 0.0
    assert math_reward("\\boxed{0.5}", "\\frac{1}{2}", mode="math_verify").correctness == 1.0  # exact path


def test_task_reward_per_mode():
    # math_task_reward(mode) is what the math tasks hand the trainer; RunConfig.reward_mode picks the mode
    pytest.importorskip("math_verify", reason="math-verify not installed (pip install math-verify)")
    from types import SimpleNamespace

    from rftlib.rewards.math import math_em_reward, math_task_reward

    ex = SimpleNamespace(answer="\\sqrt{8}")  # any object with an answer: the reward does not import rftlib.data
    assert math_task_reward("exact") is math_em_reward
    assert math_task_reward("exact")("\\boxed{2\\sqrt{2}}", ex, False)[0] == 0.0
    reward, diag = math_task_reward("math_verify")("\\boxed{2\\sqrt{2}}", ex, False)
    assert reward == 1.0 and diag["correctness"] == 1.0
    with pytest.raises(ValueError, match="choose exact or math_verify"):
        math_task_reward("sympy")
