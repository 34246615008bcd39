"""The GitHub App end to end: real payloads in, check runs out.

gunicorn serves the webhook; two `fastci worker` processes (selection, and one "GPU") take
jobs from real Redis; git remotes are local repositories; GitHub is the local fake. A push to
the default branch records evidence; a pull request carrying examples/tinyllm's `rope_bug`
change then gets its "FastCI selection" and "FastCI regressions" check runs, with the
failing tests annotated at their assertion lines.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import redis as redis_lib
import requests
import yaml

from conftest import shared_dir
from fakegithub import FakeGitHub
from test_fakegithub import make_key_pair

from fastci.app.signature import sign

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
TINYLLM = ROOT / "examples" / "tinyllm"
REPO, INSTALLATION, APP_ID, NUMBER = "octo/tinyllm", 31, 9001, 7
SECRET = "e2e-webhook-secret"
CHANGE = "rope_bug"


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.email=e2e@fastci.invalid", "-c",
                           "user.name=e2e", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout: float, what: str, procs=()):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        for proc, log in procs:
            if proc.poll() is not None:
                raise AssertionError(f"{what}: a process exited early:\n"
                                     f"{Path(log).read_text()[-3000:]}")
        time.sleep(0.5)
    logs = "\n".join(Path(log).read_text()[-3000:] for _, log in procs)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}\n{logs}")


@pytest.fixture
def redis():
    client = redis_lib.Redis.from_url("redis://127.0.0.1:6379/0")
    try:
        client.ping()
    except redis_lib.exceptions.ConnectionError:
        pytest.skip("no Redis on 127.0.0.1:6379 (.ci/run starts one)")
    return client


def payload(event: str, name: str) -> dict:
    return json.loads((shared_dir("github-payloads") / event / name).read_bytes())


def deliver(url: str, event: str, body: dict) -> requests.Response:
    data = json.dumps(body).encode()
    return requests.post(f"{url}/webhooks", data=data, timeout=10, headers={
        "X-GitHub-Event": event, "X-GitHub-Delivery": str(uuid.uuid4()),
        "Content-Type": "application/json", "X-Hub-Signature-256": sign(SECRET, data)})


def test_a_pull_request_gets_its_check_runs(tmp_path, redis):
    # -- the repository on "GitHub": a local remote with main and a feature branch -------------
    remote = tmp_path / "remote" / REPO
    shutil.copytree(TINYLLM, remote, ignore=shutil.ignore_patterns(
        "__pycache__", ".fastci", ".pytest_cache"))
    git(remote, "init", "-q", "-b", "main")
    git(remote, "add", "-A")
    git(remote, "commit", "-q", "-m", "tinyllm")
    base = git(remote, "rev-parse", "HEAD")
    git(remote, "checkout", "-q", "-b", "feature")
    git(remote, "apply", str(remote / "changes" / f"{CHANGE}.patch"))
    git(remote, "commit", "-q", "-am", CHANGE)
    head = git(remote, "rev-parse", "HEAD")
    git(remote, "checkout", "-q", "main")
    expected = next(c for c in yaml.safe_load((remote / "changes" / "changes.yaml").read_text())
                    ["changes"] if c["name"] == CHANGE)["failing_tests"]

    keys = make_key_pair()
    key_file = tmp_path / "app-key.pem"
    key_file.write_text(keys.private)
    prefix = f"fastci-e2e-{uuid.uuid4().hex[:8]}"
    workspace = tmp_path / "workspace"
    with FakeGitHub() as fake:
        fake.register_app(APP_ID, keys.public)
        fake.add_repo(REPO, installation_id=INSTALLATION)
        fake.add_pull(REPO, NUMBER, head_sha=head, head_ref="feature", base_sha=base)
        env = {**os.environ, "FASTCI_APP_ID": str(APP_ID),
               "FASTCI_APP_PRIVATE_KEY_FILE": str(key_file), "FASTCI_WEBHOOK_SECRET": SECRET,
               "FASTCI_GITHUB_URL": fake.url, "FASTCI_WORKSPACE": str(workspace),
               "FASTCI_CLONE_URL": str(tmp_path / "remote") + "/{repo}",
               "FASTCI_QUEUE_PREFIX": prefix, "FASTCI_GPUS": "1"}
        env.pop("FASTCI_STORE", None)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        procs = []
        commands = {"serve": ["serve", "--bind", f"127.0.0.1:{port}", "--workers", "1"],
                    "cpu": ["worker", "--cpu", "--name", f"{prefix}-cpu"],
                    "gpu": ["worker", "--gpu", "0", "--name", f"{prefix}-gpu0"]}
        try:
            for name, args in commands.items():
                log = tmp_path / f"{name}.log"
                proc = subprocess.Popen([sys.executable, "-m", "fastci", *args], env=env,
                                        stdout=open(log, "w"), stderr=subprocess.STDOUT,
                                        start_new_session=True)
                procs.append((proc, log))
            wait_for(lambda: _healthy(url), 30, "the webhook service", procs)

            # -- a push to the default branch records the evidence ---------------------------
            push = payload("push", "with-new-branch.payload.json")
            push["ref"], push["after"], push["deleted"] = "refs/heads/main", base, False
            push["repository"].update(full_name=REPO, default_branch="main",
                                      master_branch="main")
            push["installation"]["id"] = INSTALLATION
            assert deliver(url, "push", push).status_code == 202
            store = workspace / "evidence.db"
            wait_for(lambda: _has_evidence(store, base), 300, "evidence for the base", procs)

            # -- the pull request -----------------------------------------------------------
            opened = payload("pull_request", "opened.payload.json")
            opened["number"] = opened["pull_request"]["number"] = NUMBER
            opened["pull_request"]["head"].update(sha=head, ref="feature")
            opened["pull_request"]["base"].update(sha=base, ref="main")
            opened["pull_request"]["head"]["repo"]["full_name"] = REPO
            opened["pull_request"]["base"]["repo"]["full_name"] = REPO
            opened["repository"]["full_name"] = REPO
            opened["installation"]["id"] = INSTALLATION
            answer = deliver(url, "pull_request", opened)
            assert answer.status_code == 202, answer.text

            def finished():
                runs = {r["name"]: r for r in fake.check_runs(REPO)}
                done = all(runs.get(name, {}).get("status") == "completed"
                           for name in ("FastCI regressions", "FastCI background"))
                return runs if done else None

            runs = wait_for(finished, 400, "the regressions and background check runs",
                            procs)
        finally:
            for proc, _ in procs:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGTERM)
            for proc, _ in procs:
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
            for key in redis.scan_iter(f"*{prefix}*"):
                redis.delete(key)

    selection, regressions = runs["FastCI selection"], runs["FastCI regressions"]
    assert selection["head_sha"] == regressions["head_sha"] == head
    assert selection["conclusion"] == "success"
    title = selection["output"]["title"]
    selected, total = (int(x) for x in title.split(" tests selected")[0].split(" of "))
    assert total == 357 and 0 < selected < total
    assert "tinyllm/model/rope.py" in selection["output"]["summary"]
    notes = [a for a in selection["annotations"] if a["path"] == "tinyllm/model/rope.py"]
    assert notes and "executed it" in notes[0]["message"]

    def failing(run) -> set[str]:
        return {a["title"].rsplit(" ", 1)[0] for a in run["annotations"]
                if a["annotation_level"] == "failure"}

    # Blocking failures in "regressions"; the golden-loss convergence tests in "background",
    # which never blocks: together, exactly the change's known failures.
    background = runs["FastCI background"]
    assert regressions["conclusion"] == "failure"
    assert background["conclusion"] == "neutral"
    assert failing(regressions) | failing(background) == set(expected)
    assert failing(background) and all("golden" in t for t in failing(background))
    for annotation in regressions["annotations"] + background["annotations"]:
        if annotation["annotation_level"] == "failure":
            assert annotation["path"].startswith("tests/") and annotation["start_line"] > 0
    assert f"**{len(failing(regressions))} failed**" in regressions["output"]["summary"]
    assert "Diff coverage" in regressions["output"]["summary"]
    assert [a["identifier"] for a in regressions["actions"]] == ["run_all", "rerun_failed"]


def _healthy(url: str) -> bool:
    try:
        return requests.get(f"{url}/healthz", timeout=1).status_code == 200
    except requests.RequestException:
        return False


def _has_evidence(store: Path, commit: str) -> bool:
    if not store.exists():
        return False
    from fastci.runner.store import EvidenceStore

    try:
        with EvidenceStore(store, create=False) as s:
            return commit in s.commits_with_evidence()
    except Exception:  # noqa: BLE001 - still being written
        return False
