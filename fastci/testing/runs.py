"""Driving the App's runs to their end in a test: the selection side's advance jobs taken
here, by a real RQ worker (the one `fastci worker --cpu` runs), while real runner workers
run the shards elsewhere.

A job that starts a run returns at once (`fastci.app.run_state`): a test that wants the
run's outcome calls `finish` with what the job returned, which works the advance queue in
bursts until the run has ended, and gives the outcome the run kept.
"""

from __future__ import annotations

import time

from redis import Redis
from rq.serializers import JSONSerializer

from fastci.app.queue import FastCIJob, advance_queue_name, queue
from fastci.app.run_state import RunStore
from fastci.app.serve import FastCIWorker
from fastci.app.settings import AppSettings, load


class RunDidNotEnd(AssertionError):
    """A run still in flight after the time a test gave it."""


def finish(started: dict, timeout: float = 300.0, settings: AppSettings | None = None,
           on_poll=None) -> dict:
    """The outcome of the run that `started` (a job's return value) names, once it ended;
    `started` itself when it names none (the job ended it, or started nothing). `on_poll`
    is called between bursts (a test may nudge, kill or start workers there)."""
    run_id = started.get("run") if isinstance(started, dict) else None
    if run_id is None:
        return started
    settings = settings or load()
    redis = Redis.from_url(settings.redis_url)
    store = RunStore(redis, settings.queue_prefix)
    advances = queue(advance_queue_name(settings.queue_prefix), redis)
    worker = FastCIWorker([advances], connection=redis, job_class=FastCIJob,
                          serializer=JSONSerializer, prefix=settings.queue_prefix)
    deadline = time.monotonic() + timeout
    while True:
        worker.work(burst=True, with_scheduler=False)
        run = store.load(run_id)
        if run is not None and run.terminal:
            return {**run.outcome, "run": run_id}
        if time.monotonic() > deadline:
            raise RunDidNotEnd(f"run {run_id} is still {run.state if run else 'missing'} "
                               f"after {timeout:.0f} s: {run.to_json() if run else ''}"[:3000])
        if on_poll is not None:
            on_poll()
        time.sleep(0.2)


def run_job(work_json: dict, delivery: str, timeout: float = 300.0) -> dict:
    """`fastci.app.jobs.handle` for one delivery, then its run to the end: its outcome."""
    from fastci.app import jobs  # noqa: PLC0415

    return finish(jobs.handle(work_json, delivery), timeout)
