"""`fastci demo --app`: the GitHub App loop on one machine, watchable by a newcomer.

gunicorn serves the webhook, a selection worker and a "GPU" worker take jobs from Redis, a
local git repository plays the GitHub remote, and the fake GitHub (fastci.testing, answering
from the fixtures packaged with FastCI) plays github.com. A push to main records evidence; a pull
request carrying one of tinyllm's bundled changes then gets its check runs, printed as they
change. `AppLoop` is also what the end-to-end test drives.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import requests

from fastci.app.signature import sign
from fastci.demo import example_dir, load_changes
from fastci.runner.errors import EXIT_PYTEST, FastCIError
from fastci.runner.git import run_git
from fastci.runner.store.redis import redacted

REPO, INSTALLATION, APP_ID, NUMBER = "octo/tinyllm", 31, 9001, 7
SECRET = "demo-webhook-secret"
RUNS = ("FastCI selection", "FastCI regressions", "FastCI background")


class AppDemoError(FastCIError):
    """The App demo cannot run; the message says why."""

    exit_code = EXIT_PYTEST


def _git(cwd: Path, *args: str) -> str:
    return run_git(["-c", "user.email=demo@fastci.invalid", "-c", "user.name=FastCI demo",
                    *args], cwd).decode(errors="surrogateescape").strip()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def key_pair() -> tuple[str, str]:
    """A fresh RSA key pair for a local App: (private PEM, public PEM)."""
    from cryptography.hazmat.primitives import serialization  # noqa: PLC0415
    from cryptography.hazmat.primitives.asymmetric import rsa  # noqa: PLC0415

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    return private, public


class AppLoop:
    """Everything the loop needs, started on enter and stopped (with its Redis keys) on exit."""

    def __init__(self, workdir: Path, change: str, redis_url: str = "redis://127.0.0.1:6379/0",
                 payloads: Path | None = None) -> None:
        from fastci.testing import FIXTURES  # noqa: PLC0415

        self.workdir, self.change, self.redis_url = Path(workdir), change, redis_url
        self.payloads = payloads or FIXTURES / "payloads"
        self.prefix = f"fastci-demo-{uuid.uuid4().hex[:8]}"
        self.procs: list[tuple[subprocess.Popen, Path]] = []
        self.fake = None

    # -- set-up ------------------------------------------------------------------------------
    def __enter__(self) -> "AppLoop":
        import redis  # noqa: PLC0415

        try:
            redis.Redis.from_url(self.redis_url, socket_connect_timeout=1).ping()
        except redis.exceptions.RedisError:
            raise AppDemoError(f"no Redis answers at {redacted(self.redis_url)}: start one "
                               "(`redis-server --daemonize yes`) or set FASTCI_REDIS_URL") from None
        changes = {c.name: c for c in load_changes(example_dir())}
        if self.change not in changes:
            raise AppDemoError(f"unknown change {self.change!r}; bundled: {', '.join(changes)}")
        self.expected = list(changes[self.change].failing_tests)
        self._make_remote(changes[self.change].patch)
        from fastci.testing.fakegithub import FakeGitHub  # noqa: PLC0415

        private, public = key_pair()
        key_file = self.workdir / "app-key.pem"
        key_file.write_text(private)
        key_file.chmod(0o600)
        self.fake = FakeGitHub().__enter__()
        self.fake.register_app(APP_ID, public)
        self.fake.add_repo(REPO, installation_id=INSTALLATION)
        self.fake.add_pull(REPO, NUMBER, head_sha=self.head, head_ref="feature",
                           base_sha=self.base)
        self.store = self.workdir / "workspace" / "evidence.db"
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        env = {**os.environ, "FASTCI_APP_ID": str(APP_ID),
               "FASTCI_APP_PRIVATE_KEY_FILE": str(key_file), "FASTCI_WEBHOOK_SECRET": SECRET,
               "FASTCI_GITHUB_URL": self.fake.url, "FASTCI_REDIS_URL": self.redis_url,
               "FASTCI_WORKSPACE": str(self.workdir / "workspace"),
               "FASTCI_CLONE_URL": str(self.workdir / "remote") + "/{repo}",
               "FASTCI_QUEUE_PREFIX": self.prefix, "FASTCI_GPUS": "1",
               # The "GPU" worker downloads its bundles from the webhook service, by URLs
               # signed with this secret, which only the service and the selection worker hold.
               "FASTCI_ARTIFACT_URL": self.url,
               "FASTCI_ARTIFACT_SECRET": f"demo-artifacts-{uuid.uuid4().hex}"}
        env.pop("FASTCI_STORE", None)
        runner_env = {k: v for k, v in env.items()
                      if not k.startswith(("FASTCI_ARTIFACT_SECRET", "FASTCI_APP_",
                                           "FASTCI_WEBHOOK_"))}
        for name, args in {"serve": ["serve", "--bind", f"127.0.0.1:{port}", "--workers", "1"],
                           "worker-cpu": ["worker", "--cpu", "--name", f"{self.prefix}-cpu"],
                           "worker-gpu0": ["worker", "--gpu", "0", "--name",
                                           f"{self.prefix}-gpu0"]}.items():
            log = self.workdir / f"{name}.log"
            proc = subprocess.Popen([sys.executable, "-m", "fastci", *args],
                                    env=runner_env if name.startswith("worker-gpu") else env,
                                    stdout=open(log, "w"), stderr=subprocess.STDOUT,
                                    start_new_session=True)
            self.procs.append((proc, log))
        self.wait(self._healthy, 30, "the webhook service")
        return self

    def _make_remote(self, patch: Path) -> None:
        remote = self.workdir / "remote" / REPO
        if remote.exists():
            shutil.rmtree(remote)
        shutil.copytree(example_dir(), remote, ignore=shutil.ignore_patterns(
            "__pycache__", ".fastci", ".pytest_cache"))
        _git(remote, "init", "-q", "-b", "main")
        _git(remote, "add", "-A")
        _git(remote, "commit", "-q", "-m", "tinyllm")
        self.base = _git(remote, "rev-parse", "HEAD")
        _git(remote, "checkout", "-q", "-b", "feature")
        _git(remote, "apply", str(patch))
        _git(remote, "add", "-A")
        _git(remote, "commit", "-q", "-m", f"change: {self.change}")
        self.head = _git(remote, "rev-parse", "HEAD")
        _git(remote, "checkout", "-q", "main")

    def __exit__(self, *exc) -> None:
        for proc, _ in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc, _ in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        if self.fake is not None:
            self.fake.__exit__(None, None, None)
        try:
            import redis  # noqa: PLC0415

            client = redis.Redis.from_url(self.redis_url)
            for key in client.scan_iter(f"*{self.prefix}*"):
                client.delete(key)
        except Exception:  # noqa: BLE001 - cleanup is best effort
            pass

    # -- the loop ------------------------------------------------------------------------------
    def payload(self, event: str, name: str) -> dict:
        return json.loads((self.payloads / event / name).read_bytes())

    def deliver(self, event: str, body: dict) -> requests.Response:
        data = json.dumps(body).encode()
        return requests.post(f"{self.url}/webhooks", data=data, timeout=10, headers={
            "X-GitHub-Event": event, "X-GitHub-Delivery": str(uuid.uuid4()),
            "Content-Type": "application/json", "X-Hub-Signature-256": sign(SECRET, data)})

    def push_main(self) -> requests.Response:
        """A push payload (one that carries an installation), pointed at our main."""
        push = self.payload("push", "default-branch.json")
        push["ref"], push["after"], push["deleted"] = "refs/heads/main", self.base, False
        push["repository"].update(full_name=REPO, default_branch="main", master_branch="main")
        push["installation"]["id"] = INSTALLATION
        return self.deliver("push", push)

    def open_pull_request(self) -> requests.Response:
        opened = self.payload("pull_request", "opened.json")
        opened["number"] = opened["pull_request"]["number"] = NUMBER
        opened["pull_request"]["head"].update(sha=self.head, ref="feature")
        opened["pull_request"]["base"].update(sha=self.base, ref="main")
        opened["pull_request"]["head"]["repo"]["full_name"] = REPO
        opened["pull_request"]["base"]["repo"]["full_name"] = REPO
        opened["repository"]["full_name"] = REPO
        opened["installation"]["id"] = INSTALLATION
        return self.deliver("pull_request", opened)

    def has_evidence(self) -> bool:
        import sqlite3  # noqa: PLC0415

        from fastci.runner.store import SqliteEvidenceStore, StoreError  # noqa: PLC0415

        if not self.store.exists():
            return False
        try:
            with SqliteEvidenceStore(self.store, create=False) as store:
                return self.base in store.commits_with_evidence()
        except (StoreError, sqlite3.Error):  # being created or written by the worker
            return False

    def check_runs(self) -> dict[str, dict]:
        return {r["name"]: r for r in self.fake.check_runs(REPO)}

    def runs_done(self) -> dict | None:
        runs = self.check_runs()
        done = all(runs.get(n, {}).get("status") == "completed" for n in RUNS[1:])
        return runs if done else None

    def wait(self, predicate, timeout: float, what: str, on_poll=None):
        deadline = time.time() + timeout
        while time.time() < deadline:
            value = predicate()
            if value:
                return value
            for proc, log in self.procs:
                if proc.poll() is not None:
                    raise AppDemoError(f"{what}: {log.name} exited early:\n"
                                       f"{log.read_text()[-3000:]}")
            if on_poll:
                on_poll()
            time.sleep(0.5)
        tails = "\n".join(f"--- {log.name}\n{log.read_text()[-2000:]}" for _, log in self.procs)
        raise AppDemoError(f"timed out after {timeout:.0f}s waiting for {what}\n{tails}")

    def _healthy(self) -> bool:
        try:
            return requests.get(f"{self.url}/healthz", timeout=1).status_code == 200
        except requests.RequestException:
            return False


def run_app_demo(workdir: str | None, change: str, say=print) -> dict[str, dict]:
    root = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="fastci-app-demo-"))
    root.mkdir(parents=True, exist_ok=True)
    started = time.time()
    with AppLoop(root, change) as loop:
        say(f"[1/4] webhook service on {loop.url}, 2 workers, Redis queues '{loop.prefix}-*', "
            f"fake GitHub on {loop.fake.url}; logs in {root}")
        say(f"[2/4] push to main ({loop.base[:12]}): the GPU worker records the tinyllm suite …")
        answer = loop.push_main()
        say(f"      webhook answered {answer.status_code}: {answer.json()['message']}")
        loop.wait(loop.has_evidence, 600, "evidence for main")
        say(f"      evidence recorded ({time.time() - started:.0f}s)")
        say(f"[3/4] pull request #{NUMBER} with the '{change}' change ({loop.head[:12]}) …")
        answer = loop.open_pull_request()
        say(f"      webhook answered {answer.status_code}: {answer.json()['message']}")
        seen: dict[str, tuple] = {}

        def show() -> None:
            for name, run in loop.check_runs().items():
                state = (run["status"], run.get("conclusion"), run["output"].get("title"))
                if seen.get(name) != state:
                    seen[name] = state
                    say(f"      {name}: {state[0]}{' / ' + state[1] if state[1] else ''}"
                        f" - {state[2]}")

        runs = loop.wait(loop.runs_done, 900, "the check runs", on_poll=show)
        show()
        say("[4/4] the check runs, as a pull request shows them")
        report = root / "check-runs.md"
        with open(report, "w") as out:
            for name in RUNS:
                run = runs.get(name)
                if run is None:
                    continue
                levels = {}
                for a in run["annotations"]:
                    levels[a["annotation_level"]] = levels.get(a["annotation_level"], 0) + 1
                say(f"  {name}: {run['conclusion']} - {run['output']['title']}; annotations: "
                    + (", ".join(f"{n} {lvl}" for lvl, n in sorted(levels.items())) or "none"))
                out.write(f"# {name}: {run['conclusion']}\n\n## {run['output']['title']}\n\n"
                          f"{run['output']['summary']}\n\n{run['output'].get('text') or ''}\n\n")
        say(f"\nsummaries written to {report}; expected failures for '{change}': "
            f"{len(loop.expected)}; total {time.time() - started:.0f}s")
        return runs
