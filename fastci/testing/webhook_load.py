"""Signed webhooks at a steady rate against a running webhook service, for the load test
(nothing lost, each delivery enqueued once) and `bench/webhook_load.py` (how fast, how late).

About 5% of the sends repeat an earlier delivery's GUID, as GitHub's redelivery does. Each
pull request number is new, so no delivery supersedes another.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import requests

from fastci.app.signature import sign

from . import FIXTURES

TEMPLATE = FIXTURES / "payloads" / "pull_request" / "synchronize.json"


@dataclass
class Load:
    """What was sent and how it was answered."""

    deliveries: list[str]  # the distinct GUIDs, each sent at least once
    sends: int
    seconds: float  # from the first send's slot to the last answer
    statuses: dict[int, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)  # seconds, per answered send

    @property
    def rate(self) -> float:
        return self.sends / self.seconds if self.seconds else 0.0

    def latency(self, quantile: float) -> float:
        """The answer time below which `quantile` of the answered sends fell, in seconds."""
        if not self.latencies:
            return float("nan")
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(quantile * len(ordered)))]


def plan(total: int, duplicates: float = 0.05) -> tuple[list[str], list[tuple[int, str]]]:
    """`total` GUIDs and the sends: (pull request index, GUID), every 1/duplicates-th one
    followed by a repeat of an earlier GUID."""
    guids = [str(uuid.uuid4()) for _ in range(total)]
    every = max(1, round(1 / duplicates)) if duplicates else 0
    sends = []
    for i, guid in enumerate(guids):
        sends.append((i, guid))
        if every and i % every == 7 % every:
            sends.append((i, guids[i // 2]))
    return guids, sends


def send(url: str, secret: str, seconds: float, rate: float, *, duplicates: float = 0.05,
         senders: int = 24, template: Path = TEMPLATE) -> Load:
    """Send int(seconds * rate) deliveries (plus the repeats) spread evenly over `seconds`
    from `senders` threads; a sender that falls behind sends at once."""
    body_of = json.loads(template.read_bytes())
    guids, sends = plan(int(seconds * rate), duplicates)
    load = Load(guids, len(sends), 0.0)
    lock = threading.Lock()
    cursor = iter(range(len(sends)))
    start = time.perf_counter() + 0.5
    step = seconds / len(sends)

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
            number, guid = sends[k]
            body = dict(body_of, number=number + 1)
            body["pull_request"] = {**body_of["pull_request"], "number": number + 1}
            data = json.dumps(body).encode()
            sent = time.perf_counter()
            try:
                response = session.post(url, data=data, timeout=10, headers={
                    "X-GitHub-Event": "pull_request", "X-GitHub-Delivery": guid,
                    "Content-Type": "application/json",
                    "X-Hub-Signature-256": sign(secret, data)})
            except requests.RequestException as exc:
                with lock:
                    load.failures.append(repr(exc)[:200])
                continue
            with lock:
                load.latencies.append(time.perf_counter() - sent)
                load.statuses[response.status_code] = load.statuses.get(
                    response.status_code, 0) + 1
                if response.status_code not in (200, 202):
                    load.failures.append(f"{response.status_code} {response.text[:100]}")

    threads = [threading.Thread(target=sender, daemon=True) for _ in range(senders)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=seconds + 120)
    load.seconds = time.perf_counter() - start
    return load


def wait_for_health(url: str, proc: subprocess.Popen, log: Path, seconds: float = 30) -> None:
    """Until the service at `url` answers /healthz; its log's tail in the error if it died
    or did not answer within `seconds`."""
    deadline = time.time() + seconds
    while True:
        try:
            requests.get(f"{url}/healthz", timeout=1)
            return
        except requests.RequestException:
            if time.time() > deadline or proc.poll() is not None:
                raise RuntimeError(f"the service did not start: {log.read_text()[-2000:]}"
                                   ) from None
            time.sleep(0.2)


@contextmanager
def service(port: int, *, secret: str, prefix: str, redis_url: str, workspace: Path,
            log: Path, workers: int = 2):
    """`fastci serve` (gunicorn) on 127.0.0.1:`port`, answering /healthz; yields the
    webhook URL, and stops the service's process group on the way out."""
    env = {**os.environ, "FASTCI_WEBHOOK_SECRET": secret, "FASTCI_QUEUE_PREFIX": prefix,
           "FASTCI_WORKSPACE": str(workspace), "FASTCI_REDIS_URL": redis_url}
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "fastci", "serve", "--bind",
                                 f"127.0.0.1:{port}", "--workers", str(workers)], env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for_health(f"http://127.0.0.1:{port}", proc, log)
        yield f"http://127.0.0.1:{port}/webhooks"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        proc.wait(timeout=20)
