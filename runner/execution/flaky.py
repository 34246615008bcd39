"""A failure is confirmed by one rerun: a test that passes the second time is flaky.

A flaky test is reported, never blocking, and kept out of the failure history (DESIGN.md).
These functions work on the recording as pytest hands it over (`recording_to_json`), so
the local `fastci run` and a runner's shard confirm failures the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from fastci.runner.record.recorder import Recording
from fastci.runner.selection.report import TestResult

FAILED = ("failed", "error")


def failed_ids(recording: Mapping | None) -> list[str]:
    """The tests of a recording that failed, in the order they ran."""
    return [t["test_id"] for t in (recording or {}).get("tests", ()) if t["outcome"] in FAILED]


def confirm(first: dict, again: Mapping | None) -> tuple[dict, dict[str, dict | None]]:
    """Merge a rerun of the failed tests into the first recording.

    Returns the recording with each flaky test's passing record in place of its failure, and
    the flaky tests with their first failure. A rerun that recorded nothing confirms every
    failure."""
    passed = {t["test_id"]: t for t in (again or {}).get("tests", ()) if t["outcome"] == "passed"}
    failed = set(failed_ids(first))
    flaky_ids = sorted(failed & set(passed))
    if not flaky_ids:
        return first, {}
    failures = dict(first.get("failures", {}))
    flaky = {t: failures.pop(t, None) for t in flaky_ids}
    merged = {**first, "failures": failures,
              "tests": [passed[t["test_id"]] if t["test_id"] in flaky else t
                        for t in first["tests"]]}
    if not failures and not (failed - set(flaky)):
        merged["first_failure_at"] = None
    return merged, flaky


def results(recording: Recording, failures: Mapping[str, dict], flaky: Mapping[str, dict | None],
            *, blocking: bool) -> list[TestResult]:
    """A recording as the report's results, in the order the tests ran.

    A flaky test counts as failed, with its first failure, marked flaky (never blocking)."""
    out = []
    for test_id in recording.order:
        t = recording.tests[test_id]
        if test_id in flaky:
            out.append(TestResult(test_id, "failed", t.duration, t.dimension, flaky[test_id],
                                  flaky=True, blocking=blocking))
        else:
            out.append(TestResult(test_id, t.outcome, t.duration, t.dimension,
                                  failures.get(test_id), blocking=blocking))
    return out


def not_run(test_ids: Iterable[str], message: str, *, when: str,
            blocking: bool) -> list[TestResult]:
    """Results for tests that could not run at all (their shard failed before recording)."""
    return [TestResult(t, "error", 0.0, failure={"path": None, "line": None, "when": when,
                                                  "message": message}, blocking=blocking)
            for t in test_ids]
