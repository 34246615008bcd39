"""Risk-aware order: run the tests most likely to fail per second of their cost first.

Risk combines independent signals with a noisy-OR, so any one strong signal makes a test
risky and weak ones add up without exceeding 1:
  - decayed failure history (a failure `half_life` runs ago weighs half; flaky results
    are kept out of the history by the store);
  - how much of the change the test touches;
  - co-failure history between the changed files and the test;
  - newness (no evidence yet).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Mapping, Sequence

WEIGHTS = {"base": 0.02, "history": 0.7, "touch": 0.5, "cofailure": 0.6, "new": 0.6}
MIN_SECONDS = 0.001


@dataclass(frozen=True)
class RiskFacts:
    test_id: str
    new: bool
    touched_units: int  # changed blocks, files and kernels in the test's evidence
    expected_seconds: float


def history_score(outcomes: Sequence[str], half_life: float) -> float:
    """Decayed share of failures among recent outcomes (newest first), in [0, 1]."""
    if not outcomes:
        return 0.0
    decay = 0.5 ** (1.0 / max(half_life, 0.1))
    weight = total = 0.0
    for age, outcome in enumerate(outcomes):
        w = decay ** age
        total += w
        if outcome in ("failed", "error"):
            weight += w
    return weight / total


def risk(facts: RiskFacts, outcomes: Sequence[str], cofailure: Mapping[str, float],
         changed_units: int, half_life: float) -> float:
    signals = {
        "base": 1.0,
        "history": history_score(outcomes, half_life),
        "touch": min(facts.touched_units / max(changed_units, 1), 1.0),
        "cofailure": max(cofailure.values(), default=0.0),
        "new": 1.0 if facts.new else 0.0,
    }
    safe = 1.0
    for name, value in signals.items():
        safe *= 1.0 - WEIGHTS[name] * min(max(value, 0.0), 1.0)
    return 1.0 - safe


def expected_seconds(test_id: str, durations: Mapping[str, float],
                     evidence_duration: float | None, fallback: float) -> float:
    if test_id in durations:
        return durations[test_id]
    if evidence_duration is not None:
        return evidence_duration
    return fallback


def typical_seconds(durations: Sequence[float]) -> float:
    """What a test with no history is expected to cost: the median known test."""
    return statistics.median(durations) if durations else 1.0


def order(items: list[tuple[str, float, float]]) -> list[str]:
    """Test ids by risk per expected second, highest first: (id, risk, seconds)."""
    return [test_id for test_id, r, s in
            sorted(items, key=lambda x: (-x[1] / max(x[2], MIN_SECONDS), x[0]))]
