"""The index stored with each snapshot: from what a test's evidence names to the tests.

Selection must decide every test, but a change reaches only the tests whose evidence names
what changed. The index says which those are without decoding any test's payload: from each
path whose blocks a test executed, each data file (with the sha it had), each directory
listed, each kernel launched (with its hash), each module read by string and each item's
code file (with its sha) to the tests whose evidence names it, plus the tests that any
change of a kind selects (those with untraced children, those recorded without the
kernel's file events). Per test it keeps what deciding it "skipped" needs: its outcome,
duration, dimension and the counts its skip reason quotes. `rules.select` decodes and
evaluates the tests the change reaches and decides all others from the index alone.

The index must name at least everything `_Rules.reasons` reads of a test
(`INDEXED_FIELDS`); tests/test_scale_index.py checks both that and that the indexed and
the full selection agree. Built from the records when a snapshot is saved; a snapshot
without one (held in memory, or stored without it) is selected by evaluating every test.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable, Iterable, Iterator, Mapping

from fastci.runner.evidence import ABSENT, FOLDER, TestRecord

INDEX_VERSION = 2  # the packed form; another is ignored (full selection), never read as this

# Kinds of key: each names one part of a test's evidence, with what decides it changed.
BLOCKS = "b"  # path whose blocks the test executed
EXECUTED = "e"  # (path, qualname) of a block the test executed (decoded a path at a time)
FILES = "f"  # (non-Python path, blob sha it had)
DIRS = "d"  # directory the test listed
KERNELS = "k"  # (kernel, hash it had)
DYNAMIC = "y"  # path of a module the test read names of by string
CODE = "c"  # (path of an item's own code, blob sha it had; "" when none was recorded)
SPAWNS = "s"  # the test started children FastCI could not trace
NO_FILE_EVENTS = "n"  # its files were recorded without the kernel's file events
KINDS = (BLOCKS, EXECUTED, FILES, DIRS, KERNELS, DYNAMIC, CODE, SPAWNS, NO_FILE_EVENTS)

INDEXED_FIELDS = frozenset({"test_id", "outcome", "failed", "duration", "dimension", "blocks",
                            "files", "dirs", "kernels", "dynamic", "code", "spawns",
                            "file_events", "child_blocks"})
"""TestRecord fields the index answers for: selection may read no other of a test it did
not decode (child_blocks is a subset of blocks: it only keeps a test from being pruned)."""

Counts = list[int]  # [blocks, files with blocks, data files, kernels] (as JSON reads them)


def evidence_counts(test: TestRecord) -> Counts:
    """What a skipped test's reason quotes of its evidence."""
    return [sum(len(q) for q in test.blocks.values()), len(test.blocks),
            sum(1 for sha in test.files.values() if sha not in (ABSENT, FOLDER)),
            len(test.kernels)]


def _keys(test: TestRecord) -> Iterable[tuple[str, tuple[str, ...]]]:
    for path, qualnames in test.blocks.items():
        yield BLOCKS, (path,)
        for qualname in qualnames:
            yield EXECUTED, (path, qualname)
    for path, sha in test.files.items():
        yield FILES, (path, sha)
    for directory in test.dirs:
        yield DIRS, (directory,)
    for kernel, digest in test.kernels.items():
        yield KERNELS, (kernel, digest)
    for path in test.dynamic:
        yield DYNAMIC, (path,)
    if test.code:
        yield CODE, (test.code.get("path", ""), test.code.get("sha") or "")
    if test.spawns:
        yield SPAWNS, ()
    if not test.file_events:
        yield NO_FILE_EVENTS, ()


@dataclass(frozen=True)
class TestIndex:
    """Tests by position (ids in sorted order, which selection relies on to find a test
    file's tests), what deciding each without its payload needs, and
    the postings: kind -> key parts -> positions of the tests whose evidence names it."""

    __test__ = False  # not a pytest test class

    tests: tuple[str, ...]
    outcomes: tuple[str, ...]
    durations: tuple[float, ...]
    dimensions: tuple[str, ...]
    counts: tuple[Counts, ...]
    postings: Mapping[str, Mapping[tuple[str, ...], list[int]]] = field(default_factory=dict)

    @classmethod
    def build(cls, tests: Mapping[str, TestRecord]) -> TestIndex:
        ids = tuple(sorted(tests))
        postings: dict[str, dict[tuple[str, ...], list[int]]] = {k: {} for k in KINDS}
        for position, test_id in enumerate(ids):
            for kind, parts in _keys(tests[test_id]):
                postings[kind].setdefault(parts, []).append(position)
        records = [tests[t] for t in ids]
        return cls(tests=ids, outcomes=tuple(r.outcome for r in records),
                   durations=tuple(r.duration for r in records),
                   dimensions=tuple(r.dimension for r in records),
                   counts=tuple(evidence_counts(r) for r in records),
                   postings={k: v for k, v in postings.items() if v})

    @cached_property
    def position(self) -> dict[str, int]:
        return {test_id: i for i, test_id in enumerate(self.tests)}

    def keys(self, kind: str) -> Mapping[tuple[str, ...], list[int]]:
        return self.postings.get(kind, {})

    def executing(self, paths: Iterable[str]) -> list[str]:
        """The tests that executed blocks in any of `paths`."""
        blocks = self.keys(BLOCKS)
        found = {i for path in paths for i in blocks.get((path,), ())}
        return [self.tests[i] for i in sorted(found)]

    def kernels(self) -> dict[str, set[str]]:
        """Kernel -> the hashes tests recorded for it."""
        out: dict[str, set[str]] = {}
        for kernel, digest in self.keys(KERNELS):
            out.setdefault(kernel, set()).add(digest)
        return out

    def data_files(self) -> set[str]:
        """The non-Python files tests read."""
        return {path for path, _ in self.keys(FILES)}

    def pack(self) -> bytes:
        outcomes = {o: i for i, o in enumerate(sorted(set(self.outcomes)))}
        dimensions = {d: i for i, d in enumerate(sorted(set(self.dimensions)))}
        body = {
            "v": INDEX_VERSION, "tests": list(self.tests),
            "o": list(outcomes), "oi": [outcomes[o] for o in self.outcomes],
            "m": list(dimensions), "mi": [dimensions[d] for d in self.dimensions],
            "t": list(self.durations), "c": list(self.counts),
            "p": {kind: [[*parts, ords] for parts, ords in keys.items()]
                  for kind, keys in self.postings.items() if kind != EXECUTED}}
        by_path: dict[str, dict[str, list[int]]] = {}
        for (path, qualname), ords in self.keys(EXECUTED).items():
            by_path.setdefault(path, {})[qualname] = ords
        # Each path's blocks as a JSON text of its own: reading the index scans the texts
        # and decodes only the paths a change touches.
        body["e"] = {path: json.dumps(blocks, separators=(",", ":"))
                     for path, blocks in by_path.items()}
        return zlib.compress(json.dumps(body, separators=(",", ":")).encode(), 6)

    @classmethod
    def unpack(cls, data: bytes) -> TestIndex | None:
        """The index, or None when it is of another version or unreadable: selection then
        evaluates every test, which is slower and never less safe."""
        try:
            body = json.loads(zlib.decompress(data))
            if body.get("v") != INDEX_VERSION:
                return None
            tests, outcomes, dimensions = tuple(body["tests"]), body["o"], body["m"]
            n = len(tests)
            postings: dict[str, Mapping[tuple[str, ...], list[int]]] = {
                kind: {tuple(e[:-1]): e[-1] for e in entries}
                for kind, entries in body["p"].items()}
            texts = body["e"]
            if not all(isinstance(t, str) for t in texts.values()) or not all(
                    _positions(ords, n) for keys in postings.values() for ords in keys.values()):
                return None
            if texts:
                postings[EXECUTED] = _Executed(texts, postings.get(BLOCKS, {}), n)
            index = cls(tests=tests, outcomes=tuple(outcomes[i] for i in body["oi"]),
                        durations=tuple(body["t"]),
                        dimensions=tuple(dimensions[i] for i in body["mi"]),
                        counts=tuple(body["c"]), postings=postings)
            columns = (index.outcomes, index.durations, index.dimensions, index.counts)
            ascending = all(a < b for a, b in zip(tests, tests[1:]))  # selection bisects them
            return index if ascending and all(len(c) == n for c in columns) else None
        except (ValueError, KeyError, IndexError, TypeError, AttributeError, zlib.error):
            return None


def _positions(ords: object, n: int) -> bool:
    """Positions as built: a non-empty ascending list within the tests."""
    return isinstance(ords, list) and bool(ords) and isinstance(ords[0], int) and \
        isinstance(ords[-1], int) and 0 <= ords[0] <= ords[-1] < n


class _Executed(Mapping[tuple[str, ...], list[int]]):
    """The EXECUTED postings of a read index: (path, qualname) -> positions, each path's
    decoded when first asked for. A path whose text does not read answers with every test
    that executed the path (BLOCKS): more tests, never fewer."""

    def __init__(self, texts: dict[str, str], by_path: Mapping[tuple[str, ...], list[int]],
                 n: int) -> None:
        self._texts, self._by_path, self._n = texts, by_path, n
        self._paths: dict[str, dict[str, list[int]] | None] = {}

    def _blocks(self, path: str) -> dict[str, list[int]] | None:
        if path not in self._paths:
            try:
                blocks = json.loads(self._texts[path])
                ok = isinstance(blocks, dict) and all(_positions(o, self._n)
                                                      for o in blocks.values())
            except (KeyError, ValueError):
                blocks, ok = None, False
            self._paths[path] = blocks if ok else None
        return self._paths[path]

    def __getitem__(self, key: tuple[str, ...]) -> list[int]:
        path, qualname = key
        if path not in self._texts:
            raise KeyError(key)
        blocks = self._blocks(path)
        if blocks is None:
            return self._by_path.get((path,), [])
        return blocks[qualname]

    def __iter__(self) -> Iterator[tuple[str, ...]]:
        for path in self._texts:
            yield from ((path, q) for q in self._blocks(path) or ())

    def __len__(self) -> int:
        return sum(1 for _ in self)


class IndexedTests(Mapping[str, TestRecord]):
    """A snapshot's tests with their index. The stores hand tests back as rows, each
    decoded into its record when first read: a selection reads the few its change reaches."""

    __test__ = False  # not a pytest test class

    def __init__(self, rows: Mapping[str, Any], decode: Callable[[str, Any], TestRecord],
                 index: TestIndex | None) -> None:
        """`rows`: test id -> what `decode(test_id, row)` makes its record from."""
        self._rows, self._decode = rows, decode
        self._decoded: dict[str, TestRecord] = {}
        self.index = index

    @classmethod
    def of(cls, records: Mapping[str, TestRecord], index: TestIndex | None = None
           ) -> IndexedTests:
        """Records already decoded, with their index (built when not given)."""
        return cls(records, _given, index or TestIndex.build(records))

    def __getitem__(self, test_id: str) -> TestRecord:
        test = self._decoded.get(test_id)
        if test is None:
            test = self._decoded[test_id] = self._decode(test_id, self._rows[test_id])
        return test

    def __contains__(self, test_id: object) -> bool:
        return test_id in self._rows

    def __iter__(self) -> Iterator[str]:
        return iter(self._rows)

    def __len__(self) -> int:
        return len(self._rows)

    @property
    def decoded(self) -> int:
        """How many tests were decoded so far (what a selection paid for)."""
        return len(self._decoded)


def _given(_test_id: str, record: TestRecord) -> TestRecord:
    return record
