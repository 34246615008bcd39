"""Counts the seconds each RQ job spends in `time.sleep`, in Redis: loaded into the workers
that `bench/app_inflight.py` starts (`install`, before FastCI runs).

A job that waits for another job polls it, and polls sleep between looks (FastCI's old
`shards.follow`, `shards.wait_for` and the replay job's wait all did), so the seconds a job
sleeps are the seconds it spent blocked on another job, up to the few milliseconds each
look itself takes. Sleeps outside a job (a worker idling, reconnecting) are not counted.
Kept in `<prefix>:bench:slept`, a hash of job id -> seconds.
"""

from __future__ import annotations

import os
import time


def install() -> None:
    """Wrap `time.sleep` in this process (FastCI's modules call it as `time.sleep`)."""
    from redis import Redis
    from rq import get_current_job

    real = time.sleep
    client: list[Redis] = []
    key = f"{os.environ.get('FASTCI_QUEUE_PREFIX', 'fastci')}:bench:slept"

    def sleep(seconds: float) -> None:
        job = get_current_job()
        started = time.monotonic()
        real(seconds)
        if job is None:
            return
        if not client:
            client.append(Redis.from_url(os.environ["FASTCI_REDIS_URL"]))
        client[0].hincrbyfloat(key, job.id, time.monotonic() - started)

    time.sleep = sleep


def main(argv: list[str]) -> int:
    """`python bench/wait_probe.py worker --cpu`: the probe, then `fastci` with argv."""
    install()
    from fastci.cli import main as fastci

    return fastci(argv)


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
