"""Which head of a pull request is current comes from the pull request (its events'
`updated_at`, then the API), never from the order deliveries arrive or jobs run. Through the
real webhook service (a WSGI server, real Redis) and the jobs themselves against the fake
GitHub."""

from __future__ import annotations

import json
import threading
import uuid

import pytest
import requests
from conftest import app_key_file, payload_path, redis_url
from fakegithub import FakeGitHub
from werkzeug.serving import make_server

from fastci.app import jobs
from fastci.app.events import Work
from fastci.app.queue import Queues, fetch
from fastci.app.settings import AppSettings, Secret
from fastci.app.signature import sign
from fastci.app.web import create_app

SECRET = "heads-secret"
REPO, NUMBER, INSTALLATION, APP_ID = "octo/widgets", 5, 7, 5150
OLD, NEW = "a" * 40, "b" * 40


@pytest.fixture
def world(redis, tmp_path, monkeypatch):
    prefix = f"fastci-heads-{uuid.uuid4().hex[:8]}"
    keys, key_file = app_key_file(tmp_path)
    for name, value in {"FASTCI_APP_ID": str(APP_ID),
                        "FASTCI_APP_PRIVATE_KEY_FILE": str(key_file),
                        "FASTCI_WORKSPACE": str(tmp_path / "ws"), "FASTCI_QUEUE_PREFIX": prefix,
                        "FASTCI_CLONE_URL": str(tmp_path / "remote") + "/{repo}",
                        "FASTCI_REDIS_URL": redis_url()}.items():
        monkeypatch.setenv(name, value)
    settings = AppSettings(webhook_secret=Secret(SECRET), workspace=tmp_path / "ws",
                           queue_prefix=prefix)
    server = make_server("127.0.0.1", 0, create_app(settings, redis), threaded=True)
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    with FakeGitHub() as fake:
        monkeypatch.setenv("FASTCI_GITHUB_URL", fake.url)
        fake.register_app(APP_ID, keys.public)
        fake.add_repo(REPO, installation_id=INSTALLATION)
        fake.add_pull(REPO, NUMBER, head_sha=OLD, base_sha="6" * 40)
        yield f"http://127.0.0.1:{server.server_port}", Queues(redis, prefix), fake
    server.shutdown()
    for key in redis.scan_iter(f"*{prefix}*"):
        redis.delete(key)


def synchronize(url: str, head: str, updated_at: str, delivery: str | None = None):
    payload = json.loads(payload_path("pull_request", "synchronize.json").read_bytes())
    payload["pull_request"]["head"]["sha"] = payload["after"] = head
    payload["pull_request"]["updated_at"] = updated_at
    body = json.dumps(payload).encode()
    return requests.post(f"{url}/webhooks", data=body, timeout=10, headers={
        "X-GitHub-Event": "pull_request", "X-GitHub-Delivery": delivery or str(uuid.uuid4()),
        "Content-Type": "application/json", "X-Hub-Signature-256": sign(SECRET, body)})


def test_a_late_older_synchronize_neither_cancels_the_newer_run_nor_becomes_current(world):
    """The older push's delivery failed (Redis was down) and GitHub redelivers it after the
    newer push's was enqueued: the newer head stays current, its job stays queued, and the
    older one's job, when it runs, does nothing."""
    url, queues, fake = world
    fake.push(REPO, NUMBER, NEW)
    newer = synchronize(url, NEW, "2024-01-02T10:05:00Z")
    older = synchronize(url, OLD, "2024-01-02T10:01:00Z")
    assert newer.status_code == older.status_code == 202, (newer.text, older.text)
    assert fetch(newer.json()["job"], queues.redis).get_status() == "queued"
    assert queues.current_head(REPO, NUMBER) == NEW
    stale = fetch(older.json()["job"], queues.redis)
    assert jobs.handle(*stale.args) == {"status": "superseded", "head": OLD}
    assert fake.check_runs(REPO) == []  # nothing was posted for the old head
    assert queues.current_head(REPO, NUMBER) == NEW


def test_a_newer_synchronize_cancels_the_older_heads_queued_job(world):
    url, queues, fake = world
    older = synchronize(url, OLD, "2024-01-02T10:01:00Z")
    newer = synchronize(url, NEW, "2024-01-02T10:05:00Z")
    assert fetch(older.json()["job"], queues.redis).get_status() == "canceled"
    assert fetch(newer.json()["job"], queues.redis).get_status() == "queued"
    assert queues.current_head(REPO, NUMBER) == NEW


def test_two_heads_at_one_instant_are_settled_by_the_api(world):
    """Equal `updated_at` (one second's resolution): nothing is cancelled, the head is in
    doubt, and the first job to run asks the pull request which head is current."""
    url, queues, fake = world
    fake.push(REPO, NUMBER, NEW)
    first = synchronize(url, NEW, "2024-01-02T10:05:00Z")
    second = synchronize(url, OLD, "2024-01-02T10:05:00Z")
    assert fetch(first.json()["job"], queues.redis).get_status() == "queued"
    assert fetch(second.json()["job"], queues.redis).get_status() == "queued"
    assert queues.current_head(REPO, NUMBER) is None  # in doubt
    stale = fetch(second.json()["job"], queues.redis)
    assert jobs.handle(*stale.args)["status"] == "superseded"
    assert queues.current_head(REPO, NUMBER) == NEW  # as the API said


def test_work_without_an_order_asks_the_api(world):
    """A check suite re-requested on an old commit carries no event order: it does not take
    the pull request over, and its job finds, through the API, that the head moved on."""
    url, queues, fake = world
    fake.push(REPO, NUMBER, NEW)
    rerequest = Work("pull_request", REPO, INSTALLATION, number=NUMBER, head_sha=OLD,
                     base_sha="6" * 40, base_ref="main", sender="someone")
    delivery = str(uuid.uuid4())
    assert queues.claim(delivery)
    queues.enqueue(rerequest, delivery)
    assert queues.current_head(REPO, NUMBER) is None
    assert jobs.handle(rerequest.to_json(), delivery)["status"] == "superseded"
    assert queues.current_head(REPO, NUMBER) == NEW


def test_a_malformed_updated_at_gets_a_422(world):
    url, queues, _ = world
    for bad in ("yesterday", "2024-01-02T10:05:00", "9" * 30):
        answer = synchronize(url, NEW, bad)
        assert answer.status_code == 422, answer.text
        assert "pull_request.updated_at" in answer.json()["message"]
    assert queues.cpu.count == 0
