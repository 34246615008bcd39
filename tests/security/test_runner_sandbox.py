"""A pull request's tests, run by a real runner worker as the sandbox user, try to reach the
App's key, the queues, the approvals, the evidence store and the mirror (issue 11, routes 1,
3 and 4). Every attempt fails, the selection side sees no effect, and the pull request's
tests still report their results."""

from __future__ import annotations

import json
import os
import uuid

import pytest
from attack_world import (
    APP_ID,
    INSTALLATION,
    NUMBER,
    PASSWORD,
    REPO,
    SANDBOX_USER,
    Runner,
    acl_file,
    github_with_pull,
    hostile_remote,
    key_file,
    selection_side,
    skip_unless_sandbox,
)
from conftest import RedisServer

from fastci.app.events import Work
from fastci.app.queue import queue
from fastci.app.settings import load
from fastci.testing.runs import run_job

pytestmark = pytest.mark.slow


@pytest.fixture(params=["sandboxed", "sandboxed, Redis ACL users"])
def world(tmp_path, monkeypatch, request):
    skip_unless_sandbox()
    if "ACL" in request.param:  # deploy/'s users: the runner's cannot reach the cpu queue
        server = RedisServer(tmp_path, "--aclfile", str(acl_file(tmp_path)))
        url = f"redis://selection:{PASSWORD}-selection@127.0.0.1:{server.port}/0"
        runner_url = f"redis://runner:{PASSWORD}-runner@127.0.0.1:{server.port}/0"
        prefix = "fastci"  # the ACL file's; the server is the test's own
    else:
        server = RedisServer(tmp_path, "--requirepass", PASSWORD)
        url = runner_url = f"redis://:{PASSWORD}@127.0.0.1:{server.port}/0"
        prefix = f"fastci-sec-{uuid.uuid4().hex[:8]}"
    keys, key = key_file(tmp_path)
    marker = tmp_path.parent / f"hook-ran-{prefix}"
    workspace = tmp_path / "workspace"
    mirror = workspace / "mirrors" / "octo__sandboxed.git"
    settings = json.dumps({
        "password": PASSWORD, "key": str(key), "mirror": str(mirror),
        "mirror_config": str(mirror / "config"), "store": str(workspace / "evidence.db"),
        "marker": str(marker), "guess": f"redis://127.0.0.1:{server.port}/0",
        "approval": f"{prefix}:ok-to-test:{REPO}:{'f' * 40}", "cpu": f"{prefix}-cpu"})
    _, base, head, _ = hostile_remote(tmp_path, settings)
    selection_side(monkeypatch, tmp_path, key, workspace, prefix, url, APP_ID)
    runner = None
    try:
        with github_with_pull(monkeypatch, keys.public, REPO, INSTALLATION, NUMBER, head,
                              base, APP_ID) as fake:
            # The runner holds the password and, carelessly, the App's own settings: the
            # sandbox, not the environment's hygiene, is what keeps them from the tests.
            sandbox = {"FASTCI_SANDBOX_USER": SANDBOX_USER,
                       "FASTCI_SANDBOX_HIDE": os.path.expanduser("~")}
            runner = Runner(tmp_path, {**os.environ, "FASTCI_REDIS_URL": runner_url, **(
                sandbox if request.param.startswith("sandboxed") else {})})
            yield fake, server, url, prefix, base, head, marker, runner
    finally:
        if runner is not None:
            runner.stop()
        server.stop()
        marker.unlink(missing_ok=True)


def test_a_hostile_pull_request_reaches_nothing_and_still_reports_its_tests(world):
    fake, server, url, prefix, base, head, marker, runner = world
    import redis

    work = Work("pull_request", REPO, INSTALLATION, number=NUMBER, head_sha=head,
                base_sha=base, head_repo=REPO, sender="octocat", mode="run_all")
    outcome = run_job(work.to_json(), "delivery-attack")
    log = runner.log.read_text()
    assert outcome["status"] == "completed", (outcome, log[-3000:])
    runs = {r["name"]: r for r in fake.check_runs(REPO)}
    regressions = runs["FastCI regressions"]
    failures = [a for a in regressions["annotations"] if a["annotation_level"] == "failure"]
    # The attack's own test passed: every read, connection and write it tried failed.
    assert regressions["conclusion"] == "success", (failures, log[-3000:])
    assert outcome["selected"] >= 2 and outcome["failed"] == 0
    assert "**All" in regressions["output"]["summary"]

    client = redis.Redis.from_url(url)
    assert not list(client.scan_iter(f"{prefix}:ok-to-test:*"))  # no approval set
    assert queue(f"{prefix}-cpu", client).count == 0  # nothing enqueued
    # The selection side syncs the mirror again (a later push): no planted hook runs.
    again = run_job(work.to_json(), "delivery-attack-2")
    assert again["status"] == "completed" and again["failed"] == 0
    from fastci.app import workspace

    workspace.sync(load().workspace, REPO, str(load().clone_url).format(repo=REPO),
                   [head], number=NUMBER)
    assert not marker.exists()
    assert not list(runner.dir.iterdir())  # the job's folder, checkout and scratch are gone


@pytest.mark.parametrize("world", ["as the worker"], indirect=True)
def test_without_the_sandbox_the_same_attack_gets_through(world):
    """The attack is real: run as the worker's own user (the laptop default), the test code
    reads the worker's environment and reaches Redis with its password."""
    fake, server, url, prefix, base, head, marker, runner = world
    work = Work("pull_request", REPO, INSTALLATION, number=NUMBER, head_sha=head,
                base_sha=base, head_repo=REPO, sender="octocat", mode="run_all")
    assert run_job(work.to_json(), "delivery-open")["failed"] == 1
    regressions = {r["name"]: r for r in fake.check_runs(REPO)}["FastCI regressions"]
    [failure] = [a for a in regressions["annotations"] if a["annotation_level"] == "failure"]
    assert "the attack got through" in failure["message"]
    got = failure["message"].split("]")[0]
    assert "'parent environ'" in got and "'key'" in got and "'mirror_config'" in got
    import redis

    client = redis.Redis.from_url(url)  # with the worker's password, it approved itself
    assert client.get(f"{prefix}:ok-to-test:{REPO}:{'f' * 40}") == b"mallory"
    assert queue(f"{prefix}-cpu", client).count >= 1  # and enqueued on the selection queue
