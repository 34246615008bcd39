"""The RQ jobs that talk to GitHub: select, publish, shard, stream results, store evidence.

`handle` is the one entry point the webhook enqueues (on the CPU queue). A pull request's job
checks out base and head into the workspace, selects with the settings of the trusted base,
posts "FastCI selection", shards the blocking tests over the GPU queues by expected duration
(`fastci.runner.execution.shard`, which knows nothing of GitHub), streams their results into "FastCI
regressions" as shards finish, hands the background dimensions to the low-priority queue
with their own job publishing "FastCI background", and stores fresh evidence for the head.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import tempfile
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path

from redis import Redis
from redis.exceptions import RedisError
from rq.exceptions import InvalidJobOperation
from rq.job import Job

from fastci.runner import config as runner_config
from fastci.runner.analysis.inventory import Inventories
from fastci.runner.engine import Engine, audit_entry
from fastci.runner.execution import validate
from fastci.runner.execution.carry import store_recording
from fastci.runner.execution.coverage_delta import changed_lines, executed, report, statement_lines
from fastci.runner.execution.flaky import not_run
from fastci.runner.execution.flaky import results as test_results
from fastci.runner.execution.shard import split
from fastci.runner.execution.validate import InvalidResult
from fastci.runner.git import WORKTREE
from fastci.runner.selection.report import Decision, RunReport, TestResult
from fastci.runner.store import EvidenceStore, SqliteEvidenceStore, StoreError

from . import artifacts, checks, github, metrics, workspace
from .events import RERUN_FAILED, RUN_ALL, Work
from .queue import SEEN_TTL, Queues, fetch, queue
from .replays import RunnerReplayer
from .settings import AppSettings, load

log = logging.getLogger("fastci.app")
POLL = 0.5
SHARD_TIMEOUT = 6 * 3600


@dataclass
class Context:
    settings: AppSettings
    redis: Redis
    queues: Queues
    gh: object  # github.Github for the installation
    repo: object  # github.Repository
    requests: dict = field(default_factory=dict)
    """job id -> the shard request this side enqueued: what a result is checked against
    (never the job's arguments as Redis holds them, which a runner could rewrite)."""
    origins: dict = field(default_factory=dict)  # job id -> the queue it was put on

    @classmethod
    def create(cls, work: Work, settings: AppSettings | None = None) -> "Context":
        settings = settings or load()
        redis = Redis.from_url(settings.redis_url)
        gi = github.integration(settings)
        gh = github.for_installation(gi, work.installation_id)
        repo = github.retrying(lambda: gh.get_repo(work.repo))
        ctx = cls(settings, redis, Queues(redis, settings.queue_prefix, settings.gpus), gh, repo)
        ctx._gi = gi
        return ctx

    def token(self, installation_id: int) -> str:
        return self._gi.get_access_token(installation_id).token

    def approved_key(self, repo: str, sha: str) -> str:
        return self.queues.key("ok-to-test", repo.lower(), sha)


def handle(work_json: dict, delivery: str) -> dict:
    """The job for one delivery."""
    work = Work.from_json(work_json)
    if work.kind == "installation":
        return {"installation": work.installation_id, "action": work.mode,
                "repos": list(work.repos)}
    ctx = Context.create(work)
    if work.kind == "pull_request":
        return run_pull_request(ctx, work, delivery)
    if work.kind == "refresh":
        return refresh(ctx, work)
    if work.kind == "command":
        from .commands import handle_command  # noqa: PLC0415

        return handle_command(ctx, work)
    raise ValueError(f"unknown work kind {work.kind!r}")


# -- pull requests ----------------------------------------------------------------------------
def run_pull_request(ctx: Context, work: Work, delivery: str = "") -> dict:
    """Idempotent per delivery: a retried job (or a redelivery) reopens the same check runs
    (their external_id is the delivery), and one whose regressions run completed is done."""
    pr = github.retrying(lambda: ctx.repo.get_pull(work.number))
    head_repo = pr.head.repo.full_name if pr.head.repo is not None else None
    fork = head_repo is None or head_repo.lower() != work.repo.lower()
    head_sha, base_sha = work.head_sha or pr.head.sha, work.base_sha or pr.base.sha
    runs = github.CheckRuns(ctx.repo)
    if _superseded(ctx, work, head_sha):
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
    token = _token(ctx, work)
    mirror = workspace.sync(ctx.settings.workspace, work.repo,
                            ctx.settings.clone_url.format(repo=work.repo), [base_sha, head_sha],
                            number=work.number, token=token)
    with workspace.worktree(mirror, head_sha) as tree:
        settings = _base_settings(mirror, base_sha)
        # Pruning replays the change's own code, and this worker holds the App's key: the
        # replays run on a runner, in its sandbox, and only their checked JSON comes back.
        replayer = RunnerReplayer(ctx.queues, ctx.settings)
        engine = Engine(tree, ctx.settings.store_path, settings=settings, replayer=replayer)
        planned, store_problem = _plan(engine, base_sha, prune=work.mode == "select")
        if planned.pruning is not None:
            planned.selection = replace(planned.selection, notes=(
                *planned.selection.notes, *replayer.notes(planned.pruning.kept)))
        selection = planned.selection
        chosen = _chosen(selection, work.mode, engine)
        shadow = settings.mode == "shadow" and work.mode == "select"
        if shadow:  # run everything, the selection first; audit what it would have missed
            chosen = [*selection.selected, *sorted(
                (d for d in selection.decisions if not d.selected), key=lambda d: -d.risk)]
        runs.update(selection_run, conclusion="success",
                    output=checks.selection_output(selection, _change_notes(planned),
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
            _, url = _bundle(ctx, mirror, head_sha)  # removed by follow_background
            ids = _enqueue_shards(ctx, [background], {**request, "bundle_url": url},
                                  background=True)
            ctx.queues.cpu.enqueue("fastci.app.jobs.follow_background", work.to_json(),
                                   head_sha, ids, key,
                                   {i: ctx.requests[i] for i in ids},
                                   job_timeout=SHARD_TIMEOUT)
        regressions = runs.open(checks.REGRESSIONS, head_sha, key,
                                output=checks.regressions_output([], shards=0, shards_done=0,
                                                                 done=False))
        watch(ctx, work, regressions, RUN_DEADLINE)
        shards = split(blocking, ctx.settings.gpus)
        bundle, url = _bundle(ctx, mirror, head_sha)
        try:  # results are checked against inventories parsed here, from git's objects
            with tempfile.TemporaryDirectory(prefix="fastci-check-") as tmp, \
                    SqliteEvidenceStore(Path(tmp) / "inventories.db") as scratch:
                check = Check(head_sha, planned.inputs.head_tree, Inventories(
                    engine.repo, WORKTREE, planned.inputs.head_tree, scratch))
                ids = _enqueue_shards(ctx, shards, {**request, "bundle_url": url})
                results, recordings, collected = _follow(ctx, work, head_sha, ids, runs,
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
                    engine.store_results(store, planned, recordings, collected,
                                         flaky={r.test_id for r in results if r.flaky})
                    coverage = _coverage(engine, store, planned)
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
    return {"status": "completed", "head": head_sha, "selected": len(chosen),
            "failed": sum(r.outcome in ("failed", "error") for r in results)}


def _plan(engine: Engine, base_sha: str, prune: bool):
    """The plan, or, when the evidence store cannot be read, every test with the reason."""
    try:
        return engine.plan(base=base_sha, head=WORKTREE, prune=prune), None
    except StoreError as exc:
        problem = str(exc)
    with tempfile.TemporaryDirectory(prefix="fastci-nostore-") as tmp:
        planned = engine.plan(base=base_sha, head=WORKTREE,
                              store=SqliteEvidenceStore(Path(tmp) / "empty.db"))
    reason = f"the evidence store could not be read ({problem}): every test runs"
    planned.selection = replace(planned.selection, select_all_reason=reason)
    return planned, problem


# -- the watchdog's list: runs that must end by a deadline --------------------------------------
SELECTION_DEADLINE = 30 * 60
RUN_DEADLINE = 8 * 3600


def watch(ctx: Context, work: Work, run, seconds: float) -> None:
    entry = json.dumps({"repo": work.repo, "installation": work.installation_id,
                        "id": run.id, "name": run.name})
    ctx.redis.zadd(ctx.queues.key("open-runs"), {entry: time.time() + seconds})


def unwatch(ctx: Context, run) -> None:
    key = ctx.queues.key("open-runs")
    for entry in ctx.redis.zrange(key, 0, -1):
        if json.loads(entry)["id"] == run.id:
            ctx.redis.zrem(key, entry)


def _token(ctx: Context, work: Work) -> str | None:
    if ctx.settings.clone_url.startswith(("file://", "/")):
        return None  # a local path (tests, demo) needs no credentials
    return ctx.token(work.installation_id)


def _superseded(ctx: Context, work: Work, head_sha: str) -> bool:
    if work.number is None:
        return False
    current = ctx.queues.current_head(work.repo, work.number)
    return current is not None and current != head_sha


def _base_settings(mirror: Path, base_sha: str) -> runner_config.Settings:
    """[tool.fastci] as the base commit has it: a pull request cannot loosen its own gate."""
    text = workspace.read_at(mirror, base_sha, "pyproject.toml")
    with tempfile.TemporaryDirectory() as tmp:
        if text is not None:
            (Path(tmp) / "pyproject.toml").write_bytes(text)
        return runner_config.load(Path(tmp), environ={})


def _chosen(selection, mode: str, engine: Engine) -> list[Decision]:
    if mode == RUN_ALL:
        return sorted(selection.decisions, key=lambda d: (d.rank is None, d.rank or 0,
                                                          -d.risk))
    if mode == RERUN_FAILED:
        with engine.open_store() as store:
            outcomes = store.outcomes(limit_per_test=1)
        return [d for d in selection.decisions
                if outcomes.get(d.test_id, ["passed"])[0] in ("failed", "error")]
    return selection.selected


@dataclass
class Check:
    """What shards' results are validated against, all from the trusted side's git objects;
    the reasons of any rejected."""

    sha: str
    head_tree: dict
    inventories: object  # Mapping[str, FileBlocks]
    rejected: list = field(default_factory=list)


def shard_id(ctx: Context) -> str:
    """Shard jobs' ids share a prefix, so the runners' Redis user may reach only them."""
    return f"{ctx.queues.prefix}-shard-{uuid.uuid4().hex}"


def _bundle(ctx: Context, mirror: Path, sha: str) -> tuple[Path, str]:
    """A bundle of `sha` for runners, and its signed URL, valid as long as a shard may run."""
    bundle = workspace.bundle(mirror, sha, artifacts.directory(ctx.settings))
    try:
        return bundle, artifacts.publish(ctx.settings, bundle, SHARD_TIMEOUT)
    except BaseException:
        bundle.unlink(missing_ok=True)
        raise


def _enqueue_shards(ctx: Context, shards: list[list[Decision]], request: dict,
                    background: bool = False) -> list[str]:
    ids = []
    for i, shard in enumerate(shards):
        target = ctx.queues.background if background else ctx.queues.gpu(i % ctx.settings.gpus)
        shard_request = {**request, "tests": [d.test_id for d in shard]}
        job = target.enqueue("fastci.runner.execution.shard.run_shard", shard_request,
                             job_id=shard_id(ctx), job_timeout=SHARD_TIMEOUT,
                             result_ttl=SEEN_TTL, failure_ttl=SEEN_TTL,
                             description=f"shard {i + 1}/{len(shards)} of {request['sha'][:12]}")
        ctx.requests[job.id], ctx.origins[job.id] = shard_request, target.name
        ids.append(job.id)
    return ids


def _follow(ctx: Context, work: Work, head_sha: str, ids: list[str], runs, run,
            blocking: bool = True, check: Check | None = None):
    """Wait for the shards, publishing as each finishes; None if a newer head came. A shard
    whose worker died is run again (at most MAX_SHARD_RUNS times in all)."""
    pending, results, recordings, collected = list(ids), [], [], []
    total = len(ids)
    outage_since = None
    while pending:
        try:
            pending = _poll(ctx, work, head_sha, pending, total, runs, run, blocking,
                            results, recordings, collected, check)
            outage_since = None
        except RedisError as exc:  # Redis restarting: wait for it, the shards keep running
            outage_since = outage_since or time.monotonic()
            if time.monotonic() - outage_since > REDIS_OUTAGE_LIMIT:
                raise
            log.warning("Redis unavailable while following shards (%s); waiting", exc)
            time.sleep(1.0)
            continue
        if pending is None:
            return None, None, None
    return results, recordings, collected


REDIS_OUTAGE_LIMIT = 600


def _poll(ctx: Context, work: Work, head_sha: str, pending: list[str], total: int, runs, run,
          blocking: bool, results, recordings, collected, check: Check | None
          ) -> list[str] | None:
    """One look at the pending shards; the ones still pending (None: superseded)."""
    for job_id in list(pending):
        again = _rerun_if_orphaned(ctx, job_id)
        if again is not None:
            pending[pending.index(job_id)] = again
    if _superseded(ctx, work, head_sha):
        for job_id in pending:
            fetch(job_id, ctx.redis).cancel()
        runs.update(run, conclusion="cancelled", output=github.CheckRunOutput(
            "Superseded by a newer push", "A newer commit was pushed to this pull "
            "request; its run replaces this one."))
        return None
    finished = []
    for job_id in pending:
        job = fetch(job_id, ctx.redis)
        status = job.get_status(refresh=True)
        if status == "finished":
            finished.append(job_id)
            _collect(job.return_value(), ctx.requests[job_id], results, recordings,
                     collected, blocking, check)
        elif status in ("failed", "stopped", "canceled"):
            finished.append(job_id)
            tests = ctx.requests[job_id]["tests"]
            results += not_run(tests, f"the shard running it {status}: {_job_error(job)}",
                               when="shard", blocking=blocking)
    if finished:
        pending = [j for j in pending if j not in finished]
        runs.update(run, output=checks.regressions_output(
            results, shards=total, shards_done=total - len(pending),
            done=not pending, blocking=blocking))
    else:
        time.sleep(POLL)
    return pending


MAX_SHARD_RUNS = 3


def _rerun_if_orphaned(ctx: Context, job_id: str) -> str | None:
    """A new job id if `job_id`'s worker died while running it (the shard is enqueued again,
    on the same queue, for any worker listening there), else None."""
    job = fetch(job_id, ctx.redis)
    status = job.get_status(refresh=True)
    abandoned = status == "failed" and "abandoned" in (_job_error(job) or "").lower()
    if status != "started" and not abandoned:
        return None
    if status == "started" and _worker_alive(ctx, job):
        return None
    runs_so_far = job.meta.get("shard_runs", 1)
    if runs_so_far >= MAX_SHARD_RUNS:
        return None
    log.warning("shard %s lost its worker; running it again (%d)", job_id, runs_so_far + 1)
    request, origin = ctx.requests[job_id], ctx.origins[job_id]
    again = queue(origin, ctx.redis).enqueue(
        "fastci.runner.execution.shard.run_shard", request, job_id=shard_id(ctx),
        job_timeout=SHARD_TIMEOUT, result_ttl=SEEN_TTL, failure_ttl=SEEN_TTL,
        meta={"shard_runs": runs_so_far + 1, "replaces": job_id},
        description=f"shard of {request['sha'][:12]} (run again)")
    ctx.requests[again.id], ctx.origins[again.id] = request, origin
    try:
        job.cancel()
    except InvalidJobOperation as exc:  # it finished meanwhile: its result is not awaited
        log.info("orphaned shard %s could not be cancelled: %s", job_id, exc)
    return again.id


def _worker_alive(ctx: Context, job: Job) -> bool:
    host, pid = job.meta.get("host"), job.meta.get("pid")
    if host == socket.gethostname() and pid:
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    if job.worker_name:  # another machine: its worker's key expires when it stops beating
        return ctx.redis.exists(f"rq:worker:{job.worker_name}") > 0
    return True


def _job_error(job: Job) -> str:
    info = (job.latest_result().exc_string if job.latest_result() else None) or "no details"
    return info.strip().splitlines()[-1][:300]


def _collect(shard, request: dict, results, recordings, collected, blocking: bool,
             check: Check) -> None:
    """A finished shard's result, validated (`fastci.runner.execution.validate`) before
    any use: one that fails is reported, its tests count as not run, and nothing of it is
    stored."""
    tests = request["tests"]
    try:
        recording, failures, ran, flaky, firsts = validate.shard(
            shard, head_tree=check.head_tree, inventories=check.inventories,
            planned=set(tests), sha=check.sha,
            capture_budget_mb=request.get("capture_budget_mb"))
    except InvalidResult as exc:
        log.warning("rejected a shard's result for %s: %s", check.sha[:12], exc)
        check.rejected.append(str(exc))
        results += not_run(tests, f"the shard's result was rejected: {exc}", when="shard",
                           blocking=blocking)
        return
    if recording is None:
        tail = shard.get("output_tail") if isinstance(shard.get("output_tail"), str) else ""
        results += not_run(tests, f"pytest exited {str(shard.get('exit_code'))[:20]} before "
                                  f"recording: {tail[-300:]}", when="shard", blocking=blocking)
        return
    recordings.append(recording)
    collected += ran
    results += test_results(recording, failures, {t: firsts.get(t) for t in flaky},
                            blocking=blocking)


def follow_background(work_json: dict, head_sha: str, ids: list[str], key: str = "",
                      requests: dict | None = None) -> dict:
    """Publish the background dimensions' shards as their own, never-blocking check run."""
    work = Work.from_json(work_json)
    ctx = Context.create(work)
    ctx.requests.update(requests or {})
    ctx.origins.update({i: ctx.queues.background.name for i in ids})
    mirror = workspace.mirror_path(ctx.settings.workspace, work.repo)
    check = Check(head_sha, workspace.tree(mirror, head_sha), {})
    runs = github.CheckRuns(ctx.repo)
    run = runs.open(checks.BACKGROUND, head_sha, key or f"bg-{head_sha}",
                    output=checks.regressions_output([], shards=len(ids), shards_done=0,
                                                     done=False, blocking=False))
    watch(ctx, work, run, RUN_DEADLINE)
    try:
        results, _, _ = _follow(ctx, work, head_sha, ids, runs, run, blocking=False,
                                check=check)
    finally:
        for request in ctx.requests.values():
            artifacts.discard(ctx.settings, request.get("bundle_url"))
    if results is None:
        return {"status": "superseded"}
    runs.update(run, conclusion=checks.conclusion(results, blocking=False),
                output=checks.regressions_output(results, shards=len(ids),
                                                 shards_done=len(ids), done=True,
                                                 blocking=False))
    unwatch(ctx, run)
    return {"status": "completed", "ran": len(results)}


# -- what the selection check run annotates ------------------------------------------------------
def _change_notes(planned) -> list[dict]:
    changes = planned.inputs.changes
    spans, per_block = {}, {}
    for path, qualname in changes.blocks:
        fb = planned.inputs.head_inventories.get(path)
        block = fb.by_qualname().get(qualname) if fb is not None else None
        if block is not None and block.kind != "module":
            spans[(path, qualname)] = (block.start, block.end)
    if planned.snapshot is not None:
        for test in planned.snapshot.tests.values():
            for path, qualnames in test.blocks.items():
                for q in qualnames:
                    if (path, q) in spans:
                        per_block[(path, q)] = per_block.get((path, q), 0) + 1
    return checks.change_annotations(dict(changes.blocks), spans, per_block)


def _coverage(engine: Engine, store: EvidenceStore, planned):
    """Diff coverage of the change, and coverage against the base, from stored evidence."""
    head_commit = engine.repo.head()
    envs = store.snapshot_envs(head_commit)
    if not envs:
        return None
    head = store.load_snapshot(head_commit, envs[0][0], with_lines=True)
    head_tree = planned.inputs.head_tree
    old_tree = planned.snapshot.tree if planned.snapshot else {}
    changed = {}
    for change in planned.inputs.changes.files:
        path = change.path
        if not path.endswith(".py") or path not in head_tree:
            continue
        old_blob = old_tree.get(change.old_path or path)
        if old_blob is None:
            text = engine.repo.read(WORKTREE, path)
            changed[path] = set(range(1, text.count(b"\n") + 2))
        else:
            changed[path] = changed_lines(engine.repo.hunks(old_blob, head_tree[path]))
    python = [p for p in head_tree if p.endswith(".py")]
    contents = engine.repo.read_many(WORKTREE, python)
    head_statements = {p: statement_lines(c) for p, c in contents.items()}
    base_statements = base_executed = None
    if planned.snapshot is not None:
        base = store.load_snapshot(planned.snapshot.commit, planned.snapshot.env_key,
                                   with_lines=True)
        blobs = {p: b for p, b in old_tree.items() if p.endswith(".py")}
        found = engine.repo.read_blobs(list(blobs.values()))
        base_statements = {p: statement_lines(found[b]) for p, b in blobs.items() if b in found}
        base_executed = executed({t: r.lines for t, r in base.tests.items()})
    return report(changed, head_statements, executed({t: r.lines for t, r in head.tests.items()}),
                  base_statements, base_executed)


# -- the default branch --------------------------------------------------------------------------
def refresh(ctx: Context, work: Work) -> dict:
    """A push to the default branch: the full run. It records the whole suite there (on a
    GPU worker, which sends the recording back), stores what passes validation, and audits
    the selection: what FastCI would have selected for this push, against what the full run
    found (`fastci audit`)."""
    sha = validate.check_sha(work.head_sha)
    mirror = workspace.sync(ctx.settings.workspace, work.repo,
                            ctx.settings.clone_url.format(repo=work.repo), [sha],
                            token=_token(ctx, work))
    would = None
    with workspace.worktree(mirror, sha) as tree:
        engine = Engine(tree, ctx.settings.store_path, settings=_base_settings(mirror, sha))
        try:  # the evidence of the nearest ancestor: the previous push
            would = engine.plan(base=None, head=WORKTREE, prune=False).selection
        except (StoreError, ValueError) as exc:
            log.warning("no selection to audit for %s: %s", sha[:12], exc)
        bundle, url = _bundle(ctx, mirror, sha)
        request = {"sha": sha, "tests": [], "record_all": True, "bundle_url": url,
                   "capture_budget_mb": engine.settings.capture_budget_mb}
        target = ctx.queues.gpu(0)
        try:
            job = target.enqueue("fastci.runner.execution.shard.run_shard", request,
                                 job_id=shard_id(ctx), job_timeout=SHARD_TIMEOUT,
                                 result_ttl=SEEN_TTL, failure_ttl=SEEN_TTL,
                                 description=f"record {work.repo}@{sha[:12]}")
            ctx.requests[job.id], ctx.origins[job.id] = request, target.name
            status, job_id = _wait(ctx, job.id)
        finally:
            bundle.unlink(missing_ok=True)
        if status != "finished":
            return {"status": f"recording {status}", "job": job_id, "audited": False}
        head_tree = engine.repo.tree(sha)
        with engine.open_store() as store:
            try:
                recording, _, _, _, _ = validate.shard(
                    fetch(job_id, ctx.redis).return_value(), head_tree=head_tree,
                    inventories=Inventories(engine.repo, sha, head_tree, store), planned=None,
                    sha=sha, capture_budget_mb=request["capture_budget_mb"])
            except InvalidResult as exc:
                log.warning("rejected the full run's result for %s: %s", sha[:12], exc)
                return {"status": f"recording rejected: {exc}", "job": job_id,
                        "audited": False}
            if recording is None:
                return {"status": "recorded nothing", "job": job_id, "audited": False}
            store_recording(store, engine.repo, recording)
            if would is None or would.base is None:
                return {"status": "recorded", "job": job_id, "audited": False}
            results = tuple(TestResult(t.test_id, t.outcome, t.duration, t.dimension)
                            for t in recording.tests.values())
            entry = audit_entry(RunReport(selection=would, results=results), sha, "full")
            store.add_audit(entry)
    return {"status": "recorded", "job": job_id, "audited": True, "missed": entry["missed"]}


def _wait(ctx: Context, job_id: str, limit: float = SHARD_TIMEOUT) -> tuple[str, str]:
    """A job's final status and id (a new one where it ran again), waiting out Redis
    restarts and re-running it if orphaned."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            again = _rerun_if_orphaned(ctx, job_id)
            job_id = again or job_id
            status = fetch(job_id, ctx.redis).get_status(refresh=True)
        except RedisError:
            time.sleep(1.0)
            continue
        if status in ("finished", "failed", "stopped", "canceled"):
            return status, job_id
        time.sleep(POLL)
    return "timed out", job_id
