"""Risk scores and the run order: the test most likely to fail per expected second first,
so the first failure of a run arrives as early as it can."""

from __future__ import annotations

import pytest

from fastci.runner.selection.risk import (
    WEIGHTS,
    RiskFacts,
    expected_seconds,
    history_score,
    order,
    risk,
    typical_seconds,
)


def score(*, new=False, touched=0, changed=1, outcomes=(), cofailure=None, half_life=10.0):
    return risk(RiskFacts("t", new, touched, 1.0), outcomes, cofailure or {}, changed,
                half_life)


# -- failure history ---------------------------------------------------------------------------

def test_no_history_scores_zero_and_all_failures_score_one():
    assert history_score((), 10.0) == 0.0
    assert history_score(("passed", "passed"), 10.0) == 0.0
    assert history_score(("failed", "error", "failed"), 10.0) == pytest.approx(1.0)


def test_a_failure_half_life_runs_ago_weighs_half_of_a_new_one():
    # half_life=1: weights 1, 0.5 for the newest and the one before.
    assert history_score(("passed", "failed"), 1.0) == pytest.approx(0.5 / 1.5)
    assert history_score(("failed", "passed"), 1.0) == pytest.approx(1.0 / 1.5)


def test_recent_failures_weigh_more_than_old_ones():
    recent = ("failed",) + ("passed",) * 9
    old = ("passed",) * 9 + ("failed",)
    assert history_score(recent, 5.0) > history_score(old, 5.0) > 0.0


def test_a_longer_half_life_remembers_old_failures_longer():
    outcomes = ("passed",) * 5 + ("failed",)
    assert history_score(outcomes, 20.0) > history_score(outcomes, 2.0)


def test_skips_count_as_runs_that_did_not_fail():
    assert history_score(("skipped", "failed"), 1.0) == pytest.approx(0.5 / 1.5)


# -- the score ---------------------------------------------------------------------------------

def test_a_test_with_no_signal_has_the_base_risk():
    assert score() == pytest.approx(WEIGHTS["base"])


def test_each_signal_raises_the_risk():
    base = score()
    assert score(new=True) > base
    assert score(touched=1) > base
    assert score(outcomes=("failed",)) > base
    assert score(cofailure={"pkg/a.py": 0.5}) > base


def test_touching_more_of_the_change_is_riskier_and_saturates():
    assert score(touched=1, changed=4) < score(touched=2, changed=4) < score(touched=4, changed=4)
    assert score(touched=9, changed=4) == score(touched=4, changed=4)


def test_the_strongest_cofailure_rate_counts():
    assert score(cofailure={"a.py": 0.1, "b.py": 0.9}) == score(cofailure={"b.py": 0.9})


def test_signals_combine_without_exceeding_one():
    everything = score(new=True, touched=5, changed=5, outcomes=("failed",) * 3,
                       cofailure={"a.py": 1.0})
    assert max(score(new=True), score(touched=5, changed=5)) < everything < 1.0


def test_out_of_range_signals_are_clamped():
    assert score(cofailure={"a.py": 7.0}) == score(cofailure={"a.py": 1.0})
    assert score(cofailure={"a.py": -1.0}) == score()


# -- expected cost -----------------------------------------------------------------------------

def test_expected_seconds_prefer_history_then_evidence_then_the_fallback():
    assert expected_seconds("t", {"t": 3.0}, 1.0, 9.0) == 3.0
    assert expected_seconds("t", {}, 1.0, 9.0) == 1.0
    assert expected_seconds("t", {}, None, 9.0) == 9.0


def test_a_test_with_no_history_is_expected_to_cost_the_median_test():
    assert typical_seconds([1.0, 10.0, 2.0]) == 2.0
    assert typical_seconds([]) == 1.0


# -- order -------------------------------------------------------------------------------------

def test_order_is_by_risk_per_expected_second():
    items = [("slow_risky", 0.8, 100.0), ("fast_safe", 0.1, 0.1), ("mid", 0.5, 1.0)]
    # 0.008/s, 1.0/s and 0.5/s
    assert order(items) == ["fast_safe", "mid", "slow_risky"]


def test_at_equal_cost_the_riskier_test_runs_first():
    assert order([("a", 0.1, 1.0), ("b", 0.9, 1.0)]) == ["b", "a"]


def test_ties_are_broken_by_test_id():
    assert order([("b", 0.5, 1.0), ("a", 0.5, 1.0)]) == ["a", "b"]


def test_a_zero_second_test_does_not_divide_by_zero():
    assert order([("zero", 0.1, 0.0), ("one", 0.9, 1.0)]) == ["zero", "one"]


def test_a_new_test_outranks_an_old_one_of_the_same_cost():
    new = risk(RiskFacts("new", True, 0, 1.0), (), {}, 1, 10.0)
    old = risk(RiskFacts("old", False, 0, 1.0), (), {}, 1, 10.0)
    assert order([("old", old, 1.0), ("new", new, 1.0)]) == ["new", "old"]
