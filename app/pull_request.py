"""The pull request's run: the job that selects, and the advances that move its run on.

The selection job checks out base and head, selects with the base's settings, posts "FastCI
selection", shards the blocking tests over the GPU queues (the background dimensions get a
run of their own, `background.py`), opens "FastCI regressions" and returns. When pruning
needs replays, it enqueues them on a runner instead and returns; the run waits in state
"replaying" and its advance plans again with the runner's validated answers, then shards.
Each shard's end advances the run: its result is validated and streamed into "FastCI
regressions", and the last one publishes (`publish.py`). A newer head cancels the run, a
shard whose worker died runs again, a run past its deadline ends as timed out.
"""

from __future__ import annotations

import logging
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from fastci.runner.engine import Engine
from fastci.runner.execution.shard import split

from . import artifacts, background, checks, github, publish, shards, workspace
from .context import Context, installation_token, superseded
from .events import Work
from .planning import (
    base_settings,
    change_notes,
    chosen_tests,
    evidence_key,
    plan_or_all,
    replayed_lines,
    replayed_reads,
)
from .queue import enqueue_advance
from .replays import QUEUE_ALLOWANCE, AnsweringReplayer, DeferredReplayer, budget
from .run_state import (
    PULL_REQUEST,
    REPLAYING,
    RUNNING,
    SELECTING,
    TIMED_OUT,
    Run,
    RunStore,
    run_id,
)
from .runs import RUN_DEADLINE, SELECTION_DEADLINE, unwatch, watch

log = logging.getLogger("fastci.app")


def run_pull_request(ctx: Context, work: Work, delivery: str = "") -> dict:
    """Start the pull request's run and return. Idempotent per delivery: a retried job (or
    a redelivery) finds the same run (its id comes from the delivery and the head) and
    reopens the same check runs (their external_id is the delivery), and one whose
    regressions run completed is done."""
    pr = github.retrying(lambda: ctx.repo.get_pull(work.number))
    head_repo = pr.head.repo.full_name if pr.head.repo is not None else None
    fork = head_repo is None or head_repo.lower() != work.repo.lower()
    head_sha, base_sha = work.head_sha or pr.head.sha, work.base_sha or pr.base.sha
    runs = github.CheckRuns(ctx.repo)
    if superseded(ctx, work, head_sha, pr):
        return {"status": "superseded", "head": head_sha}
    if fork and not ctx.redis.exists(ctx.approved_key(work.repo, head_sha)):
        runs.create(checks.SELECTION, head_sha, conclusion="action_required",
                    output=github.CheckRunOutput(
                        "Waiting for /fastci ok-to-test",
                        f"This pull request comes from a fork (`{head_repo}`). FastCI runs "
                        "tests on self-hosted GPU runners, so code from a fork runs only after "
                        "a maintainer with write access comments `/fastci ok-to-test` on this "
                        f"head commit (`{head_sha[:12]}`). The approval holds for this commit "
                        "only; a new push needs a new one."))
        return {"status": "action_required", "head": head_sha}
    key = (delivery or f"{work.mode}-{head_sha}")[:64]
    done = runs.find(checks.REGRESSIONS, head_sha, key)
    if done is not None and done.status == "completed":
        return {"status": "already completed", "head": head_sha}
    store = RunStore(ctx.redis, ctx.queues.prefix)
    work = replace(work, head_sha=head_sha, base_sha=base_sha)
    run = Run(run_id(work.repo.lower(), head_sha, key), PULL_REQUEST, SELECTING,
              work.to_json(), head_sha, key, time.time() + SELECTION_DEADLINE)
    token = store.acquire(run.id, SELECTION_DEADLINE)
    if token is None:  # another job selects (or advances) this run right now
        return {"status": "in flight", "head": head_sha, "run": run.id}
    try:
        found = store.load(run.id)
        if found is not None and found.state not in (SELECTING, TIMED_OUT):
            return {"status": found.outcome["status"] if found.outcome else "in flight",
                    "head": head_sha, "run": run.id}
        store.save(run)  # a run whose selection job was killed starts over
        _nudge_older_heads(ctx, store, run)
        outcome = _select(ctx, store, run, runs, work)
    finally:
        store.release(run.id, token)
    if store.take_dirty(run.id):  # a runner job ended while this job held the run
        enqueue_advance(ctx.redis, ctx.queues.prefix, run.id, "ended during selection")
    return outcome


def _select(ctx: Context, store: RunStore, run: Run, runs, work: Work) -> dict:
    selection_run = runs.open(checks.SELECTION, run.head, run.key, output=github.CheckRunOutput(
        "Selecting tests…", "FastCI is comparing this change with the recorded evidence."))
    run.data.update(selection_run=selection_run.id)
    watch(ctx, work, selection_run, SELECTION_DEADLINE)
    mirror = _mirror(ctx, work)
    with workspace.worktree(mirror, run.head) as tree, \
            tempfile.TemporaryDirectory(prefix="fastci-replays-") as staging:
        settings = base_settings(mirror, work.base_sha)
        # Pruning replays the change's own code, and this worker holds the App's key: the
        # replays run on a runner, in its sandbox, and this job does not wait for them.
        replayer = DeferredReplayer(Path(staging))
        engine = Engine(tree, ctx.settings.store_path, settings=settings, replayer=replayer)
        planned, store_problem = plan_or_all(engine, work.base_sha,
                                             prune=work.mode == "select")
        if replayer.asked:
            return _send_replays(ctx, store, run, runs, selection_run, replayer)
        return _start(ctx, store, run, runs, work, selection_run, engine, planned,
                      store_problem, mirror)


def _send_replays(ctx: Context, store: RunStore, run: Run, runs, selection_run,
                  replayer: DeferredReplayer) -> dict:
    """Pack what pruning's replays need, publish it behind a signed link, enqueue the
    replay job and leave the run "replaying"."""
    path = artifacts.directory(ctx.settings) / f"replays-{run.id}-{int(time.time())}.tar.gz"
    seconds = budget(len(replayer.steps))
    try:
        steps = replayer.pack(path)
        url = artifacts.publish(ctx.settings, path, seconds + QUEUE_ALLOWANCE)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    job = shards.enqueue(ctx, run, "replay", {"steps": steps, "pack_url": url},
                         ctx.queues.gpu(0).name, timeout=int(seconds),
                         description="pruning replays")
    items = sum(len(step) for step in replayer.steps)
    run.data.update(replay={"job": job, "digests": replayer.digests, "pack": url,
                            "deadline": time.time() + seconds + QUEUE_ALLOWANCE})
    # Past the replays' deadline the run goes on without them (their candidates stay
    # selected); past the run's, nothing advanced it at all.
    run.state, run.deadline = REPLAYING, run.data["replay"]["deadline"] + SELECTION_DEADLINE
    watch(ctx, Work.from_json(run.work), selection_run,
          seconds + QUEUE_ALLOWANCE + SELECTION_DEADLINE)
    runs.update(selection_run, output=github.CheckRunOutput(
        "Selecting tests… (replaying on a runner)",
        f"FastCI is replaying recorded calls under this change on a runner "
        f"({items} replay process(es)), to prune the tests whose computations it proves "
        "unchanged; the selection follows when they are done."))
    run.data["sent"] = runs.sent()
    store.save(run)
    return {"status": "replaying", "head": run.head, "run": run.id}


def _start(ctx: Context, store: RunStore, run: Run, runs, work: Work, selection_run,
           engine: Engine, planned, store_problem: str | None, mirror: Path,
           replayer: AnsweringReplayer | None = None) -> dict:
    """Post the selection, shard it, open the regressions check run; with no shard to run,
    publish at once."""
    if planned.pruning is not None and replayer is not None:
        planned.selection = replace(planned.selection, notes=(
            *planned.selection.notes, *replayer.notes(planned.pruning.kept)))
    selection = planned.selection
    chosen = chosen_tests(selection, work.mode, engine)
    settings = engine.settings
    shadow = settings.mode == "shadow" and work.mode == "select"
    if shadow:  # run everything, the selection first; audit what it would have missed
        chosen = [*selection.selected, *sorted(
            (d for d in selection.decisions if not d.selected), key=lambda d: -d.risk)]
    runs.update(selection_run, conclusion="success",
                output=checks.selection_output(selection, change_notes(planned),
                                                mode=work.mode))
    unwatch(ctx, selection_run)
    blocking = [d for d in chosen if settings.is_blocking(d.dimension) or d.new]
    later = [d for d in chosen if d not in blocking]
    known = sorted({*(planned.snapshot.tests if planned.snapshot else ()),
                    *(d.test_id for d in selection.decisions)})
    # Runners get the commit as a bundle of its own objects, never the mirror, the
    # store or a credential; they record into scratch and send the recording back.
    # The capture budget is the base's: the head's own config could raise it.
    request = {"sha": run.head, "capture_budget_mb": settings.capture_budget_mb}
    kept = {"known": known, "uncaptured": shards.uncaptured(engine, set(known))}
    ran = {d.test_id for d in chosen}
    run.data.update(
        selection=selection.to_json(), chosen=[d.test_id for d in chosen], shadow=shadow,
        store_problem=store_problem, evidence=evidence_key(planned),
        replayed_lines=replayed_lines(planned), replayed_reads=replayed_reads(planned),
        steps=[],
        saved_seconds=sum(d.expected_seconds for d in selection.decisions
                          if d.test_id not in ran),
        capture_budget_mb=settings.capture_budget_mb)
    store.put_request(run.id, kept)
    parts = split(blocking, ctx.settings.gpus)
    regressions = runs.open(checks.REGRESSIONS, run.head, run.key,
                            output=checks.regressions_output([], shards=len(parts),
                                                             shards_done=0, done=False))
    run.data["regressions_run"] = regressions.id
    watch(ctx, work, regressions, RUN_DEADLINE)
    if parts:
        _, url = shards.publish_bundle(ctx, mirror, run.head)  # discarded when the run ends
        run.data["bundle"] = url
        shards.enqueue_shards(ctx, run, parts, {**request, "bundle_url": url}, kept)
    if later:  # after the blocking shards: a runner free now takes those first
        background.start(ctx, run, later, request, kept, mirror)
    run.state, run.deadline = RUNNING, time.time() + RUN_DEADLINE
    run.data["sent"] = runs.sent()
    if not parts:  # nothing to run: publish now, from the plan in hand
        publish.publish(ctx, store, run, runs, engine=engine, planned=planned)
    store.save(run)
    return {"status": "running" if parts else run.outcome["status"], "head": run.head,
            "run": run.id, "selected": len(chosen), "shards": len(parts)}


# -- advancing the run ---------------------------------------------------------------------
def advance(ctx: Context, store: RunStore, run: Run) -> dict:
    """Move the run on from what changed since it was last looked at; an advance that finds
    nothing new touches nothing (no GitHub, no git)."""
    work = Work.from_json(run.work)
    over = shards.end_if_over(ctx, store, run)
    if over is not None:
        return over
    if run.state == REPLAYING:
        return _after_replays(ctx, store, run, work)
    ended = shards.collect_ended(ctx, store, run)
    if not ended:
        return {"status": run.state, "run": run.id, "pending": len(run.pending())}
    online = ctx.online(work)
    runs = github.CheckRuns(online.repo, run.data.get("sent"))
    results = shards.run_results(store, run)
    regressions = github.retrying(lambda: online.repo.get_check_run(run.data["regressions_run"]))
    total = len(run.current())
    if run.pending():
        runs.update(regressions, output=checks.regressions_output(
            results, shards=total, shards_done=total - len(run.pending()), done=False))
        run.data["sent"] = runs.sent()
    else:
        publish.publish(online, store, run, runs)
    store.save(run)
    return run.outcome or {"status": run.state, "run": run.id,
                           "pending": len(run.pending())}


def _after_replays(ctx: Context, store: RunStore, run: Run, work: Work) -> dict:
    """In state "replaying": once the replay job ended (or its time is up), plan again with
    its validated answers, then shard."""
    replay = run.data["replay"]
    job_id = replay["job"]
    kept = store.request(run.id)
    state, again = shards.observe(ctx, run, job_id, kept)
    if again is not None:
        replay["job"] = again
        store.save(run)
        return {"status": run.state, "run": run.id, "replays": "run again"}
    if state == "finished":
        raw = shards.fetch(job_id, ctx.redis).return_value()
    elif state in (*shards.ENDED, "gone"):
        raw = f"the replay job {state} on the runner"
    elif time.time() > replay["deadline"]:
        shards.cancel_pending(ctx, run)
        raw = "no runner finished the replays in time"
    else:
        return {"status": run.state, "run": run.id, "replays": state}
    run.jobs[job_id]["done"] = True
    artifacts.discard(ctx.settings, replay["pack"])
    online = ctx.online(work)
    runs = github.CheckRuns(online.repo, run.data.get("sent"))
    selection_run = github.retrying(lambda: online.repo.get_check_run(
        run.data["selection_run"]))
    mirror = _mirror(online, work)
    with workspace.worktree(mirror, run.head) as tree:
        replayer = AnsweringReplayer(raw, replay["digests"])
        engine = Engine(tree, ctx.settings.store_path,
                        settings=base_settings(mirror, work.base_sha), replayer=replayer)
        planned, store_problem = plan_or_all(engine, work.base_sha, prune=True)
        return _start(online, store, run, runs, work, selection_run, engine, planned,
                      store_problem, mirror, replayer)


def _nudge_older_heads(ctx: Context, store: RunStore, run: Run) -> None:
    """This head is current: the pull request's runs of other heads learn it now."""
    for other in store.of_pull_request(run.work["repo"], run.work["number"]):
        if other != run.id:
            enqueue_advance(ctx.redis, ctx.queues.prefix, other, "a newer head is selecting")


def _mirror(ctx: Context, work: Work) -> Path:
    return workspace.sync(ctx.settings.workspace, work.repo,
                          ctx.settings.clone_url.format(repo=work.repo),
                          [work.base_sha, work.head_sha], number=work.number,
                          token=installation_token(ctx, work))
