"""Redis restarts in the middle of a pull request's run: the shard keeps running, the
selection worker waits for Redis, and the check runs still complete correctly. A Redis
server of the test's own (on a free port, persisting to a temporary folder) is stopped and
started again; the shared one on 6379 is never touched."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid

import pytest
import redis as redis_lib
from conftest import app_key_file, app_remote, artifact_service, redis_url
from fakegithub import FakeGitHub
from test_app_faults import APP_ID, FILES, INSTALLATION, NUMBER, REPO, pull, runs_by_name

from fastci.app.queue import Queues

pytestmark = pytest.mark.slow


def start_redis(port: int, folder) -> subprocess.Popen:
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                             "--dir", str(folder), "--appendonly", "yes", "--save", ""],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis_lib.Redis(port=port)
    for _ in range(100):
        try:
            client.ping()
            return proc
        except redis_lib.exceptions.ConnectionError:
            time.sleep(0.05)
    raise AssertionError("redis-server did not start")


def worker_story(log) -> str:
    """A worker log's own lines, without the tracebacks between them (each traceback's last
    line kept): what a failed run's message needs to say which path each worker took."""
    lines = log.read_text().splitlines()
    kept = [line for i, line in enumerate(lines) if line[:4].isdigit()
            or (i + 1 < len(lines) and lines[i + 1][:4].isdigit() and not line.startswith(" "))]
    return f"--- {log.name}\n" + "\n".join(kept)[-6000:]


@pytest.mark.parametrize("moment", ["a shard runs", "the selection job holds the run"])
def test_a_redis_restart_mid_run_still_ends_in_complete_check_runs(tmp_path, monkeypatch,
                                                                   moment):
    """While a shard runs, or while the selection job is between opening the regressions
    check run and saving the run it started (it holds the run's lock then, and the run's
    shards are not yet on record): both jobs are handed back, the lock freed, and the run
    still completes, with one check run of each kind."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    redis_dir = tmp_path / "redis"
    redis_dir.mkdir()
    server = start_redis(port, redis_dir)
    url = f"redis://127.0.0.1:{port}/0"
    _, base, head, workspace = app_remote(tmp_path, REPO, FILES,
                                          ("pkg/calc.py", "return a + b", "return b + a"))
    keys, key_file = app_key_file(tmp_path)
    prefix = f"fastci-restart-{uuid.uuid4().hex[:8]}"
    procs = []
    monkeypatch.setenv("FASTCI_WORKSPACE", str(workspace))  # the bundles' service serves it
    with FakeGitHub() as fake, artifact_service(monkeypatch):
        fake.register_app(APP_ID, keys.public)
        fake.add_repo(REPO, installation_id=INSTALLATION)
        fake.add_pull(REPO, NUMBER, head_sha=head, base_sha=base)
        held = fake.hold("POST", r"/check-runs$", body={"name": "FastCI regressions"})
        if moment != "the selection job holds the run":
            held.release()
        env = {**os.environ, "FASTCI_APP_ID": str(APP_ID),
               "FASTCI_APP_PRIVATE_KEY_FILE": str(key_file),
               "FASTCI_WORKSPACE": str(workspace), "FASTCI_QUEUE_PREFIX": prefix,
               "FASTCI_CLONE_URL": str(tmp_path / "remote") + "/{repo}",
               "FASTCI_REDIS_URL": url, "FASTCI_GITHUB_URL": fake.url}
        try:
            for args, extra in ((["--cpu"], {}), (["--gpu", "0"], {"SLOW": "3",
                                                                "FASTCI_SANDBOX_ENV": "SLOW"})):
                log = open(tmp_path / f"worker{len(procs)}.log", "w")
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "fastci", "worker", *args], env={**env, **extra},
                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
            client = redis_lib.Redis.from_url(url)
            queues = Queues(client, prefix)
            delivery = str(uuid.uuid4())
            assert queues.claim(delivery)
            queues.enqueue(pull(head, base), delivery)
            if moment == "a shard runs":
                from rq.registry import StartedJobRegistry

                shards = StartedJobRegistry(f"{prefix}-gpu-0", connection=client)
                deadline = time.time() + 120
                while not shards.get_job_ids() and time.time() < deadline:
                    time.sleep(0.005)  # at once: the shard's first write is then lost too
                assert shards.get_job_ids(), (tmp_path / "worker0.log").read_text()[-2000:]
            else:
                assert held.arrived.wait(120), (tmp_path / "worker0.log").read_text()[-2000:]
            # Redis goes away (persisting its data), and comes back 3 s later.
            subprocess.run(["redis-cli", "-p", str(port), "shutdown"], check=False,
                           capture_output=True)
            if moment == "the selection job holds the run":
                held.release()  # the selection job goes on, into the outage
            server.wait(timeout=20)
            time.sleep(3)
            server = start_redis(port, redis_dir)

            def done():
                runs = runs_by_name(fake).get("FastCI regressions", [])
                return runs and runs[0]["status"] == "completed"

            deadline = time.time() + 180
            while not done() and time.time() < deadline:
                time.sleep(0.5)
            if not done():  # what the run was left as, then the workers' own account
                state = {key.decode(): (client.type(key).decode(), client.ttl(key),
                                        client.get(key)[:600] if client.type(key) == b"string"
                                        else None)
                         for key in client.scan_iter(f"{prefix}:run:*")}
                logs = "\n".join(worker_story(tmp_path / f"worker{i}.log") for i in range(2))
                pytest.fail(f"no completed regressions check run; run keys {state}\n{logs}")
        finally:
            for proc in procs:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=20)
    runs = runs_by_name(fake)
    assert len(runs["FastCI selection"]) == 1 and len(runs["FastCI regressions"]) == 1
    regressions = runs["FastCI regressions"][0]
    assert regressions["conclusion"] == "success", regressions["output"]["summary"]
    assert "All 2 selected tests passed" in regressions["output"]["summary"]


def test_a_worker_that_lost_redis_mid_job_hands_the_job_back(redis):
    """The worker's loop came back after an outage that took it down while RQ was running a
    shard: the process is alive, so nothing else would ever see that shard as orphaned. It
    fails the job as abandoned (which a run's advance answers by running it again) and tells
    the run; a job whose end RQ had recorded is left alone."""
    from rq.job import JobStatus
    from rq.serializers import JSONSerializer

    from fastci.app.queue import FastCIJob, advance_queue_name, queue
    from fastci.app.run_state import RUNNING, Run, RunStore, run_id
    from fastci.app.serve import FastCIWorker
    from fastci.app.shards import job_error

    prefix = f"fastci-handback-{uuid.uuid4().hex[:8]}"
    shards = queue(f"{prefix}-gpu-0", redis)
    try:
        # A run in flight: a runner's worker leaves it alone (its Redis user reads no run).
        RunStore(redis, prefix).save(Run(run_id("octo/repo", "x"), "pull_request", RUNNING,
                                         {"repo": "octo/repo"}, "x", "k", time.time() + 60))
        worker = FastCIWorker([shards], connection=redis, job_class=FastCIJob,
                              serializer=JSONSerializer, prefix=prefix)
        running = shards.enqueue("fastci.runner.execution.shard.run_shard", {"tests": []},
                                 meta={"run": "run-1"})
        running.set_status(JobStatus.STARTED)
        worker.fastci_running = (running, shards)
        worker.hand_back()
        assert running.get_status(refresh=True) == JobStatus.FAILED
        assert "abandoned" in job_error(running).lower()
        advances = queue(advance_queue_name(prefix), redis)
        assert [list(j.args) for j in advances.jobs] == [["run-1"]]  # JSON: a list

        finished = shards.enqueue("fastci.runner.execution.shard.run_shard", {"tests": []},
                                  meta={"run": "run-2"})
        finished.set_status(JobStatus.FINISHED)
        worker.fastci_running = (finished, shards)
        worker.hand_back()
        assert finished.get_status(refresh=True) == JobStatus.FINISHED
        assert len(advances.jobs) == 1
    finally:
        for key in redis.scan_iter(f"*{prefix}*"):
            redis.delete(key)
        for job in (locals().get("running"), locals().get("finished")):
            if job is not None:
                job.delete()


def test_a_worker_back_from_an_outage_frees_the_runs_its_job_held(redis):
    """The job held a run's lock when Redis went away (its `release` failed): the worker
    releases it and advances the run, instead of leaving it locked for a 15-minute lease,
    and advances every other run in flight too (as the watchdog's next cycle would). Its
    job, from the selection side's queue, is run again: it is idempotent."""
    from rq.job import JobStatus
    from rq.serializers import JSONSerializer

    from fastci.app.queue import FastCIJob, advance_queue_name, queue
    from fastci.app.run_state import RUNNING, Run, RunStore, run_id
    from fastci.app.serve import OUTAGE_REQUEUES, FastCIWorker

    prefix = f"fastci-stranded-{uuid.uuid4().hex[:8]}"
    selection = queue(f"{prefix}-cpu", redis)
    store = RunStore(redis, prefix)
    run = run_id("octo/repo", "abc", "delivery")
    other = run_id("octo/repo", "def", "delivery")
    try:
        store.save(Run(other, "pull_request", RUNNING, {"repo": "octo/repo"}, "def", "k",
                       time.time() + 60))
        worker = FastCIWorker([queue(advance_queue_name(prefix), redis), selection],
                              connection=redis, job_class=FastCIJob,
                              serializer=JSONSerializer, prefix=prefix)
        job = selection.enqueue("fastci.app.jobs.handle", {}, "delivery")
        for _ in range(OUTAGE_REQUEUES + 1):
            job.set_status(JobStatus.STARTED)
            assert store.acquire(run) is not None  # as the job did, before the outage
            worker.fastci_running = (job, selection)
            worker.hand_back()
            assert not redis.exists(store.key(run, "lock"))
            token = store.acquire(run, lease=5)  # anyone may advance it now
            assert token is not None
            store.release(run, token)
        advances = queue(advance_queue_name(prefix), redis)
        assert sorted(j.args[0] for j in advances.jobs) == sorted(
            [run, other] * (OUTAGE_REQUEUES + 1))
        # Requeued twice, then left failed: an outage each time is not a job to retry.
        assert job.get_status(refresh=True) == JobStatus.FAILED
        assert job.meta["outage_requeues"] == OUTAGE_REQUEUES
    finally:
        for key in redis.scan_iter(f"*{prefix}*"):
            redis.delete(key)
        if locals().get("job") is not None:
            job.delete()


def test_a_worker_whose_loop_ends_on_its_own_hands_back_and_goes_on(redis, monkeypatch):
    """RQ's loop ends on an error it logged while Redis answers again (a short outage, or
    any other fault): the process used to return and exit, leaving the run its job held
    locked until the lease ran out. It hands the run back and starts its loop again."""
    from fastci.app import serve
    from fastci.app.queue import advance_queue_name, queue
    from fastci.app.run_state import RunStore, run_id
    from fastci.app.settings import AppSettings

    prefix = f"fastci-loop-{uuid.uuid4().hex[:8]}"
    store = RunStore(redis, prefix)
    run = run_id("octo/repo", "abc", "delivery")
    loops = []

    def work(worker, burst=False, with_scheduler=False):  # noqa: ARG001 (RQ's signature)
        loops.append(worker)
        if len(loops) == 1:  # a job took the run's lock, then RQ's loop quit on an error
            assert store.acquire(run) is not None
            return True
        assert not redis.exists(store.key(run, "lock")), "the run was not handed back"
        worker.stopping = True  # the second loop: stopped as a service stops it
        return True

    monkeypatch.setattr(serve.FastCIWorker, "work", work)
    monkeypatch.setattr(serve, "RESTART_PAUSE", 0.0)
    settings = AppSettings(redis_url=redis_url(), queue_prefix=prefix)
    try:
        assert serve.work(cpu=True, settings=settings) is True
        assert len(loops) == 2
        advances = queue(advance_queue_name(prefix), redis)
        assert [j.args[0] for j in advances.jobs] == [run]
        token = store.acquire(run, lease=5)  # anyone may advance it now
        assert token is not None
        store.release(run, token)
    finally:
        for key in redis.scan_iter(f"*{prefix}*"):
            redis.delete(key)
