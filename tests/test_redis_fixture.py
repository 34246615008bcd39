"""The tests' Redis (conftest.redis_url): when none answers, a private redis-server is started
for the session and stopped at its end, a failing test included; without redis-server the
tests that need Redis skip with one line. Run in a child pytest, with the fixture pointed
at a port where nothing listens."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
PROBE = '''
import os
from conftest import _redis, redis_or_skip


def test_a_failing_test_that_uses_redis():
    client = redis_or_skip()
    client.set("fastci-probe", "1")
    with open(os.environ["PROBE_OUT"], "w") as out:
        out.write(f"{_redis['url']} {_redis['private'].proc.pid}")
    assert False, "fails on purpose: the server must still be stopped"
'''


def probe(tmp_path: Path, path: str) -> tuple[subprocess.CompletedProcess, Path]:
    (tmp_path / "test_probe.py").write_text(PROBE)
    out = tmp_path / "probe.out"
    env = {**os.environ, "FASTCI_TEST_REDIS_URL": "redis://127.0.0.1:1/0", "PATH": path,
           "PROBE_OUT": str(out), "PYTHONPATH": str(TESTS)}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "conftest",
                           "-p", "no:cacheprovider", str(tmp_path / "test_probe.py")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    return proc, out


def test_without_redis_a_private_server_is_started_and_stopped_after_a_failure(tmp_path):
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    proc, out = probe(tmp_path, os.environ["PATH"])
    assert "1 failed" in proc.stdout, proc.stdout + proc.stderr
    url, pid = out.read_text().split()
    assert url != "redis://127.0.0.1:1/0" and url.startswith("redis://127.0.0.1:")
    assert not Path(f"/proc/{pid}").exists() or \
        Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"  # stopped with the session


def test_without_redis_server_the_test_skips_with_one_line(tmp_path):
    bare = tmp_path / "bin"
    bare.mkdir()
    proc, out = probe(tmp_path, str(bare))
    assert "1 skipped" in proc.stdout, proc.stdout + proc.stderr
    assert "no Redis answers at redis://127.0.0.1:1/0 and redis-server is not installed" \
        in proc.stdout
    assert not out.exists()
