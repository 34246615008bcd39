"""The watchdog: no check run stays "in progress" forever, no delivery is lost to an outage.

Each cycle it (0) nudges every run in flight (`run_state`): it enqueues `advance(run)`, at
most once per cycle per run, which is how a run notices what no job's end tells it (a
runner worker that died mid-shard, whose shard then runs again; a trigger lost to a Redis
outage; a deadline passed); (1) concludes every FastCI check run still open past its
deadline (jobs list the runs they open, with a deadline, in Redis) as timed out, saying why
and what to do; (2) asks GitHub to redeliver the webhook deliveries that failed (whatever
the answer: a 5xx while Redis was down, a 401 while the webhook secret rotated, a timeout)
and never reached the queue, through the App's hook deliveries API, over all its pages, a
few times each with backoff, recording the ones it gives up on; and (3) once per
FASTCI_GC_INTERVAL_HOURS, runs retention (`fastci gc`) on the App's evidence store, with
the branches of every mirror in the workspace, so it must run where the selection worker's
workspace is. The time of the last gc is a key in Redis, set only if absent and expiring
after the interval, so several watchdogs run it once between them. Run it as `fastci
watchdog` (one per deployment, or more: they share the work).
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

from . import artifacts, github, metrics, schema
from .queue import Queues, enqueue_advance
from .run_state import RunStore
from .settings import AppSettings, load

log = logging.getLogger("fastci.app")
REDELIVERY_WINDOW = 3 * 24 * 3600  # GitHub keeps deliveries for redelivery about 3 days
TIMED_OUT = ("FastCI stopped hearing from this run before its deadline (a worker or the "
             "queue was lost). Nothing is assumed to have passed: comment `/fastci retest` or "
             "press Re-run to run it again.")


def nudge_runs(settings: AppSettings, redis: Redis, every: float = 30.0) -> list[str]:
    """Enqueue `advance` for each run in flight not nudged within `every` seconds; their
    ids. An advance that finds nothing new costs a few Redis reads."""
    store = RunStore(redis, settings.queue_prefix)
    nudged = []
    for run in store.in_flight():
        if redis.set(store.key(run, "nudged"), 1, nx=True, ex=max(1, int(every))):
            enqueue_advance(redis, settings.queue_prefix, run, "watchdog")
            nudged.append(run)
    metrics.count_watchdog(redis, settings.queue_prefix, "nudged_run", len(nudged))
    return nudged


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


MAX_PAGES = 200  # of 100 deliveries: far more than GitHub keeps for redelivery


def list_deliveries(gi, now: float) -> list[dict]:
    """The App's hook deliveries, newest first, over every page (GitHub's `Link: rel="next"`)
    until one lies wholly outside the redelivery window."""
    url, parameters, found = "/app/hook/deliveries", {"per_page": 100}, []
    for _ in range(MAX_PAGES):
        headers, page = github.retrying(lambda u=url, p=parameters: gi.requester
                                        .requestJsonAndCheck("GET", u, parameters=p))
        page = [d for d in (page if isinstance(page, list) else []) if isinstance(d, dict)]
        found += page
        url = _next_link({k.lower(): v for k, v in (headers or {}).items()}.get("link"))
        if url is None or (page and all(_age(d, now) > REDELIVERY_WINDOW for d in page)):
            return found
        parameters = None  # the next link carries them
    log.warning("stopped reading deliveries after %d pages", MAX_PAGES)
    return found


def _next_link(header: str | None) -> str | None:
    for part in (header or "").split(","):
        target, _, rel = part.partition(";")
        if rel.strip().replace(" ", "") == 'rel="next"':
            return target.strip().strip("<>")
    return None


def _age(delivery: dict, now: float) -> float:
    try:
        return now - schema.timestamp(str(delivery.get("delivered_at")))
    except (ValueError, OverflowError):
        return 0.0  # no readable time: treat as recent, the budget still bounds it


def _delivered(delivery: dict) -> bool:
    code = delivery.get("status_code")
    return isinstance(code, int) and 200 <= code < 300


def redeliver_failed(settings: AppSettings, redis: Redis, gi=None, now: float | None = None
                     ) -> list[int]:
    """Ask GitHub to redeliver each delivery that failed, whatever the status (a 5xx while
    Redis was down, a 401 while the secret rotated, a timeout) and never reached the queue:
    every attempt of its GUID failed, redeliveries included. Each GUID is asked at most
    `redelivery_attempts` times, waiting `redelivery_backoff` seconds, doubled after each
    ask; then the watchdog gives up on it and records that (`given_up`, /metrics). Returns
    the ids of the deliveries it asked for."""
    queues = Queues(redis, settings.queue_prefix)
    gi = gi or github.integration(settings)
    now = time.time() if now is None else now
    attempts: dict[str, list[dict]] = {}
    for delivery in list_deliveries(gi, now):
        if isinstance(delivery.get("guid"), str) and delivery["guid"]:
            attempts.setdefault(delivery["guid"], []).append(delivery)
    asked = []
    for guid, tries in attempts.items():
        if any(_delivered(d) for d in tries) or redis.exists(queues.key("delivery", guid)):
            continue  # it reached FastCI (or the queue) after all
        if min(_age(d, now) for d in tries) > REDELIVERY_WINDOW:
            continue  # GitHub no longer redelivers it
        first = min(tries, key=lambda d: (bool(d.get("redelivery")), -_age(d, now)))
        state = queues.key("redelivery", guid)
        asked_before, next_at = (int(v or 0) if i == 0 else float(v or 0) for i, v in
                                 enumerate(redis.hmget(state, "asked", "next_at")))
        if asked_before >= settings.redelivery_attempts:
            _give_up(redis, queues, state, first, asked_before, now)
            continue
        if now < next_at or not redis.set(f"{state}:{asked_before}", now, nx=True,
                                          ex=REDELIVERY_WINDOW):
            continue  # backing off, or another watchdog is asking this time
        try:
            github.retrying(lambda d=first: gi.requester.requestJsonAndCheck(
                "POST", f"/app/hook/deliveries/{d['id']}/attempts"))
            outcome = "asked"
            asked.append(first["id"])
            log.info("asked GitHub to redeliver %s (%s, answered %s)", guid,
                     first.get("event"), first.get("status_code"))
        except GithubException as exc:
            outcome = "failed"
            log.warning("GitHub refused to redeliver %s: %s", guid, exc.status)
        pipe = redis.pipeline()
        pipe.hset(state, mapping={"asked": asked_before + 1, "next_at": now + (
            settings.redelivery_backoff * 2 ** asked_before)})
        pipe.expire(state, REDELIVERY_WINDOW)
        pipe.execute()
        metrics.count_watchdog(redis, settings.queue_prefix, f"redelivery_{outcome}")
    return asked


GIVEN_UP_KEPT = 30 * 24 * 3600  # seconds the record of a delivery given up on is kept


def _give_up(redis: Redis, queues: Queues, state: str, delivery: dict, asked: int,
             now: float) -> None:
    """Record, once per GUID, that the watchdog stopped asking for it."""
    if not redis.hsetnx(state, "gave_up", now):
        return
    record = {"guid": delivery["guid"], "id": delivery.get("id"),
              "event": delivery.get("event"), "action": delivery.get("action"),
              "status_code": delivery.get("status_code"),
              "delivered_at": delivery.get("delivered_at"), "asked": asked, "at": now}
    key = queues.key("redeliveries-given-up")
    pipe = redis.pipeline()
    pipe.zadd(key, {json.dumps(record, sort_keys=True): now})
    pipe.zremrangebyscore(key, 0, now - GIVEN_UP_KEPT)
    pipe.execute()
    metrics.count_watchdog(redis, queues.prefix, "redelivery_gave_up")
    log.warning("gave up redelivering %s (%s) after %d asks", delivery["guid"],
                delivery.get("event"), asked)


def given_up(redis: Redis, prefix: str, since: float = 0.0) -> list[dict]:
    """The deliveries the watchdog gave up on since `since`, oldest first (`fastci audit`)."""
    key = Queues(redis, prefix).key("redeliveries-given-up")
    return [json.loads(raw) for raw in redis.zrangebyscore(key, since, "+inf")]


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
            nudge_runs(settings, redis, every=interval)
        except Exception as exc:  # noqa: BLE001 - the watchdog outlives outages
            log.warning("watchdog could not nudge runs: %s: %s", type(exc).__name__, exc)
        try:
            conclude_stale_runs(settings, redis, gi)
            redeliver_failed(settings, redis, gi)
        except Exception as exc:  # noqa: BLE001 - the watchdog outlives outages
            log.warning("watchdog cycle failed: %s: %s", type(exc).__name__, exc)
        try:  # on its own: GitHub being down must not stop retention
            collect_garbage(settings, redis)
            artifacts.sweep(settings)  # bundles of selection jobs that were killed
        except Exception as exc:  # noqa: BLE001 - the watchdog outlives outages
            log.warning("watchdog gc failed: %s: %s", type(exc).__name__, exc)
        if once:
            return
        time.sleep(interval)
