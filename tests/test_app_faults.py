"""Faults a fleet has, each ending with complete, correct check runs: a redelivered webhook,
a worker killed mid-shard, GitHub answering 500 and rate-limiting, a run left open past its
deadline, deliveries that failed while Redis was down. Real Redis, real RQ workers in
subprocesses, the fake GitHub, a small real repository."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest
from conftest import app_key_file, app_remote, artifact_service, redis_or_skip, redis_url
from fakegithub import FakeGitHub

from fastci.app import jobs, watchdog
from fastci.app.context import Context
from fastci.app.events import Work
from fastci.app.queue import Queues
from fastci.app.runs import watch
from fastci.app.settings import load

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
    first = jobs.handle(work.to_json(), "delivery-1")
    again = jobs.handle(work.to_json(), "delivery-1")  # RQ retry, or a redelivery
    assert first["status"] == "completed" and first["failed"] == 0
    assert again["status"] == "already completed"
    runs = runs_by_name(fake)
    assert [len(runs[n]) for n in ("FastCI selection", "FastCI regressions")] == [1, 1]
    assert runs["FastCI regressions"][0]["conclusion"] == "success"


def test_a_worker_killed_mid_shard_has_its_shard_run_elsewhere(world):
    fake, client, prefix, base, head, workers = world
    # its tests would take a minute (SLOW reaches them only because the runner allows it)
    doomed = workers.start({"SLOW": "30", "FASTCI_SANDBOX_ENV": "SLOW"})
    outcome = {}
    thread = threading.Thread(target=lambda: outcome.update(
        jobs.handle(pull(head, base).to_json(), "delivery-kill")))
    thread.start()
    from rq.registry import StartedJobRegistry

    from fastci.app.queue import queue

    deadline = time.time() + 60
    started = StartedJobRegistry(f"{prefix}-gpu-0", connection=client)
    while not started.get_job_ids() and time.time() < deadline:
        time.sleep(0.2)
    assert started.get_job_ids(), "the shard never started"
    time.sleep(1.0)
    os.killpg(doomed.pid, signal.SIGKILL)  # the runner dies mid-shard
    doomed.wait()
    workers.start()  # a healthy runner joins
    thread.join(timeout=180)
    assert not thread.is_alive()
    assert outcome["status"] == "completed" and outcome["failed"] == 0
    [regressions] = runs_by_name(fake)["FastCI regressions"]
    assert regressions["conclusion"] == "success"
    assert "**All 2 selected tests passed**" in regressions["output"]["summary"]
    assert queue(f"{prefix}-gpu-0", client).count == 0


def test_github_500s_and_rate_limits_are_retried_to_a_complete_run(world):
    fake, client, prefix, base, head, workers = world
    workers.start()
    fake.fail_next(2, status=502, method="POST", path="check-runs")
    fake.fail_next(2, status=500, method="PATCH", path="check-runs")
    fake.rate_limit_next(1, kind="secondary", method="PATCH", path="check-runs",
                         retry_after=1)
    result = jobs.handle(pull(head, base).to_json(), "delivery-faults")
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
    result = jobs.handle(pull(head, base).to_json(), "delivery-spread")
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
    result = jobs.handle(refresh.to_json(), "delivery-push")
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
    result = jobs.handle(pull(head, base).to_json().copy() | {"mode": "select"}, "d-corrupt")
    assert result["status"] == "completed" and result["selected"] == 2  # everything
    runs = runs_by_name(fake)
    [selection], [regressions] = runs["FastCI selection"], runs["FastCI regressions"]
    assert "could not be read" in selection["output"]["summary"]
    assert "every test runs" in selection["output"]["summary"]
    assert regressions["conclusion"] == "success", regressions["output"]["summary"]
    assert "Evidence was not stored" in regressions["output"]["summary"]
    assert store.read_bytes().startswith(b"this is not")  # nothing lost: left untouched
