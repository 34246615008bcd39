"""Prometheus metrics, served at GET /metrics by prometheus-client.

Two sources, because FastCI's processes live on several machines:

- **The webhook service's own counters** (deliveries by status and outcome, other answers by
  status) are prometheus-client metrics. Under gunicorn they run in prometheus-client's
  multiprocess mode: `PROMETHEUS_MULTIPROC_DIR` names a folder each worker writes its values
  into, any worker's scrape sums them, and gunicorn's `child_exit` hook
  (`mark_process_dead`) retires a dead worker's files. `serve()` and
  deploy/gunicorn.conf.py set the folder up before prometheus-client is imported.
- **What workers, runners and the watchdog do** (job durations by kind, GPU-seconds saved
  and run, the watchdog's actions, deliveries enqueued) is counted in Redis, which every
  machine reaches, and read at scrape time by `RedisCollector`, along with the queue depths
  and the check runs in flight. A worker on another machine cannot share the web service's
  multiprocess folder, and a worker exposing its own port would need a scrape target per
  runner, reachable through the runners' sandbox. Writing a metric never fails a job or a
  request: Redis errors are swallowed.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString
from redis import Redis
from redis.exceptions import RedisError

log = logging.getLogger("fastci.app")
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# -- the webhook service's own counters (multiprocess under gunicorn) -----------------------------
LOCAL = CollectorRegistry(auto_describe=True)
DELIVERIES = Counter("fastci_deliveries", "Webhook deliveries answered, by HTTP status and "
                     "outcome (enqueued, duplicate, ignored, pong, refused, unavailable, error).",
                     ["status", "outcome"], registry=LOCAL)
REQUESTS = Counter("fastci_requests", "Error answers to anything but POST /webhooks "
                   "(unknown paths, refused artifact links), by HTTP status.", ["status"],
                   registry=LOCAL)


def count_answer(delivery: bool, status: int, message: str) -> None:
    """One answer of the service: a delivery's (with its outcome), or another request's."""
    if delivery:
        DELIVERIES.labels(str(status), outcome_of(status, message)).inc()
    else:
        REQUESTS.labels(str(status)).inc()


def outcome_of(status: int, message: str) -> str:
    """A delivery's outcome, from the answer the service gave it."""
    if status == 202:
        return "ignored" if message.startswith("ignored") else "enqueued"
    if status == 200:
        return "pong" if message == "pong" else "duplicate"
    if status == 503:
        return "unavailable"
    if status >= 500:
        return "error"
    return "refused"


# -- what other processes count, in Redis -------------------------------------------------------
JOB_KINDS = ("pull_request", "refresh", "command", "installation", "advance", "shard",
             "replay", "other")
BUCKETS = (1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 21600.0)
WATCHDOG_ACTIONS = ("concluded_stale_run", "nudged_run", "redelivery_asked",
                    "redelivery_failed", "redelivery_gave_up", "gc_ran", "gc_failed")


def _key(prefix: str, *parts: str) -> str:
    return ":".join((prefix, "metrics", *parts))


def job_kind(func_name: str, args: tuple | list) -> str:
    """The kind a job's duration is counted under: the work's kind for `handle`."""
    if func_name.endswith(".handle") and args and isinstance(args[0], dict):
        kind = str(args[0].get("kind", ""))
        return kind if kind in JOB_KINDS else "other"
    return {"fastci.app.advance.advance": "advance",
            "fastci.runner.execution.shard.run_shard": "shard",
            "fastci.runner.execution.replays.run_replays": "replay"}.get(func_name, "other")


def observe_job(redis: Redis, prefix: str, kind: str, seconds: float) -> None:
    """One finished job's duration, into its kind's histogram in Redis."""
    bucket = next((f"{b:g}" for b in BUCKETS if seconds <= b), "+Inf")
    try:
        pipe = redis.pipeline(transaction=False)
        key = _key(prefix, "job_seconds", kind)
        pipe.hincrby(key, bucket, 1)
        pipe.hincrbyfloat(key, "sum", round(seconds, 6))
        pipe.execute()
    except RedisError as exc:
        log.debug("job metric not written: %s", exc)


@contextmanager
def timed_job(redis: Redis, prefix: str, kind: str) -> Iterator[None]:
    start = time.monotonic()
    try:
        yield
    finally:
        observe_job(redis, prefix, kind, time.monotonic() - start)


def count_watchdog(redis: Redis, prefix: str, action: str, amount: int = 1) -> None:
    """One of the watchdog's actions (WATCHDOG_ACTIONS)."""
    if amount <= 0:
        return
    try:
        redis.hincrby(_key(prefix, "watchdog"), action, amount)
    except RedisError as exc:
        log.debug("watchdog metric not written: %s", exc)


def add_gpu_seconds(redis: Redis, prefix: str, saved: float, ran: float) -> None:
    """Recorded test-seconds on GPU runners: skipped by the selection (saved) and run."""
    try:
        pipe = redis.pipeline(transaction=False)
        pipe.hincrbyfloat(_key(prefix, "gpu_seconds"), "saved", round(max(saved, 0.0), 3))
        pipe.hincrbyfloat(_key(prefix, "gpu_seconds"), "run", round(max(ran, 0.0), 3))
        pipe.execute()
    except RedisError as exc:
        log.debug("gpu-seconds metric not written: %s", exc)


class RedisCollector(Collector):
    """Reads, at scrape time, what FastCI's processes counted in Redis, the queue depths and
    the check runs in flight. `fastci_redis_up` says whether Redis answered."""

    def __init__(self, redis: Redis, prefix: str, queues: Iterable[str]) -> None:
        self.redis, self.prefix, self.queues = redis, prefix, list(queues)

    def collect(self) -> Iterator[Metric]:
        try:
            families = self._families()
            up = 1.0
        except RedisError as exc:
            log.warning("metrics: Redis did not answer: %s", type(exc).__name__)
            families, up = [], 0.0
        yield from families
        yield GaugeMetricFamily("fastci_redis_up", "Whether Redis answered this scrape.",
                                value=up)

    def _families(self) -> list[Metric]:
        pipe = self.redis.pipeline(transaction=False)
        pipe.get(_key(self.prefix, "enqueued_total"))
        pipe.hgetall(_key(self.prefix, "gpu_seconds"))
        pipe.hgetall(_key(self.prefix, "watchdog"))
        pipe.zrange(f"{self.prefix}:open-runs", 0, -1)
        for name in self.queues:
            pipe.llen(f"rq:queue:{name}")
        for kind in JOB_KINDS:
            pipe.hgetall(_key(self.prefix, "job_seconds", kind))
        answers = pipe.execute()
        enqueued, gpu, watchdog, runs = answers[:4]
        depths = answers[4:4 + len(self.queues)]
        jobs = answers[4 + len(self.queues):]

        out: list[Metric] = [CounterMetricFamily(
            "fastci_enqueued", "Deliveries whose job was enqueued (each delivery once).",
            value=int(enqueued or 0))]
        gpu = _decoded(gpu)
        seconds = CounterMetricFamily(
            "fastci_gpu_seconds", "Recorded test-seconds on GPU runners: skipped by the "
            "selection (saved) and selected to run (run), per pull request.", labels=["kind"])
        for kind in ("saved", "run"):
            seconds.add_metric([kind], float(gpu.get(kind, 0.0)))
        saved = CounterMetricFamily("fastci_gpu_seconds_saved", "Recorded test-seconds the "
                                    "selection skipped on GPU runners.",
                                    value=float(gpu.get("saved", 0.0)))
        actions = CounterMetricFamily("fastci_watchdog_actions", "The watchdog's actions: "
                                      "stale check runs concluded, redeliveries asked of "
                                      "GitHub (refused, given up on), gc runs and "
                                      "failures.", labels=["action"])
        watchdog = _decoded(watchdog)
        for action in WATCHDOG_ACTIONS:
            actions.add_metric([action], float(watchdog.get(action, 0)))
        in_flight = GaugeMetricFamily("fastci_runs_in_flight", "FastCI check runs open (and "
                                      "watched by the watchdog), by check name.",
                                      labels=["check"])
        by_check: dict[str, int] = {}
        for raw in runs:
            try:
                name = str(json.loads(raw).get("name", "unknown"))
            except (ValueError, AttributeError):
                name = "unknown"
            by_check[name] = by_check.get(name, 0) + 1
        for name, count in sorted(by_check.items()):
            in_flight.add_metric([name], count)
        depth = GaugeMetricFamily("fastci_queue_jobs", "Jobs waiting per RQ queue.",
                                  labels=["queue"])
        for name, count in zip(self.queues, depths):
            depth.add_metric([name], int(count or 0))
        durations = HistogramMetricFamily("fastci_job_duration_seconds", "Job durations by "
                                          "kind, as the worker that ran them timed them.",
                                          labels=["kind"])
        for kind, raw in zip(JOB_KINDS, jobs):
            fields = _decoded(raw)
            if not fields:
                continue
            cumulative, buckets = 0, []
            for bound, le in [*((f"{b:g}", floatToGoString(b)) for b in BUCKETS),
                              ("+Inf", "+Inf")]:
                cumulative += int(fields.get(bound, 0))
                buckets.append((le, cumulative))
            durations.add_metric([kind], buckets, sum_value=float(fields.get("sum", 0.0)))
        return [*out, seconds, saved, actions, in_flight, depth, durations]


def _decoded(raw: dict) -> dict[str, str]:
    return {(k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes)
                                                          else v) for k, v in raw.items()}


# -- the exposition -------------------------------------------------------------------------------
def multiprocess_dir() -> str | None:
    return os.environ.get(MULTIPROC_ENV) or os.environ.get(MULTIPROC_ENV.lower()) or None


def exposition(redis_collector: Collector) -> bytes:
    """Everything, in Prometheus' text format: the service's counters (summed over gunicorn's
    workers in multiprocess mode) and what Redis holds."""
    registry = CollectorRegistry(auto_describe=False)
    if multiprocess_dir():
        from prometheus_client import multiprocess  # noqa: PLC0415 (multiprocess mode only)

        multiprocess.MultiProcessCollector(registry)
    else:
        registry.register(_Local())
    registry.register(redis_collector)
    return generate_latest(registry)


class _Local(Collector):
    def collect(self) -> Iterator[Metric]:
        yield from LOCAL.collect()
