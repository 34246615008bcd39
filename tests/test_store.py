"""The evidence store: round trips, versioning, bad files, two writers."""

from __future__ import annotations

import multiprocessing
import sqlite3

import pytest

from fastci.runner.analysis.blocks import parse_blocks
from fastci.runner.analysis.environment import current
from fastci.runner.evidence import Snapshot, TestRecord
from fastci.runner.store.sqlite import SCHEMA_VERSION, EvidenceStore, StoreError


def snapshot(commit="c1", tests=3, source="record") -> Snapshot:
    records = {
        f"tests/test_a.py::test_{i}": TestRecord(
            test_id=f"tests/test_a.py::test_{i}", outcome="passed", duration=0.1 * i,
            blocks={"pkg/a.py": ("f", "g"), "tests/test_a.py": (f"test_{i}",)},
            files={"data/x.txt": "abc"}, kernels={"pkg/k.py::kern": "h1"},
            markers=("convergence",), dimension="convergence",
            lines={"pkg/a.py": (1, 2, 3, 7)})
        for i in range(tests)}
    return Snapshot(commit=commit, environment=current(), tree={"pkg/a.py": "b1"},
                    tests=records, import_time={"pkg/a.py": {"f": ["*"]}},
                    session_files={"data/y.txt": "s"}, source=source)


def test_snapshot_round_trip(tmp_path):
    snap = snapshot()
    with EvidenceStore(tmp_path / "e.db") as store:
        store.save_snapshot(snap)
        loaded = store.load_snapshot("c1", snap.environment.digest, with_lines=True)
    assert loaded.tree == snap.tree and loaded.import_time == snap.import_time
    assert loaded.session_files == snap.session_files
    for test_id, test in snap.tests.items():
        got = loaded.tests[test_id]
        assert got.blocks == test.blocks and got.files == test.files
        assert got.kernels == test.kernels and got.lines == test.lines
        assert got.dimension == "convergence" and got.markers == ("convergence",)


def test_saving_the_same_commit_replaces_it_and_dedupes_evidence(tmp_path):
    with EvidenceStore(tmp_path / "e.db") as store:
        store.save_snapshot(snapshot("c1"))
        store.save_snapshot(snapshot("c1"))
        store.save_snapshot(snapshot("c2"))
        db = store._db
        assert db.execute("SELECT count(*) FROM snapshots").fetchone()[0] == 2
        # three distinct tests' evidence, shared by both commits
        assert db.execute("SELECT count(*) FROM evidence").fetchone()[0] == 3


def test_inventory_cache_round_trip(tmp_path):
    fb = parse_blocks("X = 1\nclass A:\n    y = X\n    def f(self):\n        return self.y\n")
    with EvidenceStore(tmp_path / "e.db") as store:
        store.save_inventories({"blob1": fb})
        got = store.load_inventories(["blob1", "missing"])["blob1"]
    assert got.blocks == fb.blocks
    assert got.owner_of(5) == "A.f" and got.owner_of(3) == "A"


def test_corrupt_file_is_a_clear_error_and_is_left_alone(tmp_path):
    path = tmp_path / "evidence.db"
    path.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(StoreError, match="not a FastCI evidence store"):
        EvidenceStore(path)
    assert path.read_bytes().startswith(b"this is not sqlite")


def test_foreign_sqlite_file_is_refused(tmp_path):
    path = tmp_path / "other.db"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE users (name TEXT)")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="not a FastCI evidence store"):
        EvidenceStore(path)


def test_older_schema_is_kept_aside_and_rebuilt(tmp_path, capsys):
    path = tmp_path / "e.db"
    with EvidenceStore(path) as store:
        store.save_snapshot(snapshot())
        store._db.execute("UPDATE meta SET value='0' WHERE key='schema_version'")
    with EvidenceStore(path) as store:
        assert store.commits_with_evidence() == set()
    assert (tmp_path / "e.db.v0.bak").exists()
    assert f"uses {SCHEMA_VERSION}" in capsys.readouterr().err


def test_missing_store_without_create_says_what_to_do(tmp_path):
    with pytest.raises(StoreError, match="fastci record"):
        EvidenceStore(tmp_path / "none.db", create=False)


def _writer(path: str, commit: str, n: int) -> None:
    with EvidenceStore(path) as store:
        for i in range(n):
            store.save_snapshot(snapshot(f"{commit}-{i}", tests=20))
            store.add_history(f"{commit}-{i}", "env", snapshot(tests=5).tests.values(),
                              changed_paths=["pkg/a.py"])


def test_two_writers_lose_nothing(tmp_path):
    path = str(tmp_path / "e.db")
    EvidenceStore(path).close()
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(path, name, 15)) for name in ("a", "b")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    with EvidenceStore(path) as store:
        assert len(store.commits_with_evidence()) == 30
        assert sum(len(v) for v in store.outcomes().values()) == 150


def test_history_feeds_risk_inputs(tmp_path):
    snap = snapshot()
    failing = {k: v.__class__(**{**v.__dict__, "outcome": "failed"}) for k, v in snap.tests.items()}
    with EvidenceStore(tmp_path / "e.db") as store:
        store.add_history("c1", "env", failing.values(), changed_paths=["pkg/a.py"])
        store.add_history("c2", "env", snap.tests.values(), changed_paths=["pkg/b.py"])
        outcomes = store.outcomes()
        rates = store.cofailure_rates(["pkg/a.py", "pkg/b.py"])
    assert outcomes["tests/test_a.py::test_1"] == ["passed", "failed"]
    assert rates["tests/test_a.py::test_1"] == {"pkg/a.py": 1.0}
