"""A pull request run's last step, taken by the advance that finds its last shard in: the
shards' recordings validated again and stored as the head's evidence (with the captures,
the coverage delta and, in shadow mode, the audit), then "FastCI regressions" concluded,
the GPU-seconds counted and the dashboard's summary written.

Each step is marked done in the run before the next begins, so an advance that dies midway
is followed by one that takes up the first step not done: the evidence is stored once and
the metrics and the summary are counted once (a step interrupted between its effect and
its mark runs again; only that one). The run's lock keeps two advances from doing it at
the same time (`run_state`).
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

from fastci.runner.analysis.inventory import Inventories
from fastci.runner.engine import Engine, audit_entry
from fastci.runner.git import WORKTREE
from fastci.runner.selection.report import RunReport
from fastci.runner.store import SqliteEvidenceStore, StoreError

from . import checks, github, ledger, markdown, metrics, shards, workspace
from .context import Context, installation_token
from .events import Work
from .planning import (
    base_settings,
    coverage_from_json,
    coverage_report,
    coverage_to_json,
    plan_to_store,
    selection_from_json,
)
from .run_state import COMPLETED, Run, RunStore
from .runs import unwatch

log = logging.getLogger("fastci.app")


def publish(ctx: Context, store: RunStore, run: Run, runs, engine: Engine | None = None,
            planned=None) -> None:
    """Conclude the run (see the module's docstring). `engine` and `planned`: the plan in
    hand when the selection job itself publishes (nothing to run); else the plan is made
    again, from the snapshot the selection used."""
    work = Work.from_json(run.work)
    data = run.data
    steps = data.setdefault("steps", [])
    summaries = store.results(run.id, run.current())
    ordered = [summaries[j] for j in run.current() if j in summaries]
    results = shards.results_of(ordered)
    selection = selection_from_json(data["selection"])
    if "evidence" not in steps:
        problem = data.get("store_problem")
        rejected = [s["rejected"] for s in ordered if s.get("rejected")]
        if rejected and problem is None:
            problem = "a shard's result failed validation (" + "; ".join(rejected)[:500] + ")"
        audit = audit_entry(RunReport(selection=selection, results=tuple(results)), run.head,
                            "shadow") if data.get("shadow") else None
        coverage = None
        if problem is None:
            try:
                coverage, problem = _store(ctx, run, summaries, results, audit, engine,
                                           planned)
            except StoreError as exc:
                problem = str(exc)
        data.update(store_problem=problem, coverage=coverage_to_json(coverage), audit=audit)
        steps.append("evidence")
        store.save(run)
    coverage, audit, problem = (coverage_from_json(data.get("coverage")), data.get("audit"),
                                data.get("store_problem"))
    total = len(run.current())
    final = checks.regressions_output(results, shards=total, shards_done=total, done=True,
                                      coverage=coverage)
    if audit is not None:
        missed = ", ".join(markdown.code(t) for t in audit["missed"][:10]) or "none"
        final.summary = (f"> **Shadow mode:** every test ran. The selection would have run "
                         f"{audit['selected']} of {audit['total']} and missed "
                         f"{len(audit['missed'])} failing test(s): {missed}.\n\n"
                         + final.summary)
    if problem:
        final.summary = (f"> Evidence was not stored: {problem}. The next change "
                         "runs everything; nothing is skipped on doubt.\n\n" + final.summary)
    regressions = github.retrying(lambda: ctx.repo.get_check_run(data["regressions_run"]))
    runs.update(regressions, output=final, conclusion=checks.conclusion(results),
                actions=checks.ACTIONS)
    unwatch(ctx, regressions)
    data["sent"] = runs.sent()
    if "metrics" not in steps:
        metrics.add_gpu_seconds(ctx.redis, ctx.settings.queue_prefix,
                                saved=data.get("saved_seconds", 0.0),
                                ran=sum(r.duration for r in results))
        steps.append("metrics")
        store.save(run)
    by_id = {d.test_id: d for d in selection.decisions}
    chosen = [by_id[t] for t in data["chosen"] if t in by_id]
    if "ledger" not in steps:
        for job_id in run.current():
            ctx.requests[job_id] = run.jobs[job_id]["request"]
            ctx.origins[job_id] = run.jobs[job_id]["queue"]
        selection_run = github.retrying(lambda: ctx.repo.get_check_run(data["selection_run"]))
        ledger.record_pull_request(ctx, work, run.head, selection, chosen, results, audit,
                                   [selection_run, regressions], bool(data.get("shadow")))
        steps.append("ledger")
    shards.discard_artifacts(ctx, run)
    run.state = COMPLETED
    run.outcome = {"status": "completed", "head": run.head, "selected": len(chosen),
                   "failed": sum(r.outcome in ("failed", "error") for r in results)}


def _store(ctx: Context, run: Run, summaries: dict, results, audit, engine: Engine | None,
           planned) -> tuple[object, str | None]:
    """Store the head's evidence; (the coverage report, None) or (None, why not)."""
    if engine is not None:
        return _store_with(ctx, run, summaries, results, audit, engine, planned)
    work = Work.from_json(run.work)
    mirror = workspace.ensure(ctx.settings.workspace, work.repo,
                              ctx.settings.clone_url.format(repo=work.repo),
                              [work.base_sha, run.head], number=work.number,
                              token=lambda: installation_token(ctx, work))
    with workspace.worktree(mirror, run.head) as tree:
        engine = Engine(tree, ctx.settings.store_path,
                        settings=base_settings(mirror, work.base_sha))
        return _store_with(ctx, run, summaries, results, audit, engine, None)


def _store_with(ctx: Context, run: Run, summaries: dict, results, audit, engine: Engine,
                planned) -> tuple[object, str | None]:
    data = run.data
    if planned is None:
        planned = plan_to_store(engine, run.work["base_sha"], data.get("evidence"),
                                data.get("replayed_lines", {}), data.get("replayed_reads"))
        if planned is None:
            return None, ("the evidence the selection used left the store, or was recorded "
                          "again, while the run ran")
    head_tree = planned.inputs.head_tree
    recordings, collected = [], []
    with tempfile.TemporaryDirectory(prefix="fastci-check-") as tmp, \
            SqliteEvidenceStore(Path(tmp) / "inventories.db") as scratch:
        # Results are checked again, against inventories parsed here from git's objects.
        check = shards.Check(run.head, head_tree, Inventories(engine.repo, WORKTREE, head_tree,
                                                              scratch))
        for job_id in run.current():
            digest = (summaries.get(job_id) or {}).get("digest")
            if digest is None:
                continue
            got = shards.recorded(ctx, job_id, run.jobs[job_id]["request"].get("tests", []),
                                  check, data.get("capture_budget_mb"), digest)
            if got is not None:
                recordings.append(got[0])
                collected += got[1]
        if check.rejected:
            return None, "a shard's result failed validation (" + "; ".join(
                check.rejected)[:500] + ")"
    with engine.open_store() as store:
        shards.save_captures(store, check.captures)
        engine.store_results(store, planned, recordings, collected,
                             flaky={r.test_id for r in results if r.flaky})
        coverage = coverage_report(engine, store, planned)
        if audit is not None:
            store.add_audit(audit)
    return coverage, None
