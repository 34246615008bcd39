"""One contract, two stores: SQLite (a laptop) and Redis (a fleet's shared store) answer alike.

Every contract test takes `store`, a fixture that yields each backend in turn, and uses it
only through the `EvidenceStore` Protocol. The Redis case runs on the tests' real Redis
(conftest.redis_url) under a key prefix of its own, flushed before and after (the server is shared
with other test runs, so the test flushes its own keys, never the whole database), and
skips with one line when there is no Redis.

Plus the schema rules on both (older: kept aside, started empty; newer: refused, untouched)
and the fleet path end to end: `fastci record` and `fastci select` through a redis:// store.
"""

from __future__ import annotations

import hashlib
import inspect
import sqlite3
import threading
import uuid
from dataclasses import replace

import pytest
import redis as redis_lib
from conftest import redis_url
from test_store import snapshot

from fastci.runner.analysis.blocks import parse_blocks
from fastci.runner.analysis.environment import current
from fastci.runner.errors import EXIT_STORE
from fastci.runner.evidence import Snapshot, TestRecord
from fastci.runner.evidence_index import IndexedTests, TestIndex
from fastci.runner.store import (
    SCHEMA_VERSION,
    EvidenceStore,
    RedisEvidenceStore,
    SqliteEvidenceStore,
    StoreError,
    open_store,
)
from fastci.runner.store.retention import DAY, Retention


def _flush(client, name: str) -> None:
    for key in client.scan_iter(f"{name}*"):  # the prefix and what was moved aside from it
        client.delete(key)


@pytest.fixture
def prefix(redis):
    """A key prefix of this test's own in the real Redis (skips, saying why, without one)."""
    name = f"fastci-test-ev-{uuid.uuid4().hex[:8]}"
    _flush(redis, name)
    yield name
    _flush(redis, name)


@pytest.fixture(params=["sqlite", "redis"])
def location(request, tmp_path):
    if request.param == "sqlite":
        return tmp_path / "e.db"
    return f"{redis_url()}?prefix={request.getfixturevalue('prefix')}"


@pytest.fixture(params=["sqlite", "redis"])
def store(request, tmp_path):
    """Each backend, opened empty; the tests see only the Protocol."""
    if request.param == "sqlite":
        opened = SqliteEvidenceStore(tmp_path / "e.db")
    else:
        opened = RedisEvidenceStore(f"{redis_url()}?prefix={request.getfixturevalue('prefix')}")
    with opened:
        yield opened


# -- the interface ---------------------------------------------------------------------------
PROTOCOL_METHODS = sorted(
    name for name, member in vars(EvidenceStore).items()
    if callable(member) and (not name.startswith("_") or name in ("__enter__", "__exit__")))


def test_the_protocol_declares_what_callers_use():
    assert {"save_inventories", "load_inventories", "save_captures", "load_capture",
            "replay_result", "save_replay_results", "save_snapshot", "snapshot_envs",
            "commits_with_evidence", "load_snapshot", "add_audit", "audits", "add_history",
            "outcomes", "durations", "cofailure_rates", "flip_history", "gc", "close",
            "load_modules", "load_lines", "save_test_names", "load_test_names",
            "__enter__", "__exit__"} <= set(PROTOCOL_METHODS)


def test_each_backend_implements_the_protocol(store):
    assert isinstance(store, EvidenceStore)
    for name in PROTOCOL_METHODS:  # same parameters, names, kinds and defaults
        declared = inspect.signature(getattr(EvidenceStore, name)).parameters
        actual = inspect.signature(getattr(type(store), name)).parameters
        assert [(p.name, p.kind, p.default) for p in actual.values()] == \
            [(p.name, p.kind, p.default) for p in declared.values()], f"{type(store)}.{name}"
    with store as entered:
        assert entered is store


def test_open_store_picks_the_backend_by_location(location):
    with open_store(location) as opened:
        assert isinstance(opened, EvidenceStore)
        assert isinstance(opened, RedisEvidenceStore if str(location).startswith("redis://")
                          else SqliteEvidenceStore)


# -- the contract ----------------------------------------------------------------------------
def test_snapshots_round_trip_alike(store: EvidenceStore):
    snap = snapshot()
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
    assert loaded.environment == snap.environment and loaded.source == "record"
    for test_id, test in snap.tests.items():
        got = loaded.tests[test_id]
        assert (got.blocks, got.files, got.kernels, got.lines) == \
            (test.blocks, test.files, test.kernels, test.lines)
        assert got.dimension == "convergence" and got.markers == ("convergence",)
        assert without_lines.tests[test_id].lines is None


def test_module_calls_load_only_when_asked(store: EvidenceStore):
    """Selection decodes a snapshot without its module calls (pruning's part, most of the
    bytes); pruning loads them for its candidates only, carry-forward with the snapshot."""
    modules = {"captures": [{"index": 0, "module": "pkg.a.Net", "digest": "d" * 64,
                             "lines": {"pkg/a.py": [1, 2]}}],
               "outside": {"pkg/a.py": [3]}, "inside": {}, "sys_path": ["."]}
    base = snapshot()
    first, second, third = sorted(base.tests)
    tests = {**base.tests, first: replace(base.tests[first], modules=modules),
             second: replace(base.tests[second], modules={**modules, "sys_path": []})}
    store.save_snapshot(replace(base, tests=tests))
    env = base.environment.digest
    plain = store.load_snapshot("c1", env, with_lines=True)
    assert all(t.modules is None for t in plain.tests.values())
    assert plain.tests[first].blocks == base.tests[first].blocks
    full = store.load_snapshot("c1", env, with_modules=True)
    assert full.tests[first].modules == modules and full.tests[third].modules is None
    assert full.tests[second].modules["sys_path"] == []
    assert store.load_modules("c1", env, [first, third, "tests/nope.py::t"]) == \
        {first: modules}
    assert store.load_modules("c1", env, []) == {}
    assert store.load_modules("c9", env, [first]) == {}


def test_the_index_is_stored_with_the_snapshot_and_tests_decode_when_read(
        store: EvidenceStore):
    """Selection reads the index of a snapshot and decodes only the tests it reaches."""
    snap = snapshot(tests=4)
    store.save_snapshot(snap)
    loaded = store.load_snapshot("c1", snap.environment.digest)
    assert loaded.index == TestIndex.build(snap.tests)
    assert isinstance(loaded.tests, IndexedTests) and loaded.tests.decoded == 0
    assert sorted(loaded.tests) == sorted(snap.tests) and len(loaded.tests) == 4
    first = sorted(snap.tests)[0]
    assert first in loaded.tests and "tests/nope.py::t" not in loaded.tests
    assert loaded.tests[first].blocks == snap.tests[first].blocks
    assert loaded.tests.decoded == 1
    with_lines = store.load_snapshot("c1", snap.environment.digest, with_lines=True)
    assert with_lines.index == loaded.index  # the index travels with the tests
    assert replace(loaded, tests=dict(loaded.tests)).index is None  # other tests: none


def _drop_index(store: EvidenceStore, commit: str, env: str, value: bytes | None) -> None:
    """Replace the stored index of a snapshot from outside (None: remove it)."""
    if isinstance(store, SqliteEvidenceStore):
        db = sqlite3.connect(store.path)
        db.execute("UPDATE snapshots SET test_index=? WHERE commit_sha=? AND env=?",
                   (value, commit, env))
        db.commit()
        db.close()
    else:
        assert isinstance(store, RedisEvidenceStore)
        client = redis_lib.Redis.from_url(redis_url())
        key = f"{store.prefix}:snap:{commit}:{env}"
        client.hdel(key, "index") if value is None else client.hset(key, "index", value)
        client.close()


@pytest.mark.parametrize("stored", [None, b"damaged"])
def test_a_snapshot_without_a_readable_index_loads_without_one(store: EvidenceStore,
                                                              stored):
    """Its selection then evaluates every test (the slow path, never a wrong one)."""
    snap = snapshot()
    store.save_snapshot(snap)
    _drop_index(store, "c1", snap.environment.digest, stored)
    loaded = store.load_snapshot("c1", snap.environment.digest)
    assert loaded.index is None and sorted(loaded.tests) == sorted(snap.tests)


def test_test_names_are_cached_by_key(store: EvidenceStore):
    store.save_test_names({f"{'a' * 40}:1": ["test_x", "TestY::test_z"], f"{'b' * 40}:1": []})
    assert store.load_test_names([f"{'a' * 40}:1", f"{'b' * 40}:1", f"{'a' * 40}:2"]) == \
        {f"{'a' * 40}:1": ["test_x", "TestY::test_z"], f"{'b' * 40}:1": []}
    store.save_test_names({f"{'a' * 40}:1": ["test_w"]})  # replaced
    assert store.load_test_names([f"{'a' * 40}:1"]) == {f"{'a' * 40}:1": ["test_w"]}
    assert store.load_test_names([]) == {}


def test_lines_load_for_the_tests_asked_for(store: EvidenceStore):
    """Selection's statement rule loads the executed lines of the tests that ran a function
    changed inside, not the whole snapshot's."""
    base = snapshot()
    first, second, third = sorted(base.tests)
    tests = {**base.tests, first: replace(base.tests[first], lines={"pkg/a.py": (1, 2, 5)}),
             second: replace(base.tests[second], lines={"pkg/b.py": (7,)}),
             third: replace(base.tests[third], lines=None)}
    store.save_snapshot(replace(base, tests=tests))
    env = base.environment.digest
    assert store.load_lines("c1", env, [first, third, "tests/nope.py::t"]) == \
        {first: {"pkg/a.py": (1, 2, 5)}}
    assert store.load_lines("c1", env, [second]) == {second: {"pkg/b.py": (7,)}}
    assert store.load_lines("c1", env, []) == {}
    assert store.load_lines("c9", env, [first]) == {}


def test_saving_a_commit_again_replaces_it(store: EvidenceStore):
    store.save_snapshot(snapshot("c1", tests=3))
    store.save_snapshot(snapshot("c1", tests=1, source="run"))
    loaded = store.load_snapshot("c1", snapshot().environment.digest)
    assert list(loaded.tests) == ["tests/test_a.py::test_0"] and loaded.source == "run"
    assert store.commits_with_evidence() == {"c1"}


def test_environments_of_a_commit_newest_first(store: EvidenceStore):
    here = current()
    there = replace(here, python="0.0.0-elsewhere")
    store.save_snapshot(replace(snapshot("c1"), environment=there, created_at=1.0))
    store.save_snapshot(replace(snapshot("c1"), environment=here, created_at=2.0))
    assert store.snapshot_envs("c1") == [(here.digest, here), (there.digest, there)]
    assert store.snapshot_envs("c2") == []
    assert store.commits_with_evidence(there.digest) == {"c1"}
    assert store.commits_with_evidence("no-such-env") == set()


def test_inventories_captures_and_replays_alike(store: EvidenceStore, tmp_path):
    fb = parse_blocks("X = 1\nclass A:\n    y = X\n    def f(self):\n        return self.y\n")
    blob = tmp_path / "capture"
    blob.write_bytes(b"\x00module bytes")
    store.save_inventories({"blob1": fb})
    got = store.load_inventories(["blob1", "missing"])
    assert list(got) == ["blob1"] and got["blob1"].blocks == fb.blocks
    assert got["blob1"].owner_of(5) == "A.f"
    store.save_captures({"d1": blob})
    assert store.load_capture("d1") == b"\x00module bytes"
    assert store.load_capture("d2") is None
    store.save_replay_results({"k": {"fingerprints": {"out": {"hash": "1"}}}})
    assert store.replay_result("k") == {"fingerprints": {"out": {"hash": "1"}}}
    assert store.replay_result("other") is None


def test_an_older_parser_s_inventory_is_parsed_again(store: EvidenceStore, monkeypatch):
    """Inventories are stored by blob: one an older parser made (its lines owned otherwise)
    is not answered from the store, and the new parse replaces it."""
    from fastci.runner.store import codec  # noqa: PLC0415

    source = 'class Hooks:\n    def on_step(self):\n        """Override me."""\n'
    fb = parse_blocks(source)
    assert fb.owner_of(2) == "Hooks.on_step"  # a call of a docstring-only body: its first line
    monkeypatch.setattr(codec, "PARSER_VERSION", codec.PARSER_VERSION - 1)
    store.save_inventories({"blob-old": fb})  # as an older FastCI wrote it
    monkeypatch.undo()
    assert store.load_inventories(["blob-old"]) == {}
    store.save_inventories({"blob-old": fb})
    assert store.load_inventories(["blob-old"])["blob-old"].owner_of(2) == "Hooks.on_step"


def test_history_alike(store: EvidenceStore):
    snap = snapshot()
    failing = {k: v.__class__(**{**v.__dict__, "outcome": "failed"}) for k, v in snap.tests.items()}
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
    assert store.outcomes(limit_per_test=1)["tests/test_a.py::test_1"] == ["passed"]


def test_audits_alike(store: EvidenceStore):
    store.add_audit({"at": 20.0, "kind": "shadow", "missed": ["t2"]})
    store.add_audit({"at": 10.0, "kind": "full", "missed": []})
    assert [a["kind"] for a in store.audits()] == ["full", "shadow"]  # oldest first
    assert store.audits(since=15.0) == [{"at": 20.0, "kind": "shadow", "missed": ["t2"]}]


# -- retention (`fastci gc`) -----------------------------------------------------------------
NOW = 1_700_000_000.0


def _hex(name: str, n: int = 64) -> str:
    """A digest-shaped name (Redis gc touches only keys shaped like its digests)."""
    return hashlib.sha256(name.encode()).hexdigest()[:n]


def _gc_snapshot(commit: str, days_old: float, env=None, shared: bool = False) -> Snapshot:
    """A snapshot of `commit` with one test of its own, which captured one module call, and
    (`shared`) one test whose evidence, capture and tree blob other snapshots share too."""
    def test(test_id: str, capture: str) -> TestRecord:
        return TestRecord(test_id=test_id, outcome="passed", duration=0.5,
                          blocks={"pkg/a.py": ("f",)}, lines={"pkg/a.py": (1, 2)},
                          modules={"captures": [{"index": 0, "module": "pkg.a.Net",
                                                 "digest": capture, "size": 5}],
                                   "outside": {}, "inside": {}, "sys_path": []})

    tests = {f"tests/test_{commit}.py::test_own": test(f"tests/test_{commit}.py::test_own",
                                                        _hex(f"cap-{commit}"))}
    tree = {f"pkg/own_{commit}.py": _hex(f"blob-{commit}", 40),
            "pkg/a.py": _hex("blob-shared", 40)}
    if shared:
        tests["tests/test_s.py::test_shared"] = test("tests/test_s.py::test_shared",
                                                     _hex("cap-shared"))
    return Snapshot(commit=commit, environment=env or current(), tree=tree, tests=tests,
                    created_at=NOW - days_old * DAY)


def _gc_world(store: EvidenceStore, tmp_path):
    """main: a -> b (b nearest main's tip); c on no branch, old; d on no branch, young; a
    also recorded in another environment, where it is main's newest. Captures, replays and
    inventories for each, plus orphans of each kind."""
    elsewhere = replace(current(), python="0.0.0-elsewhere")
    snaps = {"a": _gc_snapshot("a", 40), "b": _gc_snapshot("b", 35, shared=True),
             "c": _gc_snapshot("c", 50, shared=True), "d": _gc_snapshot("d", 1),
             "a@elsewhere": _gc_snapshot("a", 40, env=elsewhere)}
    for snap in snaps.values():
        store.save_snapshot(snap)
    names = ["a", "b", "c", "d", "shared", "orphan"]
    files = {}
    for name in names:
        files[_hex(f"cap-{name}")] = tmp_path / f"cap-{name}"
        files[_hex(f"cap-{name}")].write_bytes(b"module call " + name.encode())
    store.save_captures(files)
    store.save_replay_results({f"{_hex(f'cap-{n}')}:{_hex('tree', 24)}:exact": {"n": n}
                               for n in names})
    fb = parse_blocks("def f():\n    return 1\n")
    store.save_inventories({_hex(f"blob-{n}", 40): fb for n in names})
    store.save_test_names({f"{_hex(f'blob-{n}', 40)}:1": ["test_f"] for n in names})
    retention = Retention(keep_days=30, now=NOW, branches={"refs/heads/main": ["b", "a"]})
    return snaps, retention, elsewhere


def _present(store: EvidenceStore) -> dict[str, set[str]]:
    names = ["a", "b", "c", "d", "shared", "orphan"]
    return {
        "captures": {n for n in names if store.load_capture(_hex(f"cap-{n}")) is not None},
        "replays": {n for n in names
                    if store.replay_result(f"{_hex(f'cap-{n}')}:{_hex('tree', 24)}:exact")},
        "inventories": {n for n in names
                        if store.load_inventories([_hex(f"blob-{n}", 40)])},
        "test_names": {n for n in names
                       if store.load_test_names([f"{_hex(f'blob-{n}', 40)}:1"])},
    }


def test_gc_keeps_what_the_rule_keeps_and_everything_they_reach(store: EvidenceStore,
                                                                 tmp_path):
    snaps, retention, elsewhere = _gc_world(store, tmp_path)
    before = _present(store)
    dry = store.gc(retention, dry_run=True)
    assert dry.dry_run and _present(store) == before  # a dry run deletes nothing
    assert store.commits_with_evidence() == {"a", "b", "c", "d"}
    report = store.gc(retention)
    assert report.to_json()["kinds"] == dry.to_json()["kinds"]  # it did what it said
    counts = {k: (v.kept, v.deleted) for k, v in report.kinds.items()}
    assert counts["snapshots"] == (3, 2)  # b, d, a@elsewhere kept; c and a@here deleted
    assert counts["captures"] == (4, 2) and counts["replays"] == (4, 2)  # c, the orphan
    assert counts["inventories"] == (4, 2) and counts["trees"] == (3, 1)
    assert counts["test_names"] == (4, 2)  # by blob, as inventories
    assert counts["modules"] == (4, 1)  # one per capture: a, b, d, shared kept; c deleted
    # (The tests' evidence is alike in every snapshot, so it is shared and stays; what
    # differs between them is their module calls.)
    assert all(report.kinds[k].bytes > 0 for k in ("snapshots", "trees", "modules",
                                                    "captures", "replays", "inventories"))
    # Kept: whole, with everything they reach (a gc that deletes too much loses evidence).
    here = current().digest
    for commit, env in (("b", here), ("d", here), ("a", elsewhere.digest)):
        loaded = store.load_snapshot(commit, env, with_lines=True, with_modules=True)
        expected = snaps["a@elsewhere" if env == elsewhere.digest else commit]
        assert loaded is not None and loaded.tree == expected.tree
        assert set(loaded.tests) == set(expected.tests)
        assert all(t.lines == {"pkg/a.py": (1, 2)} and t.modules is not None
                   for t in loaded.tests.values())
    present = _present(store)
    assert present["captures"] == {"a", "b", "d", "shared"}  # shared: c's too, but b keeps it
    assert present["replays"] == {"a", "b", "d", "shared"}
    assert present["inventories"] == {"a", "b", "d", "shared"}  # blobs of the kept trees
    assert present["test_names"] == {"a", "b", "d", "shared"}
    # Deleted: c (old, on no branch) and a in this environment (b is main's newest here).
    assert store.load_snapshot("c", here) is None and store.load_snapshot("a", here) is None
    assert store.commits_with_evidence() == {"a", "b", "d"}
    assert store.commits_with_evidence(here) == {"b", "d"}
    assert [key for key, _ in store.snapshot_envs("a")] == [elsewhere.digest]
    again = store.gc(retention)
    assert again.deleted == 0 and again.kinds["snapshots"].kept == 3


def test_gc_with_no_branches_keeps_the_young_and_a_long_retention_keeps_all(
        store: EvidenceStore, tmp_path):
    _gc_world(store, tmp_path)
    everything = store.gc(Retention(keep_days=365, now=NOW))
    assert everything.kinds["snapshots"].deleted == 0
    assert everything.kinds["captures"].deleted == 1  # only the orphan
    report = store.gc(Retention(keep_days=30, now=NOW))
    assert report.kinds["snapshots"].kept == 1
    assert store.commits_with_evidence() == {"d"}
    assert _present(store)["captures"] == {"d"}


def test_a_snapshot_saved_during_gc_keeps_its_parts(store: EvidenceStore, tmp_path, request):
    """A writer saves, while gc plans, a snapshot made of the very parts gc is about to
    delete (c's tree, evidence and capture): it must come out whole."""
    snaps, retention, _ = _gc_world(store, tmp_path)
    location = (store.path if isinstance(store, SqliteEvidenceStore)
                else f"{redis_url()}?prefix={request.getfixturevalue('prefix')}")
    late = replace(snaps["c"], commit="e", created_at=NOW)
    writer = threading.Thread(target=lambda: _save_elsewhere(location, late))

    calls: list = []

    class Racing(Retention):
        def kept(self, snapshots):
            if not writer.is_alive() and writer.ident is None:
                writer.start()  # SQLite: it waits for gc's transaction; Redis: it races
                writer.join(timeout=2)
            calls.append(1)
            return super().kept(snapshots)

    store.gc(Racing(keep_days=retention.keep_days, now=NOW, branches=retention.branches))
    writer.join(timeout=60)
    loaded = store.load_snapshot("e", current().digest, with_lines=True)
    assert loaded is not None and loaded.tree == late.tree
    assert set(loaded.tests) == set(late.tests)
    assert all(t.lines == {"pkg/a.py": (1, 2)} for t in loaded.tests.values())
    assert store.load_snapshot("c", current().digest) is None
    # Redis: the write made gc's EXEC fail, and gc planned again with the new snapshot.
    assert len(calls) == (1 if isinstance(store, SqliteEvidenceStore) else 2)


def _save_elsewhere(location, snap: Snapshot) -> None:
    with open_store(location) as other:
        other.save_snapshot(snap)


def test_an_empty_store_read_without_create_is_a_clear_error(location):
    with pytest.raises(StoreError, match="fastci record|no FastCI evidence") as info:
        open_store(location, create=False)
    assert info.value.exit_code == EXIT_STORE


# -- the schema version, on both -------------------------------------------------------------
def _set_version(location, version: int) -> None:
    """Mark the store at `location` as written by another schema version, from outside."""
    if str(location).startswith("redis://"):
        client = redis_lib.Redis.from_url(redis_url())
        client.set(f"{str(location).split('prefix=')[1]}:schema_version", version)
        client.close()
    else:
        db = sqlite3.connect(location)
        db.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(version),))
        db.commit()
        db.close()


def _kept_aside(location) -> list:
    if str(location).startswith("redis://"):
        client = redis_lib.Redis.from_url(redis_url())
        kept = list(client.scan_iter(f"{str(location).split('prefix=')[1]}.v*"))
        client.close()
        return kept
    return list(location.parent.glob("*.bak"))


def test_a_newer_schema_is_refused_and_left_untouched(location):
    with open_store(location) as store:
        store.save_snapshot(snapshot())
    _set_version(location, SCHEMA_VERSION + 1)
    for _ in range(2):  # refused every time, never moved aside
        with pytest.raises(StoreError, match="upgrade FastCI") as info:
            open_store(location)
        assert info.value.exit_code == EXIT_STORE and "re-record" in str(info.value)
    assert _kept_aside(location) == []
    _set_version(location, SCHEMA_VERSION)  # what it held is still there
    with open_store(location) as store:
        assert store.commits_with_evidence() == {"c1"}


def test_an_older_schema_is_kept_aside_and_started_empty(location, capsys):
    with open_store(location) as store:
        store.save_snapshot(snapshot())
    old = SCHEMA_VERSION - 1
    _set_version(location, old)
    with open_store(location) as store:
        assert store.commits_with_evidence() == set()
        store.save_snapshot(snapshot("c2"))
    err = capsys.readouterr().err
    assert f"schema version {old}, this FastCI uses {SCHEMA_VERSION}" in err
    assert "re-recorded (`fastci record`)" in err
    with open_store(location) as store:  # the new version holds: nothing moves again
        assert store.commits_with_evidence() == {"c2"}
    assert "kept it as" not in capsys.readouterr().err
    assert _kept_aside(location)


def test_redis_keeps_an_older_version_under_its_own_prefix(prefix, redis):
    url = f"{redis_url()}?prefix={prefix}"
    with RedisEvidenceStore(url) as store:
        store.save_snapshot(snapshot())
        store.add_history("c1", "env", snapshot().tests.values())
    old = SCHEMA_VERSION - 1
    redis.set(f"{prefix}:schema_version", old)
    redis.set(f"{prefix}x:neighbour", b"not ours")  # a longer prefix is another store
    before = {k[len(prefix):] for k in redis.scan_iter(f"{prefix}:*")}
    errors = []

    def open_once() -> None:
        try:
            RedisEvidenceStore(url).close()
        except Exception as exc:  # noqa: BLE001 - reported below, in the test's thread
            errors.append(exc)

    openers = [threading.Thread(target=open_once) for _ in range(3)]
    for t in openers:  # several processes meet the old version at once: one moves it
        t.start()
    for t in openers:
        t.join(30)
    assert errors == []
    aside = f"{prefix}.v{old}"
    assert {k[len(aside):] for k in redis.scan_iter(f"{aside}:*")} == before
    assert {k for k in redis.scan_iter(f"{prefix}:*")} == {f"{prefix}:schema_version".encode()}
    assert int(redis.get(f"{prefix}:schema_version")) == SCHEMA_VERSION
    assert int(redis.get(f"{aside}:schema_version")) == old
    assert redis.get(f"{prefix}x:neighbour") == b"not ours"
    with RedisEvidenceStore(url) as store:
        assert store.commits_with_evidence() == set() and store.outcomes() == {}


# -- Redis only ------------------------------------------------------------------------------
def test_an_unreachable_redis_store_is_a_clear_error():
    with pytest.raises(StoreError, match="unreachable"):
        RedisEvidenceStore("redis://127.0.0.1:1/0")


def test_an_empty_redis_store_read_without_create_is_a_clear_error(prefix):
    with pytest.raises(StoreError, match="no FastCI evidence"):
        RedisEvidenceStore(f"{redis_url()}?prefix={prefix}", create=False)


def test_the_cli_records_and_selects_through_a_redis_store(library, prefix):
    url = f"{redis_url()}?prefix={prefix}"
    library.fastci("record", "-q", "--store", url, "--", "-q", "-p", "no:cacheprovider")
    library.edit("calc/norms.py", "return", "return  ")  # formatting only
    plain = library.select("--store", str(library.root / ".fastci" / "evidence.db"))
    shared = library.select("--store", url)
    assert [t["id"] for t in shared["tests"]] == [t["id"] for t in plain["tests"]]
    assert shared["summary"]["selected"] == plain["summary"]["selected"] == 0
    assert shared["base"] == plain["base"]
