"""A runner that forges the one thing it may put on the selection side: `advance(run)` on the
advance queue (issue 12, item 5). Real Redis with deploy/'s ACL users, a real runner worker
(`fastci worker --gpu 0`, the runner's user), two real selection workers racing for the
advances (`fastci worker --cpu`), the fake GitHub and a small real repository.

While a pull request's shard still runs, the runner's user floods advances for its run,
sends some for runs that do not exist, puts a job of another function on the advance queue,
and pushes there the id of a real job that already ran. None of it changes the run: no
result, no conclusion, no second run of anything. When the shard really ends, the run
publishes once and stores once; more advances afterwards change nothing either.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest
import redis
from attack_world import PASSWORD, acl_file, github_with_pull, key_file, selection_side
from conftest import RedisServer, app_remote
from test_app_faults import FILES

from fastci.app import jobs, ledger
from fastci.app.events import Work
from fastci.app.queue import Queues, enqueue_advance, fetch, queue
from fastci.app.run_state import RunStore
from fastci.app.settings import load
from fastci.runner.store import open_store

pytestmark = pytest.mark.slow

REPO, INSTALLATION, APP_ID, NUMBER = "octo/advanced", 81, 8181, 6
PREFIX = "fastci"  # the ACL file's; the server is this test's own


@pytest.fixture
def world(tmp_path, monkeypatch):
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    server = RedisServer(tmp_path, "--aclfile", str(acl_file(tmp_path)))
    url = f"redis://selection:{PASSWORD}-selection@127.0.0.1:{server.port}/0"
    runner_url = f"redis://runner:{PASSWORD}-runner@127.0.0.1:{server.port}/0"
    keys, key = key_file(tmp_path)
    _, base, head, workspace = app_remote(tmp_path, REPO, FILES,
                                          ("pkg/calc.py", "return a + b", "return b + a"))
    selection_side(monkeypatch, tmp_path, key, workspace, PREFIX, url, APP_ID)
    procs = []
    try:
        with github_with_pull(monkeypatch, keys.public, REPO, INSTALLATION, NUMBER, head,
                              base, APP_ID) as fake:
            runner_env = {k: v for k, v in os.environ.items()
                          if not k.startswith(("FASTCI_APP_", "FASTCI_ARTIFACT_SECRET"))}
            for name, args, env in (
                    ("runner", ["--gpu", "0"], {**runner_env, "FASTCI_REDIS_URL": runner_url,
                                                "SLOW": "12", "FASTCI_SANDBOX_ENV": "SLOW",
                                                "FASTCI_RUNNER_DIR": str(tmp_path / "rd")}),
                    ("cpu-1", ["--cpu"], dict(os.environ)),
                    ("cpu-2", ["--cpu"], dict(os.environ))):
                log = tmp_path / f"{name}.log"
                procs.append((subprocess.Popen(
                    [sys.executable, "-m", "fastci", "worker", *args], env=env,
                    stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True),
                    log))
            selection = redis.Redis.from_url(url)
            runner = redis.Redis.from_url(runner_url)
            yield fake, selection, runner, base, head, procs
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        server.stop()


def wait(predicate, timeout: float, what: str, procs) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    logs = "\n".join(f"--- {log.name}\n{log.read_text()[-2500:]}" for _, log in procs)
    raise AssertionError(f"timed out waiting for {what}\n{logs}")


def concluded(fake) -> int:
    """PATCHes that concluded a check run."""
    return sum(1 for r in fake.requests if r.method == "PATCH" and "check-runs" in r.path
               and isinstance(r.json, dict) and r.json.get("conclusion"))


def test_forged_advances_change_nothing_and_the_run_publishes_once(world):
    fake, selection, runner, base, head, procs = world
    store = RunStore(selection, PREFIX)
    advances = queue(f"{PREFIX}-advance", selection)
    # A real job that ran on the selection side: its id, pushed again, must not run again.
    queues = Queues(selection, PREFIX)
    done_job = queues.enqueue(Work("installation", REPO, INSTALLATION, mode="created"), "d-0")
    wait(lambda: done_job.get_status(refresh=True) == "finished", 60, "a selection job", procs)

    work = Work("pull_request", REPO, INSTALLATION, number=NUMBER, head_sha=head,
                base_sha=base, head_repo=REPO, sender="octocat", mode="run_all")
    started = jobs.handle(work.to_json(), "delivery-advanced")
    assert started["status"] == "running", started
    run_id = started["run"]
    [shard] = store.load(run_id).jobs
    wait(lambda: fetch(shard, selection).get_status(refresh=True) == "started", 60,
         "the shard to start", procs)
    before = concluded(fake)

    # The runner's user forges what it can: advances for this run, for runs that do not
    # exist and for no run at all, a job of another function on the advance queue, and the
    # id of a job that already ran.
    for _ in range(200):
        enqueue_advance(runner, PREFIX, run_id, "forged")
    enqueue_advance(runner, PREFIX, uuid.uuid4().hex, "no such run")
    enqueue_advance(runner, PREFIX, "../../etc/passwd", "not a run id")
    forged = Work("pull_request", REPO, INSTALLATION, number=NUMBER, head_sha=head,
                  base_sha=base, head_repo=REPO, sender="mallory", mode="run_all")
    queue(f"{PREFIX}-advance", runner).enqueue(
        "fastci.app.jobs.handle", forged.to_json(), "evil", job_id=f"{PREFIX}-advance-evil")
    runner.rpush(f"rq:queue:{PREFIX}-advance", done_job.id)
    wait(lambda: advances.count == 0, 120, "the selection workers to take every advance",
         procs)
    time.sleep(1.0)  # the last ones taken finish
    assert fetch(shard, selection).get_status(refresh=True) == "started", \
        "the shard ended before the forged advances were all handled: lengthen SLOW"
    run = store.load(run_id)
    assert run.state == "running" and not run.jobs[shard]["done"]
    assert store.results(run_id, [shard]) == {}
    assert concluded(fake) == before
    regressions = {r["name"]: r for r in fake.check_runs(REPO)}["FastCI regressions"]
    assert regressions["status"] == "in_progress"
    assert fetch(f"{PREFIX}-advance-evil", selection).get_status() == "queued"  # never ran
    assert len(fetch(done_job.id, selection).results()) == 1  # never ran again
    logs = "".join(log.read_text() for _, log in procs)
    assert f"refused job {PREFIX}-advance-evil" in logs
    assert f"refused job {done_job.id}" in logs

    # The shard really ends while forged advances keep coming, so the two selection workers
    # race over advances of a run whose last shard is in: it publishes once.
    flooding = threading.Event()

    def flood() -> None:
        while not flooding.is_set():
            enqueue_advance(runner, PREFIX, run_id, "forged, racing")
            time.sleep(0.01)

    flooder = threading.Thread(target=flood, daemon=True)
    flooder.start()
    try:
        wait(lambda: store.load(run_id).terminal, 180, "the run to end", procs)
        time.sleep(2.0)
    finally:
        flooding.set()
        flooder.join()
    wait(lambda: advances.count == 0, 120, "the racing advances", procs)
    time.sleep(1.0)
    run = store.load(run_id)
    assert run.outcome["status"] == "completed" and run.outcome["failed"] == 0, run.outcome
    assert run.data["steps"] == ["evidence", "metrics", "ledger"]
    assert sorted(r["name"] for r in fake.check_runs(REPO)) == [
        "FastCI regressions", "FastCI selection"]  # mallory's job made none
    runs = {r["name"]: r for r in fake.check_runs(REPO)}
    assert runs["FastCI regressions"]["conclusion"] == "success"
    after = concluded(fake)
    assert after == before + 1  # the regressions run, concluded once

    def stored() -> tuple:
        with open_store(load().store_path, create=False) as evidence:
            outcomes = evidence.outcomes()
            return (head in evidence.commits_with_evidence(),
                    sorted(len(v) for v in outcomes.values()))

    assert stored() == (True, [2, 2])  # the base's run and this one: stored once
    entries = ledger.runs(selection, PREFIX, REPO)
    assert len(entries) == 1 and entries[0]["head"] == head
    gpu = {k.decode(): float(v) for k, v in
           selection.hgetall(f"{PREFIX}:metrics:gpu_seconds").items()}

    # More advances once it ended: nothing moves.
    for _ in range(50):
        enqueue_advance(runner, PREFIX, run_id, "forged, late")
    wait(lambda: advances.count == 0, 120, "the late advances", procs)
    time.sleep(1.0)
    assert concluded(fake) == after
    assert stored() == (True, [2, 2])
    assert len(ledger.runs(selection, PREFIX, REPO)) == 1
    assert {k.decode(): float(v) for k, v in
            selection.hgetall(f"{PREFIX}:metrics:gpu_seconds").items()} == gpu
    assert json.loads(selection.get(store.key(run_id)))["outcome"] == run.outcome
