"""The SQLite evidence store: round trips, versioning, bad files, two writers; where the
store is. What every backend answers alike is in test_store_backends.py."""

from __future__ import annotations

import multiprocessing
import sqlite3
from pathlib import Path

import pytest

from fastci.runner.analysis.blocks import parse_blocks
from fastci.runner.analysis.environment import current
from fastci.runner.errors import EXIT_STORE
from fastci.runner.evidence import Snapshot, TestRecord
from fastci.runner.store import (
    SCHEMA_VERSION,
    SqliteEvidenceStore,
    StoreError,
    open_store,
    resolve_store,
)


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
    with SqliteEvidenceStore(tmp_path / "e.db") as store:
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
    with SqliteEvidenceStore(tmp_path / "e.db") as store:
        store.save_snapshot(snapshot("c1"))
        store.save_snapshot(snapshot("c1"))
        store.save_snapshot(snapshot("c2"))
        db = store._db
        assert db.execute("SELECT count(*) FROM snapshots").fetchone()[0] == 2
        # three distinct tests' evidence, shared by both commits
        assert db.execute("SELECT count(*) FROM evidence").fetchone()[0] == 3


def test_inventory_cache_round_trip(tmp_path):
    fb = parse_blocks("X = 1\nclass A:\n    y = X\n    def f(self):\n        return self.y\n")
    with SqliteEvidenceStore(tmp_path / "e.db") as store:
        store.save_inventories({"blob1": fb})
        got = store.load_inventories(["blob1", "missing"])["blob1"]
    assert got.blocks == fb.blocks
    assert got.owner_of(5) == "A.f" and got.owner_of(3) == "A"


def test_corrupt_file_is_a_clear_error_and_is_left_alone(tmp_path):
    path = tmp_path / "evidence.db"
    path.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(StoreError, match="not a FastCI evidence store"):
        SqliteEvidenceStore(path)
    assert path.read_bytes().startswith(b"this is not sqlite")


def test_foreign_sqlite_file_is_refused(tmp_path):
    path = tmp_path / "other.db"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE users (name TEXT)")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="not a FastCI evidence store"):
        SqliteEvidenceStore(path)


class _Interleaved:
    """A connection that runs `between` right after its first `PRAGMA application_id`: the
    moment another process's creation of the store commits, in the race xdist hit."""

    def __init__(self, db: sqlite3.Connection, between) -> None:
        self._db, self._between = db, between

    def execute(self, sql, *args):
        cursor = self._db.execute(sql, *args)
        if sql.startswith("PRAGMA application_id") and self._between is not None:
            rows = cursor.fetchall()
            self._between()
            self._between = None
            return _Rows(rows)
        return cursor

    def __getattr__(self, name):
        return getattr(self._db, name)


class _Rows(list):
    """Rows already fetched, answering `fetchone` like the cursor they came from."""

    def fetchone(self):
        return self[0] if self else None


def test_a_store_another_process_is_creating_opens_instead_of_looking_foreign(tmp_path):
    from fastci.runner.store import sqlite as sqlite_store

    path = tmp_path / "evidence.db"
    creator = sqlite3.connect(path, isolation_level=None)
    creator.execute("PRAGMA journal_mode = WAL")
    creator.execute("BEGIN IMMEDIATE")
    creator.execute(f"PRAGMA application_id = {sqlite_store.APPLICATION_ID}")
    for statement in sqlite_store.SCHEMA.split(";"):
        if statement.strip():
            creator.execute(statement)
    creator.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))

    class Racing(SqliteEvidenceStore):
        def _connect(self):
            return _Interleaved(super()._connect(), lambda: creator.execute("COMMIT"))

    with Racing(path) as store:  # the creator commits between the reader's two reads
        store.save_snapshot(snapshot())
        assert store.load_snapshot("c1", store.snapshot_envs("c1")[0][0]) is not None
    creator.close()


def test_older_schema_is_kept_aside_and_rebuilt(tmp_path, capsys):
    path = tmp_path / "e.db"
    with SqliteEvidenceStore(path) as store:
        store.save_snapshot(snapshot())
        store._db.execute("UPDATE meta SET value='0' WHERE key='schema_version'")
    with SqliteEvidenceStore(path) as store:
        assert store.commits_with_evidence() == set()
    assert (tmp_path / "e.db.v0.bak").exists()
    err = capsys.readouterr().err
    assert f"uses {SCHEMA_VERSION}" in err
    assert "re-recorded (`fastci record`)" in err and "e.db.v0.bak" in err


def test_the_previous_schema_version_is_kept_aside_too(tmp_path, capsys):
    path = tmp_path / "e.db"
    with SqliteEvidenceStore(path) as store:
        store.save_snapshot(snapshot())
        store._db.execute("UPDATE meta SET value=? WHERE key='schema_version'",
                          (str(SCHEMA_VERSION - 1),))
    with SqliteEvidenceStore(path) as store:
        assert store.commits_with_evidence() == set()
        tables = {r[0] for r in store._db.execute("SELECT name FROM sqlite_master")}
    kept = tmp_path / f"e.db.v{SCHEMA_VERSION - 1}.bak"
    old = sqlite3.connect(kept)  # the old evidence is intact, for an older FastCI
    assert old.execute("SELECT count(*) FROM snapshots").fetchone()[0] == 1
    old.close()
    assert "audit" in tables and "fastci record" in capsys.readouterr().err


def test_a_newer_schema_is_refused_and_left_alone(tmp_path):
    path = tmp_path / "e.db"
    with SqliteEvidenceStore(path) as store:
        store.save_snapshot(snapshot())
        store._db.execute("UPDATE meta SET value=? WHERE key='schema_version'",
                          (str(SCHEMA_VERSION + 1),))
    before = path.read_bytes()
    for _ in range(2):  # refused every time, never rebuilt
        with pytest.raises(StoreError, match="upgrade FastCI") as info:
            SqliteEvidenceStore(path)
        assert info.value.exit_code == EXIT_STORE
        assert f"schema version {SCHEMA_VERSION + 1}" in str(info.value)
    assert path.read_bytes() == before
    assert list(tmp_path.glob("*.bak")) == []


def test_the_cli_exits_4_on_a_newer_store(project, tmp_path):
    project.write({"README": "x\n"})
    project.commit()
    path = tmp_path / "newer.db"
    with SqliteEvidenceStore(path) as store:
        store._db.execute("UPDATE meta SET value=? WHERE key='schema_version'",
                          (str(SCHEMA_VERSION + 1),))
    proc = project.fastci("audit", "--store", str(path), check=False)
    assert proc.returncode == EXIT_STORE, proc.stderr
    assert "upgrade FastCI" in proc.stderr and "re-record" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_missing_store_without_create_says_what_to_do(tmp_path):
    with pytest.raises(StoreError, match="fastci record"):
        SqliteEvidenceStore(tmp_path / "none.db", create=False)


def _writer(path: str, commit: str, n: int) -> None:
    with SqliteEvidenceStore(path) as store:
        for i in range(n):
            store.save_snapshot(snapshot(f"{commit}-{i}", tests=20))
            store.add_history(f"{commit}-{i}", "env", snapshot(tests=5).tests.values(),
                              changed_paths=["pkg/a.py"])


def test_two_writers_lose_nothing(tmp_path):
    path = str(tmp_path / "e.db")
    SqliteEvidenceStore(path).close()
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(path, name, 15)) for name in ("a", "b")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    with SqliteEvidenceStore(path) as store:
        assert len(store.commits_with_evidence()) == 30
        assert sum(len(v) for v in store.outcomes().values()) == 150


def test_history_feeds_risk_inputs(tmp_path):
    snap = snapshot()
    failing = {k: v.__class__(**{**v.__dict__, "outcome": "failed"}) for k, v in snap.tests.items()}
    with SqliteEvidenceStore(tmp_path / "e.db") as store:
        store.add_history("c1", "env", failing.values(), changed_paths=["pkg/a.py"])
        store.add_history("c2", "env", snap.tests.values(), changed_paths=["pkg/b.py"])
        outcomes = store.outcomes()
        rates = store.cofailure_rates(["pkg/a.py", "pkg/b.py"])
    assert outcomes["tests/test_a.py::test_1"] == ["passed", "failed"]
    assert rates["tests/test_a.py::test_1"] == {"pkg/a.py": 1.0}


def test_where_the_store_is(tmp_path):
    root = tmp_path / "repo"
    # an explicit location is taken as given (a relative one is the working directory's)
    assert resolve_store("mine.db", ".fastci/evidence.db", root) == Path("mine.db")
    assert resolve_store(tmp_path / "x.db", ".fastci/evidence.db", root) == tmp_path / "x.db"
    # else the configured one, relative to the root
    assert resolve_store(None, ".fastci/evidence.db", root) == root / ".fastci" / "evidence.db"
    assert resolve_store("", "/abs/e.db", root) == Path("/abs/e.db")
    # a redis:// URL passes through, explicit or configured
    url = "redis://127.0.0.1:6379/0?prefix=team-a"
    assert resolve_store(url, ".fastci/evidence.db", root) == url
    assert resolve_store(None, url, root) == url
    assert resolve_store(None, "unix:///run/redis.sock", root) == "unix:///run/redis.sock"


def test_the_app_and_the_runner_resolve_alike(tmp_path, project, monkeypatch):
    from fastci.app.settings import load as app_settings
    from fastci.runner.engine import Engine

    monkeypatch.delenv("FASTCI_STORE", raising=False)
    project.write({"pyproject.toml": "[tool.fastci]\nstore = \"cache/e.db\"\n"})
    project.commit()
    assert Engine(project.root).store_path == project.root / "cache" / "e.db"
    assert Engine(project.root, "given.db").store_path == Path("given.db")
    workspace = tmp_path / "ws"
    assert app_settings({"FASTCI_WORKSPACE": str(workspace)}).store_path == \
        workspace / "evidence.db"
    assert app_settings({"FASTCI_STORE": "redis://h:1/2"}).store_path == "redis://h:1/2"


def test_open_store_opens_a_file_by_path(tmp_path):
    with open_store(tmp_path / "e.db") as store:
        assert isinstance(store, SqliteEvidenceStore)
    with pytest.raises(StoreError, match="fastci record"):
        open_store(tmp_path / "none.db", create=False)



def _open_at_once(path: str, barrier, errors) -> None:
    barrier.wait()
    try:
        SqliteEvidenceStore(path).close()
    except BaseException as exc:  # noqa: BLE001 (reported to the test)
        errors.put(f"{type(exc).__name__}: {exc}")


def test_processes_opening_a_new_store_at_once_all_open_it(tmp_path):
    """SQLite answers a journal-mode change that another connection's lock blocks with
    "database is locked" at once, busy timeout or not: an xdist worker opening a new store
    while another created it failed its recording that way (CI). Three processes racing on
    a fresh file failed 6 times in 60 rounds before the switch to WAL waited."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    errors = context.Queue()
    for round_ in range(40):
        path = str(tmp_path / f"evidence-{round_}.db")
        barrier = context.Barrier(3)
        processes = [context.Process(target=_open_at_once, args=(path, barrier, errors))
                     for _ in range(3)]
        for process in processes:
            process.start()
        for process in processes:
            process.join(60)
            assert process.exitcode == 0
    failures = []
    while not errors.empty():
        failures.append(errors.get())
    assert not failures, failures
