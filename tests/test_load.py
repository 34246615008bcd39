"""Load: at least 200 signed webhooks a second for 30 seconds at the real service (gunicorn,
loopback, real Redis), about 5% of them redelivered; every delivery must be enqueued exactly
once, none lost. Bounded: it stops by itself. FASTCI_LOAD_SECONDS / FASTCI_LOAD_RATE change
the shape (the defaults are the requirement)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid

import pytest
import requests
from conftest import payload_path, redis_or_skip, redis_url

from fastci.app.signature import sign

pytestmark = pytest.mark.slow
SECRET = "load-secret"
SECONDS = float(os.environ.get("FASTCI_LOAD_SECONDS", 30))
RATE = float(os.environ.get("FASTCI_LOAD_RATE", 200))
DUPLICATES = 0.05
SENDERS = 24


def test_the_service_holds_200_deliveries_a_second_losing_none(tmp_path):
    client = redis_or_skip()
    template = json.loads(payload_path("pull_request", "synchronize.json").read_bytes())
    prefix = f"fastci-load-{uuid.uuid4().hex[:8]}"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "FASTCI_WEBHOOK_SECRET": SECRET, "FASTCI_QUEUE_PREFIX": prefix,
           "FASTCI_WORKSPACE": str(tmp_path), "FASTCI_REDIS_URL": redis_url()}
    log = open(tmp_path / "serve.log", "w")
    server = subprocess.Popen([sys.executable, "-m", "fastci", "serve", "--bind",
                               f"127.0.0.1:{port}", "--workers", "2"], env=env, stdout=log,
                              stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}/webhooks"
    try:
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                requests.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
                break
            except requests.RequestException:
                time.sleep(0.2)
        total = int(SECONDS * RATE)
        deliveries = [str(uuid.uuid4()) for _ in range(total)]
        # Every 20th send repeats an earlier delivery (GitHub's redelivery keeps the GUID).
        sends = []
        for i, delivery in enumerate(deliveries):
            sends.append((i, delivery))
            if i % int(1 / DUPLICATES) == 7:
                sends.append((i, deliveries[i // 2]))
        statuses: dict[int, int] = {}
        failures: list[str] = []
        lock = threading.Lock()
        cursor = iter(range(len(sends)))
        start = time.perf_counter() + 0.5
        step = SECONDS / len(sends)

        def sender() -> None:
            session = requests.Session()
            while True:
                with lock:
                    k = next(cursor, None)
                if k is None:
                    return
                wait = start + k * step - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
                number, delivery = sends[k]
                body = dict(template)
                body["number"] = number + 1
                body["pull_request"] = {**template["pull_request"], "number": number + 1}
                data = json.dumps(body).encode()
                try:
                    response = session.post(url, data=data, timeout=10, headers={
                        "X-GitHub-Event": "pull_request", "X-GitHub-Delivery": delivery,
                        "Content-Type": "application/json",
                        "X-Hub-Signature-256": sign(SECRET, data)})
                    with lock:
                        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
                        if response.status_code not in (200, 202):
                            failures.append(f"{response.status_code} {response.text[:100]}")
                except requests.RequestException as exc:
                    with lock:
                        failures.append(repr(exc)[:200])

        threads = [threading.Thread(target=sender) for _ in range(SENDERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=SECONDS + 120)
        elapsed = time.perf_counter() - start
        rate = len(sends) / elapsed
        print(f"\nload: {len(sends)} deliveries ({len(sends) - total} redelivered) in "
              f"{elapsed:.1f} s = {rate:.0f}/s; answers {statuses}; failures {len(failures)}")
        assert not failures, failures[:5]
        assert rate >= RATE * 0.95, f"only {rate:.0f} deliveries/s were sent and answered"
        assert statuses == {202: total, 200: len(sends) - total}
        queued = {job_id.removeprefix(f"{prefix}-") for job_id in
                  (j.decode() for j in client.lrange(f"rq:queue:{prefix}-cpu", 0, -1))}
        assert queued == set(deliveries)  # each delivery exactly once, none lost
        assert client.llen(f"rq:queue:{prefix}-cpu") == total
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=20)
        for key in client.scan_iter(f"*{prefix}*"):
            client.delete(key)
