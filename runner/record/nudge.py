"""A terminated child that is still alive while its parent waits gets SIGTERM again.

A recorded child catches SIGTERM in Python to write its evidence before it dies (child.py).
CPython runs a Python signal handler only between bytecodes: a SIGTERM that lands after the
child's last check and before it blocks in C (a pool worker entering `sem_wait` on its task
queue's lock) sets the handler's flag and then waits for the next signal, which never comes.
`Pool.terminate()` then joins that worker forever: a recording would hang a suite that runs
in seconds without it (seen once in about 200 pools under load; coverage.py's `sigterm`
option and pytest-cov's `cleanup_on_sigterm` met the same race).

Any second signal interrupts the blocked call, and the interpreter then runs the flagged
handler. So, in every recorded process, `Process.join()` after `Process.terminate()` waits in
short steps and sends SIGTERM again after each step the child outlives: the caller waits as
long as it asked to, and the child ends as SIGTERM ends it, with its evidence written.
"""

from __future__ import annotations

import time

STEP_SECONDS = 0.5  # how long a terminated child may outlive its SIGTERM before another
_MARK = "_fastci_nudges"


def install(process_class) -> list[tuple[object, str, object]]:
    """Wrap `terminate` and `join` of multiprocessing's BaseProcess; return what to restore.

    Idempotent: a forked child inherits its parent's wrappers and keeps them."""
    if getattr(process_class.join, _MARK, False):
        return []
    terminate, join = process_class.terminate, process_class.join

    def terminate_then_watch(self):
        self._fastci_terminated = True
        return terminate(self)

    def join_nudging(self, timeout=None):
        if not getattr(self, "_fastci_terminated", False):
            return join(self, timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            join(self, STEP_SECONDS if left is None else min(STEP_SECONDS, left))
            if self.exitcode is not None or left is not None and left <= STEP_SECONDS:
                return None
            terminate(self)  # the first SIGTERM may be flagged and unhandled: wake it

    for wrapper, original in ((terminate_then_watch, terminate), (join_nudging, join)):
        wrapper.__name__, wrapper.__doc__ = original.__name__, original.__doc__
        wrapper.__wrapped__ = original  # type: ignore[attr-defined]
        setattr(wrapper, _MARK, True)
    process_class.terminate, process_class.join = terminate_then_watch, join_nudging
    return [(process_class, "terminate", terminate), (process_class, "join", join)]
