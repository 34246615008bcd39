"""The job for a pull request: check out base and head, select with the base's settings
(pruning's replays on a runner), publish "FastCI selection", shard the blocking tests
over the GPU queues, stream their results into "FastCI regressions", hand the background
dimensions to their own job, and store the head's evidence."""

from __future__ import annotations

import logging
import tempfile
from dataclasses import replace
from pathlib import Path

from fastci.runner.analysis.inventory import Inventories
from fastci.runner.engine import Engine, audit_entry
from fastci.runner.execution.shard import split
from fastci.runner.git import WORKTREE
from fastci.runner.selection.report import RunReport
from fastci.runner.store import SqliteEvidenceStore, StoreError

from . import checks, github, ledger, metrics, workspace
from .context import Context, installation_token, superseded
from .events import Work
from .planning import base_settings, change_notes, chosen_tests, coverage_report, plan_or_all
from .replays import RunnerReplayer
from .runs import RUN_DEADLINE, SELECTION_DEADLINE, unwatch, watch
from .shards import SHARD_TIMEOUT, Check, enqueue_shards, follow, publish_bundle, save_captures

log = logging.getLogger("fastci.app")


def run_pull_request(ctx: Context, work: Work, delivery: str = "") -> dict:
    """Idempotent per delivery: a retried job (or a redelivery) reopens the same check runs
    (their external_id is the delivery), and one whose regressions run completed is done."""
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
    selection_run = runs.open(checks.SELECTION, head_sha, key, output=github.CheckRunOutput(
        "Selecting tests…", "FastCI is comparing this change with the recorded evidence."))
    watch(ctx, work, selection_run, SELECTION_DEADLINE)
    token = installation_token(ctx, work)
    mirror = workspace.sync(ctx.settings.workspace, work.repo,
                            ctx.settings.clone_url.format(repo=work.repo), [base_sha, head_sha],
                            number=work.number, token=token)
    with workspace.worktree(mirror, head_sha) as tree:
        settings = base_settings(mirror, base_sha)
        # Pruning replays the change's own code, and this worker holds the App's key: the
        # replays run on a runner, in its sandbox, and only their checked JSON comes back.
        replayer = RunnerReplayer(ctx.queues, ctx.settings)
        engine = Engine(tree, ctx.settings.store_path, settings=settings, replayer=replayer)
        planned, store_problem = plan_or_all(engine, base_sha, prune=work.mode == "select")
        if planned.pruning is not None:
            planned.selection = replace(planned.selection, notes=(
                *planned.selection.notes, *replayer.notes(planned.pruning.kept)))
        selection = planned.selection
        chosen = chosen_tests(selection, work.mode, engine)
        shadow = settings.mode == "shadow" and work.mode == "select"
        if shadow:  # run everything, the selection first; audit what it would have missed
            chosen = [*selection.selected, *sorted(
                (d for d in selection.decisions if not d.selected), key=lambda d: -d.risk)]
        runs.update(selection_run, conclusion="success",
                    output=checks.selection_output(selection, change_notes(planned),
                                                    mode=work.mode))
        unwatch(ctx, selection_run)
        blocking = [d for d in chosen if settings.is_blocking(d.dimension) or d.new]
        background = [d for d in chosen if d not in blocking]
        known = sorted({*(planned.snapshot.tests if planned.snapshot else ()),
                        *(d.test_id for d in selection.decisions)})
        # Runners get the commit as a bundle of its own objects, never the mirror, the
        # store or a credential; they record into scratch and send the recording back.
        # The capture budget is the base's: the head's own config could raise it.
        request = {"sha": head_sha, "known": known,
                   "capture_budget_mb": settings.capture_budget_mb}
        if background:
            _, url = publish_bundle(ctx, mirror, head_sha)  # removed by follow_background
            ids = enqueue_shards(ctx, [background], {**request, "bundle_url": url},
                                  background=True)
            ctx.queues.cpu.enqueue("fastci.app.background.follow_background", work.to_json(),
                                   head_sha, ids, key,
                                   {i: ctx.requests[i] for i in ids},
                                   job_timeout=SHARD_TIMEOUT)
        regressions = runs.open(checks.REGRESSIONS, head_sha, key,
                                output=checks.regressions_output([], shards=0, shards_done=0,
                                                                 done=False))
        watch(ctx, work, regressions, RUN_DEADLINE)
        shards = split(blocking, ctx.settings.gpus)
        bundle, url = publish_bundle(ctx, mirror, head_sha)
        try:  # results are checked against inventories parsed here, from git's objects
            with tempfile.TemporaryDirectory(prefix="fastci-check-") as tmp, \
                    SqliteEvidenceStore(Path(tmp) / "inventories.db") as scratch:
                check = Check(head_sha, planned.inputs.head_tree, Inventories(
                    engine.repo, WORKTREE, planned.inputs.head_tree, scratch))
                ids = enqueue_shards(ctx, shards, {**request, "bundle_url": url})
                results, recordings, collected = follow(ctx, work, head_sha, ids, runs,
                                                         regressions, check=check)
        finally:
            bundle.unlink(missing_ok=True)
        if results is None:
            return {"status": "superseded", "head": head_sha}
        if check.rejected and store_problem is None:
            store_problem = "a shard's result failed validation (" + "; ".join(
                check.rejected)[:500] + ")"
        coverage = audit = None
        if shadow:
            audit = audit_entry(RunReport(selection=selection, results=tuple(results)),
                                head_sha, "shadow")
        if store_problem is None:
            try:
                with engine.open_store() as store:
                    save_captures(store, check.captures)
                    engine.store_results(store, planned, recordings, collected,
                                         flaky={r.test_id for r in results if r.flaky})
                    coverage = coverage_report(engine, store, planned)
                    if audit is not None:
                        store.add_audit(audit)
            except StoreError as exc:
                store_problem = str(exc)
        final = checks.regressions_output(results, shards=len(ids), shards_done=len(ids),
                                          done=True, coverage=coverage)
        if audit is not None:
            missed = ", ".join(f"`{t}`" for t in audit["missed"][:10]) or "none"
            final.summary = (f"> **Shadow mode:** every test ran. The selection would have run "
                             f"{audit['selected']} of {audit['total']} and missed "
                             f"{len(audit['missed'])} failing test(s): {missed}.\n\n"
                             + final.summary)
        if store_problem:
            final.summary = (f"> Evidence was not stored: {store_problem}. The next change "
                             "runs everything; nothing is skipped on doubt.\n\n" + final.summary)
        runs.update(regressions, output=final, conclusion=checks.conclusion(results),
                    actions=checks.ACTIONS)
        unwatch(ctx, regressions)
        ran = {d.test_id for d in chosen}
        metrics.add_gpu_seconds(ctx.redis, ctx.settings.queue_prefix, saved=sum(
            d.expected_seconds for d in selection.decisions if d.test_id not in ran),
            ran=sum(r.duration for r in results))
        ledger.record_pull_request(ctx, work, head_sha, selection, chosen, results, audit,
                                   [selection_run, regressions], shadow)
    return {"status": "completed", "head": head_sha, "selected": len(chosen),
            "failed": sum(r.outcome in ("failed", "error") for r in results)}
