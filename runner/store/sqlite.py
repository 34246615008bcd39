"""The SQLite evidence store: one file, keyed by (commit, environment).

The embedded default (`.fastci/evidence.db`). The file is content-addressed where it can be
(file inventories by blob sha, test evidence by digest), so carrying a skipped test's
evidence to a new commit copies a row id, not its data. The schema version and its history
are in `base.py` (shared with the Redis backend): an older file is moved aside, kept, and
rebuilt empty; a newer one, a corrupt one or another program's file is an error the user
decides about.
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Collection, Iterable, Iterator, Mapping

from fastci.runner.analysis.blocks import FileBlocks
from fastci.runner.analysis.environment import Environment
from fastci.runner.evidence import (
    Snapshot,
    TestRecord,
    pack,
    unpack,
    unpack_lines,
    unpack_modules,
)
from fastci.runner.evidence_index import IndexedTests, TestIndex
from fastci.runner.store.base import (
    SCHEMA_VERSION,
    StoreError,
    newer_version_error,
    older_version_message,
)
from fastci.runner.store.codec import inventory_from_json, inventory_to_json, snapshot_parts
from fastci.runner.store.retention import GcReport, Reach, Retention, SnapshotRef

APPLICATION_ID = 0x46434931  # "FCI1": marks the file as ours for `file(1)` and for us

SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE inventories (blob TEXT PRIMARY KEY, data BLOB NOT NULL);
CREATE TABLE test_names (key TEXT PRIMARY KEY, data TEXT NOT NULL);
CREATE TABLE trees (digest TEXT PRIMARY KEY, data BLOB NOT NULL);
CREATE TABLE evidence (digest TEXT PRIMARY KEY, data BLOB NOT NULL);
CREATE TABLE lines (digest TEXT PRIMARY KEY, data BLOB NOT NULL);
CREATE TABLE modules (digest TEXT PRIMARY KEY, data BLOB NOT NULL);
CREATE TABLE captures (digest TEXT PRIMARY KEY, data BLOB NOT NULL);
CREATE TABLE replays (key TEXT PRIMARY KEY, data BLOB NOT NULL);
CREATE TABLE audit (id INTEGER PRIMARY KEY, at REAL NOT NULL, data TEXT NOT NULL);
CREATE TABLE snapshots (
    id INTEGER PRIMARY KEY,
    commit_sha TEXT NOT NULL,
    env TEXT NOT NULL,
    env_json TEXT NOT NULL,
    tree TEXT NOT NULL REFERENCES trees(digest),
    import_time TEXT NOT NULL,
    session_files TEXT NOT NULL,
    created_at REAL NOT NULL,
    source TEXT NOT NULL,
    scope TEXT NOT NULL DEFAULT '{}',
    test_index BLOB,
    UNIQUE (commit_sha, env)
);
CREATE TABLE tests (
    snapshot INTEGER NOT NULL REFERENCES snapshots(id) ON DELETE CASCADE,
    test_id TEXT NOT NULL,
    outcome TEXT NOT NULL,
    duration REAL NOT NULL,
    evidence TEXT NOT NULL REFERENCES evidence(digest),
    lines TEXT REFERENCES lines(digest),
    modules TEXT REFERENCES modules(digest),
    markers TEXT NOT NULL,
    dimension TEXT NOT NULL,
    peak_memory INTEGER NOT NULL,
    cuda INTEGER NOT NULL,
    carried_from TEXT,
    PRIMARY KEY (snapshot, test_id)
);
CREATE TABLE history (
    id INTEGER PRIMARY KEY,
    at REAL NOT NULL,
    commit_sha TEXT NOT NULL,
    env TEXT NOT NULL,
    test_id TEXT NOT NULL,
    outcome TEXT NOT NULL,
    duration REAL NOT NULL,
    flaky INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX history_test ON history (test_id, id);
CREATE TABLE cofailures (
    path TEXT NOT NULL,
    test_id TEXT NOT NULL,
    failures INTEGER NOT NULL,
    PRIMARY KEY (path, test_id)
);
CREATE TABLE changes (path TEXT PRIMARY KEY, runs INTEGER NOT NULL);
"""


class SqliteEvidenceStore:
    """The `EvidenceStore` in one SQLite file. Safe for two writers: WAL, a busy timeout, and
    every write in one IMMEDIATE transaction."""

    def __init__(self, path: str | os.PathLike[str], *, create: bool = True) -> None:
        self.path = Path(path)
        if not self.path.exists():
            if not create:
                raise StoreError(f"no evidence store at {self.path}: run `fastci record` first")
            self.path.parent.mkdir(parents=True, exist_ok=True)
            ignore = self.path.parent / ".gitignore"
            if self.path.parent.name == ".fastci" and not ignore.exists():
                ignore.write_text("# FastCI's evidence store: a cache, never committed\n*\n")
        elif not self.path.is_file():
            raise StoreError(f"evidence store {self.path} is not a file")
        self._db = self._open()

    # -- opening ---------------------------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        try:
            db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open evidence store {self.path}: {exc}") from None
        db.execute("PRAGMA busy_timeout = 30000")
        return db

    def _header(self, db: sqlite3.Connection, mode: str) -> tuple[int, set[str]]:
        """The file's application id and tables, read in one transaction: read apart, a
        store another process was creating meanwhile looked like a foreign file (tables
        already there, the header not yet), and two xdist workers recording at once lost
        one's evidence that way."""
        try:
            with _transaction(db, mode):
                app_id = db.execute("PRAGMA application_id").fetchone()[0]
                tables = {r[0] for r in db.execute(
                    "SELECT name FROM sqlite_master WHERE type='table'")}
        except sqlite3.DatabaseError as exc:
            db.close()
            raise StoreError(
                f"{self.path} is not a FastCI evidence store ({exc}). It may be corrupt or "
                "another program's file. Move it away or pass another --store; evidence is a "
                "cache, so starting empty only costs time.") from None
        return app_id, tables

    def _open(self) -> sqlite3.Connection:
        db = self._connect()
        app_id, tables = self._header(db, "DEFERRED")
        if tables and (app_id != APPLICATION_ID or "meta" not in tables):
            # Once more behind any writer (a creator still inside its transaction) before
            # calling the file foreign.
            app_id, tables = self._header(db, "IMMEDIATE")
        if not tables:
            self._create(db)
            return db
        if app_id != APPLICATION_ID or "meta" not in tables:
            db.close()
            raise StoreError(
                f"{self.path} is an SQLite file but not a FastCI evidence store (no FastCI "
                "header). Refusing to touch it: pass another --store.")
        row = db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        found = str(row[0]) if row and str(row[0]).isdigit() else "unknown"
        version = int(found) if found != "unknown" else 0  # unreadable: older than any
        if version > SCHEMA_VERSION:
            db.close()
            raise newer_version_error(str(self.path), found)
        if version < SCHEMA_VERSION:
            db.close()
            return self._rebuild(found)
        _write_ahead_log(db)
        db.execute("PRAGMA foreign_keys = ON")
        return db

    def _create(self, db: sqlite3.Connection) -> None:
        _write_ahead_log(db)
        db.execute("PRAGMA foreign_keys = ON")
        with _transaction(db):
            if db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
                return  # another writer created it while we waited
            db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            for statement in SCHEMA.split(";"):
                if statement.strip():
                    db.execute(statement)
            db.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))

    def _rebuild(self, found: str) -> sqlite3.Connection:
        backup = self.path.with_name(f"{self.path.name}.v{found}.bak")
        os.replace(self.path, backup)
        for suffix in ("-wal", "-shm"):
            Path(f"{self.path}{suffix}").unlink(missing_ok=True)
        print(older_version_message(str(self.path), found, backup.name), file=sys.stderr)
        db = self._connect()
        self._create(db)
        return db

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> SqliteEvidenceStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- file inventories (content-addressed by blob sha) ---------------------------------
    def save_inventories(self, inventories: dict[str, FileBlocks]) -> None:
        rows = [(blob, pack(inventory_to_json(fb))) for blob, fb in inventories.items()]
        with _transaction(self._db):
            # REPLACE: an inventory an older parser stored is parsed again and replaced.
            self._db.executemany("INSERT OR REPLACE INTO inventories VALUES (?, ?)", rows)

    def load_inventories(self, blobs: Iterable[str]) -> dict[str, FileBlocks]:
        wanted = list(dict.fromkeys(blobs))
        found: dict[str, FileBlocks] = {}
        for chunk in _chunks(wanted, 500):
            marks = ",".join("?" * len(chunk))
            for blob, data in self._db.execute(
                    f"SELECT blob, data FROM inventories WHERE blob IN ({marks})", chunk):
                fb = inventory_from_json(unpack(data))
                if fb is not None:
                    found[blob] = fb
        return found

    def save_test_names(self, names: dict[str, list[str]]) -> None:
        with _transaction(self._db):
            self._db.executemany("INSERT OR REPLACE INTO test_names VALUES (?, ?)",
                                 [(key, json.dumps(found)) for key, found in names.items()])

    def load_test_names(self, keys: Iterable[str]) -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}
        for chunk in _chunks(list(dict.fromkeys(keys)), 500):
            marks = ",".join("?" * len(chunk))
            for key, data in self._db.execute(
                    f"SELECT key, data FROM test_names WHERE key IN ({marks})", chunk):
                found[key] = json.loads(data)
        return found

    # -- captured module calls (content-addressed by sha256) -------------------------------
    def save_captures(self, files: dict[str, Path]) -> None:
        """Store spilled captures ({digest: file}), reading one file at a time."""
        with _transaction(self._db):
            for digest, path in files.items():
                if self._db.execute("SELECT 1 FROM captures WHERE digest = ?",
                                    (digest,)).fetchone() is None:
                    self._db.execute("INSERT INTO captures VALUES (?, ?)",
                                     (digest, Path(path).read_bytes()))

    def load_capture(self, digest: str) -> bytes | None:
        row = self._db.execute("SELECT data FROM captures WHERE digest = ?",
                               (digest,)).fetchone()
        return row[0] if row else None

    def replay_result(self, key: str) -> dict | None:
        """A cached replay of a capture under some code (key: capture + tree digest)."""
        row = self._db.execute("SELECT data FROM replays WHERE key = ?", (key,)).fetchone()
        return unpack(row[0]) if row else None

    def save_replay_results(self, results: dict[str, dict]) -> None:
        with _transaction(self._db):
            self._db.executemany("INSERT OR REPLACE INTO replays VALUES (?, ?)",
                                 [(k, pack(v)) for k, v in results.items()])

    # -- snapshots -------------------------------------------------------------------------
    def save_snapshot(self, snap: Snapshot) -> None:
        """Store (or replace) the evidence of one (commit, environment)."""
        parts = snapshot_parts(snap)
        tree_digest, tree_data = parts.tree_digest, parts.tree_data
        evidence_rows, line_rows = parts.evidence, parts.lines
        test_rows = [(test.test_id, test.outcome, test.duration, digest, lines_digest,
                      modules_digest, json.dumps(list(test.markers)), test.dimension,
                      test.peak_memory, int(test.cuda), test.carried_from)
                     for test, digest, lines_digest, modules_digest in parts.tests]
        env = snap.environment
        with _transaction(self._db):
            self._db.execute("INSERT OR IGNORE INTO trees VALUES (?, ?)", (tree_digest, tree_data))
            self._db.executemany("INSERT OR IGNORE INTO evidence VALUES (?, ?)",
                                 evidence_rows.items())
            self._db.executemany("INSERT OR IGNORE INTO lines VALUES (?, ?)", line_rows.items())
            self._db.executemany("INSERT OR IGNORE INTO modules VALUES (?, ?)",
                                 parts.modules.items())
            self._db.execute("DELETE FROM snapshots WHERE commit_sha=? AND env=?",
                             (snap.commit, env.digest))
            cur = self._db.execute(
                "INSERT INTO snapshots (commit_sha, env, env_json, tree, import_time, "
                "session_files, created_at, source, scope, test_index) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (snap.commit, env.digest, env.to_json(), tree_digest,
                 json.dumps(snap.import_time, sort_keys=True),
                 json.dumps(snap.session_files, sort_keys=True),
                 snap.created_at or time.time(), snap.source,
                 json.dumps(dict(snap.scope), sort_keys=True), parts.index))
            sid = cur.lastrowid
            self._db.executemany(
                "INSERT INTO tests VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(sid, *row) for row in test_rows])

    def snapshot_envs(self, commit: str) -> list[tuple[str, Environment]]:
        """(environment key, environment) of each snapshot of a commit, newest first."""
        rows = self._db.execute(
            "SELECT env, env_json FROM snapshots WHERE commit_sha=? ORDER BY created_at DESC",
            (commit,))
        return [(key, Environment.from_json(text)) for key, text in rows]

    def commits_with_evidence(self, env_digest: str | None = None) -> set[str]:
        if env_digest is None:
            rows = self._db.execute("SELECT commit_sha FROM snapshots")
        else:
            rows = self._db.execute("SELECT commit_sha FROM snapshots WHERE env=?", (env_digest,))
        return {r[0] for r in rows}

    def load_snapshot(self, commit: str, env_digest: str, *, with_lines: bool = False,
                      with_modules: bool = False) -> Snapshot | None:
        row = self._db.execute(
            "SELECT s.id, s.env_json, t.data, s.import_time, s.session_files, s.created_at, "
            "s.source, s.scope, s.test_index FROM snapshots s JOIN trees t "
            "ON t.digest = s.tree WHERE s.commit_sha=? AND s.env=?",
            (commit, env_digest)).fetchone()
        if row is None:
            return None
        (sid, env_json, tree_data, import_time, session_files, created_at, source, scope,
         index_data) = row
        query = ("SELECT t.test_id, t.outcome, t.duration, e.data, t.markers, t.dimension, "
                 "t.peak_memory, t.cuda, t.carried_from, t.lines, t.modules FROM tests t "
                 "JOIN evidence e ON e.digest = t.evidence WHERE t.snapshot=?")
        rows = {row[0]: row for row in self._db.execute(query, (sid,))}  # decoded when read
        index = TestIndex.unpack(index_data) if index_data is not None else None
        tests: Mapping[str, TestRecord] = IndexedTests(rows, _test_record, index)
        line_digests = {t: r[9] for t, r in rows.items() if r[9]} if with_lines else {}
        module_digests = {t: r[10] for t, r in rows.items() if r[10]} if with_modules else {}
        if with_lines and line_digests:
            blobs = self._blobs("lines", set(line_digests.values()))
            tests = IndexedTests.of({
                tid: replace(t, lines=unpack_lines(blobs[line_digests[tid]])
                             if tid in line_digests else None)
                for tid, t in tests.items()}, index)
        if with_modules and module_digests:
            blobs = self._blobs("modules", set(module_digests.values()))
            tests = IndexedTests.of({
                tid: replace(t, modules=unpack_modules(blobs[module_digests[tid]]))
                if module_digests.get(tid) in blobs else t for tid, t in tests.items()}, index)
        return Snapshot(commit=commit, environment=Environment.from_json(env_json),
                        tree=unpack(tree_data), tests=tests,
                        import_time=json.loads(import_time),
                        session_files=json.loads(session_files),
                        created_at=created_at, source=source, env_key=env_digest,
                        scope=json.loads(scope))

    def load_lines(self, commit: str, env_digest: str, test_ids: Iterable[str],
                   paths: Collection[str] | None = None
                   ) -> dict[str, dict[str, tuple[int, ...]]]:
        """The executed lines of some tests of a snapshot (the statement rule's candidates),
        of every file or of `paths` only."""
        return {t: unpack_lines(d, paths) for t, d in
                self._parts("lines", commit, env_digest, test_ids).items()}

    def load_modules(self, commit: str, env_digest: str, test_ids: Iterable[str]
                     ) -> dict[str, dict]:
        """The captured module calls of some tests of a snapshot (pruning's candidates)."""
        return {t: unpack_modules(d) for t, d in
                self._parts("modules", commit, env_digest, test_ids).items()}

    def _parts(self, table: str, commit: str, env_digest: str, test_ids: Iterable[str]
               ) -> dict[str, bytes]:
        """test -> the packed part (`lines` or `modules`) its row names, for some tests."""
        row = self._db.execute("SELECT id FROM snapshots WHERE commit_sha=? AND env=?",
                               (commit, env_digest)).fetchone()
        if row is None:
            return {}
        out: dict[str, bytes] = {}
        for chunk in _chunks(sorted(set(test_ids)), 500):
            marks = ",".join("?" * len(chunk))
            out.update(self._db.execute(
                f"SELECT t.test_id, p.data FROM tests t JOIN {table} p "
                f"ON p.digest = t.{table} WHERE t.snapshot=? AND t.test_id IN ({marks})",
                (row[0], *chunk)))
        return out

    def _blobs(self, table: str, digests: set[str]) -> dict[str, bytes]:
        out: dict[str, bytes] = {}
        for chunk in _chunks(sorted(digests), 500):
            marks = ",".join("?" * len(chunk))
            out.update(self._db.execute(
                f"SELECT digest, data FROM {table} WHERE digest IN ({marks})", chunk))
        return out

    # -- retention -------------------------------------------------------------------------
    def gc(self, retention: Retention, *, dry_run: bool = False) -> GcReport:
        """Delete the snapshots `retention` does not keep and whatever no kept snapshot
        reaches (`retention.py`), in one IMMEDIATE transaction: a writer waits for it (busy
        timeout), so no snapshot is saved half-way through and none is half-deleted. A dry
        run reads the same in a read transaction and deletes nothing. Freed pages are reused
        by later writes; the file itself shrinks only with `VACUUM`."""
        report = GcReport(dry_run=dry_run)
        db = self._db
        with _transaction(db, "DEFERRED" if dry_run else "IMMEDIATE"):
            rows = db.execute("SELECT id, commit_sha, env, created_at FROM snapshots").fetchall()
            kept = retention.kept(SnapshotRef(c, e, t) for _, c, e, t in rows)
            dropped = [sid for sid, c, e, _ in rows if (c, e) not in kept]
            db.execute("CREATE TEMP TABLE IF NOT EXISTS gc_dropped (id INTEGER PRIMARY KEY)")
            db.execute("DELETE FROM gc_dropped")
            db.executemany("INSERT INTO gc_dropped VALUES (?)", [(i,) for i in dropped])
            for (size,) in db.execute(
                    "SELECT length(s.env_json) + length(s.import_time) + "
                    "length(s.session_files) + coalesce(length(s.test_index), 0) + "
                    "coalesce((SELECT sum(length(t.test_id) + "
                    "length(t.evidence) + coalesce(length(t.lines), 0) + "
                    "coalesce(length(t.modules), 0) + length(t.markers)) "
                    "FROM tests t WHERE t.snapshot = s.id), 0) FROM snapshots s "
                    "WHERE s.id IN (SELECT id FROM gc_dropped)"):
                report.count("snapshots", False, size)
            report.kinds["snapshots"].kept = len(rows) - len(dropped)
            reach = Reach()
            live = "NOT IN (SELECT id FROM gc_dropped)"
            for digest, data in db.execute(
                    f"SELECT digest, data FROM trees WHERE digest IN "
                    f"(SELECT tree FROM snapshots WHERE id {live})"):
                reach.trees.add(digest)
                reach.add_tree(data)
            reach.lines.update(d for (d,) in db.execute(
                f"SELECT DISTINCT lines FROM tests WHERE lines IS NOT NULL AND snapshot {live}"))
            reach.evidence.update(d for (d,) in db.execute(
                f"SELECT DISTINCT evidence FROM tests WHERE snapshot {live}"))
            for digest, data in db.execute(
                    f"SELECT digest, data FROM modules WHERE digest IN "
                    f"(SELECT modules FROM tests WHERE snapshot {live})"):
                reach.modules.add(digest)
                reach.add_modules(data)
            doomed: dict[str, list[str]] = {}
            for kind, table, key in (("trees", "trees", "digest"),
                                     ("evidence", "evidence", "digest"),
                                     ("lines", "lines", "digest"),
                                     ("modules", "modules", "digest"),
                                     ("captures", "captures", "digest"),
                                     ("replays", "replays", "key"),
                                     ("inventories", "inventories", "blob"),
                                     ("test_names", "test_names", "key")):
                doomed[table] = []
                for name, size in db.execute(f"SELECT {key}, length(data) FROM {table}"):
                    keep = reach.keeps(kind, name)
                    report.count(kind, keep, size)
                    if not keep:
                        doomed[table].append(name)
            if not dry_run:  # snapshots first: their tests cascade, then nothing refers on
                db.execute("DELETE FROM snapshots WHERE id IN (SELECT id FROM gc_dropped)")
                for table, key in (("trees", "digest"), ("evidence", "digest"),
                                   ("lines", "digest"), ("modules", "digest"),
                                   ("captures", "digest"),
                                   ("replays", "key"), ("inventories", "blob"),
                                   ("test_names", "key")):
                    db.executemany(f"DELETE FROM {table} WHERE {key} = ?",
                                   [(k,) for k in doomed[table]])
            db.execute("DELETE FROM gc_dropped")
        return report

    # -- audit: what the selection would have missed (shadow runs, full runs) -----------------
    def add_audit(self, entry: dict) -> None:
        with _transaction(self._db):
            self._db.execute("INSERT INTO audit (at, data) VALUES (?, ?)",
                             (entry.get("at", time.time()), json.dumps(entry, sort_keys=True)))

    def audits(self, since: float = 0.0) -> list[dict]:
        return [json.loads(d) for (d,) in self._db.execute(
            "SELECT data FROM audit WHERE at >= ? ORDER BY at", (since,))]

    # -- history: outcomes over time, co-failures -------------------------------------------
    def add_history(self, commit: str, env_digest: str, results: Iterable[TestRecord],
                    changed_paths: Iterable[str] = (), flaky: Iterable[str] = ()) -> None:
        now = time.time()
        results = list(results)
        flaky = set(flaky)
        failed = [r.test_id for r in results if r.failed and r.test_id not in flaky]
        changed = sorted(set(changed_paths))
        with _transaction(self._db):
            self._db.executemany(
                "INSERT INTO history (at, commit_sha, env, test_id, outcome, duration, flaky) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(now, commit, env_digest, r.test_id, r.outcome, r.duration,
                  int(r.test_id in flaky)) for r in results])
            self._db.executemany(
                "INSERT INTO changes VALUES (?, 1) ON CONFLICT(path) DO UPDATE SET runs=runs+1",
                [(p,) for p in changed])
            self._db.executemany(
                "INSERT INTO cofailures VALUES (?, ?, 1) ON CONFLICT(path, test_id) "
                "DO UPDATE SET failures=failures+1",
                [(p, t) for p in changed for t in failed])

    def outcomes(self, limit_per_test: int = 50) -> dict[str, list[str]]:
        """Recent outcomes per test, newest first, flaky results left out."""
        out: dict[str, list[str]] = {}
        for test_id, outcome in self._db.execute(
                "SELECT test_id, outcome FROM history WHERE flaky=0 ORDER BY id DESC"):
            seen = out.setdefault(test_id, [])
            if len(seen) < limit_per_test:
                seen.append(outcome)
        return out

    def durations(self) -> dict[str, float]:
        """The latest duration of each test from history."""
        return dict(self._db.execute(
            "SELECT test_id, duration FROM history WHERE id IN "
            "(SELECT max(id) FROM history GROUP BY test_id)"))

    def cofailure_rates(self, paths: Iterable[str]) -> dict[str, dict[str, float]]:
        """test -> {changed path: failures with that path changed / runs that changed it}."""
        paths = list(set(paths))
        rates: dict[str, dict[str, float]] = {}
        for chunk in _chunks(paths, 500):
            marks = ",".join("?" * len(chunk))
            for path, test_id, failures, runs in self._db.execute(
                    f"SELECT c.path, c.test_id, c.failures, ch.runs FROM cofailures c "
                    f"JOIN changes ch ON ch.path = c.path WHERE c.path IN ({marks})", chunk):
                rates.setdefault(test_id, {})[path] = failures / max(runs, 1)
        return rates

    def flip_history(self, test_ids: Iterable[str]) -> dict[str, list[tuple[str, str]]]:
        """(commit, outcome) pairs per test, newest first: flakiness shows as a flip at one
        commit."""
        ids = list(set(test_ids))
        out: dict[str, list[tuple[str, str]]] = {}
        for chunk in _chunks(ids, 500):
            marks = ",".join("?" * len(chunk))
            for test_id, commit, outcome in self._db.execute(
                    f"SELECT test_id, commit_sha, outcome FROM history WHERE test_id IN "
                    f"({marks}) ORDER BY id DESC", chunk):
                out.setdefault(test_id, []).append((commit, outcome))
        return out


def _test_record(test_id: str, row: tuple) -> TestRecord:
    """A test's record from its row in `load_snapshot`'s query (decoded when first read)."""
    _, outcome, duration, data, markers, dimension, peak, cuda, carried = row[:9]
    return TestRecord.from_payload(data, test_id=test_id, outcome=outcome, duration=duration,
                                   markers=tuple(json.loads(markers)), dimension=dimension,
                                   peak_memory=peak, cuda=bool(cuda), carried_from=carried)


def _write_ahead_log(db: sqlite3.Connection, wait: float = 30.0) -> None:
    """Switch the file to WAL, waiting for other connections as long as the busy timeout.

    SQLite answers a journal-mode change that another connection's lock blocks with "database
    is locked" at once, without its busy handler: an xdist worker opening a new store while
    another created it lost its recording that way (three processes racing on a fresh file:
    6 failures in 60 rounds before)."""
    deadline = time.monotonic() + wait
    delay = 0.005
    while True:
        try:
            db.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc):
                raise
            if time.monotonic() >= deadline:
                raise StoreError(f"evidence store is busy: {exc}") from None
        time.sleep(delay)
        delay = min(delay * 2, 0.25)


@contextmanager
def _transaction(db: sqlite3.Connection, mode: str = "IMMEDIATE") -> Iterator[None]:
    try:
        db.execute(f"BEGIN {mode}")
    except sqlite3.OperationalError as exc:
        raise StoreError(f"evidence store is busy or read-only: {exc}") from None
    try:
        yield
    except BaseException:
        db.execute("ROLLBACK")
        raise
    else:
        db.execute("COMMIT")


def _chunks(items: list, size: int) -> Iterator[list]:
    for i in range(0, len(items), size):
        yield items[i:i + size]
