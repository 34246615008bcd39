"""Putting work on RQ queues: at most once per delivery, the pull request's newest head wins.

Queues: `<prefix>-cpu` (selection, commands), `<prefix>-advance` (`advance(run id)`: moving
a run on when a runner job ends, taken by the selection workers first), `<prefix>-gpu-<n>`
(one per GPU: test shards and pruning's replays), `<prefix>-background` (convergence and perf
shards, taken by GPU workers only when their own queue is empty). A delivery is claimed in
Redis before it is enqueued and the claim is dropped if enqueueing fails, so a redelivery is
never lost and never doubled.

Every queue, job and worker here speaks JSON (`rq.serializers.JSONSerializer`), never pickle,
and a job runs only if its function is one of `JOBS`: a job anyone else put on a queue (an
unknown name, a bound method, a callback or a webhook) is refused and logged, never imported.
Runners may put one kind of job on one queue: `advance` on `<prefix>-advance`, whose only
argument is a run id; the selection worker refuses anything else there (`serve.FastCIWorker`)
and `advance` re-reads everything it acts on from this side's own keys.
"""

from __future__ import annotations

import importlib
import json
import logging
import re
import time
import uuid

from redis import Redis
from redis.exceptions import WatchError
from rq import Queue
from rq.job import Job
from rq.serializers import JSONSerializer

from fastci.runner.errors import FastCIError

from . import metrics, schema
from .events import Work

log = logging.getLogger("fastci.app")

# The only functions a FastCI worker runs: job name -> (module, attribute).
ADVANCE = "fastci.app.advance.advance"
JOBS = {
    "fastci.app.jobs.handle": ("fastci.app.jobs", "handle"),
    ADVANCE: ("fastci.app.advance", "advance"),
    "fastci.runner.execution.shard.run_shard": ("fastci.runner.execution.shard", "run_shard"),
    "fastci.runner.execution.shard.pause": ("fastci.runner.execution.shard", "pause"),
    "fastci.runner.execution.replays.run_replays": ("fastci.runner.execution.replays",
                                                    "run_replays"),
}


QUEUE_SUFFIX = re.compile(r"-(cpu|advance|background|gpu-\d+)$")  # a queue name, less its prefix


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
ADVANCE_TIMEOUT = 3600  # an advance validates, publishes and stores; it never waits
ADVANCE_KEPT = 3600  # seconds a finished advance job stays in Redis


def advance_queue_name(prefix: str) -> str:
    return f"{prefix}-advance"


def advance_job_id(prefix: str) -> str:
    """Advance jobs' ids share a prefix: the runners' Redis user may create only those."""
    return f"{prefix}-advance-{uuid.uuid4().hex}"


def enqueue_advance(redis: Redis, prefix: str, run: str, why: str) -> str:
    """Put `advance(run)` on the advance queue (any role may: it only makes the selection
    side look again); returns the job's id."""
    job = queue(advance_queue_name(prefix), redis).enqueue(
        ADVANCE, run, job_id=advance_job_id(prefix), job_timeout=ADVANCE_TIMEOUT,
        result_ttl=ADVANCE_KEPT, failure_ttl=SEEN_TTL, description=f"advance {run[:12]} ({why})")
    return job.id


class Queues:
    def __init__(self, redis: Redis, prefix: str = "fastci", gpus: int = 1) -> None:
        self.redis, self.prefix, self.gpus = redis, prefix, gpus
        self.cpu = queue(f"{prefix}-cpu", redis)
        self.advances = queue(advance_queue_name(prefix), redis)
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

    # -- the pull request's head, in GitHub's order ------------------------------------------------
    def pr_key(self, repo: str, number: int) -> str:
        return self.key("pr", repo.lower(), str(number))

    def supersede(self, work: Work, job_id: str) -> list[str]:
        """Note `work`'s job under its head. If its event is newer than any seen for the pull
        request (by the payload's `pull_request.updated_at`, never by arrival or run order),
        its head becomes the current one and queued jobs of other heads are cancelled. A late
        or redelivered older event changes nothing; two heads at the same instant leave the
        head in doubt, and work without an order changes nothing: their jobs ask the API
        (`settle`). Returns the ids cancelled."""
        key = self.pr_key(work.repo, work.number)
        self.redis.rpush(key + ":jobs", json.dumps([work.head_sha, job_id]))
        self.redis.expire(key + ":jobs", SEEN_TTL)
        try:
            at = schema.timestamp(work.updated_at) if work.updated_at else None
        except (ValueError, OverflowError):
            at = None  # the webhook checked it; a job from elsewhere carries no order
        if at is None:
            return []
        self._note_head(key, work.head_sha, at)
        if not self._advance(key, work.head_sha, at, from_event=True):
            return []
        cancelled = []
        for raw in self.redis.lrange(key + ":jobs", 0, -1):
            head, old_id = json.loads(raw)
            if head == work.head_sha:
                continue
            job = fetch(old_id, self.redis) if exists(old_id, self.redis) else None
            if job is not None and job.get_status(refresh=True) in ("queued", "deferred",
                                                                    "scheduled"):
                job.cancel()
                cancelled.append(old_id)
        # Runs of older heads already running: each advance sees the newer head and
        # cancels its run (what a follower's poll used to notice).
        for run in sorted(self.redis.smembers(key + ":runs")):
            enqueue_advance(self.redis, self.prefix, run.decode(), "a newer head")
        return cancelled

    HEADS_KEPT = 100

    def _note_head(self, key: str, head: str, at: float) -> None:
        """The pull request's heads as its events showed them, by their time: what an
        approval is checked against (head_at)."""
        pipe = self.redis.pipeline()
        pipe.zadd(key + ":heads", {json.dumps([head, at]): at})
        pipe.zremrangebyrank(key + ":heads", 0, -self.HEADS_KEPT - 1)
        pipe.expire(key + ":heads", SEEN_TTL)
        pipe.execute()

    def head_at(self, repo: str, number: int, when: float) -> tuple[str | None, list[str]]:
        """The pull request's head at `when` by its events (None when no event before `when`
        was seen, or two heads tie at the latest one), and the heads of events at or after
        `when` (a push after a comment; one in the same second counts as after).

        An event's `updated_at` is no earlier than its head change and no later than the
        next change, so the head of the latest event before `when` was the head at `when`,
        unless a later push's event has not arrived yet: callers compare with the API."""
        entries = [(json.loads(raw)[0], score) for raw, score in self.redis.zrange(
            self.pr_key(repo, number) + ":heads", 0, -1, withscores=True)]
        before = [(head, score) for head, score in entries if score < when]
        later = [head for head, score in entries if score >= when]
        if not before:
            return None, later
        latest = max(score for _, score in before)
        heads = {head for head, score in before if score == latest}
        return (heads.pop() if len(heads) == 1 else None), later

    def settle(self, repo: str, number: int, head: str, at: float) -> None:
        """The head the API gave (at its `updated_at`) is current, unless an event newer than
        that answer was seen meanwhile."""
        self._advance(self.pr_key(repo, number), head, at, from_event=False)

    def _advance(self, key: str, head: str, at: float, from_event: bool) -> bool:
        """Make `head` current if `at` is later than the stored head's time (or the head is in
        doubt and the API answers); True when it became current. Two different heads at the
        same instant from events leave it in doubt. WATCH, not a script: the webhook's Redis
        user may not run scripts."""
        with self.redis.pipeline() as pipe:
            while True:
                try:
                    pipe.watch(key)
                    stored, when, doubt = pipe.hmget(key, "head", "updated", "doubt")
                    stored_head = stored.decode() if stored else None
                    when = float(when) if when is not None else None
                    newer = when is None or at > when or (doubt and not from_event
                                                          and at >= when)
                    pipe.multi()
                    if newer:
                        pipe.hset(key, mapping={"head": head, "updated": at,
                                                "at": time.time()})
                        pipe.hdel(key, "doubt")
                    elif from_event and at == when and head != stored_head:
                        pipe.hset(key, "doubt", 1)
                    pipe.expire(key, SEEN_TTL)
                    pipe.execute()
                    return newer
                except WatchError:
                    continue

    def current_head(self, repo: str, number: int) -> str | None:
        """The pull request's current head as its events ordered them; None when unknown or
        in doubt (two heads at one instant): then only the API can say."""
        head, doubt = self.redis.hmget(self.pr_key(repo, number), "head", "doubt")
        return head.decode() if head and not doubt else None
