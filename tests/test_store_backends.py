"""One contract, two stores: SQLite (a laptop) and Redis (a fleet's shared store) answer alike.

Plus the fleet path end to end: `fastci record` and `fastci select` through a redis:// store.
"""

from __future__ import annotations

import uuid

import pytest

from conftest import REDIS_URL as REDIS
from test_store import snapshot

from fastci.runner.analysis.blocks import parse_blocks
from fastci.runner.store.redis import RedisEvidenceStore, open_store
from fastci.runner.store.sqlite import StoreError

@pytest.fixture
def prefix(redis):
    """A key prefix of this test's own in the real Redis (skips, saying why, without one)."""
    name = f"fastci-test-ev-{uuid.uuid4().hex[:8]}"
    yield name
    for key in redis.scan_iter(f"{name}:*"):
        redis.delete(key)


@pytest.fixture(params=["sqlite", "redis"])
def location(request, tmp_path):
    if request.param == "sqlite":
        return tmp_path / "e.db"
    return f"{REDIS}?prefix={request.getfixturevalue('prefix')}"


def test_snapshots_round_trip_alike(location):
    snap = snapshot()
    with open_store(location) as store:
        store.save_snapshot(snap)
        store.save_snapshot(snapshot("c2"))
        env = snap.environment.digest
        loaded = store.load_snapshot("c1", env, with_lines=True)
        assert store.commits_with_evidence() == {"c1", "c2"}
        assert store.commits_with_evidence(env) == {"c1", "c2"}
        assert [key for key, _ in store.snapshot_envs("c1")] == [env]
        assert store.load_snapshot("nope", env) is None
        without_lines = store.load_snapshot("c1", env)
    assert loaded.tree == snap.tree and loaded.import_time == snap.import_time
    assert loaded.session_files == snap.session_files and loaded.env_key == env
    for test_id, test in snap.tests.items():
        got = loaded.tests[test_id]
        assert (got.blocks, got.files, got.kernels, got.lines) == \
            (test.blocks, test.files, test.kernels, test.lines)
        assert got.dimension == "convergence" and got.markers == ("convergence",)
        assert without_lines.tests[test_id].lines is None


def test_inventories_captures_and_replays_alike(location, tmp_path):
    fb = parse_blocks("X = 1\nclass A:\n    y = X\n    def f(self):\n        return self.y\n")
    blob = tmp_path / "capture"
    blob.write_bytes(b"\x00module bytes")
    with open_store(location) as store:
        store.save_inventories({"blob1": fb})
        assert store.load_inventories(["blob1", "missing"])["blob1"].blocks == fb.blocks
        store.save_captures({"d1": blob})
        assert store.load_capture("d1") == b"\x00module bytes"
        assert store.load_capture("d2") is None
        store.save_replay_results({"k": {"fingerprints": {"out": {"hash": "1"}}}})
        assert store.replay_result("k") == {"fingerprints": {"out": {"hash": "1"}}}
        assert store.replay_result("other") is None


def test_history_alike(location):
    snap = snapshot()
    failing = {k: v.__class__(**{**v.__dict__, "outcome": "failed"}) for k, v in snap.tests.items()}
    with open_store(location) as store:
        store.add_history("c1", "env", failing.values(), changed_paths=["pkg/a.py"])
        store.add_history("c2", "env", snap.tests.values(), changed_paths=["pkg/b.py"],
                          flaky={"tests/test_a.py::test_2"})
        outcomes = store.outcomes()
        rates = store.cofailure_rates(["pkg/a.py", "pkg/b.py"])
        durations = store.durations()
        flips = store.flip_history(["tests/test_a.py::test_1"])
    assert outcomes["tests/test_a.py::test_1"] == ["passed", "failed"]
    assert outcomes["tests/test_a.py::test_2"] == ["failed"]  # the flaky pass left out
    assert rates["tests/test_a.py::test_1"] == {"pkg/a.py": 1.0}
    assert durations["tests/test_a.py::test_1"] == pytest.approx(0.1)
    assert flips["tests/test_a.py::test_1"] == [("c2", "passed"), ("c1", "failed")]


def test_an_unreachable_redis_store_is_a_clear_error():
    with pytest.raises(StoreError, match="unreachable"):
        RedisEvidenceStore("redis://127.0.0.1:1/0")


def test_an_empty_redis_store_read_without_create_is_a_clear_error(prefix):
    with pytest.raises(StoreError, match="no FastCI evidence"):
        RedisEvidenceStore(f"{REDIS}?prefix={prefix}", create=False)


def test_the_cli_records_and_selects_through_a_redis_store(library, prefix):
    url = f"{REDIS}?prefix={prefix}"
    library.fastci("record", "-q", "--store", url, "--", "-q", "-p", "no:cacheprovider")
    library.edit("calc/norms.py", "return", "return  ")  # formatting only
    plain = library.select("--store", str(library.root / ".fastci" / "evidence.db"))
    shared = library.select("--store", url)
    assert [t["id"] for t in shared["tests"]] == [t["id"] for t in plain["tests"]]
    assert shared["summary"]["selected"] == plain["summary"]["selected"] == 0
    assert shared["base"] == plain["base"]
