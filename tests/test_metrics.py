"""GET /metrics, served by prometheus-client and parsed with its parser: the service's own
counters summed over gunicorn's workers (multiprocess mode), and what workers, runners and the
watchdog counted in Redis, read at scrape time."""

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
from conftest import payload_path, redis_or_skip
from prometheus_client.parser import text_string_to_metric_families
from redis import Redis
from werkzeug.serving import make_server

from fastci.app import metrics
from fastci.app.events import Work
from fastci.app.queue import Queues, queue
from fastci.app.serve import prepare_metrics_dir
from fastci.app.settings import AppSettings, Secret
from fastci.app.signature import sign
from fastci.app.web import create_app
from fastci.testing.webhook_load import wait_for_health

SECRET = "metrics-secret"


def scrape(url: str) -> dict:
    """(sample name, sorted labels) -> value, from the exposition as Prometheus reads it."""
    response = requests.get(f"{url}/metrics", timeout=10)
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(response.text)
            for s in family.samples}


def post(url: str, body: bytes, delivery: str | None = None, signature: str | None = None):
    return requests.post(f"{url}/webhooks", data=body, timeout=10, headers={
        "X-GitHub-Event": "pull_request", "X-GitHub-Delivery": delivery or str(uuid.uuid4()),
        "Content-Type": "application/json",
        "X-Hub-Signature-256": signature or sign(SECRET, body)})


def _cleanup(redis: Redis, prefix: str) -> None:
    for pattern in (f"{prefix}*", f"rq:*{prefix}*"):
        for key in redis.scan_iter(pattern):
            redis.delete(key)


@pytest.fixture
def prefix():
    redis = redis_or_skip()
    name = f"fastci-metrics-{uuid.uuid4().hex[:8]}"
    yield name
    _cleanup(redis, name)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def gunicorn(tmp_path, prefix):
    """`fastci serve` with two workers and its own multiprocess folder."""
    port = _free_port()
    folder = tmp_path / "prometheus"
    env = {**os.environ, "FASTCI_WEBHOOK_SECRET": SECRET, "FASTCI_QUEUE_PREFIX": prefix,
           "FASTCI_WORKSPACE": str(tmp_path), "PROMETHEUS_MULTIPROC_DIR": str(folder)}
    folder.mkdir()
    (folder / "counter_99999999.db").write_bytes(b"a previous run's file")  # must be emptied
    log = open(tmp_path / "serve.log", "w")
    server = subprocess.Popen([sys.executable, "-m", "fastci", "serve", "--bind",
                               f"127.0.0.1:{port}", "--workers", "2"], env=env, stdout=log,
                              stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_health(url, server, tmp_path / "serve.log")
        yield url, folder, server
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
        log.close()


def test_gunicorn_workers_sum_their_counters_in_multiprocess_mode(gunicorn, prefix):
    url, folder, _ = gunicorn
    body = payload_path("pull_request", "opened.json").read_bytes()
    sent = 24
    with requests.Session():
        threads = [threading.Thread(target=post, args=(url, body)) for _ in range(sent)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    post(url, b"{}", signature="sha256=" + "0" * 64)  # refused: a bad signature
    duplicate = str(uuid.uuid4())
    post(url, body, delivery=duplicate)
    post(url, body, delivery=duplicate)
    requests.get(f"{url}/nowhere", timeout=5)
    # Several scrapes land on different workers; each must see every worker's counts.
    pids_seen = {p.name.split("_")[-1] for p in folder.glob("counter_*.db")}
    assert "99999999.db" not in pids_seen, "the previous run's files were not removed"
    assert len(pids_seen) >= 1
    for _ in range(6):
        samples = scrape(url)
        enqueued = ("fastci_deliveries_total", (("outcome", "enqueued"), ("status", "202")))
        assert samples[enqueued] == sent + 1
        assert samples[("fastci_deliveries_total",
                        (("outcome", "duplicate"), ("status", "200")))] == 1
        assert samples[("fastci_deliveries_total",
                        (("outcome", "refused"), ("status", "401")))] == 1
        assert samples[("fastci_requests_total", (("status", "404"),))] == 1
        assert samples[("fastci_enqueued_total", ())] == sent + 1  # from Redis
        assert samples[("fastci_queue_jobs", (("queue", f"{prefix}-cpu"),))] == sent + 1
        assert samples[("fastci_redis_up", ())] == 1


def test_a_killed_worker_is_replaced_and_its_counts_kept(gunicorn):
    url, folder, server = gunicorn
    body = payload_path("pull_request", "opened.json").read_bytes()
    for _ in range(4):
        assert post(url, body).status_code == 202
    workers = {int(p.name.split("_")[-1][:-3]) for p in folder.glob("counter_*.db")}
    os.kill(workers.pop(), signal.SIGKILL)  # gunicorn's child_exit hook marks it dead
    time.sleep(1.5)
    assert server.poll() is None
    key = ("fastci_deliveries_total", (("outcome", "enqueued"), ("status", "202")))
    assert all(scrape(url)[key] == 4 for _ in range(4))


@pytest.fixture
def werkzeug_service(tmp_path, prefix):
    redis = redis_or_skip()
    settings = AppSettings(webhook_secret=Secret(SECRET), workspace=tmp_path,
                           queue_prefix=prefix, gpus=2)
    server = make_server("127.0.0.1", 0, create_app(settings, redis), threaded=True)
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}", redis
    server.shutdown()


def test_what_workers_count_in_redis_is_read_at_scrape_time(werkzeug_service, prefix):
    url, redis = werkzeug_service
    for seconds in (0.5, 3.0, 3.0, 100.0):
        metrics.observe_job(redis, prefix, "pull_request", seconds)
    metrics.observe_job(redis, prefix, "shard", 99999.0)
    metrics.add_gpu_seconds(redis, prefix, saved=120.5, ran=30.0)
    metrics.add_gpu_seconds(redis, prefix, saved=10.0, ran=-1.0)  # never negative
    for action in ("concluded_stale_run", "redelivery_asked", "redelivery_asked"):
        metrics.count_watchdog(redis, prefix, action)
    for name in ("FastCI selection", "FastCI regressions", "FastCI regressions"):
        redis.zadd(f"{prefix}:open-runs", {json.dumps({"id": uuid.uuid4().hex, "name": name}):
                                           time.time() + 60})
    queue(f"{prefix}-gpu-1", redis).enqueue("fastci.runner.execution.shard.pause", 0)

    samples = scrape(url)
    hist = "fastci_job_duration_seconds"
    assert samples[(f"{hist}_count", (("kind", "pull_request"),))] == 4
    assert samples[(f"{hist}_sum", (("kind", "pull_request"),))] == pytest.approx(106.5)
    assert samples[(f"{hist}_bucket", (("kind", "pull_request"), ("le", "1.0")))] == 1
    assert samples[(f"{hist}_bucket", (("kind", "pull_request"), ("le", "5.0")))] == 3
    assert samples[(f"{hist}_bucket", (("kind", "pull_request"), ("le", "+Inf")))] == 4
    assert samples[(f"{hist}_bucket", (("kind", "shard"), ("le", "21600.0")))] == 0
    assert samples[(f"{hist}_bucket", (("kind", "shard"), ("le", "+Inf")))] == 1
    assert (f"{hist}_count", (("kind", "refresh"),)) not in samples  # no such job yet
    assert samples[("fastci_gpu_seconds_saved_total", ())] == pytest.approx(130.5)
    assert samples[("fastci_gpu_seconds_total", (("kind", "run"),))] == pytest.approx(30.0)
    assert samples[("fastci_watchdog_actions_total",
                    (("action", "redelivery_asked"),))] == 2
    assert samples[("fastci_watchdog_actions_total", (("action", "concluded_stale_run"),))] == 1
    assert samples[("fastci_watchdog_actions_total", (("action", "gc_ran"),))] == 0
    assert samples[("fastci_runs_in_flight", (("check", "FastCI regressions"),))] == 2
    assert samples[("fastci_runs_in_flight", (("check", "FastCI selection"),))] == 1
    assert samples[("fastci_queue_jobs", (("queue", f"{prefix}-gpu-1"),))] == 1
    assert samples[("fastci_queue_jobs", (("queue", f"{prefix}-gpu-0"),))] == 0
    assert samples[("fastci_queue_jobs", (("queue", f"{prefix}-background"),))] == 0


def test_a_worker_times_each_job_by_kind(prefix):
    from rq.serializers import JSONSerializer

    from fastci.app.queue import FastCIJob
    from fastci.app.serve import FastCIWorker

    redis = redis_or_skip()
    gpu = queue(f"{prefix}-gpu-0", redis)
    gpu.enqueue("fastci.runner.execution.shard.pause", 0)
    Queues(redis, prefix).enqueue(Work("installation", "octo/x", 1, mode="created"), "d-1")
    # FastCI's worker: RQ's own waited up to a minute for its pubsub thread at the end of
    # a burst (`FastCIWorker.subscribe`), which made this test take 60 s one run in two.
    worker = FastCIWorker([queue(f"{prefix}-cpu", redis), gpu], connection=redis,
                          job_class=FastCIJob, serializer=JSONSerializer, prefix=prefix)
    worker.work(burst=True)
    collector = metrics.RedisCollector(redis, prefix, [])
    families = {f.name: f for f in collector.collect()}
    counts = {s.labels["kind"]: s.value for s in families["fastci_job_duration_seconds"].samples
              if s.name.endswith("_count")}
    assert counts == {"installation": 1, "other": 1}


def test_redis_down_is_a_scrape_that_says_so(tmp_path):
    down = Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.5)
    app = create_app(AppSettings(webhook_secret=Secret(SECRET), workspace=tmp_path), down)
    response = app.test_client().get("/metrics")
    assert response.status_code == 200
    samples = {s.name: s.value for f in text_string_to_metric_families(response.get_data(
        as_text=True)) for s in f.samples}
    assert samples["fastci_redis_up"] == 0
    metrics.observe_job(down, "fastci", "shard", 1.0)  # never raises
    metrics.count_watchdog(down, "fastci", "gc_ran")
    metrics.add_gpu_seconds(down, "fastci", 1.0, 1.0)


def test_the_multiprocess_folder_is_prepared_before_use(tmp_path):
    env: dict = {}
    made = prepare_metrics_dir(env)
    assert env["PROMETHEUS_MULTIPROC_DIR"] == made and os.path.isdir(made)
    folder = tmp_path / "p"
    folder.mkdir()
    (folder / "gauge_livesum_1.db").write_bytes(b"x")
    (folder / "keep.txt").write_text("not ours")
    env = {"PROMETHEUS_MULTIPROC_DIR": str(folder)}
    assert prepare_metrics_dir(env) == str(folder)
    assert sorted(p.name for p in folder.iterdir()) == ["keep.txt"]


def test_job_kinds():
    assert metrics.job_kind("fastci.app.jobs.handle", [{"kind": "pull_request"}, "d"]) == \
        "pull_request"
    assert metrics.job_kind("fastci.app.jobs.handle", [{"kind": "evil\n"}, "d"]) == "other"
    assert metrics.job_kind("fastci.runner.execution.shard.run_shard", []) == "shard"
    assert metrics.job_kind("fastci.runner.execution.replays.run_replays", []) == "replay"
    assert metrics.job_kind("fastci.app.advance.advance", ["0" * 32]) == "advance"
    assert metrics.job_kind("fastci.app.background.follow_background", []) == "other"  # gone
    assert metrics.outcome_of(202, "ignored: closed") == "ignored"
    assert metrics.outcome_of(503, "x") == "unavailable"
