"""A run as a state machine kept in Redis, so that no job waits for another.

The job that starts a run (a pull request's selection, a push's full recording) saves it,
enqueues the runner jobs it needs and returns. When a runner job ends, its worker enqueues
`advance(run id)` (`serve.FastCIWorker`), and so do the webhook (a newer head) and the
watchdog (every cycle, for runs in flight: a dead worker, a lost trigger, a deadline). An
advance re-reads the run and the runner jobs' status from Redis and moves the run on; the
data that drives it is only ever this side's (what it enqueued, what it validated), never an
argument a runner sent.

One advance at a time per run: an advance that finds the run locked marks it dirty and
returns at once; the holder, once done, looks again while it is dirty. The lock is a lease
(SET NX with an expiry), so a killed holder blocks the run for one lease at most. WATCH and
MULTI, never a script: every Redis user FastCI has may do that.

Keys, all under the deployment's prefix (the selection user's; the runner's user reaches
none of them):

    <prefix>:run:<id>              the Run as JSON
    <prefix>:run:<id>:request      what every shard of the run was sent (written once)
    <prefix>:run:<id>:result:<job> a runner job's validated summary (written once)
    <prefix>:run:<id>:lock         the advancing job's token, for a lease
    <prefix>:run:<id>:dirty        an advance came while it was locked
    <prefix>:runs                  runs in flight, scored by their deadline
    <prefix>:pr:<repo>:<n>:runs    a pull request's runs in flight (the webhook nudges them
                                   when a newer head arrives)
"""

from __future__ import annotations

import hashlib
import json
import re
import time
import uuid
from dataclasses import asdict, dataclass, field

from redis import Redis
from redis.exceptions import WatchError

SELECTING, REPLAYING, RUNNING = "selecting", "replaying", "running"
COMPLETED, CANCELLED, TIMED_OUT = "completed", "cancelled", "timed_out"
TERMINAL = (COMPLETED, CANCELLED, TIMED_OUT)

PULL_REQUEST, BACKGROUND, REFRESH = "pull_request", "background", "refresh"

RUN_ID = re.compile(r"[0-9a-f]{32}\Z")
KEPT = 7 * 24 * 3600  # seconds a run's keys stay after it was last written
LEASE = 15 * 60  # seconds an advance may hold a run before another may take it
RELEASE_TRIES = 5  # looks at a lock whose release was aborted, before leaving it held


# The runs this process holds, (prefix, run) -> token: a worker runs one job at a time, so
# after an outage took its job down, whatever is left here was stranded by that job.
_held: dict[tuple[str, str], str] = {}


def run_id(*parts: str) -> str:
    """A run's id: derived from what makes it one run (a redelivered or retried job finds
    the same run, never a second one), or random with no parts."""
    if not parts:
        return uuid.uuid4().hex
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


@dataclass
class Run:
    """One run. `jobs`: runner job id -> what this side enqueued (function, queue, tests,
    how many runs, done, replaced_by). `data`: what its kind needs to go on (check run ids,
    the selection, the evidence it was planned from)."""

    id: str
    kind: str
    state: str
    work: dict
    head: str
    key: str  # the external id of its check runs
    deadline: float
    jobs: dict = field(default_factory=dict)
    data: dict = field(default_factory=dict)
    outcome: dict | None = None
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    def pending(self) -> list[str]:
        """The runner jobs still awaited (not done, not replaced by a run again)."""
        return [j for j, info in self.jobs.items()
                if not info.get("done") and not info.get("replaced_by")]

    def current(self) -> list[str]:
        """The runner jobs whose result counts: every one not replaced by another."""
        return [j for j, info in self.jobs.items() if not info.get("replaced_by")]

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "Run":
        return cls(**data)


class RunStore:
    """The runs of one deployment (its queue prefix) in Redis."""

    def __init__(self, redis: Redis, prefix: str) -> None:
        self.redis, self.prefix = redis, prefix

    def key(self, run: str, *parts: str) -> str:
        return ":".join((self.prefix, "run", run, *parts))

    # -- the record ------------------------------------------------------------------------
    def create(self, run: Run) -> bool:
        """Save a new run; False if one with its id exists (the caller loads that one)."""
        return bool(self.redis.set(self.key(run.id), json.dumps(run.to_json()), nx=True,
                                   ex=KEPT))

    def load(self, run: str) -> Run | None:
        raw = self.redis.get(self.key(run)) if RUN_ID.match(str(run)) else None
        return Run.from_json(json.loads(raw)) if raw else None

    def save(self, run: Run) -> None:
        """Write the run (its advancer holds the lock); runs in flight are indexed by their
        deadline, for the watchdog, and by pull request, for the webhook."""
        run.updated = time.time()
        pipe = self.redis.pipeline()
        pipe.set(self.key(run.id), json.dumps(run.to_json()), ex=KEPT)
        if run.terminal:
            pipe.zrem(self.index(), run.id)
        else:
            pipe.zadd(self.index(), {run.id: run.deadline})
        number = run.work.get("number")
        if number is not None:
            pr = self.pull_request_key(run.work["repo"], number)
            if run.terminal:
                pipe.srem(pr, run.id)
            else:
                pipe.sadd(pr, run.id)
                pipe.expire(pr, KEPT)
        pipe.execute()

    def put_request(self, run: str, request: dict) -> None:
        self.redis.set(self.key(run, "request"), json.dumps(request), ex=KEPT)

    def request(self, run: str) -> dict:
        raw = self.redis.get(self.key(run, "request"))
        return json.loads(raw) if raw else {}

    def put_result(self, run: str, job: str, summary: dict) -> None:
        self.redis.set(self.key(run, "result", job), json.dumps(summary), ex=KEPT)

    def results(self, run: str, jobs: list[str]) -> dict[str, dict]:
        """job id -> its validated summary, for the jobs given that have one."""
        if not jobs:
            return {}
        raws = self.redis.mget([self.key(run, "result", j) for j in jobs])
        return {j: json.loads(raw) for j, raw in zip(jobs, raws) if raw}

    # -- who advances it -------------------------------------------------------------------
    def acquire(self, run: str, lease: float = LEASE) -> str | None:
        """A token if this caller now holds the run, else None (someone else does)."""
        token, held = uuid.uuid4().hex, (self.prefix, run)
        # Noted before asking: a SET that Redis applied but whose reply an outage lost
        # leaves a lock that only this process can know is its own (`free_stranded`).
        before, _held[held] = _held.get(held), token
        got = self.redis.set(self.key(run, "lock"), token, nx=True, ex=max(1, int(lease)))
        if not got:
            if before is None:
                del _held[held]
            else:
                _held[held] = before
            return None
        return token

    def release(self, run: str, token: str) -> None:
        """Drop the lock if it is still this token's (a lease may have passed to another).

        An aborted EXEC is no proof that the lock changed hands: Redis aborts a watched
        transaction while it shuts down too (12 of 30 shutdowns that met a loop of
        releases; `tests/test_run_state_release.py`), so it looks again. The process forgets
        the run only once Redis said the lock is gone or another's; a release that fails
        leaves it for `free_stranded`."""
        key = self.key(run, "lock")
        for _ in range(RELEASE_TRIES):
            with self.redis.pipeline() as pipe:
                try:
                    pipe.watch(key)
                    if pipe.get(key) == token.encode():
                        pipe.multi()
                        pipe.delete(key)
                        pipe.execute()
                    break
                except WatchError:
                    continue  # touched meanwhile: whose it is now, the next look says
        else:
            return  # touched at every look: still ours for all we know
        if _held.get((self.prefix, run)) == token:
            del _held[(self.prefix, run)]

    def free_stranded(self) -> list[str]:
        """Release the runs this process still holds under this prefix, and return their
        ids. Only for a worker whose job an outage took down (`serve.FastCIWorker`): the
        job's `release` failed with Redis, and without this the run would wait out the
        lease (up to 15 minutes) before any advance could move it."""
        runs = [run for prefix, run in list(_held) if prefix == self.prefix]
        for run in runs:
            self.release(run, _held[(self.prefix, run)])
        return runs

    def mark_dirty(self, run: str) -> None:
        self.redis.set(self.key(run, "dirty"), 1, ex=KEPT)

    def take_dirty(self, run: str) -> bool:
        """Whether an advance came while the run was held (and forget it)."""
        return bool(self.redis.delete(self.key(run, "dirty")))

    # -- indexes -----------------------------------------------------------------------------
    def index(self) -> str:
        return f"{self.prefix}:runs"

    def in_flight(self) -> list[str]:
        return [r.decode() for r in self.redis.zrange(self.index(), 0, -1)]

    def pull_request_key(self, repo: str, number: int) -> str:
        return f"{self.prefix}:pr:{repo.lower()}:{number}:runs"

    def of_pull_request(self, repo: str, number: int) -> list[str]:
        return sorted(r.decode() for r in self.redis.smembers(
            self.pull_request_key(repo, number)))
