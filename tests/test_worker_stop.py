"""A worker ends promptly: RQ's pubsub thread must not hold its shutdown.

Since redis-py 8.2, stopping a pubsub thread waits for its current read, and RQ reads for
60 s at a time, so every worker that had run a while (each App test's, each runner's) took
up to a minute to end (`FastCIWorker.subscribe` reads for a second). A hang guard, not a
performance figure.
"""

from __future__ import annotations

import time
import uuid

from rq import Queue

from fastci.app.queue import FastCIJob
from fastci.app.serve import PUBSUB_POLL, FastCIWorker


def test_a_worker_stops_its_pubsub_thread_without_waiting_a_minute(redis):
    prefix = f"fastci-stop-{uuid.uuid4().hex[:8]}"
    queue = Queue(f"{prefix}-cpu", connection=redis)
    worker = FastCIWorker([queue], connection=redis, job_class=FastCIJob, prefix=prefix)
    worker.subscribe()
    try:
        # As under load: the thread has read the channel's unsubscribe reply, and waits for
        # a new subscription (for its read time) before stop() clears its flag.
        time.sleep(0.3)
        worker.pubsub.unsubscribe()
        time.sleep(0.5)
        started = time.monotonic()
        worker.unsubscribe()
        assert time.monotonic() - started < 5 * PUBSUB_POLL
    finally:
        worker.pubsub_thread.join(timeout=120)
    assert not worker.pubsub_thread.is_alive()
