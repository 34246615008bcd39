"""The evidence store in Redis, behind the same interface as the SQLite one.

A fleet of runners shares one store this way: any runner can select for any commit. Keys
(all under a prefix, default `fastci:evidence`) mirror the SQLite tables: content-addressed
inventories, trees, evidence payloads, line maps, module calls (`mod`, read only by
pruning) and captures; a hash per snapshot and one of its tests; history as capped lists.
Losing it costs time (everything runs once more), never safety: a commit without evidence
selects every test.

    --store redis://host:6379/0            (or FASTCI_STORE, or [tool.fastci] store)
    --store redis://host:6379/0?prefix=team-a

The schema version (`base.py`) is the key `<prefix>:schema_version`. Keys of an older
version are moved aside under `<prefix>.v<old>` (an older FastCI can still read them with
`?prefix=<prefix>.v<old>`) and the prefix starts empty; a newer version is a StoreError.
"""

from __future__ import annotations

import json
import re
import sys
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Collection, Iterable, Mapping
from urllib.parse import parse_qs, urlsplit, urlunsplit

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

if TYPE_CHECKING:
    from redis.typing import EncodableT, FieldT

HISTORY_LIMIT = 200  # outcomes kept per test
REBUILD_WAIT = 60.0  # seconds a process waits for another to move an older version aside
GC_ATTEMPTS = 5  # gc plans again when a snapshot was saved meanwhile, at most this often
GC_BATCH = 1000
# gc's key kinds, and what the rest of such a key must look like for gc to touch it (another
# store's prefix may extend ours: "p" and "p:ev" share "p:ev:*", and only digests are ours).
_GC_KINDS = {"trees": "tree", "evidence": "ev", "lines": "lines", "modules": "mod",
             "captures": "cap",
             "replays": "replay", "inventories": "inv", "test_names": "tn"}
_DIGEST = re.compile(r"[0-9a-f]{40,64}\Z")
_TEST_NAMES = re.compile(r"[0-9a-f]{40,64}:[0-9]{1,6}\Z")
_REPLAY = re.compile(r"[0-9a-f]{64}:[0-9a-f]{1,64}:[a-z]{1,32}\Z")


def is_redis_url(location: object) -> bool:
    return str(location).startswith(("redis://", "rediss://", "unix://"))


def _bytes(value: object) -> bytes:
    """A reply as the bytes it is: redis-py types replies loosely (`bytes | str | Any`), but
    the store's client keeps decode_responses off, so every value comes back as bytes."""
    assert isinstance(value, bytes), f"a Redis reply of type {type(value).__name__}"
    return value


def redacted(url: str) -> str:
    """A Redis URL fit for a message or a log: its password (and user) replaced by ***."""
    parts = urlsplit(str(url))
    if parts.password is None and parts.username is None:
        return str(url)
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return urlunsplit(parts._replace(netloc=f"***@{host}{port}"))


class RedisEvidenceStore:
    """The `EvidenceStore` in Redis, shared by a fleet."""

    def __init__(self, url: str, *, create: bool = True, client=None) -> None:
        import redis  # noqa: PLC0415

        parts = urlsplit(url)
        query = parse_qs(parts.query)
        self.prefix = (query.pop("prefix", ["fastci:evidence"])[0]).rstrip(":")
        self.url = urlunsplit(parts._replace(query=""))
        self.shown = redacted(self.url)  # what messages name: never the password
        self._r = client or redis.Redis.from_url(self.url, socket_timeout=10,
                                                 socket_connect_timeout=5)
        try:
            self._check_version(create)
        except redis.RedisError as exc:
            raise StoreError(f"evidence store {self.shown} is unreachable: {exc}") from None

    def _version(self) -> str | None:
        raw = self._r.get(self._k("schema_version"))
        if raw is None:
            return None
        text = _bytes(raw).decode(errors="replace")
        return text if text.isdigit() else "unknown"

    def _check_version(self, create: bool) -> None:
        found = self._version()
        if found is None:
            if not create:
                raise StoreError(f"no FastCI evidence under {self.prefix!r} in {self.shown}")
            self._r.set(self._k("schema_version"), SCHEMA_VERSION, nx=True)
            return
        version = int(found) if found != "unknown" else 0  # unreadable: older than any
        if version > SCHEMA_VERSION:
            raise newer_version_error(f"{self.shown} under {self.prefix!r}", found)
        if version < SCHEMA_VERSION:
            self._move_aside(found)

    def _move_aside(self, found: str) -> None:
        """Rename every key of the older version to the prefix `<prefix>.v<found>`, then mark
        the prefix as this version, in one transaction. One process moves; the others wait
        for the version to change (the old version key stays until the very end, so no one
        writes new keys that the move would take along)."""
        lock, version_key = self._k("rebuilding"), self._k("schema_version")
        token = uuid.uuid4().hex
        if not self._r.set(lock, token, nx=True, ex=int(REBUILD_WAIT * 5)):
            deadline = time.monotonic() + REBUILD_WAIT
            while time.monotonic() < deadline:
                if self._version() == str(SCHEMA_VERSION):
                    return
                time.sleep(0.1)
            raise StoreError(f"the evidence in {self.shown} under {self.prefix!r} is being moved "
                             "aside by another FastCI (an older schema version); try again")
        if self._version() != found:  # another process moved it between our read and the lock
            self._r.delete(lock)
            return
        aside = f"{self.prefix}.v{found}"
        keep = {lock.encode(), version_key.encode()}
        pattern = re.sub(r"([\\\[\]*?])", r"\\\1", self.prefix) + ":*"
        batch: list[bytes] = []

        def flush() -> None:
            pipe = self._r.pipeline(transaction=False)
            for key in batch:
                pipe.rename(key, aside.encode() + key[len(self.prefix.encode()):])
            pipe.execute(raise_on_error=False)  # a key SCAN returned twice is gone already
            batch.clear()

        try:
            for key in self._r.scan_iter(match=pattern, count=1000):
                if key not in keep:
                    batch.append(key)
                    if len(batch) >= 1000:
                        flush()
            flush()
            pipe = self._r.pipeline(transaction=True)
            pipe.rename(version_key, f"{aside}:schema_version")
            pipe.set(version_key, SCHEMA_VERSION)
            pipe.delete(lock)
            pipe.execute()
        except BaseException:
            if self._r.get(lock) == token.encode():
                self._r.delete(lock)  # let the next process try again at once
            raise
        print(older_version_message(f"{self.shown} under {self.prefix!r}", found,
                                    f"prefix {aside!r}"), file=sys.stderr)

    def _k(self, *parts: str) -> str:
        return ":".join((self.prefix, *parts))

    def close(self) -> None:
        self._r.close()

    def __enter__(self) -> RedisEvidenceStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- content-addressed blobs ------------------------------------------------------------
    def _put(self, kind: str, items: dict, replace: bool = False) -> None:
        if items:
            pipe = self._r.pipeline(transaction=False)
            for key, data in items.items():
                pipe.set(self._k(kind, key), data, nx=not replace)
            pipe.execute()

    def _get_many(self, kind: str, keys: Iterable[str]) -> dict[str, bytes]:
        keys = list(dict.fromkeys(keys))
        if not keys:
            return {}
        values = self._r.mget([self._k(kind, k) for k in keys])
        return {k: v for k, v in zip(keys, values) if v is not None}

    def save_inventories(self, inventories: dict[str, FileBlocks]) -> None:
        # replace: an inventory an older parser stored is parsed again and replaced
        self._put("inv", {blob: pack(inventory_to_json(fb)) for blob, fb in inventories.items()},
                  replace=True)

    def load_inventories(self, blobs: Iterable[str]) -> dict[str, FileBlocks]:
        found = {b: inventory_from_json(unpack(d)) for b, d in self._get_many("inv", blobs).items()}
        return {b: fb for b, fb in found.items() if fb is not None}  # None: an older parser's

    def save_test_names(self, names: dict[str, list[str]]) -> None:
        if names:
            pipe = self._r.pipeline(transaction=False)
            for key, found in names.items():
                pipe.set(self._k("tn", key), json.dumps(found))
            pipe.execute()

    def load_test_names(self, keys: Iterable[str]) -> dict[str, list[str]]:
        return {k: json.loads(v) for k, v in self._get_many("tn", keys).items()}

    def save_captures(self, files: dict[str, Path]) -> None:
        for digest, path in files.items():
            if not self._r.exists(self._k("cap", digest)):
                self._r.set(self._k("cap", digest), Path(path).read_bytes())

    def load_capture(self, digest: str) -> bytes | None:
        data = self._r.get(self._k("cap", digest))
        return _bytes(data) if data is not None else None

    def replay_result(self, key: str) -> dict | None:
        data = self._r.get(self._k("replay", key))
        return unpack(_bytes(data)) if data is not None else None

    def save_replay_results(self, results: dict[str, dict]) -> None:
        pipe = self._r.pipeline(transaction=False)
        for key, value in results.items():
            pipe.set(self._k("replay", key), pack(value))
        pipe.execute()

    # -- snapshots ------------------------------------------------------------------------------
    def save_snapshot(self, snap: Snapshot) -> None:
        parts = snapshot_parts(snap)
        tree_digest, tree_data = parts.tree_digest, parts.tree_data
        evidence, lines = parts.evidence, parts.lines
        rows: dict[FieldT, EncodableT] = {
            test.test_id: json.dumps([test.outcome, test.duration, digest, lines_digest,
                                      list(test.markers), test.dimension,
                                      test.peak_memory, test.cuda, test.carried_from,
                                      modules_digest])
            for test, digest, lines_digest, modules_digest in parts.tests}
        env = snap.environment
        key = self._k("snap", snap.commit, env.digest)
        created_at = repr(snap.created_at or time.time())
        meta: dict[FieldT, EncodableT] = {
            "env_json": env.to_json(), "tree": tree_digest,
            "import_time": json.dumps(snap.import_time, sort_keys=True),
            "session_files": json.dumps(snap.session_files, sort_keys=True),
            "created_at": created_at, "source": snap.source,
            "scope": json.dumps(dict(snap.scope), sort_keys=True), "index": parts.index}
        # The parts and the snapshot in one transaction that also counts the write, which
        # `gc` watches: a snapshot is never saved against a part gc is deleting (see gc).
        pipe = self._r.pipeline(transaction=True)
        for kind, items in (("tree", {tree_digest: tree_data}), ("ev", evidence),
                            ("lines", lines), ("mod", parts.modules)):
            for digest, data in items.items():
                pipe.set(self._k(kind, digest), data, nx=True)
        pipe.delete(key, key + ":tests")
        pipe.hset(key, mapping=meta)
        if rows:
            pipe.hset(key + ":tests", mapping=rows)
        pipe.zadd(self._k("commits", snap.commit), {env.digest: float(created_at)})
        pipe.sadd(self._k("envs", env.digest), snap.commit)
        pipe.sadd(self._k("all-commits"), snap.commit)
        pipe.incr(self._k("writes"))
        pipe.execute()

    def snapshot_envs(self, commit: str) -> list[tuple[str, Environment]]:
        out = []
        for member in self._r.zrevrange(self._k("commits", commit), 0, -1):
            env = _bytes(member).decode()
            text = self._r.hget(self._k("snap", commit, env), "env_json")
            if text is not None:
                out.append((env, Environment.from_json(_bytes(text).decode())))
        return out

    def commits_with_evidence(self, env_digest: str | None = None) -> set[str]:
        key = self._k("all-commits") if env_digest is None else self._k("envs", env_digest)
        return {_bytes(c).decode() for c in self._r.smembers(key)}

    def load_snapshot(self, commit: str, env_digest: str, *, with_lines: bool = False,
                      with_modules: bool = False) -> Snapshot | None:
        key = self._k("snap", commit, env_digest)
        raw = {_bytes(k).decode(): _bytes(v) for k, v in self._r.hgetall(key).items()}
        if not raw:
            return None
        index_data = raw.pop("index", None)  # binary; every other field is text
        meta = {k: v.decode() for k, v in raw.items()}
        tree = self._get_many("tree", [meta["tree"]]).get(meta["tree"])
        if tree is None:
            raise StoreError(f"the evidence of {commit[:12]} in {self.shown} lost its tree; "
                             "record again")
        rows = {_bytes(t).decode(): json.loads(_bytes(v))
                for t, v in self._r.hgetall(key + ":tests").items()}
        payloads = self._get_many("ev", {r[2] for r in rows.values()})
        # An evicted payload: the test is left out and counts as new (it runs).
        found = {t: (payloads[r[2]], r) for t, r in rows.items() if r[2] in payloads}
        index = TestIndex.unpack(index_data) if index_data is not None else None
        tests: Mapping[str, TestRecord] = IndexedTests(found, _test_record, index)
        if with_lines or with_modules:
            line_blobs = self._get_many("lines", {r[3] for r in rows.values() if r[3]}) \
                if with_lines else {}
            module_blobs = self._get_many("mod", {r[9] for r in rows.values() if r[9]}) \
                if with_modules else {}
            records = {}
            for test_id, test in tests.items():
                lines_digest, modules_digest = rows[test_id][3], rows[test_id][9]
                if with_lines and lines_digest in line_blobs:
                    test = replace(test, lines=unpack_lines(line_blobs[lines_digest]))
                if with_modules and modules_digest in module_blobs:
                    test = replace(test, modules=unpack_modules(module_blobs[modules_digest]))
                records[test_id] = test
            tests = IndexedTests.of(records, index)
        return Snapshot(commit=commit, environment=Environment.from_json(meta["env_json"]),
                        tree=unpack(tree), tests=tests,
                        import_time=json.loads(meta["import_time"]),
                        session_files=json.loads(meta["session_files"]),
                        created_at=float(meta["created_at"]), source=meta["source"],
                        scope=json.loads(meta.get("scope", "{}")),
                        env_key=env_digest)

    def load_lines(self, commit: str, env_digest: str, test_ids: Iterable[str],
                   paths: Collection[str] | None = None
                   ) -> dict[str, dict[str, tuple[int, ...]]]:
        """The executed lines of some tests of a snapshot (the statement rule's candidates),
        of every file or of `paths` only."""
        return {t: unpack_lines(d, paths) for t, d in
                self._parts("lines", 3, commit, env_digest, test_ids).items()}

    def load_modules(self, commit: str, env_digest: str, test_ids: Iterable[str]
                     ) -> dict[str, dict]:
        """The captured module calls of some tests of a snapshot (pruning's candidates)."""
        return {t: unpack_modules(d) for t, d in
                self._parts("mod", 9, commit, env_digest, test_ids).items()}

    def _parts(self, kind: str, column: int, commit: str, env_digest: str,
               test_ids: Iterable[str]) -> dict[str, bytes]:
        """test -> the packed part its row names in `column` (3 lines, 9 module calls)."""
        ids = sorted(set(test_ids))
        if not ids:
            return {}
        rows = self._r.hmget(self._k("snap", commit, env_digest, "tests"), ids)
        digests = {test_id: json.loads(_bytes(row))[column]
                   for test_id, row in zip(ids, rows) if row is not None}
        blobs = self._get_many(kind, {d for d in digests.values() if d})
        return {t: blobs[d] for t, d in digests.items() if d in blobs}

    # -- retention ------------------------------------------------------------------------------
    def gc(self, retention: Retention, *, dry_run: bool = False) -> GcReport:
        """Delete the snapshots `retention` does not keep and whatever no kept snapshot
        reaches (`retention.py`).

        Safe against writers without stopping them: gc WATCHes `<prefix>:writes`, reads and
        plans, then deletes in one MULTI. `save_snapshot` writes a snapshot's parts (tree,
        evidence, lines, module calls), its keys and an INCR of `writes` in one MULTI of its
        own. So a snapshot saved before gc's EXEC either came before gc read (gc saw it and keeps
        what it reaches) or made the EXEC fail (gc plans again, at most GC_ATTEMPTS times);
        one saved after it writes its parts again (SET NX finds them gone). No snapshot is
        ever left without its parts. Captures, replays and inventories are saved outside
        that transaction: one gc deletes between its save and its snapshot's costs time (the
        test is not pruned, the file parsed again), never safety."""
        import redis  # noqa: PLC0415

        try:
            for _ in range(GC_ATTEMPTS):
                with self._r.pipeline(transaction=True) as pipe:
                    pipe.watch(self._k("writes"))
                    report, plan = self._gc_plan(retention, dry_run)
                    if dry_run:
                        pipe.unwatch()
                        return report
                    pipe.multi()
                    for op, key, member in plan:
                        if op == "unlink":
                            pipe.unlink(key)
                        elif op == "zrem":
                            pipe.zrem(key, member)
                        else:
                            pipe.srem(key, member)
                    try:
                        pipe.execute()
                    except redis.WatchError:
                        continue  # a snapshot was saved meanwhile: plan again
                    return report
        except redis.RedisError as exc:
            raise StoreError(f"evidence store {self.shown}: gc failed: {exc}") from None
        raise StoreError(f"evidence store {self.shown} kept changing while gc planned "
                         f"({GC_ATTEMPTS} tries): nothing was deleted; try again")

    def _gc_plan(self, retention: Retention, dry_run: bool
                 ) -> tuple[GcReport, list[tuple[str, str, str]]]:
        """What gc deletes: (report, [(op, key, member)])."""
        report = GcReport(dry_run=dry_run)
        plan: list[tuple[str, str, str]] = []
        commits = sorted(_bytes(c).decode() for c in self._r.smembers(self._k("all-commits")))
        pipe = self._r.pipeline(transaction=False)
        for commit in commits:
            pipe.zrange(self._k("commits", commit), 0, -1, withscores=True)
        listing = []
        for commit, members in zip(commits, pipe.execute()):
            if not members:
                plan.append(("srem", self._k("all-commits"), commit))  # a stale index entry
            listing += [SnapshotRef(commit, _bytes(e).decode(), float(t)) for e, t in members]
        kept = retention.kept(listing)
        pipe = self._r.pipeline(transaction=False)
        for ref in listing:
            key = self._k("snap", ref.commit, ref.env)
            pipe.hgetall(key)
            pipe.hgetall(key + ":tests")
        replies = pipe.execute()
        reach = Reach()
        for i, ref in enumerate(listing):
            meta, tests = replies[2 * i], replies[2 * i + 1]
            if (ref.commit, ref.env) in kept:
                report.count("snapshots", True)
                if b"tree" in meta:
                    reach.trees.add(_bytes(meta[b"tree"]).decode())
                for row in tests.values():
                    fields = json.loads(_bytes(row))
                    reach.evidence.add(fields[2])
                    if fields[3]:
                        reach.lines.add(fields[3])
                    if fields[9]:
                        reach.modules.add(fields[9])
                continue
            size = sum(len(k) + len(v) for k, v in (*meta.items(), *tests.items()))
            report.count("snapshots", False, size)
            key = self._k("snap", ref.commit, ref.env)
            plan += [("unlink", key, ""), ("unlink", key + ":tests", ""),
                     ("zrem", self._k("commits", ref.commit), ref.env),
                     ("srem", self._k("envs", ref.env), ref.commit)]
        envs_left: dict[str, int] = {}
        for ref in listing:
            envs_left[ref.commit] = envs_left.get(ref.commit, 0) + ((ref.commit, ref.env) in kept)
        plan += [("srem", self._k("all-commits"), c) for c, n in envs_left.items() if not n]
        self._gc_parts(reach, report, plan)
        return report, plan

    def _gc_parts(self, reach: Reach, report: GcReport, plan: list) -> None:
        """Add to `plan` every part of the store that `reach` does not keep."""
        for data in self._get_many("tree", sorted(reach.trees)).values():
            reach.add_tree(data)
        modules = sorted(reach.modules)
        for start in range(0, len(modules), GC_BATCH):
            for data in self._get_many("mod", modules[start:start + GC_BATCH]).values():
                reach.add_modules(data)
        for kind, short in _GC_KINDS.items():
            head = self._k(short) + ":"
            pattern = re.sub(r"([\\\[\]*?])", r"\\\1", head) + "*"
            form = {"replays": _REPLAY, "test_names": _TEST_NAMES}.get(kind, _DIGEST)
            keys = [k for k in (_bytes(k).decode(errors="replace")
                                for k in self._r.scan_iter(match=pattern, count=GC_BATCH))
                    if form.match(k[len(head):])]
            for start in range(0, len(keys), GC_BATCH):
                batch = keys[start:start + GC_BATCH]
                pipe = self._r.pipeline(transaction=False)
                for key in batch:
                    pipe.strlen(key)
                for key, size in zip(batch, pipe.execute()):
                    keep = reach.keeps(kind, key[len(head):])
                    report.count(kind, keep, int(size))
                    if not keep:
                        plan.append(("unlink", key, ""))

    # -- audit ----------------------------------------------------------------------------------
    def add_audit(self, entry: dict) -> None:
        at = entry.get("at", time.time())
        self._r.zadd(self._k("audit"), {json.dumps(entry, sort_keys=True): at})

    def audits(self, since: float = 0.0) -> list[dict]:
        return [json.loads(_bytes(e))
                for e in self._r.zrangebyscore(self._k("audit"), since, "+inf")]

    # -- history ------------------------------------------------------------------------------
    def add_history(self, commit: str, env_digest: str,  # noqa: ARG002 (the interface's; history here spans environments)
                    results: Iterable[TestRecord],
                    changed_paths: Iterable[str] = (), flaky: Iterable[str] = ()) -> None:
        results, flaky = list(results), set(flaky)
        changed = sorted(set(changed_paths))
        pipe = self._r.pipeline(transaction=False)
        for r in results:
            entry = json.dumps([commit, r.outcome, r.duration, r.test_id in flaky])
            pipe.lpush(self._k("hist", r.test_id), entry)
            pipe.ltrim(self._k("hist", r.test_id), 0, HISTORY_LIMIT - 1)
            pipe.hset(self._k("durations"), r.test_id, r.duration)
            pipe.sadd(self._k("tested"), r.test_id)
        for path in changed:
            pipe.hincrby(self._k("changes"), path, 1)
            for r in results:
                if r.failed and r.test_id not in flaky:
                    pipe.hincrby(self._k("cofail", path), r.test_id, 1)
        pipe.execute()

    def _history(self, test_ids) -> dict[str, list]:
        test_ids = list(test_ids)
        pipe = self._r.pipeline(transaction=False)
        for t in test_ids:
            pipe.lrange(self._k("hist", t), 0, -1)
        return {t: [json.loads(e) for e in entries]
                for t, entries in zip(test_ids, pipe.execute())}

    def outcomes(self, limit_per_test: int = 50) -> dict[str, list[str]]:
        tested = [_bytes(t).decode() for t in self._r.smembers(self._k("tested"))]
        out = {}
        for test_id, entries in self._history(tested).items():
            kept = [outcome for _, outcome, _, flaky in entries if not flaky][:limit_per_test]
            if kept:
                out[test_id] = kept
        return out

    def durations(self) -> dict[str, float]:
        return {_bytes(t).decode(): float(d)
                for t, d in self._r.hgetall(self._k("durations")).items()}

    def cofailure_rates(self, paths: Iterable[str]) -> dict[str, dict[str, float]]:
        rates: dict[str, dict[str, float]] = {}
        for path in set(paths):
            runs = int(self._r.hget(self._k("changes"), path) or 0)
            for test_id, failures in self._r.hgetall(self._k("cofail", path)).items():
                rates.setdefault(_bytes(test_id).decode(), {})[path] = \
                    int(failures) / max(runs, 1)
        return rates

    def flip_history(self, test_ids: Iterable[str]) -> dict[str, list[tuple[str, str]]]:
        return {t: [(commit, outcome) for commit, outcome, _, _ in entries]
                for t, entries in self._history(set(test_ids)).items() if entries}



def _test_record(test_id: str, found: tuple[bytes, list]) -> TestRecord:
    """A test's record from its payload and its row of the snapshot's tests hash."""
    payload, (outcome, duration, _, _, markers, dimension, peak, cuda, carried, _) = found
    return TestRecord.from_payload(payload, test_id=test_id, outcome=outcome,
                                   duration=duration, markers=tuple(markers),
                                   dimension=dimension, peak_memory=peak, cuda=bool(cuda),
                                   carried_from=carried)
