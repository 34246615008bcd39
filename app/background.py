"""The background dimensions' run (convergence, perf): their shards on the background queue,
published as their own, never-blocking check run, "FastCI background", which a run of its
own moves on as each shard ends, so it never delays the blocking verdict."""

from __future__ import annotations

import logging
import time

from fastci.runner.selection.report import Decision

from . import checks, github, shards
from .context import Context
from .events import Work
from .queue import enqueue_advance
from .run_state import BACKGROUND, COMPLETED, RUNNING, Run, RunStore, run_id
from .runs import RUN_DEADLINE, unwatch, watch

log = logging.getLogger("fastci.app")


def start(ctx: Context, parent: Run, decisions: list[Decision], request: dict, kept: dict,
          mirror) -> Run:
    """Open "FastCI background" and enqueue its shard for `parent`'s head, as a run of its
    own (held while its shard is enqueued, so an end that comes at once waits for nothing:
    it finds the run saved)."""
    store = RunStore(ctx.redis, ctx.queues.prefix)
    run = Run(run_id(parent.id, BACKGROUND), BACKGROUND, RUNNING, parent.work, parent.head,
              parent.key or f"bg-{parent.head}", time.time() + RUN_DEADLINE)
    token = store.acquire(run.id)
    if token is None:  # a retried selection job: the background run goes on by itself
        return run
    try:
        found = store.load(run.id)
        if found is not None:
            return found
        runs = github.CheckRuns(ctx.repo)
        check_run = runs.open(checks.BACKGROUND, run.head, run.key,
                              output=checks.regressions_output([], shards=1, shards_done=0,
                                                               done=False, blocking=False))
        watch(ctx, Work.from_json(run.work), check_run, RUN_DEADLINE)
        _, url = shards.publish_bundle(ctx, mirror, run.head)  # discarded when it ends
        run.data.update(check_run=check_run.id, bundle=url, sent=runs.sent())
        store.put_request(run.id, kept)
        shards.enqueue_shards(ctx, run, [decisions], {**request, "bundle_url": url}, kept,
                              background=True)
        store.save(run)
    finally:
        store.release(run.id, token)
    if store.take_dirty(run.id):
        enqueue_advance(ctx.redis, ctx.queues.prefix, run.id, "ended while starting")
    return run


def advance(ctx: Context, store: RunStore, run: Run) -> dict:
    """Stream the ended shards into "FastCI background"; conclude it when the last is in."""
    work = Work.from_json(run.work)
    over = shards.end_if_over(ctx, store, run)
    if over is not None:
        return over
    if not shards.collect_ended(ctx, store, run, blocking=False):
        return {"status": run.state, "run": run.id, "pending": len(run.pending())}
    online = ctx.online(work)
    runs = github.CheckRuns(online.repo, run.data.get("sent"))
    results = shards.run_results(store, run)
    check_run = github.retrying(lambda: online.repo.get_check_run(run.data["check_run"]))
    total, left = len(run.current()), len(run.pending())
    output = checks.regressions_output(results, shards=total, shards_done=total - left,
                                       done=not left, blocking=False)
    if left:
        runs.update(check_run, output=output)
    else:
        runs.update(check_run, output=output,
                    conclusion=checks.conclusion(results, blocking=False))
        unwatch(online, check_run)
        shards.discard_artifacts(online, run)
        run.state = COMPLETED
        run.outcome = {"status": "completed", "head": run.head, "ran": len(results)}
    run.data["sent"] = runs.sent()
    store.save(run)
    return run.outcome or {"status": run.state, "run": run.id, "pending": left}
