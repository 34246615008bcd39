"""Runners get the commit they test by a signed URL of the webhook service, and nothing else
(issue 11, step 5). A runner that holds its job's URL plays the attacker through the real
service (a real WSGI server in front of a real workspace, with a mirror, a store and a key):
an altered signature, an altered expiry, an expired link, another job's bundle under its own
signature, path traversal, the mirror by name, a symbolic link planted among the artifacts:
each is refused with 403 or 404, and nothing of the workspace is ever served. The runner's
side refuses other schemes, redirects and oversized files. End to end, a pull request's
shards download their bundle over HTTP; the secret appears in no job, no result, no log."""

from __future__ import annotations

import http.server
import json
import logging
import os
import subprocess
import sys
import threading
import time
import uuid
import zlib
from urllib.parse import quote

import pytest
import requests
from conftest import (
    Project,
    app_key_file,
    app_remote,
    artifact_service,
    redis_or_skip,
    redis_url,
)
from fakegithub import FakeGitHub

from fastci.app import artifacts, workspace
from fastci.app.events import Work
from fastci.app.settings import SettingsError, load
from fastci.runner.errors import RunError
from fastci.runner.execution.fetch import download
from fastci.runner.execution.sandbox import Sandbox
from fastci.runner.execution.shard import checkout
from fastci.runner.git import GitError, Repo
from fastci.testing.runs import run_job

REPO, INSTALLATION, APP_ID, NUMBER = "octo/fetched", 71, 7171, 5
MIRROR_SECRET = b"mirror-only-" + uuid.uuid4().hex.encode()


@pytest.fixture
def served(tmp_path, monkeypatch):
    """A workspace as the selection worker keeps it (a mirror holding a private branch, a
    store, a key), the webhook service serving its artifacts, and two jobs' bundles."""
    remote = Project(tmp_path / "remote" / REPO)
    remote.write({"a.py": "x = 1\n"})
    first = remote.commit("job A's commit")
    remote.write({"b.py": "y = 2\n"})
    second = remote.commit("job B's commit")
    remote.git("checkout", "-q", "-b", "private")
    remote.write({"secret.txt": MIRROR_SECRET.decode()})
    private = remote.commit("a branch no runner may see")
    remote.git("checkout", "-q", "-")
    space = tmp_path / "workspace"
    _, key_file = app_key_file(tmp_path)
    monkeypatch.setenv("FASTCI_WORKSPACE", str(space))
    monkeypatch.setenv("FASTCI_WEBHOOK_SECRET", "webhook-" + uuid.uuid4().hex)
    mirror = workspace.sync(space, REPO, str(remote.root), [first, second, private])
    (space / "evidence.db").write_bytes(b"SQLite format 3\0" + MIRROR_SECRET)
    with artifact_service(monkeypatch) as url:
        settings = load()
        folder = artifacts.directory(settings)
        job_a = workspace.bundle(mirror, first, folder)
        job_b = workspace.bundle(mirror, second, folder)
        yield {"url": url, "settings": settings, "mirror": mirror, "key": key_file,
               "a": (job_a, artifacts.publish(settings, job_a, 600)),
               "b": (job_b, artifacts.publish(settings, job_b, 600)),
               "shas": (first, second, private), "tmp": tmp_path}


def get(url: str) -> requests.Response:
    return requests.get(url, timeout=10, allow_redirects=False)


def parts(signed: str) -> tuple[str, str, str]:
    """(path, expires, sig) of a signed URL."""
    path, query = signed.split("?")
    fields = dict(p.split("=") for p in query.split("&"))
    return path, fields["expires"], fields["sig"]


def test_a_jobs_url_serves_its_bundle_and_nothing_else_is_served(served):
    url, settings = served["url"], served["settings"]
    (bundle_a, url_a), (bundle_b, url_b) = served["a"], served["b"]
    ok = get(url_a)
    assert ok.status_code == 200 and ok.content == bundle_a.read_bytes()
    assert ok.headers["Content-Type"] == "application/octet-stream"
    path_a, expires, sig = parts(url_a)
    path_b, expires_b, sig_b = parts(url_b)
    flipped = sig[:-1] + ("0" if sig[-1] != "0" else "1")
    attempts = {
        "tampered signature": f"{path_a}?expires={expires}&sig={flipped}",
        "no signature": path_a,
        "no expiry": f"{path_a}?sig={sig}",
        "a later expiry": f"{path_a}?expires={int(expires) + 3600}&sig={sig}",
        "a signature in capitals": f"{path_a}?expires={expires}&sig={sig.upper()}",
        "job B's bundle with job A's signature": f"{path_b}?expires={expires}&sig={sig}",
        "job B's expiry and A's signature": f"{path_b}?expires={expires_b}&sig={sig}",
    }
    refused = {what: get(link) for what, link in attempts.items()}
    assert {what: r.status_code for what, r in refused.items()} == \
        {what: 403 for what in attempts}
    assert all(r.content != bundle_b.read_bytes() and b"PACK" not in r.content
               for r in refused.values())

    # Names that are no artifact: traversal to the mirror, the store, the key; the folder
    # itself. Signed with A's signature, and even signed properly with the secret (a leak
    # of the secret would still not open the workspace): 404, or 403 for a wrong signature.
    secret = settings.artifact_secret.reveal()
    mirror_name = served["mirror"].name
    names = ["../evidence.db", "..%2Fevidence.db", "%2e%2e%2fevidence.db",
             f"..%2Fmirrors%2F{mirror_name}%2Fconfig", f"..%2F..%2F{mirror_name}",
             mirror_name, f"{mirror_name}%2FHEAD", "evidence.db", "..", "%2e%2e", ".",
             ".hidden", "a%00.bundle", "mirrors", bundle_a.name + "%2F..%2F..%2Fevidence.db",
             "x" * 300, str(served["key"]).replace("/", "%2F")]
    for name in names:
        for signature in (sig, artifacts.sign(secret, name, int(expires))):
            response = get(f"{url}/artifacts/{name}?expires={expires}&sig={signature}")
            assert response.status_code in (403, 404), (name, response.status_code)
            assert MIRROR_SECRET not in response.content
            assert b"[core]" not in response.content and b"PRIVATE KEY" not in response.content
    for path in ("/artifacts/", "/artifacts", f"/mirrors/{mirror_name}/config",
                 "/evidence.db", "/artifacts/../evidence.db"):
        response = get(url + path)
        assert response.status_code in (403, 404, 405), path
        assert MIRROR_SECRET not in response.content and b"[core]" not in response.content

    # A symbolic link planted among the artifacts, signed as if published: never followed.
    link = settings.artifacts / "planted.bundle"
    link.symlink_to(served["mirror"] / "config")
    with pytest.raises(ValueError):
        artifacts.publish(settings, link, 600)
    planted = get(f"{url}/artifacts/planted.bundle?expires={expires}"
                  f"&sig={artifacts.sign(secret, 'planted.bundle', int(expires))}")
    assert planted.status_code == 404 and b"[core]" not in planted.content
    with pytest.raises(ValueError):  # only files directly in the artifacts folder
        artifacts.publish(settings, served["mirror"] / "config", 600)

    # When job A ends its bundle is removed: its URL answers 404 from then on.
    artifacts.discard(settings, url_a)
    assert not bundle_a.exists() and bundle_b.exists()
    assert get(url_a).status_code == 404
    assert get(url_b).status_code == 200


def test_a_link_expires(served):
    bundle, _ = served["a"]
    url = artifacts.publish(served["settings"], bundle, 1)
    assert get(url).status_code == 200
    time.sleep(2.1)
    expired = get(url)
    assert expired.status_code == 403 and "expired" in expired.json()["message"]


def test_the_runner_gets_the_commit_and_no_other_branch(served, tmp_path):
    (_, url_a) = served["a"]
    first, _, private = served["shas"]
    dest = tmp_path / "commit.bundle"
    assert download(url_a, dest, max_bytes=2**20) == dest.stat().st_size > 0
    assert dest.stat().st_mode & 0o777 == 0o600
    home = tmp_path / "home"
    home.mkdir()
    root = checkout(Sandbox(), dest, first, home)
    assert Repo(root).resolve("HEAD") == first and (root / "a.py").exists()
    with pytest.raises(GitError):
        Repo(root).resolve(private)
    assert MIRROR_SECRET not in b"".join(p.read_bytes() for p in root.rglob("*")
                                         if p.is_file())


def test_the_runner_refuses_what_its_job_does_not_need(served, tmp_path):
    (_, url_a) = served["a"]
    path, expires, sig = parts(url_a)
    flipped = sig[:-1] + ("0" if sig[-1] != "0" else "1")
    with pytest.raises(RunError) as info:
        download(f"{path}?expires={expires}&sig={flipped}", tmp_path / "x", 2**20)
    assert "403" in str(info.value) and flipped not in str(info.value)
    assert not (tmp_path / "x").exists()  # nothing half-written is left
    with pytest.raises(RunError, match="byte limit"):
        download(url_a, tmp_path / "small", max_bytes=100)
    assert not (tmp_path / "small").exists()
    for bad in (f"file://{served['mirror']}/config", "ftp://127.0.0.1/x", "/etc/passwd",
                "http:///no-host", None, 7, url_a + " extra", "http://h/\nx"):
        with pytest.raises(RunError):
            download(bad, tmp_path / "bad", 2**20)
        assert not (tmp_path / "bad").exists()
    (tmp_path / "exists").write_text("keep")
    with pytest.raises(RunError):  # never overwrites, never follows a link
        download(url_a, tmp_path / "exists", 2**20)
    assert (tmp_path / "exists").read_text() == "keep"

    class Redirect(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(302)
            self.send_header("Location", f"file://{served['mirror']}/config")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Redirect)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(RunError, match="302"):
            download(f"http://127.0.0.1:{server.server_port}/x", tmp_path / "r", 2**20)
    finally:
        server.shutdown()
        server.server_close()
    assert not (tmp_path / "r").exists()


def test_publishing_needs_the_secret_and_the_url(tmp_path):
    settings = load({"FASTCI_WORKSPACE": str(tmp_path)})
    path = artifacts.directory(settings) / "one.bundle"
    path.write_bytes(b"x")
    with pytest.raises(SettingsError, match="FASTCI_ARTIFACT_SECRET.*FASTCI_ARTIFACT_URL"):
        artifacts.publish(settings, path, 60)
    with pytest.raises(SettingsError, match="at least 32"):
        load({"FASTCI_ARTIFACT_SECRET": "short"})
    secret_file = tmp_path / "artifact.secret"
    secret_file.write_text("s" * 40 + "\n")
    settings = load({"FASTCI_WORKSPACE": str(tmp_path), "FASTCI_ARTIFACT_URL": "ftp://h",
                     "FASTCI_ARTIFACT_SECRET_FILE": str(secret_file)})
    assert settings.artifact_secret.reveal() == "s" * 40 and "s" * 40 not in repr(settings)
    with pytest.raises(SettingsError, match="http"):
        artifacts.publish(settings, path, 60)
    # Behind a path prefix too; the link names the one file, and quoting changes nothing.
    settings = load({"FASTCI_WORKSPACE": str(tmp_path), "FASTCI_ARTIFACT_URL": "https://h/ci/",
                     "FASTCI_ARTIFACT_SECRET": "s" * 40})
    link = artifacts.publish(settings, path, 60)
    assert link.startswith("https://h/ci/artifacts/one.bundle?expires=")
    assert "s" * 40 not in link and quote("one.bundle") in link
    artifacts.discard(settings, "https://h/ci/artifacts/..%2Fevidence.db")
    artifacts.discard(settings, link)
    assert not path.exists()


# -- end to end: a pull request's shards, a real runner worker, the real service -------------
@pytest.fixture
def pulled(tmp_path, monkeypatch):
    client = redis_or_skip()
    _, base, head, space = app_remote(
        tmp_path, REPO, {"pkg/__init__.py": "", "pkg/calc.py": "def add(a, b):\n"
                         "    return a + b\n",
                         "tests/test_calc.py": "from pkg.calc import add\n\n\n"
                                               "def test_add():\n    assert add(1, 2) == 3\n"},
        ("pkg/calc.py", "return a + b", "return b + a"))
    keys, key_file = app_key_file(tmp_path)
    prefix = f"fastci-art-{uuid.uuid4().hex[:8]}"
    for name, value in {"FASTCI_APP_ID": str(APP_ID),
                        "FASTCI_APP_PRIVATE_KEY_FILE": str(key_file),
                        "FASTCI_WORKSPACE": str(space), "FASTCI_QUEUE_PREFIX": prefix,
                        "FASTCI_CLONE_URL": str(tmp_path / "remote") + "/{repo}",
                        "FASTCI_REDIS_URL": redis_url(),
                        "FASTCI_WEBHOOK_SECRET": "webhook-" + uuid.uuid4().hex}.items():
        monkeypatch.setenv(name, value)
    worker = None
    try:
        with FakeGitHub() as fake, artifact_service(monkeypatch) as url:
            monkeypatch.setenv("FASTCI_GITHUB_URL", fake.url)
            fake.register_app(APP_ID, keys.public)
            fake.add_repo(REPO, installation_id=INSTALLATION)
            fake.add_pull(REPO, NUMBER, head_sha=head, base_sha=base)
            # The runner knows the service's URL from its job alone: no secret, no workspace.
            env = {k: v for k, v in os.environ.items()
                   if not k.startswith(("FASTCI_ARTIFACT", "FASTCI_WORKSPACE", "FASTCI_APP_",
                                        "FASTCI_WEBHOOK", "FASTCI_CLONE"))}
            log = tmp_path / "runner.log"
            worker = subprocess.Popen(
                [sys.executable, "-m", "fastci", "worker", "--gpu", "0"],
                env={**env, "FASTCI_RUNNER_DIR": str(tmp_path / "runner")},
                stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
            yield fake, client, prefix, base, head, url, log
    finally:
        if worker is not None and worker.poll() is None:
            os.killpg(worker.pid, 9)
            worker.wait()
        for key in client.scan_iter(f"*{prefix}*"):
            client.delete(key)


def _everything_stored(client, prefix: str) -> bytes:
    """Every value Redis holds for this test's queues and jobs (RQ compresses job data)."""
    out = []
    for key in client.scan_iter(f"*{prefix}*"):
        kind = client.type(key)
        if kind == b"string":
            values = [client.get(key)]
        elif kind == b"hash":
            values = [*client.hgetall(key).keys(), *client.hgetall(key).values()]
        elif kind == b"list":
            values = client.lrange(key, 0, -1)
        elif kind == b"set":
            values = list(client.smembers(key))
        elif kind == b"zset":
            values = client.zrange(key, 0, -1)
        else:
            values = []
        for value in values:
            out.append(value or b"")
            try:
                out.append(zlib.decompress(value))
            except (zlib.error, TypeError):
                pass
    return b"\n".join(out)


def test_a_pull_requests_shards_download_their_bundle_and_the_secret_goes_nowhere(
        pulled, caplog):
    fake, client, prefix, base, head, url, log = pulled
    caplog.set_level(logging.DEBUG)
    settings = load()
    secret = settings.artifact_secret.reveal().encode()
    work = Work("pull_request", REPO, INSTALLATION, number=NUMBER, head_sha=head,
                base_sha=base, head_repo=REPO, sender="octocat", mode="run_all")
    outcome = run_job(work.to_json(), "delivery-fetched")
    assert outcome["status"] == "completed" and outcome["failed"] == 0, \
        (outcome, log.read_text()[-3000:])
    [regressions] = [r for r in fake.check_runs(REPO) if r["name"] == "FastCI regressions"]
    assert regressions["conclusion"] == "success"

    from fastci.app.queue import fetch

    shard_ids = [k.decode().split("rq:job:", 1)[1]
                 for k in client.scan_iter(f"rq:job:{prefix}-shard-*")]
    assert shard_ids
    for job_id in shard_ids:
        request = fetch(job_id, client).args[0]
        assert "bundle" not in request  # no path on a shared filesystem
        assert request["bundle_url"].startswith(f"{url}/artifacts/")
        assert str(settings.workspace) not in str(request)
        assert get(request["bundle_url"]).status_code == 404  # removed when the job ended
    assert not any(settings.artifacts.iterdir())
    stored = _everything_stored(client, prefix)
    assert b"bundle_url" in stored  # the scan does see the jobs' arguments
    assert secret not in stored
    assert secret.decode() not in caplog.text
    assert secret.decode() not in json.dumps(fake.check_runs(REPO))  # nor on GitHub
    assert secret not in log.read_bytes()
    runner_log = log.read_text()
    assert "sig=" not in runner_log  # nor does the runner log its job's signed URL


def test_the_watchdog_sweeps_bundles_whose_links_all_expired(served):
    """A selection job killed mid-run never discards its bundle: the sweep does, and only
    files past every link's lifetime (a live job's bundle stays; a planted link is not
    followed)."""
    settings = served["settings"]
    (old, _), (live, _) = served["a"], served["b"]
    past = time.time() - artifacts.STALE_AFTER - 60
    os.utime(old, (past, past))
    outside = served["tmp"] / "not-an-artifact"
    outside.write_text("kept")
    os.utime(outside, (past, past))
    (settings.artifacts / "planted.bundle").symlink_to(outside)
    assert artifacts.sweep(settings) == 1
    assert not old.exists() and live.exists() and outside.exists()
