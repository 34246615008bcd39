"""The job for a push to the default branch: the whole suite recorded on a runner, stored
as the new evidence once validated, and the selection audited against what the full run
found (`fastci audit`)."""

from __future__ import annotations

import logging

from fastci.runner.analysis.inventory import Inventories
from fastci.runner.engine import Engine, audit_entry
from fastci.runner.execution import validate
from fastci.runner.execution.carry import store_recording
from fastci.runner.execution.validate import InvalidResult
from fastci.runner.git import WORKTREE
from fastci.runner.selection.report import RunReport, TestResult
from fastci.runner.store import StoreError

from . import ledger, workspace
from .context import Context, installation_token
from .events import Work
from .planning import base_settings
from .queue import SEEN_TTL, fetch
from .shards import SHARD_TIMEOUT, publish_bundle, save_captures, shard_id, wait_for

log = logging.getLogger("fastci.app")


def refresh(ctx: Context, work: Work) -> dict:
    """A push to the default branch: the full run. It records the whole suite there (on a
    GPU worker, which sends the recording back), stores what passes validation, and audits
    the selection: what FastCI would have selected for this push, against what the full run
    found (`fastci audit`)."""
    sha = validate.check_sha(work.head_sha)
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
        bundle, url = publish_bundle(ctx, mirror, sha)
        request = {"sha": sha, "tests": [], "record_all": True, "bundle_url": url,
                   "capture_budget_mb": engine.settings.capture_budget_mb}
        target = ctx.queues.gpu(0)
        try:
            job = target.enqueue("fastci.runner.execution.shard.run_shard", request,
                                 job_id=shard_id(ctx), job_timeout=SHARD_TIMEOUT,
                                 result_ttl=SEEN_TTL, failure_ttl=SEEN_TTL,
                                 description=f"record {work.repo}@{sha[:12]}")
            ctx.requests[job.id], ctx.origins[job.id] = request, target.name
            status, job_id = wait_for(ctx, job.id)
        finally:
            bundle.unlink(missing_ok=True)
        if status != "finished":
            return {"status": f"recording {status}", "job": job_id, "audited": False}
        head_tree = engine.repo.tree(sha)
        result = fetch(job_id, ctx.redis).return_value()
        with engine.open_store() as store:
            try:
                recording, _, _, _, _ = validate.shard(
                    result, head_tree=head_tree,
                    inventories=Inventories(engine.repo, sha, head_tree, store), planned=None,
                    sha=sha, capture_budget_mb=request["capture_budget_mb"])
                if recording is not None:
                    save_captures(store, validate.captures(result, recording,
                                                            request["capture_budget_mb"]))
            except InvalidResult as exc:
                log.warning("rejected the full run's result for %s: %s", sha[:12], exc)
                return {"status": f"recording rejected: {exc}", "job": job_id,
                        "audited": False}
            if recording is None:
                return {"status": "recorded nothing", "job": job_id, "audited": False}
            store_recording(store, engine.repo, recording)
            if would is None or would.base is None:
                ledger.record_full_run(ctx, work, sha, None, [job_id])
                return {"status": "recorded", "job": job_id, "audited": False}
            results = tuple(TestResult(t.test_id, t.outcome, t.duration, t.dimension)
                            for t in recording.tests.values())
            entry = audit_entry(RunReport(selection=would, results=results), sha, "full")
            store.add_audit(entry)
    ledger.record_full_run(ctx, work, sha, entry, [job_id])
    return {"status": "recorded", "job": job_id, "audited": True, "missed": entry["missed"]}
