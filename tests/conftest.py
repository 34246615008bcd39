"""Shared fixtures: real git repositories in temporary folders, driven through the real CLI."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import uuid
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest

# Triton picks interpreter or compiler when a kernel module is first imported, in whichever
# test module imports one first: without an NVIDIA GPU the kernel tests need the interpreter,
# so it is chosen here, before any test module is imported.
if not Path("/proc/driver/nvidia/version").exists():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# Warm replays leave a zygote waiting for the next replay, for minutes: tests replay cold,
# and the tests of the zygote start and stop their own.
os.environ.setdefault("FASTCI_WARM_REPLAYS", "0")
# What pruning decides must not hang on the machine's speed: under a loaded CI run a replay
# can outlast the default budget and keep a test the assertion expects pruned. The budget's
# own tests set one (tests/unit/test_budget.py, test_prune.py).
os.environ.setdefault("FASTCI_PRUNE_BUDGET", "0")
# Likewise the capture threshold and allowance: the toy repositories' tests take
# milliseconds, so a second recording would capture none of them. Their own tests set them
# (tests/test_capture_threshold.py).
os.environ.setdefault("FASTCI_CAPTURE_MIN_SECONDS", "0")
os.environ.setdefault("FASTCI_CAPTURE_SHARE", "0")
# Replays remember kernel launches in a folder of the test session's own, never the
# developer's cache (`runner/prune/launches.py`): each xdist worker has its own.
_LAUNCHES = tempfile.mkdtemp(prefix="fastci-test-launches-")
atexit.register(shutil.rmtree, _LAUNCHES, True)
os.environ.setdefault("FASTCI_LAUNCH_CACHE", _LAUNCHES)
# Every selection the tests make from a stored snapshot is also made by evaluating every
# test, and must agree with the one its index made (`selection/crosscheck.py`).
os.environ.setdefault("FASTCI_CHECK_INDEX", "1")


class Project:
    """A throwaway git repository with a Python package and its tests."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.git("init", "-q", "-b", "main")
        self.git("config", "user.email", "test@fastci.invalid")
        self.git("config", "user.name", "FastCI tests")
        self.git("config", "commit.gpgsign", "false")

    @classmethod
    def at(cls, root: Path) -> "Project":
        """An existing repository (a copy of another project's)."""
        project = cls.__new__(cls)
        project.root = root
        return project

    @classmethod
    def copied(cls, source: Path, root: Path) -> "Project":
        """A copy of a recorded repository (its evidence too), for one test to change."""
        shutil.copytree(source, root, symlinks=True)
        return cls.at(root)

    def git(self, *args: str) -> str:
        return subprocess.run(["git", *args], cwd=self.root, check=True, text=True,
                              capture_output=True).stdout.strip()

    def write(self, files: dict[str, str]) -> None:
        for path, text in files.items():
            target = self.root / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(textwrap.dedent(text).lstrip("\n"))

    def edit(self, path: str, old: str, new: str) -> None:
        target = self.root / path
        text = target.read_text()
        assert old in text, f"{old!r} not in {path}"
        target.write_text(text.replace(old, new, 1))

    def commit(self, message: str = "change") -> str:
        self.git("add", "-A")
        self.git("commit", "-q", "-m", message)
        return self.git("rev-parse", "HEAD")

    def fastci(self, *args: str, check: bool = True, env: dict | None = None
               ) -> subprocess.CompletedProcess:
        full_env = {**os.environ, **(env or {})}
        full_env.pop("FASTCI_STORE", None)
        # A hang fails this test, never the whole run.
        proc = subprocess.run([sys.executable, "-m", "fastci", *args], cwd=self.root,
                              text=True, capture_output=True, env=full_env, timeout=900)
        if check and proc.returncode != 0:
            raise AssertionError(f"fastci {' '.join(args)} exited {proc.returncode}\n"
                                 f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
        return proc

    def record(self, *pytest_args: str) -> subprocess.CompletedProcess:
        return self.fastci("record", "-q", "--", "-q", "-p", "no:cacheprovider", *pytest_args)

    def select(self, *args: str) -> dict:
        out = self.fastci("select", "-q", "--format", "json", *args).stdout
        return json.loads(out)

    def fails(self, test_id: str) -> bool:
        """Does the test fail on the tree as it is now, run by plain pytest (no FastCI)? The
        change a pruning test makes must break the test it keeps selected."""
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               test_id], cwd=self.root, capture_output=True, timeout=300
                              ).returncode != 0

    def selected(self, *args: str) -> set[str]:
        return {t["id"] for t in self.select(*args)["tests"] if t["decision"] == "selected"}

    def decisions(self, *args: str) -> dict[str, dict]:
        """Test id -> its decision, as `fastci select --format json` gives it."""
        return {t["id"]: t for t in self.select(*args)["tests"]}

    @classmethod
    def recorded_once(cls, root: Path, files: dict[str, str], passed: int) -> Path:
        """A repository holding `files`, committed and recorded (all `passed` tests
        passing), for a module's tests to copy (`copied`) rather than record each."""
        project = cls(root)
        project.write(files)
        project.commit("base")
        proc = project.record()
        assert f"{passed} passed" in proc.stdout, proc.stdout + proc.stderr
        return project.root


@pytest.fixture
def project(tmp_path) -> Project:
    return Project(tmp_path / "repo")


# A small numeric package with the shapes that trip selectors: a constant imported by name,
# a class attribute, a dataclass default, a config file read at test time, a session
# fixture, an import-time computation and a helper only some tests call.
LIBRARY = {
    "pyproject.toml": """
        [project]
        name = "calc"
        version = "0"
        dependencies = []

        [tool.pytest.ini_options]
        markers = ["convergence: slow", "perf: perf"]
    """,
    "calc/__init__.py": '''
        """calc: a tiny numeric library."""
    ''',
    "calc/norms.py": '''
        """Norms."""
        EPS = 1e-6


        def rms(xs, eps=None):
            """Root mean square."""
            eps = EPS if eps is None else eps
            return (sum(x * x for x in xs) / len(xs) + eps) ** 0.5


        def l1(xs):
            return sum(abs(x) for x in xs)
    ''',
    "calc/config.py": '''
        from dataclasses import dataclass


        @dataclass
        class Config:
            width: int = 4
            scale: float = 2.0


        def load(path):
            with open(path) as fh:
                key, value = fh.read().split("=")
            return Config(**{key.strip(): int(value)})
    ''',
    "calc/model.py": '''
        from calc.norms import EPS, rms

        TABLE = [i * 2 for i in range(4)]


        def _build_offsets():
            return [1, 2, 3]


        OFFSETS = _build_offsets()


        class Model:
            bias = 0.5

            def __init__(self, cfg):
                self.cfg = cfg

            def forward(self, xs):
                n = rms(xs)
                return [x / n * self.cfg.scale + self.bias for x in xs]

            def width(self):
                return self.cfg.width

            def offsets(self):
                return OFFSETS
    ''',
    "configs/small.cfg": "width = 8\n",
    "tests/conftest.py": '''
        import pytest

        from calc.config import Config


        def make_config():
            return Config()


        @pytest.fixture(scope="session")
        def cfg():
            return make_config()
    ''',
    "tests/test_norms.py": '''
        from calc.norms import l1, rms


        def test_rms():
            assert abs(rms([3.0, 4.0]) - 12.5 ** 0.5) < 1e-3


        def test_l1():
            assert l1([-1, 2]) == 3
    ''',
    "tests/test_model.py": '''
        import pytest

        from calc.config import load
        from calc.model import Model


        def test_forward(cfg):
            assert len(Model(cfg).forward([1.0, 2.0])) == 2


        def test_width(cfg):
            assert Model(cfg).width() == 4


        def test_offsets(cfg):
            assert Model(cfg).offsets() == [1, 2, 3]


        def test_config_file():
            assert load("configs/small.cfg").width == 8


        @pytest.mark.convergence
        @pytest.mark.parametrize("n", [1, 2])
        def test_bias(cfg, n):
            assert Model(cfg).bias == 0.5
    ''',
}


@pytest.fixture
def library(project) -> Project:
    """The library committed, with evidence recorded for its first commit."""
    project.write(LIBRARY)
    project.commit("library")
    project.record()
    return project


# The Redis the tests use: FASTCI_TEST_REDIS_URL, else the usual one on 127.0.0.1:6379. When it
# does not answer, the first test that needs Redis starts a private redis-server (no
# persistence, a free port, its own folder) for the rest of the session; without
# redis-server those tests skip, each with one line saying why.
REDIS_ENV = "FASTCI_TEST_REDIS_URL"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


class RedisServer:
    """A redis-server of the caller's own on a free port, keeping its files in `folder`, with
    extra `args` (a password, an ACL file); `stop` ends it, also when the caller failed."""

    def __init__(self, folder: Path, *args: str) -> None:
        import socket  # noqa: PLC0415
        import time  # noqa: PLC0415

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(folder), *args],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while True:  # listening is enough: a password or an ACL may refuse a PING
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"redis-server did not start on port {self.port}")
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class _PrivateRedis(RedisServer):
    """A redis-server this session started, in a folder of its own; stopped at the session's
    end (pytest_sessionfinish, and at exit should the session die first)."""

    def __init__(self) -> None:
        import atexit  # noqa: PLC0415
        import tempfile  # noqa: PLC0415

        self.folder = tempfile.mkdtemp(prefix="fastci-test-redis-")
        super().__init__(Path(self.folder))
        atexit.register(self.stop)

    def stop(self) -> None:
        import shutil  # noqa: PLC0415

        super().stop()
        shutil.rmtree(self.folder, ignore_errors=True)


def _answers(url: str) -> bool:
    import redis as redis_lib  # noqa: PLC0415

    try:
        return bool(redis_lib.Redis.from_url(url, socket_connect_timeout=0.5,
                                             socket_timeout=2).ping())
    except redis_lib.exceptions.RedisError:
        return False


_redis: dict = {}  # "url" once one answers, or "skip": why there is none; "private": the server


def redis_url() -> str:
    """The URL of a Redis that answers, or a skip that says why there is none."""
    import shutil  # noqa: PLC0415

    if "url" not in _redis and "skip" not in _redis:
        wanted = os.environ.get(REDIS_ENV) or DEFAULT_REDIS_URL
        if _answers(wanted):
            _redis["url"] = wanted
        elif shutil.which("redis-server") is None:
            _redis["skip"] = (f"no Redis answers at {wanted} and redis-server is not installed "
                              f"(install it, or point {REDIS_ENV} at one)")
        else:
            try:
                _redis["private"] = _PrivateRedis()
                _redis["url"] = _redis["private"].url
            except (OSError, RuntimeError) as exc:
                _redis["skip"] = f"no Redis answers at {wanted}, and starting one failed: {exc}"
    if "skip" in _redis:
        pytest.skip(_redis["skip"])
    return _redis["url"]


def pytest_sessionfinish(session, exitstatus):
    private = _redis.pop("private", None)
    if private is not None:
        private.stop()


def redis_or_skip():
    """A client of the tests' Redis (redis_url), or a skip that says why there is none."""
    import redis as redis_lib  # noqa: PLC0415

    return redis_lib.Redis.from_url(redis_url())


@pytest.fixture
def redis():
    return redis_or_skip()


def app_remote(tmp_path: Path, repo: str, files: dict, edit: tuple[str, str, str]):
    """A repository as the App finds it on "GitHub": its first commit recorded into the
    App's workspace store, and a second commit with `edit` (path, old, new). Returns the
    remote project, the base and head shas, and the workspace."""
    remote = Project(tmp_path / "remote" / repo)
    remote.write(files)
    base = remote.commit("base")
    workspace = tmp_path / "workspace"
    remote.fastci("record", "-q", "--store", str(workspace / "evidence.db"), "--", "-q",
                  "-p", "no:cacheprovider")
    remote.edit(*edit)
    head = remote.commit("change")
    return remote, base, head, workspace


def app_key_file(tmp_path: Path):
    """A fresh App key pair; the private half written to a file (as deployments keep it)."""
    from test_fakegithub import make_key_pair  # noqa: PLC0415

    keys = make_key_pair()
    key_file = tmp_path / "app-key.pem"
    key_file.write_text(keys.private)
    return keys, key_file


def payload_path(event: str, name: str) -> Path:
    """One of the project's webhook payload fixtures (fastci/testing/fixtures/payloads)."""
    from fastci.testing import FIXTURES  # noqa: PLC0415

    return FIXTURES / "payloads" / event / name


@contextmanager
def artifact_service(monkeypatch):
    """The App's web service on a real WSGI server, serving the artifacts of the App's
    settings in the environment: how runners download their jobs' bundles. Sets
    FASTCI_ARTIFACT_SECRET and FASTCI_ARTIFACT_URL for this process (the selection side, run
    in the test) and for workers started afterwards; yields the service's URL."""
    import threading  # noqa: PLC0415

    from werkzeug.serving import make_server  # noqa: PLC0415

    from fastci.app.settings import Secret, load  # noqa: PLC0415
    from fastci.app.web import create_app  # noqa: PLC0415

    monkeypatch.setenv("FASTCI_ARTIFACT_SECRET", f"artifact-secret-{uuid.uuid4().hex}")
    settings = replace(load(), webhook_secret=Secret(f"webhook-secret-{uuid.uuid4().hex}"))
    server = make_server("127.0.0.1", 0, create_app(settings), threaded=True)
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_port}"
    monkeypatch.setenv("FASTCI_ARTIFACT_URL", url)
    try:
        yield url
    finally:
        server.shutdown()
        server.server_close()
