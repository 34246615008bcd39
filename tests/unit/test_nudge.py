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
import subprocess
import sys
import time

import pytest

from fastci.runner.record import nudge

FORK = multiprocessing.get_context("fork")


def _let_pass(first_n: int) -> list[int]:
    """Let the first `first_n` SIGTERMs pass (as a flagged, unhandled one does), die on the
    next (as the recorded child's handler does once a second signal wakes it). Returns the
    count of SIGTERMs seen, as a one-item list."""
    seen = [0]

    def on_term(signum, frame):  # noqa: ARG001
        seen[0] += 1
        if seen[0] > first_n:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_term)
    return seen


def _survive(first_n: int, ready, started_alone: float) -> None:
    """A fork child: let SIGTERMs pass as above; exit 0 after `started_alone` if none came."""
    seen = _let_pass(first_n)
    ready.set()
    deadline = time.monotonic() + started_alone
    while time.monotonic() < deadline:
        time.sleep(0.01)
    os._exit(0 if seen[0] == 0 else 3)


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
    popen = _popen_class(lambda pid: True)
    wait = popen.wait
    assert nudge.install_popen(popen, lambda pid: True) == []
    assert popen.wait is wait


# -- subprocess.Popen: the same, for a child that started a recording ---------------------
SURVIVOR = (f"import sys, time; sys.path.insert(0, {os.path.dirname(__file__)!r}); "
            "from test_nudge import _let_pass; _let_pass(int(sys.argv[1])); "
            "print('ready', flush=True); time.sleep(60)")


def _popen_class(recorded):
    class Child(subprocess.Popen):
        pass

    nudge.install_popen(Child, recorded)
    return Child


@pytest.fixture
def popen():
    started: list[subprocess.Popen] = []

    def start(cls, first_n: int) -> subprocess.Popen:
        proc = cls([sys.executable, "-c", SURVIVOR, str(first_n)], stdout=subprocess.PIPE,
                   text=True)
        started.append(proc)
        assert proc.stdout.readline().strip() == "ready"
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(5)
        proc.stdout.close()


def test_a_recorded_subprocess_is_signalled_again_while_it_is_waited_for(popen):
    proc = popen(_popen_class(lambda pid: True), first_n=2)
    proc.terminate()
    assert proc.wait(30) == -signal.SIGTERM  # without the nudge: TimeoutExpired after 30 s


def test_another_programs_handler_gets_one_sigterm_as_without_fastci(popen):
    proc = popen(_popen_class(lambda pid: False), first_n=1)
    proc.terminate()
    with pytest.raises(subprocess.TimeoutExpired) as waited:
        proc.wait(1.2)
    assert waited.value.timeout == 1.2  # the caller's timeout, not a step's
    assert proc.poll() is None


def test_started_in_finds_a_recordings_start_marker(tmp_path):
    from fastci.runner.record.child import started_in

    (tmp_path / "0123abcd").mkdir()
    (tmp_path / "0123abcd" / "4242-00ff.start").write_text("{}")
    (tmp_path / "0123abcd" / "4243-00ff.json").write_text("{}")
    assert started_in(str(tmp_path), 4242)
    assert not started_in(str(tmp_path), 4243) and not started_in(str(tmp_path), 424)
    assert not started_in(str(tmp_path / "missing"), 4242)
