"""Putting work on RQ queues: at most once per delivery, newest head wins.

Queues: `<prefix>-cpu` (selection, publishing, commands), `<prefix>-gpu-<n>` (one per GPU,
test shards), `<prefix>-background` (convergence and perf shards, taken by GPU workers only
when their own queue is empty). A delivery is claimed in Redis before it is enqueued and the
claim is dropped if enqueueing fails, so a redelivery is never lost and never doubled.

Every queue, job and worker here speaks JSON (`rq.serializers.JSONSerializer`), never pickle,
and a job runs only if its function is one of `JOBS`: a job anyone else put on a queue (an
unknown name, a bound method, a callback or a webhook) is refused and logged, never imported.
"""

from __future__ import annotations

import importlib
import json
import logging
import re
import time

from redis import Redis
from rq import Queue
from rq.job import Job
from rq.serializers import JSONSerializer

from fastci.runner.errors import FastCIError

from . import metrics
from .events import Work

log = logging.getLogger("fastci.app")

# The only functions a FastCI worker runs: job name -> (module, attribute).
JOBS = {
    "fastci.app.jobs.handle": ("fastci.app.jobs", "handle"),
    "fastci.app.jobs.follow_background": ("fastci.app.jobs", "follow_background"),
    "fastci.runner.execution.shard.run_shard": ("fastci.runner.execution.shard", "run_shard"),
    "fastci.runner.execution.shard.pause": ("fastci.runner.execution.shard", "pause"),
    "fastci.runner.execution.replays.run_replays": ("fastci.runner.execution.replays",
                                                    "run_replays"),
}


QUEUE_SUFFIX = re.compile(r"-(cpu|background|gpu-\d+)$")  # a queue name, less its prefix


class UnknownJob(FastCIError):
    """A job whose function is not one of FastCI's: refused, never imported."""


class FastCIJob(Job):
    """An RQ job that is JSON on the wire and runs only an allowlisted FastCI function."""

    def __init__(self, id: str | None = None, connection: Redis | None = None,
                 serializer=None) -> None:
        super().__init__(id, connection, serializer or JSONSerializer)

    @property
    def func(self):
        name = self.func_name
        if self.instance is not None or name not in JOBS:
            log.error("refused job %s: %r is not a FastCI job", self.id, name)
            raise UnknownJob(f"refused: {str(name)[:100]!r} is not a FastCI job")
        module, attribute = JOBS[name]
        return getattr(importlib.import_module(module), attribute)

    def perform(self):
        """Runs the job, timed: its duration goes to /metrics by kind (`metrics.py`)."""
        prefix = QUEUE_SUFFIX.sub("", self.origin or "") or "fastci"
        with metrics.timed_job(self.connection, prefix, metrics.job_kind(
                str(self.func_name), self.args if self.instance is None else ())):
            return super().perform()

    def restore(self, raw_data):
        """Callbacks and webhooks would be imported or called by name: FastCI sets none,
        so any found on a job are dropped (and logged)."""
        out = super().restore(raw_data)
        if self._success_callback_name or self._failure_callback_name or \
                self._stopped_callback_name or self.webhooks:
            log.error("job %s carried callbacks or webhooks; dropped", self.id)
        self._success_callback_name = self._failure_callback_name = None
        self._stopped_callback_name = None
        self.webhooks = []
        return out


def queue(name: str, redis: Redis) -> Queue:
    """An RQ queue that speaks JSON and makes `FastCIJob`s."""
    return Queue(name, connection=redis, job_class=FastCIJob, serializer=JSONSerializer)


def fetch(job_id: str, redis: Redis) -> FastCIJob:
    return FastCIJob.fetch(job_id, connection=redis, serializer=JSONSerializer)


def exists(job_id: str, redis: Redis) -> bool:
    return FastCIJob.exists(job_id, connection=redis)

CLAIM_TTL = 60  # seconds a delivery is held while its job is enqueued
SEEN_TTL = 7 * 24 * 3600  # GitHub keeps deliveries for redelivery about this long
JOB_TIMEOUT = 6 * 3600


class Queues:
    def __init__(self, redis: Redis, prefix: str = "fastci", gpus: int = 1) -> None:
        self.redis, self.prefix, self.gpus = redis, prefix, gpus
        self.cpu = queue(f"{prefix}-cpu", redis)
        self.background = queue(f"{prefix}-background", redis)

    def gpu(self, index: int) -> Queue:
        return queue(f"{self.prefix}-gpu-{index}", self.redis)

    def key(self, *parts: str) -> str:
        return ":".join((self.prefix, *parts))

    # -- deliveries --------------------------------------------------------------------------
    def claim(self, delivery: str) -> bool:
        """True if this delivery is new (and is now ours to enqueue)."""
        return bool(self.redis.set(self.key("delivery", delivery), "claimed", nx=True,
                                   ex=CLAIM_TTL))

    def release(self, delivery: str) -> None:
        self.redis.delete(self.key("delivery", delivery))

    def enqueue(self, work: Work, delivery: str) -> Job:
        """Enqueue the job for `work` (claimed first by the caller); returns it."""
        job = self.cpu.enqueue("fastci.app.jobs.handle", work.to_json(), delivery,
                               job_id=f"{self.prefix}-{delivery}", job_timeout=JOB_TIMEOUT,
                               result_ttl=SEEN_TTL, failure_ttl=SEEN_TTL,
                               description=f"{work.kind} {work.repo}"
                                           + (f"#{work.number}" if work.number else ""))
        pipe = self.redis.pipeline()
        pipe.set(self.key("delivery", delivery), "enqueued", ex=SEEN_TTL)
        pipe.incr(self.key("metrics", "enqueued_total"))
        pipe.execute()
        if work.kind == "pull_request" and work.number is not None:
            self.supersede(work, job.id)
        return job

    # -- newest head wins ------------------------------------------------------------------------
    def pr_key(self, repo: str, number: int) -> str:
        return self.key("pr", repo.lower(), str(number))

    def supersede(self, work: Work, job_id: str) -> list[str]:
        """Make `work`'s head the pull request's current one; cancel queued jobs of older
        heads. Returns the ids cancelled."""
        key = self.pr_key(work.repo, work.number)
        previous = self.redis.hget(key, "head")
        self.redis.hset(key, mapping={"head": work.head_sha, "at": time.time()})
        self.redis.rpush(key + ":jobs", json.dumps([work.head_sha, job_id]))
        self.redis.expire(key, SEEN_TTL)
        self.redis.expire(key + ":jobs", SEEN_TTL)
        cancelled = []
        if previous is not None and previous.decode() != work.head_sha:
            for raw in self.redis.lrange(key + ":jobs", 0, -1):
                head, old_id = json.loads(raw)
                if head == work.head_sha:
                    continue
                job = fetch(old_id, self.redis) if exists(old_id, self.redis) else None
                if job is not None and job.get_status(refresh=True) in ("queued", "deferred",
                                                                        "scheduled"):
                    job.cancel()
                    cancelled.append(old_id)
        return cancelled

    def current_head(self, repo: str, number: int) -> str | None:
        value = self.redis.hget(self.pr_key(repo, number), "head")
        return value.decode() if value else None
