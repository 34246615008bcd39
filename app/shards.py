"""Test shards as the App runs them: bundles published for runners, shards enqueued on the
GPU queues, followed as they finish (a shard whose worker died runs again), and their
results validated before any use. The runner side is `fastci.runner.execution.shard`."""

from __future__ import annotations

import logging
import os
import socket
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from redis.exceptions import RedisError
from rq.exceptions import InvalidJobOperation
from rq.job import Job

from fastci.runner.execution import validate
from fastci.runner.execution.flaky import not_run
from fastci.runner.execution.flaky import results as test_results
from fastci.runner.execution.validate import InvalidResult
from fastci.runner.selection.report import Decision
from fastci.runner.store import EvidenceStore

from . import artifacts, checks, github, workspace
from .context import Context, superseded
from .events import Work
from .queue import SEEN_TTL, fetch, queue

log = logging.getLogger("fastci.app")


POLL = 0.5


SHARD_TIMEOUT = 6 * 3600


REDIS_OUTAGE_LIMIT = 600


MAX_SHARD_RUNS = 3


@dataclass
class Check:
    """What shards' results are validated against, all from the trusted side's git objects;
    the reasons of any rejected."""

    sha: str
    head_tree: dict
    inventories: object  # Mapping[str, FileBlocks]
    rejected: list = field(default_factory=list)
    captures: dict = field(default_factory=dict)
    """digest -> bytes of the module captures shards sent back, digest-checked."""


def shard_id(ctx: Context) -> str:
    """Shard jobs' ids share a prefix, so the runners' Redis user may reach only them."""
    return f"{ctx.queues.prefix}-shard-{uuid.uuid4().hex}"


def publish_bundle(ctx: Context, mirror: Path, sha: str) -> tuple[Path, str]:
    """A bundle of `sha` for runners, and its signed URL, valid as long as a shard may run."""
    bundle = workspace.bundle(mirror, sha, artifacts.directory(ctx.settings))
    try:
        return bundle, artifacts.publish(ctx.settings, bundle, SHARD_TIMEOUT)
    except BaseException:
        bundle.unlink(missing_ok=True)
        raise


def enqueue_shards(ctx: Context, shards: list[list[Decision]], request: dict,
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


def follow(ctx: Context, work: Work, head_sha: str, ids: list[str], runs, run,
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


def _poll(ctx: Context, work: Work, head_sha: str, pending: list[str], total: int, runs, run,
          blocking: bool, results, recordings, collected, check: Check | None
          ) -> list[str] | None:
    """One look at the pending shards; the ones still pending (None: superseded)."""
    for job_id in list(pending):
        again = _rerun_if_orphaned(ctx, job_id)
        if again is not None:
            pending[pending.index(job_id)] = again
    if superseded(ctx, work, head_sha):
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
            results += not_run(tests, f"the shard running it {status}: {job_error(job)}",
                               when="shard", blocking=blocking)
    if finished:
        pending = [j for j in pending if j not in finished]
        runs.update(run, output=checks.regressions_output(
            results, shards=total, shards_done=total - len(pending),
            done=not pending, blocking=blocking))
    else:
        time.sleep(POLL)
    return pending


def _rerun_if_orphaned(ctx: Context, job_id: str) -> str | None:
    """A new job id if `job_id`'s worker died while running it (the shard is enqueued again,
    on the same queue, for any worker listening there), else None."""
    job = fetch(job_id, ctx.redis)
    status = job.get_status(refresh=True)
    abandoned = status == "failed" and "abandoned" in (job_error(job) or "").lower()
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


def job_error(job: Job) -> str:
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
        if recording is not None:
            check.captures.update(validate.captures(shard, recording,
                                                    request.get("capture_budget_mb")))
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


def save_captures(store: EvidenceStore, captures: dict[str, bytes]) -> None:
    """Store digest-checked capture bytes (content-addressed; never unpickled here)."""
    if not captures:
        return
    with tempfile.TemporaryDirectory(prefix="fastci-captures-") as tmp:
        files = {}
        for digest, data in captures.items():
            files[digest] = Path(tmp) / digest
            files[digest].write_bytes(data)
        store.save_captures(files)


def wait_for(ctx: Context, job_id: str, limit: float = SHARD_TIMEOUT) -> tuple[str, str]:
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
