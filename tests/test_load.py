"""Load: 200 signed webhooks a second for 30 seconds at the real service (gunicorn, loopback,
real Redis), about 5% of them redelivered: every delivery must be answered and enqueued
exactly once, none lost. How fast the service answers is measured by
`bench/webhook_load.py`, not here (a test's timing is the machine's load, not FastCI's).
Bounded: it stops by itself. FASTCI_LOAD_SECONDS / FASTCI_LOAD_RATE change the shape."""

from __future__ import annotations

import os
import socket
import uuid

import pytest
from conftest import redis_or_skip, redis_url

from fastci.testing import webhook_load

pytestmark = pytest.mark.slow
SECRET = "load-secret"
SECONDS = float(os.environ.get("FASTCI_LOAD_SECONDS", 30))
RATE = float(os.environ.get("FASTCI_LOAD_RATE", 200))


def test_the_service_takes_200_deliveries_a_second_losing_none(tmp_path):
    client = redis_or_skip()
    prefix = f"fastci-load-{uuid.uuid4().hex[:8]}"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    try:
        with webhook_load.service(port, secret=SECRET, prefix=prefix, redis_url=redis_url(),
                                  workspace=tmp_path, log=tmp_path / "serve.log") as url:
            load = webhook_load.send(url, SECRET, SECONDS, RATE)
        print(f"\nload: {load.sends} sends ({load.sends - len(load.deliveries)} redelivered) "
              f"in {load.seconds:.1f} s = {load.rate:.0f}/s; answers {load.statuses}; "
              f"p99 {load.latency(0.99) * 1000:.0f} ms; failures {len(load.failures)}")
        assert not load.failures, load.failures[:5]
        total = len(load.deliveries)
        assert load.statuses == {202: total, 200: load.sends - total}
        queued = {job_id.removeprefix(f"{prefix}-") for job_id in
                  (j.decode() for j in client.lrange(f"rq:queue:{prefix}-cpu", 0, -1))}
        assert queued == set(load.deliveries)  # each delivery exactly once, none lost
        assert client.llen(f"rq:queue:{prefix}-cpu") == total
    finally:
        for key in client.scan_iter(f"*{prefix}*"):
            client.delete(key)
