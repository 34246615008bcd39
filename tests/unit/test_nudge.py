"""A terminated child that outlives its SIGTERM is signalled again while it is joined.

The race itself (a SIGTERM flagged just before the child blocks in C, its Python handler never
run) lands once in some hundreds of pools under load. These children play it out on purpose:
their handler lets the first SIGTERM pass, as a flagged-but-unhandled signal does, and dies on
the next, as the recorded child's handler does once a second signal wakes it.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

import pytest

from fastci.runner.record import nudge

FORK = multiprocessing.get_context("fork")


def _survive(first_n: int, ready, started_alone: float) -> None:
    """Let the first `first_n` SIGTERMs pass, die on the next; exit 0 after `started_alone`."""
    seen = 0

    def on_term(signum, frame):  # noqa: ARG001
        nonlocal seen
        seen += 1
        if seen > first_n:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_term)
    ready.set()
    deadline = time.monotonic() + started_alone
    while time.monotonic() < deadline:
        time.sleep(0.01)
    os._exit(0 if seen == 0 else 3)


def _process_class(nudged: bool):
    class Child(FORK.Process):  # type: ignore[name-defined,misc]
        pass

    if nudged:
        nudge.install(Child)
    return Child


def _start(cls, first_n: int, started_alone: float = 60.0):
    ready = FORK.Event()
    proc = cls(target=_survive, args=(first_n, ready, started_alone), daemon=True)
    proc.start()
    assert ready.wait(10), "the child did not start"
    return proc


@pytest.fixture
def reap():
    started: list = []
    yield started.append
    for proc in started:
        if proc.is_alive():
            proc.kill()
        proc.join(5)


def test_a_lost_sigterm_leaves_an_unnudged_join_waiting(reap):
    """The fault is real: without the nudge, the join outlives the child's first SIGTERM."""
    proc = _start(_process_class(nudged=False), first_n=1)
    reap(proc)
    proc.terminate()
    proc.join(1.5)
    assert proc.is_alive()


def test_a_join_after_terminate_signals_again_until_the_child_ends(reap):
    proc = _start(_process_class(nudged=True), first_n=2)
    reap(proc)
    began = time.monotonic()
    proc.terminate()
    proc.join()  # no timeout: without the nudge this waits for 60 s
    assert proc.exitcode == -signal.SIGTERM
    assert time.monotonic() - began < 3 * nudge.STEP_SECONDS + 2


def test_a_join_with_a_timeout_still_returns_at_its_timeout(reap):
    proc = _start(_process_class(nudged=True), first_n=1000)
    reap(proc)
    proc.terminate()
    began = time.monotonic()
    proc.join(1.2)
    waited = time.monotonic() - began
    assert proc.is_alive()
    assert 1.1 <= waited < 3.0


def test_a_join_without_terminate_sends_no_signal(reap):
    proc = _start(_process_class(nudged=True), first_n=1000, started_alone=1.5)
    reap(proc)
    proc.join()
    assert proc.exitcode == 0  # it saw no SIGTERM


def test_install_is_idempotent_so_a_forked_child_keeps_its_parents_wrappers():
    cls = _process_class(nudged=True)
    join = cls.join
    assert nudge.install(cls) == []
    assert cls.join is join
