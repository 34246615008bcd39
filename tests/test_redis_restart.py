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
from conftest import app_key_file, app_remote, artifact_service
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


def test_a_redis_restart_mid_run_still_ends_in_complete_check_runs(tmp_path, monkeypatch):
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
            from rq.registry import StartedJobRegistry

            shards = StartedJobRegistry(f"{prefix}-gpu-0", connection=client)
            deadline = time.time() + 120
            while not shards.get_job_ids() and time.time() < deadline:
                time.sleep(0.2)
            assert shards.get_job_ids(), (tmp_path / "worker0.log").read_text()[-2000:]
            # Mid-shard: Redis goes away (persisting its data), and comes back 3 s later.
            subprocess.run(["redis-cli", "-p", str(port), "shutdown"], check=False,
                           capture_output=True)
            server.wait(timeout=20)
            time.sleep(3)
            server = start_redis(port, redis_dir)

            def done():
                runs = runs_by_name(fake).get("FastCI regressions", [])
                return runs and runs[0]["status"] == "completed"

            deadline = time.time() + 180
            while not done() and time.time() < deadline:
                time.sleep(0.5)
            logs = "\n".join((tmp_path / f"worker{i}.log").read_text()[-2000:]
                             for i in range(2))
            assert done(), logs
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
