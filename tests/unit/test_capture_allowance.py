"""A test's capture allowance: its own share of its last duration, plus what earlier tests
left unspent of theirs, up to BORROW times its own. The session's captures never take more
than the tests' allowances sum to."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from fastci.runner.record import capture as capture_module
from fastci.runner.record.capture import BORROW, ModuleCapture


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(capture_module.time, "perf_counter", clock)
    return clock


@pytest.fixture
def capture(tmp_path) -> ModuleCapture:
    return ModuleCapture(SimpleNamespace(root=str(tmp_path), environ={}), spill=tmp_path)


def run(capture: ModuleCapture, clock: Clock, test: str, spends: list[float]) -> int:
    """Run `test`, capturing a call of each duration in `spends` while its allowance lasts;
    how many were captured."""
    capture.begin_test(test)
    captured = 0
    for seconds in spends:
        if capture._spent_all(test):
            break
        with capture._timed():
            clock.now += seconds
        captured += 1
    capture.end_test()
    return captured


def test_a_test_spends_its_own_allowance_first(capture, clock):
    capture.allowance = {"a": 0.01}
    assert run(capture, clock, "a", [0.004] * 10) == 3  # 4, 8, 12 ms: the third overruns
    assert "capture_share" in capture.stopped["a"] and "unspent" not in capture.stopped["a"]
    assert capture.saved == 0.0


def test_what_a_test_leaves_unspent_a_later_test_may_borrow(capture, clock):
    capture.allowance = {"long": 1.0, "short": 0.01}
    assert run(capture, clock, "long", [0.1]) == 1  # 0.9 s left unspent
    assert capture.saved == pytest.approx(0.9)
    # Ten times its own 10 ms at most: 110 ms in all, so 9 calls of 12 ms and one over.
    assert run(capture, clock, "short", [0.012] * 20) == 10
    assert "left unspent by earlier tests" in capture.stopped["short"]
    assert capture.saved == pytest.approx(0.9 + 0.01 - 0.12)  # the overrun is paid back too


def test_borrowing_is_bounded_by_the_savings(capture, clock):
    capture.allowance = {"a": 0.02, "b": 0.01}
    run(capture, clock, "a", [0.015])  # 5 ms saved
    assert run(capture, clock, "b", [0.005] * 10) == 3  # 15 ms granted: 5, 10, 15
    assert capture.saved == 0.0


def test_the_session_never_spends_more_than_the_allowances_sum_to(capture, clock):
    """Whatever the order, spending stays within the sum, but for each test's last overrun."""
    capture.allowance = {f"t{i}": 0.01 * (1 + i % 3) for i in range(30)}
    spent = 0.0
    for i, test in enumerate(capture.allowance):
        before = clock.now
        run(capture, clock, test, [0.003 * (1 + i % 4)] * (2 + i % 7))
        spent += clock.now - before
    overruns = 30 * 0.012
    assert spent <= sum(capture.allowance.values()) + overruns


def test_tests_without_a_duration_on_record_neither_borrow_nor_save(capture, clock):
    capture.allowance = {"a": 1.0}
    run(capture, clock, "a", [0.5])
    saved = capture.saved
    assert run(capture, clock, "new", [0.2] * 10) == 10  # no limit, and nothing borrowed
    assert capture.saved == saved
    capture.uncaptured = {"fast": "under capture_min_seconds"}
    capture.begin_test("fast")
    assert math.isinf(capture._granted) and capture.child_request("fast") is None
    capture.end_test()
    assert capture.saved == saved


def test_a_child_process_is_granted_what_its_test_was(capture, clock, monkeypatch):
    import json

    from fastci.runner.record import child_capture

    monkeypatch.setattr(child_capture, "digests", lambda environ: {})
    capture.allowance = {"long": 1.0, "short": 0.01}
    run(capture, clock, "long", [0.5])
    capture.begin_test("short")
    granted = json.loads(capture.child_request("short"))["allowance"]  # type: ignore[arg-type]
    assert granted == pytest.approx(0.01 + BORROW * 0.01)
    capture.end_test()
