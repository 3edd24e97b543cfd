"""rftlib.evalmath: pass@k and maj@k against hand-computed values; the eval-mode validator."""

from math import comb

import pytest

from rftlib.evalmath import (
    EVAL_MODES, check_eval_mode, maj_at_k, majority_answer, mean_over_problems, pass_at_k, pass_at_k_dataset,
)


def test_pass_at_k_hand_values():
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)  # c / n
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)  # 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert pass_at_k(5, 0, 3) == 0.0  # no correct sample
    assert pass_at_k(5, 3, 3) == 1.0  # n - c = 2 < k = 3: every 3-draw holds a correct one
    assert pass_at_k(8, 8, 8) == 1.0
    assert pass_at_k(1, 1, 1) == 1.0 and pass_at_k(1, 0, 1) == 0.0


@pytest.mark.parametrize("n, c, k", [(10, 3, 4), (20, 1, 5), (16, 7, 8), (200, 13, 100)])
def test_pass_at_k_matches_binomials(n, c, k):
    assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k), rel=1e-12)


def test_pass_at_k_stable_for_large_n():
    v = pass_at_k(10_000, 1, 1)  # C(10000, 1) fine, but C(10000, 5000) would overflow a float
    assert v == pytest.approx(1e-4)
    assert 0.0 < pass_at_k(10_000, 3, 5_000) <= 1.0


def test_pass_at_k_rejects_bad_counts():
    for n, c, k in [(5, 6, 1), (5, 2, 0), (5, 2, 6), (5, -1, 1)]:
        with pytest.raises(ValueError):
            pass_at_k(n, c, k)


def test_maj_at_k():
    assert maj_at_k(["42", "41", "42", "7"], "42") == 1.0
    assert maj_at_k(["$1,000$", "1000.", "12"], "1000") == 1.0  # normalised before voting
    assert maj_at_k(["41", "41", "42"], "42") == 0.0
    assert maj_at_k(["41", "41", "42", "42", "42"], "42", k=3) == 0.0  # only the first 3 vote
    # tie 2-2: the answer seen first wins, whatever the hash order
    assert majority_answer(["7", "42", "42", "7"]) == "7"
    assert majority_answer(["42", "7", "7", "42"]) == "42"
    assert majority_answer([None, "", "5"]) == "5"  # empty answers do not vote
    assert maj_at_k([None, None], "5") == 0.0


def test_means_over_problems():
    assert mean_over_problems([1.0, 0.0, 0.5]) == pytest.approx(0.5)
    # (n, c) per problem at k=2: 0.7, 0.0, 1.0 -> 0.5667
    assert pass_at_k_dataset([(5, 2), (5, 0), (5, 5)], k=2) == pytest.approx((0.7 + 0.0 + 1.0) / 3)
    with pytest.raises(ValueError):
        mean_over_problems([])


def test_eval_modes_table():
    assert (EVAL_MODES["greedy_pass@1"].temperature, EVAL_MODES["greedy_pass@1"].n) == (0.0, 1)
    assert EVAL_MODES["sampling_pass@k"].temperature == 0.6
    assert EVAL_MODES["nondet_proxy_pass@k"].temperature == 0.0


def test_check_eval_mode():
    assert check_eval_mode("greedy_pass@1", 0.0, 1) == "greedy_pass@1"
    assert check_eval_mode("sampling_pass@k", 0.6, 8) == "sampling_pass@8"
    assert check_eval_mode("sampling_pass@8", 0.6, 8) == "sampling_pass@8"
    assert check_eval_mode("nondet_proxy_pass@k", 0.0, 8) == "nondet_proxy_pass@8"
    with pytest.raises(ValueError, match="nondet_proxy"):
        check_eval_mode("sampling_pass@k", 0.0, 8)  # attempt-26's temp 0 / n 8, under a sampling name
    with pytest.raises(ValueError):
        check_eval_mode("greedy_pass@1", 0.0, 8)
    with pytest.raises(ValueError):
        check_eval_mode("greedy_pass@1", 0.6, 1)
    with pytest.raises(ValueError):
        check_eval_mode("nondet_proxy_pass@k", 0.6, 8)
    with pytest.raises(ValueError, match="k=4"):
        check_eval_mode("sampling_pass@4", 0.6, 8)
    with pytest.raises(ValueError, match="valid"):
        check_eval_mode("pass@1", 0.0, 1)
