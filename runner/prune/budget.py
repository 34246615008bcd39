"""Pruning's time budget: a replay process stops replaying when its seconds are spent.

Pruning pays off only while it costs less than running the tests it might drop, and a
selection that waits on a long replay (a Triton kernel under the interpreter takes seconds)
keeps a developer waiting. So a replay request may carry a budget: seconds counted by the
replay process itself from when its start-up is done (a runner's clock need not agree with
the selection side's, and importing torch is no replay work). Before each
capture the process checks the time left; during one, an interval timer interrupts the call
when the time runs out.

On the developer's machine the budget is also a deadline for the whole selection (`until`,
a `time.monotonic()` value: one clock for every process of the machine), counted from the
selection's start: start-up, a zygote still starting, and each process's repository imports
count, since the developer waits for them too. A replay request carries it only when its
paths are local (a runner's pack never does).

A capture cut off or never started comes back as an error, and an error keeps every test
that needs it selected: the budget only ever keeps more tests.

The interruption is a BaseException, so replayed code that catches Exception does not see
it; and a call during which the timer fired is reported as cut off whatever it returned,
so code that swallows even that (a bare except) cannot turn the interruption into a result.

Plain standard library only: the replay process and `decide.py` both use it.
"""

from __future__ import annotations

import signal
import threading
import time
from typing import Callable, TypeVar

T = TypeVar("T")
OUT_OF_TIME = "not replayed: pruning's time budget ran out"
# Seconds a local selection needs after its last replay (the decisions, the store). 0.1 left
# the slowest selections of bench/selection.py 0.04-0.06 s past a 2 s budget; 0.25 left them
# up to 0.08 s past it in 3 of 10 runs on a loaded 2-core machine (processes that see the
# deadline late, then write, exit and are judged).
WRAP_UP = 0.35


class OutOfTime(BaseException):  # noqa: N818 (a signal, not an error of the replayed code)
    """Raised in the replayed call when the budget runs out."""


class Deadline:
    """The end of a replay process's budget; `None` seconds: no limit."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self.at = None if seconds is None else time.monotonic() + max(0.0, seconds)
        self.fired = False

    def spent(self) -> bool:
        return self.at is not None and time.monotonic() >= self.at

    def call(self, fn: Callable[..., T], *args: object) -> T | None:
        """`fn(*args)`, or None when the budget ran out before or during it. Off the main
        thread (where no timer can interrupt) the call runs to its end and is judged after."""
        self.fired = False
        if self.spent():
            return None
        if self.at is None:
            return fn(*args)
        if threading.current_thread() is not threading.main_thread():
            done = fn(*args)
            return None if self.spent() else done
        armed = [True]

        def expire(_signum, _frame):
            self.fired = True
            if armed:  # never once the call has returned: cleaning up is not interrupted
                raise OutOfTime

        previous = signal.signal(signal.SIGALRM, expire)
        value: T | None = None
        try:
            signal.setitimer(signal.ITIMER_REAL, max(self.at - time.monotonic(), 1e-3))
            try:
                value = fn(*args)
            finally:
                armed.clear()
        except OutOfTime:
            self.fired = True
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        return None if self.fired else value

    def result(self) -> dict:
        """What a capture cut off (or never started) reports."""
        return {"fingerprints": {}, "error": f"{OUT_OF_TIME} ({self.seconds:g} s)",
                "seconds": 0.0, "load_seconds": 0.0}


def cut_off(result: object) -> bool:
    """Did this replay result stop at the budget?"""
    return isinstance(result, dict) and str(result.get("error") or "").startswith(OUT_OF_TIME)
