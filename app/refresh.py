"""The run for a push to the default branch: the whole suite recorded on a runner, stored as
the new evidence once validated, and the selection audited against what the full run found
(`fastci audit`). The job that starts it enqueues the recording and returns; the recording
job's end advances the run, which stores what it brought."""

from __future__ import annotations

import logging
import time

from fastci.runner.analysis.inventory import Inventories
from fastci.runner.engine import Engine, audit_entry
from fastci.runner.execution import validate
from fastci.runner.execution.carry import store_recording
from fastci.runner.execution.validate import InvalidResult
from fastci.runner.git import WORKTREE
from fastci.runner.selection.report import RunReport, TestResult
from fastci.runner.store import StoreError

from . import ledger, shards, workspace
from .context import Context, installation_token
from .events import Work
from .planning import base_settings, selection_from_json
from .queue import enqueue_advance
from .run_state import COMPLETED, REFRESH, RUNNING, SELECTING, TIMED_OUT, Run, RunStore, run_id
from .runs import RUN_DEADLINE

log = logging.getLogger("fastci.app")


def refresh(ctx: Context, work: Work, delivery: str = "") -> dict:
    """A push to the default branch: plan what FastCI would have selected for it (the
    audit's other half), and enqueue the recording of the whole suite on a GPU worker,
    which sends the recording back; returns at once."""
    sha = validate.check_sha(work.head_sha)
    store = RunStore(ctx.redis, ctx.queues.prefix)
    run = Run(run_id(work.repo.lower(), sha, delivery or "refresh"), REFRESH, SELECTING,
              work.to_json(), sha, delivery, time.time() + RUN_DEADLINE)
    token = store.acquire(run.id)
    if token is None:
        return {"status": "in flight", "run": run.id}
    try:
        found = store.load(run.id)
        if found is not None and found.state not in (SELECTING, TIMED_OUT):
            return found.outcome or {"status": "recording", "run": run.id}
        store.save(run)
        mirror = workspace.sync(ctx.settings.workspace, work.repo,
                                ctx.settings.clone_url.format(repo=work.repo), [sha],
                                token=installation_token(ctx, work))
        would = None
        with workspace.worktree(mirror, sha) as tree:
            engine = Engine(tree, ctx.settings.store_path, settings=base_settings(mirror, sha))
            try:  # the evidence of the nearest ancestor: the previous push
                would = engine.plan(base=None, head=WORKTREE, prune=False).selection
            except (StoreError, ValueError) as exc:
                log.warning("no selection to audit for %s: %s", sha[:12], exc)
        _, url = shards.publish_bundle(ctx, mirror, sha)  # discarded when the run ends
        request = {"sha": sha, "tests": [], "record_all": True, "bundle_url": url,
                   "capture_budget_mb": engine.settings.capture_budget_mb,
                   "uncaptured": shards.uncaptured(engine)}
        run.data.update(bundle=url, capture_budget_mb=request["capture_budget_mb"],
                        would=would.to_json() if would is not None and would.base else None)
        job = shards.enqueue(ctx, run, "shard", request, ctx.queues.gpu(0).name,
                             description=f"record {work.repo}@{sha[:12]}")
        run.state = RUNNING
        store.save(run)
    finally:
        store.release(run.id, token)
    if store.take_dirty(run.id):
        enqueue_advance(ctx.redis, ctx.queues.prefix, run.id, "ended while starting")
    return {"status": "recording", "run": run.id, "job": job}


def advance(ctx: Context, store: RunStore, run: Run) -> dict:
    """Once the recording job ended: validate it, store it, audit the selection."""
    kept = store.request(run.id)
    seen = {job_id: shards.observe(ctx, run, job_id, kept) for job_id in list(run.pending())}
    [job_id] = run.current()  # the job run again, if its worker died
    state = (seen[job_id][0] if job_id in seen
             else shards.observe(ctx, run, job_id, kept)[0])
    late = time.time() > run.deadline
    if state not in (*shards.ENDED, "gone") and not late:
        store.save(run)  # a job run again is noted
        return {"status": run.state, "run": run.id, "job": job_id}
    run.jobs[job_id]["done"] = True
    if late and state not in shards.ENDED:
        shards.cancel_pending(ctx, run)
        run.outcome, run.state = {"status": "recording timed out", "job": job_id,
                                  "audited": False}, TIMED_OUT
    elif state != "finished":
        run.outcome = {"status": f"recording {state}", "job": job_id, "audited": False}
    else:
        run.outcome = _store(ctx, run, job_id)
    shards.discard_artifacts(ctx, run)
    if run.state != TIMED_OUT:
        run.state = COMPLETED
    store.save(run)
    return run.outcome


def _store(ctx: Context, run: Run, job_id: str) -> dict:
    work = Work.from_json(run.work)
    sha = run.head
    online = ctx.online(work)
    mirror = workspace.ensure(ctx.settings.workspace, work.repo,
                              ctx.settings.clone_url.format(repo=work.repo), [sha],
                              token=lambda: installation_token(online, work))
    budget = run.data.get("capture_budget_mb")
    online.requests[job_id] = run.jobs[job_id]["request"]  # what the dashboard shows of it
    online.origins[job_id] = run.jobs[job_id]["queue"]
    with workspace.worktree(mirror, sha) as tree:
        engine = Engine(tree, ctx.settings.store_path, settings=base_settings(mirror, sha))
        head_tree = engine.repo.tree(sha)
        result = shards.fetch(job_id, ctx.redis).return_value()
        with engine.open_store() as store:
            try:
                recording, _, _, _, _ = validate.shard(
                    result, head_tree=head_tree,
                    inventories=Inventories(engine.repo, sha, head_tree, store), planned=None,
                    sha=sha, capture_budget_mb=budget)
                if recording is not None:
                    shards.save_captures(store, validate.captures(result, recording, budget))
            except InvalidResult as exc:
                log.warning("rejected the full run's result for %s: %s", sha[:12], exc)
                return {"status": f"recording rejected: {exc}", "job": job_id,
                        "audited": False}
            if recording is None:
                return {"status": "recorded nothing", "job": job_id, "audited": False}
            store_recording(store, engine.repo, recording)
            would = run.data.get("would")
            if would is None:
                ledger.record_full_run(online, work, sha, None, [job_id])
                return {"status": "recorded", "job": job_id, "audited": False}
            results = tuple(TestResult(t.test_id, t.outcome, t.duration, t.dimension)
                            for t in recording.tests.values())
            entry = audit_entry(RunReport(selection=selection_from_json(would),
                                          results=results), sha, "full")
            store.add_audit(entry)
    ledger.record_full_run(online, work, sha, entry, [job_id])
    return {"status": "recorded", "job": job_id, "audited": True, "missed": entry["missed"]}
