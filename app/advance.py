"""The job that moves a run on: `advance(run id)`, on the advance queue.

Runner workers enqueue it when one of a run's jobs ends (after RQ stored how it ended), the
webhook when a newer head arrives, the watchdog every cycle for the runs in flight, a job
that started a run when something ended while it held it. Its one argument is a run id;
everything it acts on is re-read from this side's keys and RQ's record of the run's own
jobs, and every result is validated before use, so an advance that someone forged (for
another run, for a job not done, a thousand of them) changes nothing that would not have
changed anyway. It never waits: one that finds the run held by another marks it dirty and
returns, and the holder looks again (`run_state`).
"""

from __future__ import annotations

import logging
import time

from . import background, pull_request, refresh
from .context import Context
from .run_state import BACKGROUND, PULL_REQUEST, REFRESH, RUN_ID, SELECTING, TIMED_OUT, RunStore

log = logging.getLogger("fastci.app")
KINDS = {PULL_REQUEST: pull_request.advance, BACKGROUND: background.advance,
         REFRESH: refresh.advance}


def advance(run_id: str) -> dict:
    if not isinstance(run_id, str) or not RUN_ID.match(run_id):
        log.warning("advance refused: %r is not a run id", str(run_id)[:80])
        return {"status": "refused: not a run id"}
    ctx = Context.offline()
    store = RunStore(ctx.redis, ctx.queues.prefix)
    store.mark_dirty(run_id)
    outcome: dict = {"run": run_id, "status": "advanced by another job"}
    while True:
        token = store.acquire(run_id)
        if token is None:  # its holder sees the mark when it is done
            return outcome
        try:
            if store.take_dirty(run_id):
                outcome = step(ctx, store, run_id)
        finally:
            store.release(run_id, token)
        if not store.redis.exists(store.key(run_id, "dirty")):
            return outcome


def step(ctx: Context, store: RunStore, run_id: str) -> dict:
    """One look at the run, by its kind's rules."""
    run = store.load(run_id)
    if run is None:
        return {"run": run_id, "status": "no such run"}
    if run.state == SELECTING and time.time() > run.deadline:
        # Its selection job died: the watchdog concludes the check run it opened, and a
        # redelivery or `/fastci retest` starts the run over.
        run.state, run.outcome = TIMED_OUT, {"status": "selection timed out",
                                             "head": run.head}
        store.save(run)
    if run.terminal or run.state == SELECTING:  # ended, or its selection job still holds it
        return {"run": run_id, "status": run.state}
    return KINDS[run.kind](ctx, store, run)
