"""The watchdog: no check run stays "in progress" forever, no delivery is lost to an outage.

Each cycle it (1) concludes every FastCI check run still open past its deadline (jobs list
the runs they open, with a deadline, in Redis) as timed out, saying why and what to do; and
(2) asks GitHub to redeliver the webhook deliveries that failed (a 5xx answer: Redis was down
or the service restarting) and that never reached the queue, through the App's hook
deliveries API; and (3) once per FASTCI_GC_INTERVAL_HOURS, runs retention (`fastci gc`) on
the App's evidence store, with the branches of every mirror in the workspace, so it must run
where the selection worker's workspace is. The time of the last gc is a key in Redis, set
only if absent and expiring after the interval, so several watchdogs run it once between
them. Run it as `fastci watchdog` (one per deployment, or more: they share the work).
"""

from __future__ import annotations

import json
import logging
import time

from github import GithubException
from redis import Redis

from fastci.runner.errors import FastCIError
from fastci.runner.store import open_store
from fastci.runner.store.retention import Retention, branch_histories

from . import github, metrics
from .queue import Queues
from .settings import AppSettings, load

log = logging.getLogger("fastci.app")
REDELIVERY_WINDOW = 3 * 24 * 3600  # GitHub keeps deliveries for redelivery about 3 days
TIMED_OUT = ("FastCI stopped hearing from this run before its deadline (a worker or the "
             "queue was lost). Nothing is assumed to have passed: comment `/fastci retest` or "
             "press Re-run to run it again.")


def conclude_stale_runs(settings: AppSettings, redis: Redis, gi=None, now: float | None = None
                        ) -> list[int]:
    """Conclude open runs past their deadline; returns their ids."""
    queues = Queues(redis, settings.queue_prefix)
    key = queues.key("open-runs")
    now = time.time() if now is None else now
    done = []
    for raw in redis.zrangebyscore(key, 0, now):
        entry = json.loads(raw)
        gi = gi or github.integration(settings)
        try:
            repo = github.retrying(lambda: github.for_installation(
                gi, entry["installation"]).get_repo(entry["repo"]))
            run = github.retrying(lambda: repo.get_check_run(entry["id"]))
            if run.status != "completed":
                github.CheckRuns(repo).update(run, conclusion="timed_out", output=(
                    github.CheckRunOutput(f"Timed out: {entry['name']}", TIMED_OUT)))
                done.append(entry["id"])
                metrics.count_watchdog(redis, settings.queue_prefix, "concluded_stale_run")
        except GithubException as exc:
            if exc.status not in (404, 410):  # gone: nothing to conclude
                log.warning("could not conclude check run %s: %s", entry["id"], exc.status)
                continue
        redis.zrem(key, raw)
    return done


def redeliver_failed(settings: AppSettings, redis: Redis, gi=None, now: float | None = None
                     ) -> list[int]:
    """Ask GitHub to redeliver failed deliveries that never reached the queue."""
    queues = Queues(redis, settings.queue_prefix)
    gi = gi or github.integration(settings)
    now = time.time() if now is None else now
    _, deliveries = github.retrying(lambda: gi.requester.requestJsonAndCheck(
        "GET", "/app/hook/deliveries", parameters={"per_page": 100}))
    asked = []
    for delivery in deliveries or []:
        if int(delivery.get("status_code") or 0) < 500 or delivery.get("redelivery"):
            continue
        if redis.exists(queues.key("delivery", delivery["guid"])):
            continue  # it reached the queue after all
        marker = queues.key("redelivered", str(delivery["id"]))
        if not redis.set(marker, now, nx=True, ex=REDELIVERY_WINDOW):
            continue  # asked already
        github.retrying(lambda d=delivery: gi.requester.requestJsonAndCheck(
            "POST", f"/app/hook/deliveries/{d['id']}/attempts"))
        asked.append(delivery["id"])
        metrics.count_watchdog(redis, settings.queue_prefix, "redelivery_requested")
        log.info("asked GitHub to redeliver %s (%s)", delivery["guid"], delivery.get("event"))
    return asked


GC_RETRY = 3600.0  # seconds before another try, after a gc that failed


def collect_garbage(settings: AppSettings, redis: Redis, now: float | None = None
                    ) -> dict | None:
    """Run gc on the App's store if no watchdog did within the interval; its report as
    JSON, or None when it was not this watchdog's turn (or gc is off, or nothing to judge)."""
    if settings.gc_interval_hours <= 0:
        return None
    now = time.time() if now is None else now
    marker = Queues(redis, settings.queue_prefix).key("gc-last")
    if not redis.set(marker, now, nx=True, ex=max(1, int(settings.gc_interval_hours * 3600))):
        return None  # another watchdog (or this one) ran it within the interval
    mirrors = sorted((settings.workspace / "mirrors").glob("*.git"))
    if not mirrors:  # no branches known here: every old snapshot would look unreachable
        log.warning("gc skipped: no mirrors in %s (run the watchdog beside the selection "
                    "worker's workspace)", settings.workspace)
        redis.expire(marker, int(GC_RETRY))
        return None
    try:
        branches: dict[str, list[str]] = {}
        for mirror in mirrors:
            branches.update(branch_histories(mirror, f"{mirror.name}:"))
        retention = Retention(keep_days=settings.retention_days, now=now, branches=branches)
        with open_store(settings.store_path, create=False) as store:
            report = store.gc(retention)
    except FastCIError as exc:
        log.warning("gc failed, trying again in %d s: %s", GC_RETRY, exc)
        redis.expire(marker, int(GC_RETRY))
        metrics.count_watchdog(redis, settings.queue_prefix, "gc_failed")
        return None
    metrics.count_watchdog(redis, settings.queue_prefix, "gc_ran")
    log.info("gc: deleted %d item(s), %d bytes freed", report.deleted, report.bytes)
    return report.to_json()


def run(interval: float = 30.0, once: bool = False, settings: AppSettings | None = None) -> None:
    settings = settings or load()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    redis = Redis.from_url(settings.redis_url)
    gi = github.integration(settings)
    while True:
        try:
            conclude_stale_runs(settings, redis, gi)
            redeliver_failed(settings, redis, gi)
        except Exception as exc:  # noqa: BLE001 - the watchdog outlives outages
            log.warning("watchdog cycle failed: %s: %s", type(exc).__name__, exc)
        try:  # on its own: GitHub being down must not stop retention
            collect_garbage(settings, redis)
        except Exception as exc:  # noqa: BLE001 - the watchdog outlives outages
            log.warning("watchdog gc failed: %s: %s", type(exc).__name__, exc)
        if once:
            return
        time.sleep(interval)
