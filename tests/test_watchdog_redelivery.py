"""The watchdog asks GitHub to redeliver every failed delivery, whatever its status, over all
pages of the App's deliveries, within a retry budget with backoff, and records what it gave
up on (in /metrics, and for `fastci audit`). Against the fake GitHub and real Redis."""

from __future__ import annotations

import time
import uuid

import pytest
from conftest import app_key_file, redis_url
from fakegithub import FakeGitHub

from fastci.app import github, watchdog
from fastci.app.settings import AppSettings, Secret
from fastci.app.web import create_app

APP_ID = 5150


@pytest.fixture
def world(redis, tmp_path):
    keys, key_file = app_key_file(tmp_path)
    prefix = f"fastci-redeliver-{uuid.uuid4().hex[:8]}"
    with FakeGitHub() as fake:
        fake.register_app(APP_ID, keys.public)
        settings = AppSettings(app_id=APP_ID, private_key=Secret(keys.private),
                               github_url=fake.url, queue_prefix=prefix, workspace=tmp_path,
                               redelivery_attempts=3, redelivery_backoff=10.0,
                               webhook_secret=Secret("s"), redis_url=redis_url())
        yield fake, redis, settings, github.integration(settings)
    for key in redis.scan_iter(f"*{prefix}*"):
        redis.delete(key)


def test_every_failed_status_is_asked_for_over_all_pages(world):
    fake, redis, settings, gi = world
    failed = {code: fake.add_delivery(f"failed-{code}", "pull_request", action="synchronize",
                                      status_code=code) for code in (401, 400, 502, 0)}
    for i in range(230):  # the failed ones end up on the third page of 100
        fake.add_delivery(f"fine-{i}", "pull_request", status_code=202)
    asked = watchdog.redeliver_failed(settings, redis, gi)
    assert sorted(asked) == sorted(failed.values())
    assert fake.attempts("GET", "/app/hook/deliveries") == 3


def test_a_failing_redelivery_is_retried_with_backoff_then_given_up_and_recorded(world):
    fake, redis, settings, gi = world
    lost = fake.add_delivery("lost-1", "pull_request", action="opened", status_code=401)
    healed = fake.add_delivery("healed-1", "push", status_code=503)
    now = time.time()
    assert watchdog.redeliver_failed(settings, redis, gi, now) == [healed, lost]  # newest first
    fake.add_delivery("lost-1", "pull_request", action="opened", status_code=502,
                      redelivery=True)  # GitHub's redelivery failed too
    fake.add_delivery("healed-1", "push", status_code=202, redelivery=True)  # this one worked
    assert watchdog.redeliver_failed(settings, redis, gi, now + 5) == []  # backing off 10 s
    assert watchdog.redeliver_failed(settings, redis, gi, now + 11) == [lost]
    assert watchdog.redeliver_failed(settings, redis, gi, now + 25) == []  # now 20 s
    assert watchdog.redeliver_failed(settings, redis, gi, now + 32) == [lost]
    assert watchdog.redeliver_failed(settings, redis, gi, now + 200) == []  # 3 asks: given up
    assert watchdog.redeliver_failed(settings, redis, gi, now + 400) == []
    assert fake.redeliveries == [healed, lost, lost, lost]
    [record] = watchdog.given_up(redis, settings.queue_prefix)
    assert record["guid"] == "lost-1" and record["asked"] == 3
    assert record["status_code"] == 401 and record["event"] == "pull_request"

    metrics = create_app(settings, redis).test_client().get("/metrics").get_data(as_text=True)
    assert 'fastci_watchdog_actions_total{action="redelivery_asked"} 4.0' in metrics
    assert 'fastci_watchdog_actions_total{action="redelivery_gave_up"} 1.0' in metrics


def test_fastci_audit_lists_the_deliveries_given_up_on(world, library):
    fake, redis, settings, gi = world
    fake.add_delivery("lost-2", "issue_comment", action="created", status_code=500)
    for step in range(4):
        watchdog.redeliver_failed(settings, redis, gi, time.time() + 1000 * step)
    proc = library.fastci("audit", check=False, env={"FASTCI_REDIS_URL": redis_url(),
                                                     "FASTCI_QUEUE_PREFIX": settings.queue_prefix})
    assert "gave up redelivering 1 webhook delivery" in proc.stdout, proc.stdout + proc.stderr
    assert "lost-2" in proc.stdout and "issue_comment" in proc.stdout
    assert "Traceback" not in proc.stderr
