"""deploy/redis/users.acl on a real redis-server (issue 11, route 1 and build step 8): the
runner's user cannot read or write the selection queue, an approval or the evidence store;
the webhook's user can enqueue but not read evidence or approve; nobody gets in without a
user."""

from __future__ import annotations

import shutil

import pytest
import redis
from attack_world import PASSWORD, acl_file
from conftest import RedisServer

from fastci.app.events import Work
from fastci.app.queue import Queues, queue
from fastci.runner.store import StoreError, open_store


@pytest.fixture
def server(tmp_path):
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    server = RedisServer(tmp_path, "--aclfile", str(acl_file(tmp_path)))
    try:
        yield server
    finally:
        server.stop()


def client(server, user: str | None) -> redis.Redis:
    auth = f"{user}:{PASSWORD}-{user}@" if user else ""
    return redis.Redis.from_url(f"redis://{auth}127.0.0.1:{server.port}/0")


def denied(call) -> bool:
    try:
        call()
    except (redis.exceptions.NoPermissionError, redis.exceptions.AuthenticationError,
            redis.exceptions.ResponseError) as exc:
        return "permission" in str(exc).lower() or "auth" in str(exc).lower() or \
            "NOPERM" in str(exc)
    return False


def test_each_role_reaches_only_its_own_keys(server):
    selection, web, runner = (client(server, u) for u in ("selection", "web", "runner"))
    with open_store(f"redis://selection:{PASSWORD}-selection@127.0.0.1:{server.port}/0"):
        pass  # the selection worker writes the store
    work = Work("pull_request", "octo/x", 1, number=2, head_sha="a" * 40, base_sha="b" * 40,
                updated_at="2024-01-02T10:00:00Z")
    Queues(web, "fastci").enqueue(work, "delivery-1")  # the webhook enqueues, keeping heads
    assert Queues(web, "fastci").current_head("octo/x", 2) == "a" * 40
    assert Queues(web, "fastci").head_at("octo/x", 2, 2e9) == ("a" * 40, [])
    assert queue("fastci-cpu", selection).count == 1
    queue("fastci-gpu-0", selection).enqueue("fastci.runner.execution.shard.pause", 0,
                                             job_id="fastci-shard-1")
    assert runner.llen("rq:queue:fastci-gpu-0") == 1  # a runner sees its own queue
    assert web.llen("rq:queue:fastci-gpu-0") == 1  # the dashboard counts, never reads, jobs
    web.set("fastci:dash:session:s", "{}")  # the dashboard's sessions

    for attempt in (
            lambda: runner.lrange("rq:queue:fastci-cpu", 0, -1),
            lambda: runner.rpush("rq:queue:fastci-cpu", "evil"),
            lambda: queue("fastci-cpu", runner).enqueue("fastci.app.jobs.handle", {}, "x"),
            lambda: runner.hgetall("rq:job:fastci-delivery-1"),
            lambda: runner.set("fastci:ok-to-test:octo/x:" + "f" * 40, "mallory"),
            lambda: runner.get("fastci:evidence:schema_version"),
            lambda: runner.set("fastci:evidence:inventory:" + "0" * 40, "poison"),
            lambda: runner.keys("*"),
            lambda: runner.flushall(),
            lambda: runner.config_get("requirepass"),
            lambda: runner.acl_list(),
            lambda: web.get("fastci:evidence:schema_version"),
            lambda: web.set("fastci:ok-to-test:octo/x:" + "f" * 40, "mallory"),
            lambda: web.lrange("rq:queue:fastci-gpu-0", 0, -1),
            lambda: web.rpush("rq:queue:fastci-gpu-0", "evil"),
            lambda: client(server, None).ping()):
        assert denied(attempt)
    assert not selection.exists("fastci:ok-to-test:octo/x:" + "f" * 40)
    assert selection.llen("rq:queue:fastci-cpu") == 1
    with pytest.raises(StoreError):  # the runner's user cannot open the store at all
        open_store(f"redis://runner:{PASSWORD}-runner@127.0.0.1:{server.port}/0")


def test_the_webhooks_user_scrapes_metrics_and_a_runner_writes_only_its_durations(server):
    from fastci.app import metrics

    selection, web, runner = (client(server, u) for u in ("selection", "web", "runner"))
    queue("fastci-gpu-0", selection).enqueue("fastci.runner.execution.shard.pause", 0,
                                             job_id="fastci-shard-2")
    selection.zadd("fastci:open-runs", {'{"id": 1, "name": "FastCI selection"}': 1e12})
    metrics.count_watchdog(selection, "fastci", "gc_ran")
    metrics.add_gpu_seconds(selection, "fastci", 5.0, 1.0)
    metrics.observe_job(runner, "fastci", "shard", 2.0)
    for attempt in (lambda: runner.hincrby("fastci:metrics:job_seconds:pull_request", "count", 1),
                    lambda: runner.hincrbyfloat("fastci:metrics:gpu_seconds", "saved", 1e9),
                    lambda: runner.hgetall("fastci:metrics:job_seconds:shard"),
                    lambda: runner.delete("fastci:metrics:job_seconds:shard"),
                    lambda: web.lrange("rq:queue:fastci-gpu-0", 0, -1),
                    lambda: web.lpop("rq:queue:fastci-gpu-0"),
                    lambda: web.zrem("fastci:open-runs", "x")):
        assert denied(attempt)
    families = {f.name: f for f in metrics.RedisCollector(
        web, "fastci", ["fastci-cpu", "fastci-gpu-0"]).collect()}
    assert families["fastci_redis_up"].samples[0].value == 1
    depth = {s.labels["queue"]: s.value for s in families["fastci_queue_jobs"].samples}
    assert depth == {"fastci-cpu": 0, "fastci-gpu-0": 1}
    assert families["fastci_runs_in_flight"].samples[0].value == 1
    shard = [s for s in families["fastci_job_duration_seconds"].samples
             if s.name.endswith("_count")]
    assert shard[0].value == 1


def test_a_runner_may_enqueue_advances_and_nothing_else_on_the_selection_side(server):
    """A runner's worker enqueues `advance(run)` when one of its jobs ends: its user may
    create advance jobs and push their ids on the advance queue, and neither read that
    queue nor pop from it, nor read any job there, nor touch a run's keys; the webhook's
    user may enqueue advances too (a newer head), and read no run."""
    from fastci.app.queue import enqueue_advance
    from fastci.app.run_state import Run, RunStore

    selection, web, runner = (client(server, u) for u in ("selection", "web", "runner"))
    store = RunStore(selection, "fastci")
    run = Run("a" * 32, "pull_request", "running", {"repo": "octo/x", "number": 2}, "h" * 40,
              "k", 2e9)
    store.save(run)
    by_runner = enqueue_advance(runner, "fastci", run.id, "a shard ended")
    by_web = enqueue_advance(web, "fastci", run.id, "a newer head")
    assert queue("fastci-advance", selection).job_ids == [by_runner, by_web]
    assert web.smembers("fastci:pr:octo/x:2:runs") == {run.id.encode()}  # to nudge them
    for attempt in (
            lambda: runner.lrange("rq:queue:fastci-advance", 0, -1),
            lambda: runner.lpop("rq:queue:fastci-advance"),
            lambda: runner.delete("rq:queue:fastci-advance"),
            lambda: runner.hgetall(f"rq:job:{by_web}"),
            lambda: runner.delete(f"rq:job:{by_web}"),
            lambda: runner.hset("rq:job:fastci-delivery-1", "status", "queued"),
            lambda: runner.srem("rq:queues", "rq:queue:fastci-cpu"),
            lambda: runner.smembers("rq:queues"),
            lambda: runner.get(f"fastci:run:{run.id}"),
            lambda: runner.set(f"fastci:run:{run.id}:dirty", 1),
            lambda: runner.set(f"fastci:run:{run.id}:lock", "mine"),
            lambda: runner.zrange("fastci:runs", 0, -1),
            lambda: runner.rpush("rq:queue:fastci-cpu", by_runner),
            lambda: web.get(f"fastci:run:{run.id}"),
            lambda: web.set(f"fastci:run:{run.id}:lock", "mine"),
            lambda: web.zrange("fastci:runs", 0, -1)):
        assert denied(attempt)
    assert store.load(run.id) == run
