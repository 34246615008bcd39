"""Nothing but FastCI's own jobs runs on a FastCI worker (issue 11, route 1): a job put on a
queue by anyone else (an unknown function, a pickled job, a job with callbacks) is refused
and logged, never imported or unpickled; and no message prints a Redis password."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest
from conftest import redis_or_skip, redis_url
from rq import Callback, Queue
from rq.serializers import JSONSerializer

from fastci.app.queue import fetch
from fastci.runner.store import StoreError, open_store


@pytest.fixture
def gpu_queue(tmp_path):
    client = redis_or_skip()
    prefix = f"fastci-q-{uuid.uuid4().hex[:8]}"
    yield client, prefix, f"{prefix}-gpu-0"
    for key in client.scan_iter(f"*{prefix}*"):
        client.delete(key)


def test_jobs_from_anyone_else_are_refused_and_logged(gpu_queue, tmp_path):
    client, prefix, name = gpu_queue
    marker = tmp_path / "ran"
    command = f"touch {marker}"
    as_json = Queue(name, connection=client, serializer=JSONSerializer)
    as_pickle = Queue(name, connection=client)  # RQ's default: pickle
    jobs = {
        "unknown name": as_json.enqueue("os.system", command),
        "pickled": as_pickle.enqueue("fastci.runner.execution.shard.pause", 0),
        "pickled unknown": as_pickle.enqueue(os.system, command),
        "callback": as_json.enqueue("fastci.runner.execution.shard.pause", 0,
                                    on_success=Callback("os.system"),
                                    on_failure=Callback("os.system")),
    }
    log = tmp_path / "worker.log"
    subprocess.run([sys.executable, "-m", "fastci", "worker", "--gpu", "0", "--burst"],
                   env={**os.environ, "FASTCI_QUEUE_PREFIX": prefix,
                        "FASTCI_REDIS_URL": redis_url(),
                        "FASTCI_RUNNER_DIR": str(tmp_path / "runner")},
                   stdout=open(log, "w"), stderr=subprocess.STDOUT, timeout=120, check=True)
    text = log.read_text()
    assert not marker.exists()
    statuses = {what: fetch(job.id, client).get_status() for what, job in jobs.items()}
    assert statuses == {"unknown name": "failed", "pickled": "failed",
                        "pickled unknown": "failed", "callback": "finished"}, text[-2000:]
    assert "'os.system' is not a FastCI job" in text
    assert "carried callbacks or webhooks; dropped" in text


def test_a_redis_password_never_reaches_a_message():
    secret = "hunter2-" + uuid.uuid4().hex
    with pytest.raises(StoreError) as info:
        open_store(f"redis://fastci:{secret}@127.0.0.1:1/0?prefix=x")
    assert secret not in str(info.value) and "redis://***@127.0.0.1:1/0" in str(info.value)
