"""What the dashboard reads: a compact JSON summary of each run, kept in Redis per repository.

The selection worker writes one entry when a pull request's run concludes (`record_pull_request`)
and one when a push's full run is audited (`record_full_run`); the webhook service's dashboard
only reads them (`runs`). The web side never opens the evidence store (the selection host's,
and shared by every repository) nor a runner's result: what it shows was decided and checked
here. Entries hold names, numbers and links, never a token, a bundle link or a test's output.

    <prefix>:dash:runs:<owner/name>   sorted set, score = when the run ended, member = JSON;
                                      the newest KEEP entries, for TTL seconds after the last
"""

from __future__ import annotations

import json
import logging
import time

from redis import Redis
from redis.exceptions import RedisError

from fastci.runner.selection.report import Selection, TestResult

from .queue import fetch

log = logging.getLogger("fastci.app")

KEEP = 2000
TTL = 90 * 24 * 3600
LIST_LIMIT = 300  # selected and pruned tests kept per run; the check run lists the rest
REASONS = 3


def key(prefix: str, repo: str) -> str:
    return f"{prefix}:dash:runs:{repo.lower()}"


def runs(redis: Redis, prefix: str, repo: str, since: float = 0.0) -> list[dict]:
    """The repository's run summaries since `since`, oldest first."""
    return [json.loads(raw) for raw in redis.zrangebyscore(key(prefix, repo), since, "+inf")]


def save(redis: Redis, prefix: str, entry: dict) -> None:
    name = key(prefix, entry["repo"])
    pipe = redis.pipeline()
    pipe.zadd(name, {json.dumps(entry, sort_keys=True): entry["at"]})
    pipe.zremrangebyrank(name, 0, -KEEP - 1)
    pipe.expire(name, TTL)
    pipe.execute()


def record_pull_request(ctx, work, head_sha: str, selection: Selection, chosen: list,
                        results: list[TestResult], audit: dict | None, check_runs: list,
                        shadow: bool) -> None:
    """The summary of one pull request's run. Never fails the job: a dashboard without this
    entry is the only cost, and the reason is logged."""
    try:
        shards = [_shard(ctx, job_id) for job_id in ctx.origins]
        save(ctx.redis, ctx.queues.prefix, {
            "kind": "shadow" if shadow else "pull_request", "at": time.time(),
            "repo": work.repo, "number": work.number, "head": head_sha,
            "base": selection.base, "mode": work.mode,
            "selection": _selection(selection),
            "chosen": len(chosen),
            "results": _results(results, shards),
            "shards": shards,
            "escaped": list(audit["missed"]) if audit else [],
            "check_runs": [{"name": r.name, "url": r.html_url,
                            "conclusion": getattr(r, "conclusion", None)}
                           for r in check_runs if r is not None],
        })
    except (RedisError, AttributeError, KeyError, TypeError, ValueError) as exc:
        log.warning("dashboard summary of %s#%s not kept: %s", work.repo, work.number, exc)


def record_full_run(ctx, work, sha: str, entry: dict | None, job_ids: list[str]) -> None:
    """A push's full run on the default branch, and its audit (`entry`) when there was one."""
    try:
        shards = [_shard(ctx, job_id) for job_id in job_ids]
        seconds = (entry or {}).get("total_seconds", 0.0)
        save(ctx.redis, ctx.queues.prefix, {
            "kind": "full", "at": time.time(), "repo": work.repo, "number": None,
            "head": sha, "base": (entry or {}).get("base"), "mode": "all",
            "selection": None, "chosen": (entry or {}).get("total", 0),
            "results": {"ran": (entry or {}).get("total", 0),
                        "failed": list((entry or {}).get("failed", [])),
                        "flaky": list((entry or {}).get("flaky", [])),
                        "test_seconds_run": seconds,
                        "saved_seconds": 0.0,
                        "would_save_seconds": max(seconds - (entry or {}).get(
                            "selected_seconds", seconds), 0.0),
                        "time_to_first_failure": (entry or {}).get("time_to_first_failure")},
            "shards": shards,
            "escaped": list((entry or {}).get("missed", [])),
            "check_runs": [],
        })
    except (RedisError, AttributeError, KeyError, TypeError, ValueError) as exc:
        log.warning("dashboard summary of %s@%s not kept: %s", work.repo, sha[:12], exc)


def _selection(selection: Selection) -> dict:
    def test(d) -> dict:
        return {"id": d.test_id, "rank": d.rank, "risk": round(d.risk, 3),
                "seconds": round(d.expected_seconds, 3), "dimension": d.dimension,
                "new": d.new, "reasons": list(d.reasons[:REASONS])}

    pruned = [d for d in selection.decisions if d.pruned is not None]
    return {**selection.summary(), "select_all_reason": selection.select_all_reason,
            "changed_files": len(selection.changed_files), "notes": list(selection.notes[:5]),
            "tests": [test(d) for d in selection.selected[:LIST_LIMIT]],
            "pruned_tests": [test(d) for d in pruned[:LIST_LIMIT]]}


def _shard(ctx, job_id: str) -> dict:
    """A shard as RQ saw it: where it ran, on which worker, for how long."""
    request = ctx.requests.get(job_id, {})
    out = {"job": job_id, "queue": ctx.origins.get(job_id), "tests": request.get("tests", []),
           "status": None, "worker": None, "host": None, "seconds": None}
    try:
        job = fetch(job_id, ctx.redis)
        out.update(status=job.get_status(refresh=True), worker=job.worker_name,
                   host=job.meta.get("host"))
        if job.started_at and job.ended_at:
            out["seconds"] = round((job.ended_at - job.started_at).total_seconds(), 3)
    except Exception as exc:  # an expired or unreadable job: shown without its details
        log.info("shard %s not read for the dashboard: %s", job_id, exc)
    out["tests"] = out["tests"][:LIST_LIMIT]
    return out


def _results(results: list[TestResult], shards: list[dict]) -> dict:
    by_id = {r.test_id: r for r in results}
    failed = [r.test_id for r in results if r.outcome in ("failed", "error") and not r.flaky]
    return {"ran": len(results), "failed": failed[:LIST_LIMIT],
            "flaky": [r.test_id for r in results if r.flaky][:LIST_LIMIT],
            "test_seconds_run": round(sum(r.duration for r in results), 3),
            "time_to_first_failure": first_failure(shards, by_id)}


def first_failure(shards: list[dict], results: dict[str, TestResult]) -> float | None:
    """Test-seconds from a shard's start to its first failure, the earliest over the shards
    (they run side by side, each riskiest first)."""
    best = None
    for shard in shards:
        clock = 0.0
        for test_id in shard["tests"]:
            result = results.get(test_id)
            if result is None:
                continue
            clock += result.duration
            if result.outcome in ("failed", "error") and not result.flaky:
                best = clock if best is None else min(best, clock)
                break
    return None if best is None else round(best, 3)
