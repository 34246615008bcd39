"""Faults a fleet has, each ending with complete, correct check runs: a redelivered webhook,
a worker killed mid-shard, GitHub answering 500 and rate-limiting, a run left open past its
deadline, deliveries that failed while Redis was down. Real Redis, real RQ workers in
subprocesses, the fake GitHub, a small real repository."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid

import pytest
from conftest import app_key_file, app_remote, artifact_service, redis_or_skip, redis_url
from fakegithub import FakeGitHub

from fastci.app import jobs, watchdog
from fastci.app.context import Context
from fastci.app.events import Work
from fastci.app.queue import Queues
from fastci.app.run_state import RunStore
from fastci.app.runs import watch
from fastci.app.settings import load
from fastci.testing.runs import finish, run_job

REPO, INSTALLATION, APP_ID, NUMBER = "octo/slow", 52, 6262, 9
FILES = {
    "pkg/__init__.py": "",
    "pkg/calc.py": "import time\n\n\ndef add(a, b):\n    time.sleep(float(__import__('os')"
                   ".environ.get('SLOW', '0')))\n    return a + b\n",
    "tests/test_calc.py": '''
        from pkg.calc import add


        def test_add():
            assert add(1, 2) == 3


        def test_add_again():
            assert add(2, 2) == 4
    ''',
}


@pytest.fixture
def world(tmp_path, monkeypatch):
    client = redis_or_skip()
    _, base, head, workspace = app_remote(tmp_path, REPO, FILES,
                                          ("pkg/calc.py", "return a + b", "return b + a"))
    keys, key_file = app_key_file(tmp_path)
    prefix = f"fastci-fault-{uuid.uuid4().hex[:8]}"
    env = {"FASTCI_APP_ID": str(APP_ID), "FASTCI_APP_PRIVATE_KEY_FILE": str(key_file),
           "FASTCI_WORKSPACE": str(workspace), "FASTCI_QUEUE_PREFIX": prefix,
           "FASTCI_CLONE_URL": str(tmp_path / "remote") + "/{repo}",
           "FASTCI_REDIS_URL": redis_url()}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with FakeGitHub() as fake, artifact_service(monkeypatch):
        monkeypatch.setenv("FASTCI_GITHUB_URL", fake.url)
        fake.register_app(APP_ID, keys.public)
        fake.add_repo(REPO, installation_id=INSTALLATION)
        fake.add_pull(REPO, NUMBER, head_sha=head, base_sha=base)
        workers = Workers(tmp_path, {**os.environ, "FASTCI_GITHUB_URL": fake.url})
        try:
            yield fake, client, prefix, base, head, workers
        finally:
            workers.stop()
    for key in client.scan_iter(f"*{prefix}*"):
        client.delete(key)


class Workers:
    """`fastci worker --gpu 0` processes, started and killed on demand."""

    def __init__(self, tmp, env) -> None:
        self.tmp, self.env, self.procs = tmp, env, []

    def start(self, env: dict | None = None) -> subprocess.Popen:
        log = open(self.tmp / f"worker{len(self.procs)}.log", "w")
        proc = subprocess.Popen([sys.executable, "-m", "fastci", "worker", "--gpu", "0"],
                                env={**self.env, **(env or {})}, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def pull(head, base) -> Work:
    return Work("pull_request", REPO, INSTALLATION, number=NUMBER, head_sha=head,
                base_sha=base, head_repo=REPO, sender="octocat", mode="run_all")


def runs_by_name(fake) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for run in fake.check_runs(REPO):
        out.setdefault(run["name"], []).append(run)
    return out


def test_a_redelivered_or_retried_job_makes_one_set_of_check_runs(world):
    fake, client, prefix, base, head, workers = world
    workers.start()
    work = pull(head, base)
    started = jobs.handle(work.to_json(), "delivery-1")
    assert started["status"] == "running"  # the job returned; the run goes on without it
    during = jobs.handle(work.to_json(), "delivery-1")  # a redelivery while it runs
    assert during["status"] == "in flight" and during["run"] == started["run"]
    first = finish(started)
    again = jobs.handle(work.to_json(), "delivery-1")  # RQ retry, or a redelivery
    assert first["status"] == "completed" and first["failed"] == 0
    assert again["status"] == "already completed"
    runs = runs_by_name(fake)
    assert [len(runs[n]) for n in ("FastCI selection", "FastCI regressions")] == [1, 1]
    assert runs["FastCI regressions"][0]["conclusion"] == "success"


def test_one_selection_worker_has_several_pull_requests_in_flight(world):
    """The selection job enqueues its shards and returns: while the first pull request's
    shard still runs, the same worker has selected and sharded a second one. Each run ends
    by itself, advanced as its shard ends."""
    fake, client, prefix, base, head, workers = world
    fake.add_pull(REPO, NUMBER + 1, head_sha=head, base_sha=base)
    workers.start({"SLOW": "8", "FASTCI_SANDBOX_ENV": "SLOW"})  # a shard takes 16 s
    first = jobs.handle(pull(head, base).to_json(), "delivery-first")
    second = jobs.handle({**pull(head, base).to_json(), "number": NUMBER + 1},
                         "delivery-second")
    assert first["status"] == second["status"] == "running", (first, second)
    from fastci.app.queue import fetch
    from fastci.app.run_state import RunStore

    store = RunStore(client, prefix)
    [shard] = store.load(first["run"]).jobs
    assert fetch(shard, client).get_status(refresh=True) in ("queued", "started")
    assert set(store.in_flight()) == {first["run"], second["run"]}
    for started in (first, second):
        outcome = finish(started, timeout=180)
        assert outcome["status"] == "completed" and outcome["failed"] == 0
    assert [r["conclusion"] for r in runs_by_name(fake)["FastCI regressions"]] == \
        ["success", "success"]


def test_a_newer_head_cancels_the_older_heads_run_while_its_shard_runs(world, tmp_path):
    """What a follower's poll used to notice: the webhook's newer push nudges the older
    head's run, whose advance cancels it at once, without waiting for its shard."""
    fake, client, prefix, base, head, workers = world
    from conftest import Project

    from fastci.app.queue import fetch

    remote = Project.at(tmp_path / "remote" / REPO)
    remote.edit("pkg/calc.py", "return b + a", "return (b + a)")
    newer = remote.commit("a newer push")
    workers.start({"SLOW": "8", "FASTCI_SANDBOX_ENV": "SLOW"})
    queues = Queues(client, prefix)
    old = Work(**{**pull(head, base).to_json(), "updated_at": "2024-01-02T10:00:00Z"})
    started = jobs.handle(*queues.enqueue(old, "delivery-old").args)  # as the webhook would
    assert started["status"] == "running"
    [shard] = RunStore(client, prefix).load(started["run"]).jobs
    fake.push(REPO, NUMBER, newer)
    queues.enqueue(Work(**{**old.to_json(), "head_sha": newer,
                           "updated_at": "2024-01-02T10:05:00Z"}), "delivery-new")
    outcome = finish(started, timeout=60)
    assert outcome["status"] == "superseded"
    assert fetch(shard, client).get_status(refresh=True) != "finished"  # it did not wait
    [regressions] = [r for r in runs_by_name(fake)["FastCI regressions"]
                     if r["head_sha"] == head]
    assert regressions["conclusion"] == "cancelled"
    assert "Superseded" in regressions["output"]["title"]


def test_a_run_whose_shard_never_comes_back_ends_at_its_deadline(world):
    """No runner takes the shard: the watchdog's nudge finds the run past its deadline, which
    cancels the shard and concludes its check run as timed out (nothing assumed passed)."""
    fake, client, prefix, base, head, workers = world
    from fastci.app.queue import fetch

    started = jobs.handle(pull(head, base).to_json(), "delivery-lost")
    store = RunStore(client, prefix)
    run = store.load(started["run"])
    [shard] = run.jobs
    run.deadline = time.time() - 1  # as if its 8 hours had passed
    store.save(run)
    outcome = finish(started, timeout=60,
                     on_poll=lambda: watchdog.nudge_runs(load(), client, every=1))
    assert outcome["status"] == "timed out"
    assert fetch(shard, client).get_status(refresh=True) == "canceled"
    [regressions] = runs_by_name(fake)["FastCI regressions"]
    assert regressions["conclusion"] == "timed_out" and "/fastci retest" in \
        regressions["output"]["summary"]
    assert store.in_flight() == []


def test_a_worker_killed_mid_shard_has_its_shard_run_elsewhere(world):
    fake, client, prefix, base, head, workers = world
    # its tests would take a minute (SLOW reaches them only because the runner allows it)
    doomed = workers.start({"SLOW": "30", "FASTCI_SANDBOX_ENV": "SLOW"})
    started = jobs.handle(pull(head, base).to_json(), "delivery-kill")
    assert started["status"] == "running"
    from rq.registry import StartedJobRegistry

    from fastci.app.queue import queue

    deadline = time.time() + 60
    shards = StartedJobRegistry(f"{prefix}-gpu-0", connection=client)
    while not shards.get_job_ids() and time.time() < deadline:
        time.sleep(0.2)
    assert shards.get_job_ids(), "the shard never started"
    time.sleep(1.0)
    os.killpg(doomed.pid, signal.SIGKILL)  # the runner dies mid-shard: no job's end says so
    doomed.wait()
    workers.start()  # a healthy runner joins
    # The watchdog's nudge is what notices: the shard runs again on the healthy runner.
    outcome = finish(started, timeout=180,
                     on_poll=lambda: watchdog.nudge_runs(load(), client, every=1))
    assert outcome["status"] == "completed" and outcome["failed"] == 0
    [regressions] = runs_by_name(fake)["FastCI regressions"]
    assert regressions["conclusion"] == "success"
    assert "**All 2 selected tests passed**" in regressions["output"]["summary"]
    assert queue(f"{prefix}-gpu-0", client).count == 0


def test_a_shard_abandoned_while_its_run_advances_is_run_again(world, monkeypatch):
    """The shard's worker, back from a Redis outage, fails its job as abandoned just after
    the run's advance has read the job as running (with its worker alive). The advance
    must not then read it again, find it failed and report its tests as failed: the
    abandoned shard is run again, by the advance that its worker's follow-up enqueues."""
    from rq.job import JobStatus
    from rq.serializers import JSONSerializer

    from fastci.app import shards
    from fastci.app.queue import FastCIJob, enqueue_advance, queue
    from fastci.app.serve import FastCIWorker

    fake, client, prefix, base, head, workers = world
    started = jobs.handle(pull(head, base).to_json(), "delivery-abandoned")
    assert started["status"] == "running"
    gpu = queue(f"{prefix}-gpu-0", client)
    [shard] = gpu.jobs  # no runner yet: it waits; as if one had taken it
    shard.meta.update(host=socket.gethostname(), pid=os.getpid())
    shard.save_meta()
    shard.set_status(JobStatus.STARTED)
    alive = shards.worker_alive

    def seen_alive_then_abandoned(ctx, job):
        if job.id != shard.id or job.get_status(refresh=True) != JobStatus.STARTED:
            return alive(ctx, job)
        runner = FastCIWorker([gpu], connection=client, job_class=FastCIJob,
                              serializer=JSONSerializer, prefix=prefix)
        runner._abandon(job, gpu)  # its worker's hand-back, right after this read
        return True

    monkeypatch.setattr(shards, "worker_alive", seen_alive_then_abandoned)
    enqueue_advance(client, prefix, started["run"], "a test")
    helper: list = []
    outcome = finish(started, timeout=180,
                     on_poll=lambda: helper or helper.append(workers.start()))
    assert outcome["status"] == "completed" and outcome["failed"] == 0, outcome
    [regressions] = runs_by_name(fake)["FastCI regressions"]
    assert regressions["conclusion"] == "success", regressions["output"]["summary"]
    assert "**All 2 selected tests passed**" in regressions["output"]["summary"]


def test_github_500s_and_rate_limits_are_retried_to_a_complete_run(world):
    fake, client, prefix, base, head, workers = world
    workers.start()
    fake.fail_next(2, status=502, method="POST", path="check-runs")
    fake.fail_next(2, status=500, method="PATCH", path="check-runs")
    fake.rate_limit_next(1, kind="secondary", method="PATCH", path="check-runs",
                         retry_after=1)
    result = run_job(pull(head, base).to_json(), "delivery-faults")
    assert result["status"] == "completed"
    runs = runs_by_name(fake)
    assert len(runs["FastCI selection"]) == 1 and len(runs["FastCI regressions"]) == 1
    assert runs["FastCI regressions"][0]["conclusion"] == "success"
    assert fake.attempts("PATCH", "check-runs") >= 3


def test_the_watchdog_concludes_runs_left_open_and_redelivers_lost_deliveries(world):
    fake, client, prefix, base, head, workers = world
    settings = load()
    from fastci.app import github

    gi = github.integration(settings)
    repo = github.for_installation(gi, INSTALLATION).get_repo(REPO)
    run = github.CheckRuns(repo).create("FastCI regressions", head)
    ctx = Context(settings, client, Queues(client, prefix), None, repo)
    watch(ctx, pull(head, base), run, seconds=-1)  # already past its deadline
    assert watchdog.conclude_stale_runs(settings, client, gi) == [run.id]
    [served] = fake.check_runs(REPO)
    assert served["conclusion"] == "timed_out" and "/fastci retest" in \
        served["output"]["summary"]
    assert watchdog.conclude_stale_runs(settings, client, gi) == []  # once only

    lost = fake.add_delivery("lost-1", "pull_request", action="opened", status_code=503,
                             installation_id=INSTALLATION)
    fake.add_delivery("fine-1", "pull_request", action="opened", status_code=202)
    reached = fake.add_delivery("reached-1", "pull_request", status_code=503)
    client.set(f"{prefix}:delivery:reached-1", "enqueued")  # it got through after all
    assert watchdog.redeliver_failed(settings, client, gi) == [lost]
    assert watchdog.redeliver_failed(settings, client, gi) == []  # asked once
    assert fake.redeliveries == [lost] and reached not in fake.redeliveries


def test_shards_spread_over_several_runners(world, monkeypatch):
    fake, client, prefix, base, head, workers = world
    monkeypatch.setenv("FASTCI_GPUS", "3")
    for gpu in range(3):
        workers.procs.append(subprocess.Popen(
            [sys.executable, "-m", "fastci", "worker", "--gpu", str(gpu)],
            env={**workers.env, "FASTCI_GPUS": "3"}, stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT, start_new_session=True))
    result = run_job(pull(head, base).to_json(), "delivery-spread")
    assert result["status"] == "completed" and result["selected"] == 2
    from rq.registry import FinishedJobRegistry

    from fastci.app.queue import fetch

    pids = {}
    for gpu in range(3):
        for job_id in FinishedJobRegistry(f"{prefix}-gpu-{gpu}", connection=client).get_job_ids():
            pids[gpu] = fetch(job_id, client).meta["pid"]
    assert len(pids) == 2 and len(set(pids.values())) == 2, (pids, result)  # two processes
    [regressions] = runs_by_name(fake)["FastCI regressions"]
    assert regressions["conclusion"] == "success"


def test_the_full_run_on_the_default_branch_audits_the_selection(world):
    fake, client, prefix, base, head, workers = world
    workers.start()
    refresh = Work("refresh", REPO, INSTALLATION, head_sha=head, base_ref="main")
    result = run_job(refresh.to_json(), "delivery-push")
    assert result["status"] == "recorded" and result["audited"] is True
    assert result["missed"] == []
    from fastci.runner.store import SqliteEvidenceStore

    with SqliteEvidenceStore(load().store_path) as store:
        [entry] = store.audits()
        assert head in store.commits_with_evidence()
    assert entry["kind"] == "full" and entry["commit"] == head and entry["base"] == base
    assert entry["total"] == 2 and entry["failed"] == []


def test_an_unreadable_evidence_store_runs_everything_and_says_why(world):
    fake, client, prefix, base, head, workers = world
    workers.start()
    store = load().store_path
    store.write_bytes(b"this is not an SQLite database, it was overwritten" * 100)
    result = run_job(pull(head, base).to_json().copy() | {"mode": "select"}, "d-corrupt")
    assert result["status"] == "completed" and result["selected"] == 2  # everything
    runs = runs_by_name(fake)
    [selection], [regressions] = runs["FastCI selection"], runs["FastCI regressions"]
    assert "could not be read" in selection["output"]["summary"]
    assert "every test runs" in selection["output"]["summary"]
    assert regressions["conclusion"] == "success", regressions["output"]["summary"]
    assert "Evidence was not stored" in regressions["output"]["summary"]
    assert store.read_bytes().startswith(b"this is not")  # nothing lost: left untouched
