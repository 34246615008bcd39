"""A terminated child that is still alive while its parent waits gets SIGTERM again.

A recorded child catches SIGTERM in Python to write its evidence before it dies (child.py).
CPython runs a Python signal handler only between bytecodes: a SIGTERM that lands after the
child's last check and before it blocks in C (a pool worker entering `sem_wait` on its task
queue's lock) sets the handler's flag and then waits for the next signal, which never comes.
`Pool.terminate()` then joins that worker forever: a recording would hang a suite that runs
in seconds without it (each of three 300-pool recordings under load hung; coverage.py's
`sigterm` option and pytest-cov's `cleanup_on_sigterm` met the same race).

Any second signal interrupts the blocked call, and the interpreter then runs the flagged
handler. So, in every recorded process, `Process.join()` after `Process.terminate()` waits in
short steps and sends SIGTERM again after each step the child outlives: the caller waits as
long as it asked to, and the child ends as SIGTERM ends it, with its evidence written.
`subprocess.Popen.wait()` after `terminate()` does the same (a recorded `python -c` asleep in
`time.sleep(60)` would otherwise sleep on), but only for a child that wrote a recording's
start marker: another program's SIGTERM handler (a shell's trap) gets one signal, as it would
without FastCI.
"""

from __future__ import annotations

import subprocess
import time
from typing import Callable, Iterator

STEP_SECONDS = 0.5  # how long a terminated child may outlive its SIGTERM before another
_MARK = "_fastci_nudges"


def install(process_class) -> list[tuple[object, str, object]]:
    """Wrap `terminate` and `join` of multiprocessing's BaseProcess; return what to restore.

    Idempotent: a forked child inherits its parent's wrappers and keeps them."""
    def nudging(terminate, join):
        def join_nudging(self, timeout=None):
            if not getattr(self, "_fastci_terminated", False):
                return join(self, timeout)
            for step, last in _steps(timeout):
                join(self, step)
                if self.exitcode is not None or last:
                    return None
                terminate(self)  # the first SIGTERM may be flagged and unhandled: wake it

        return join_nudging

    return _wrap(process_class, "join", nudging)


def install_popen(popen_class, recorded: Callable[[int], bool]) -> list[tuple[object, str, object]]:
    """Wrap `terminate` and `wait` of subprocess.Popen; `recorded(pid)`: did that child start
    a recording (and so catch SIGTERM in Python)? Returns what to restore; idempotent."""
    def nudging(terminate, wait):
        def wait_nudging(self, timeout=None):
            if not getattr(self, "_fastci_terminated", False):
                return wait(self, timeout)
            for step, last in _steps(timeout):
                try:
                    return wait(self, step)
                except subprocess.TimeoutExpired:
                    if last:
                        raise subprocess.TimeoutExpired(self.args, timeout) from None
                if recorded(self.pid):
                    terminate(self)  # the first SIGTERM may be flagged and unhandled
            return None  # not reached: the last step returns or raises

        return wait_nudging

    return _wrap(popen_class, "wait", nudging)


def _steps(timeout: float | None) -> Iterator[tuple[float, bool]]:
    """The waits a nudging join makes: STEP_SECONDS each, the last one ending at `timeout`
    (none is last without one)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        if deadline is None:
            yield STEP_SECONDS, False
            continue
        left = max(0.0, deadline - time.monotonic())
        yield min(STEP_SECONDS, left), left <= STEP_SECONDS


def _wrap(cls, name: str, nudging) -> list[tuple[object, str, object]]:
    """Install `nudging(terminate, waiter)` as `cls.<name>`, and a `terminate` that marks the
    child for it; nothing if they are installed already. Returns what to restore."""
    waiter, terminate = getattr(cls, name), cls.terminate
    if getattr(waiter, _MARK, False):
        return []

    def terminate_then_watch(self):
        self._fastci_terminated = True
        return terminate(self)

    wrapped = nudging(terminate, waiter)
    for wrapper, original in ((terminate_then_watch, terminate), (wrapped, waiter)):
        wrapper.__name__, wrapper.__doc__ = original.__name__, original.__doc__
        setattr(wrapper, "__wrapped__", original)
        setattr(wrapper, _MARK, True)
    cls.terminate = terminate_then_watch
    setattr(cls, name, wrapped)
    return [(cls, "terminate", terminate), (cls, name, waiter)]
