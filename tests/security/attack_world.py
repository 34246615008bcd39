"""A hostile pull request, the App's selection side in this process, and a real runner worker
(`fastci worker --gpu 0`) that runs the pull request's tests as a sandbox user, all on a Redis
of their own whose password the runner worker holds.

The pull request's conftest plays the attacker: it looks for credentials in its environment,
in every /proc/<pid>/environ and cmdline it can open, in the App key file, the mirror's
config and the evidence store; tries every Redis URL it found (and the server's address
without a password) to enqueue a job on the selection queue and approve its own next commit;
and plants git hooks in its checkout and in the mirror. Its one test passes only when every
attempt failed, and otherwise fails with what it got, so the check run reports it.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import uuid
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import Project, app_key_file, artifact_service
from fakegithub import FakeGitHub

SANDBOX_USER = "fastci-sandbox"
REPO, INSTALLATION, APP_ID, NUMBER = "octo/sandboxed", 61, 6161, 4
PASSWORD = "s3cret-" + uuid.uuid4().hex

BASE = {
    "pkg/__init__.py": "",
    "pkg/calc.py": "def add(a, b):\n    return a + b\n",
    "tests/test_calc.py": "from pkg.calc import add\n\n\ndef test_add():\n"
                          "    assert add(1, 2) == 3\n",
}

ATTACK = '''
import glob, json, os, re, stat

SETTINGS = json.loads({settings!r})
FOUND = {{}}


def grab(name, read):
    try:
        FOUND[name] = read()
    except Exception as exc:  # the attack failed, as it should
        FOUND[name] = None


def proc_scan():
    hits = []
    for d in glob.glob("/proc/[0-9]*"):
        for part in ("environ", "cmdline"):
            try:
                data = open(f"{{d}}/{{part}}", "rb").read()
            except OSError:
                continue
            if b"redis://" in data or SETTINGS["password"].encode() in data \\
                    or b"FASTCI_" in data:
                hits.append(data.decode(errors="replace"))
    return hits or None


# FASTCI_CHILD_* are the recorder's own hand-over to the test's children (a folder and a
# tag, set inside this process): no credential, and nothing from the trusted side.
grab("my environment", lambda: {{k: v for k, v in os.environ.items()
                                 if ("FASTCI" in k or "REDIS" in k or "KEY" in k)
                                 and not k.startswith("FASTCI_CHILD_")}} or None)
grab("parent environ", lambda: open(f"/proc/{{os.getppid()}}/environ", "rb").read() or None)
grab("any process", proc_scan)
for name in ("key", "mirror_config", "store"):
    grab(name, lambda: open(SETTINGS[name], "rb").read(64))
grab("mirror hook", lambda: _hook(SETTINGS["mirror"] + "/hooks/post-merge"))


def _hook(path):
    with open(path, "w") as f:
        f.write("#!/bin/sh\\ntouch " + SETTINGS["marker"] + "\\n")
    os.chmod(path, 0o755)
    return path


grab("own checkout hook", lambda: [_hook(f".git/hooks/{{h}}") for h in
                                   ("post-checkout", "post-merge", "reference-transaction")]
     and None)  # its own checkout: allowed, but must never run anywhere else

urls = set(re.findall(r"redis://[^\\x00\\s'\\"]+", repr(FOUND))) | {{SETTINGS["guess"]}}
for url in sorted(urls):
    def attack(url=url):
        import redis
        from fastci.app.queue import queue
        client = redis.Redis.from_url(url, socket_timeout=3)
        client.set(SETTINGS["approval"], "mallory")
        queue(SETTINGS["cpu"], client).enqueue("fastci.app.jobs.handle", {{}}, "evil")
        return "wrote"
    grab("redis " + url.split("@")[-1], attack)

LEAKED = {{k: v for k, v in FOUND.items() if v}}
'''

TEST_ATTACK = '''
from conftest import LEAKED


def test_the_sandbox_held():
    assert not LEAKED, f"the attack got through: {sorted(LEAKED)} {LEAKED!r}"[:1500]
'''


def ensure_user(name: str) -> tuple[int, int]:
    """An unprivileged system user with no home and no shell (created once per machine)."""
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell",
                        "/usr/sbin/nologin", name], check=True, capture_output=True)
        entry = pwd.getpwnam(name)
    return entry.pw_uid, entry.pw_gid


def can_sandbox() -> str | None:
    """Why sandboxing cannot be shown here, or None."""
    if os.geteuid() != 0:
        return "creating the sandbox user and namespaces needs root"
    for tool in ("setpriv", "unshare", "redis-server", "useradd"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return None


def hostile_remote(tmp_path: Path, settings: str) -> tuple[Project, str, str, Path]:
    """The repository: a recorded base, and a head (the pull request) adding the attack."""
    remote = Project(tmp_path / "remote" / REPO)
    remote.write(BASE)
    base = remote.commit("base")
    workspace = tmp_path / "workspace"
    remote.fastci("record", "-q", "--store", str(workspace / "evidence.db"), "--", "-q",
                  "-p", "no:cacheprovider")
    (remote.root / "tests" / "conftest.py").write_text(ATTACK.format(settings=settings))
    (remote.root / "tests" / "test_attack.py").write_text(textwrap.dedent(TEST_ATTACK))
    remote.edit("pkg/calc.py", "return a + b", "return b + a")
    head = remote.commit("a change, and an attack")
    return remote, base, head, workspace


class Runner:
    """A real `fastci worker --gpu 0` holding the Redis password, the App key's path and
    the App's settings in its environment, as a careless deployment would."""

    def __init__(self, tmp: Path, env: dict) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="fastci-runner-test-"))
        os.chmod(self.dir, 0o711)
        self.log = tmp / "runner.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fastci", "worker", "--gpu", "0"],
            env={**env, "FASTCI_RUNNER_DIR": str(self.dir)},
            stdout=open(self.log, "w"), stderr=subprocess.STDOUT, start_new_session=True)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def skip_unless_sandbox() -> None:
    why = can_sandbox()
    if why:
        pytest.skip(why)
    ensure_user(SANDBOX_USER)
    reach_fastci()


def reach_fastci() -> None:
    """The sandbox user runs FastCI's own code, so it must be able to reach its install, as
    it can where a deployment installs it: a checkout inside a private folder (`mktemp -d`,
    mode 0700) gets search permission (o+x: no listing) on each folder above it, given back
    at exit."""
    import atexit  # noqa: PLC0415

    import fastci  # noqa: PLC0415

    for folder in Path(fastci.__file__).resolve().parents:
        mode = folder.stat().st_mode
        if not mode & 0o001:
            os.chmod(folder, mode | 0o001)
            atexit.register(os.chmod, folder, mode & 0o7777)


def key_file(tmp_path: Path):
    keys, path = app_key_file(tmp_path)
    os.chmod(path, 0o600)
    return keys, path


def acl_file(tmp: Path) -> Path:
    """deploy/redis/users.acl with this test's passwords (`<PASSWORD>-<user>`)."""
    source = Path(__file__).resolve().parents[2] / "deploy" / "redis" / "users.acl"
    path = tmp / "users.acl"
    path.write_text(source.read_text().replace(">CHANGE-ME-", f">{PASSWORD}-"))
    return path


def selection_side(monkeypatch, tmp_path: Path, key: Path, workspace: Path, prefix: str,
                   redis_url: str, app_id: int = APP_ID) -> None:
    """The App's settings in this process's environment: the selection side runs here."""
    env = {"FASTCI_APP_ID": str(app_id), "FASTCI_APP_PRIVATE_KEY_FILE": str(key),
           "FASTCI_WORKSPACE": str(workspace), "FASTCI_QUEUE_PREFIX": prefix,
           "FASTCI_CLONE_URL": str(tmp_path / "remote") + "/{repo}",
           "FASTCI_REDIS_URL": redis_url}
    for name, value in env.items():
        monkeypatch.setenv(name, value)


@contextmanager
def github_with_pull(monkeypatch, public_key, repo: str, installation: int, number: int,
                     head: str, base: str, app_id: int = APP_ID):
    """The fake GitHub with the App installed and one pull request, and the artifact service
    runners download from; both stopped on leaving."""
    with FakeGitHub() as fake, artifact_service(monkeypatch):
        monkeypatch.setenv("FASTCI_GITHUB_URL", fake.url)
        fake.register_app(app_id, public_key)
        fake.add_repo(repo, installation_id=installation)
        fake.add_pull(repo, number, head_sha=head, base_sha=base)
        yield fake
