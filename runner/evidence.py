"""What was recorded: per-test runtime evidence and the snapshot of a commit.

Plain frozen dataclasses; the store serialises them and selection reads them. A snapshot
pins the evidence to the exact contents it was recorded against (`tree`: path -> git blob
sha), so comparing it with any later tree is exact, dirty working trees included.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Collection, Mapping, Sequence

from fastci.runner.analysis.environment import Environment

if TYPE_CHECKING:
    from fastci.runner.evidence_index import TestIndex

SESSION = "*"  # import-time work done before any test file was collected
DYNAMIC_ALL = "*"  # in TestRecord.dynamic: the whole module namespace was read
IMPORTED = "<import>"  # ... and: the module was imported by name (importlib.import_module)
FAILED = ("failed", "error")  # the outcomes that count as a failure
UNRECORDED = "lines unrecorded: "
"""In TestRecord.spawns: how some of the test's own lines went unrecorded (the line tracer
replaced, a thread started outside `threading`); selected on any code or data change."""
ABSENT = "-"  # in TestRecord.files: a path the test looked for and did not find
FOLDER = "/"  # ... and: a folder the test asked about (`os.path.isdir`) and found
CALLER = "="  # in Snapshot.import_time origins: the module-level statement that made the call


@dataclass(frozen=True)
class TestRecord:
    """One test's evidence from its last run."""

    __test__ = False  # not a pytest test class

    test_id: str
    outcome: str  # passed | failed | skipped | error
    duration: float
    blocks: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # path -> qualnames
    files: Mapping[str, str] = field(default_factory=dict)
    """non-Python path -> blob sha it had when the test read it or asked about it (stat), or
    ABSENT for a path (of any kind) it looked for and did not find, FOLDER for a folder it
    asked about and found."""
    dirs: tuple[str, ...] = ()  # directories the test listed
    spawns: tuple[str, ...] = ()  # child processes able to run the repo's Python (untraced)
    kernels: Mapping[str, str] = field(default_factory=dict)  # "path::qualname" -> hash
    markers: tuple[str, ...] = ()
    dimension: str = "correctness"
    peak_memory: int = 0  # bytes (CUDA peak where CUDA ran, else the RSS high-water mark)
    cuda: bool = False
    carried_from: str | None = None  # commit whose run produced this evidence
    lines: Mapping[str, tuple[int, ...]] | None = None  # loaded on demand (coverage)
    modules: Mapping | None = None
    """Captured module calls and which lines ran inside them (`capture.py`), or None. Stored
    apart from the payload (only pruning reads it): None until loaded with `with_modules` or
    `load_modules`."""
    dynamic: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """path -> module-level names the test read by string (getattr, import_module); the
    name DYNAMIC_ALL means it read the module's namespace as a whole (vars, __dict__)."""
    code: Mapping[str, str] = field(default_factory=dict)
    """Where the item's own code lives when it is not a Python function (a doctest's
    docstring, a YAML test's file): kind, path, object, digest, sha. Empty for functions."""
    child_blocks: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """The blocks (also in `blocks`) that ran in a child process: never pruned."""
    ranks: tuple[str, ...] = ()  # process groups joined, "backend:world_size" ("gloo:2")
    file_events: bool = False
    """Its files were recorded from the kernel's events (every reader, native code and
    children included), not from Python's `open` alone."""
    credited: Mapping[str, tuple[str, ...]] | None = None
    """The blocks (also in `blocks`) the test reached without running their lines in its
    contexts: a cache hit, a cached property read, a kernel launch. For every other block its
    `lines` are exactly what it ran. None: evidence recorded before this was kept (its lines
    cannot tell a path through a function)."""

    @property
    def failed(self) -> bool:
        return self.outcome in FAILED

    def payload(self) -> bytes:
        """The part selection reads, compressed for the store (`modules` is stored apart:
        `modules_payload`)."""
        body: dict[str, object] = {"b": self.blocks, "f": self.files, "d": list(self.dirs),
                                   "k": self.kernels, "s": list(self.spawns)}
        if self.dynamic:
            body["y"] = self.dynamic
        if self.code:
            body["c"] = self.code
        if self.child_blocks:
            body["cb"] = self.child_blocks
        if self.ranks:
            body["r"] = list(self.ranks)
        if self.file_events:
            body["n"] = True
        if self.credited is not None:
            body["cr"] = self.credited
        return _pack(body)

    def modules_payload(self) -> bytes | None:
        """The part only pruning reads: captured calls and the lines that ran in each."""
        return None if self.modules is None else _pack(self.modules)

    @classmethod
    def from_payload(cls, data: bytes, **fields) -> "TestRecord":
        body = _unpack(data)
        return cls(blocks={p: tuple(q) for p, q in body["b"].items()}, files=body["f"],
                   dirs=tuple(body["d"]), kernels=body["k"], spawns=tuple(body["s"]),
                   dynamic={p: tuple(n) for p, n in body.get("y", {}).items()},
                   code=body.get("c", {}),
                   child_blocks={p: tuple(q) for p, q in body.get("cb", {}).items()},
                   ranks=tuple(body.get("r", ())), file_events=bool(body.get("n")),
                   credited=({p: tuple(q) for p, q in body["cr"].items()} if "cr" in body
                             else None), **fields)


@dataclass(frozen=True)
class Snapshot:
    """All evidence for one (commit, environment)."""

    commit: str
    environment: Environment
    tree: Mapping[str, str]  # path -> git blob sha of every file the evidence was recorded on
    tests: Mapping[str, TestRecord]
    import_time: Mapping[str, Mapping[str, Sequence[str]]] = field(default_factory=dict)
    """path -> qualname -> test files whose collection ran the block (SESSION: before any),
    and, as `ImportCaller` texts (starting with CALLER), the module-level statements that
    called it while a test file was collected; lists as recorded and as the stores hand them
    back."""
    session_files: Mapping[str, str] = field(default_factory=dict)
    """Non-Python files read at import or collection time, outside every test."""
    created_at: float = 0.0
    source: str = "record"  # record | run
    env_key: str = ""  # the store's key for the environment (its digest when written)
    scope: Mapping = field(default_factory=dict)
    """The pytest arguments the suite was recorded with (`selection/scope.py`, JSON); empty:
    the whole repository."""

    @property
    def index(self) -> TestIndex | None:
        """What each test's evidence names (`evidence_index.py`), so selection decodes only
        the tests a change reaches; None: every test is evaluated. It travels with the
        tests it describes (`IndexedTests`, as the stores hand them back): a snapshot given
        other tests has none."""
        return getattr(self.tests, "index", None)


@dataclass(frozen=True)
class ImportCaller:
    """The module-level statement whose execution called a function at import time, with
    what the statement binds (`blocks.Statement`'s kind and defines). `kind` is "class" for
    a call from a class body and "?" where no module-level statement of the repository was
    on the stack (a pytest hook, a thread, a generator resumed later)."""

    kind: str
    path: str = ""
    line: int = 0
    defines: tuple[str, ...] = ()

    def encode(self) -> str:
        return CALLER + json.dumps([self.kind, self.path, self.line, list(self.defines)],
                                   separators=(",", ":"))

    @classmethod
    def decode(cls, text: str) -> "ImportCaller | None":
        """The caller an origin names, or None when it is a test file (or SESSION)."""
        if not text.startswith(CALLER):
            return None
        try:
            kind, path, line, defines = json.loads(text[len(CALLER):])
            return cls(str(kind), str(path), int(line), tuple(str(d) for d in defines))
        except (ValueError, TypeError):
            return cls("?")  # unreadable: as unknown as no caller at all


def import_origins(origins: Sequence[str]) -> tuple[list[str], list[ImportCaller]]:
    """An import-time entry's origins split into test files (and SESSION) and callers."""
    files, callers = [], []
    for origin in origins:
        caller = ImportCaller.decode(origin)
        if caller is None:
            files.append(origin)
        else:
            callers.append(caller)
    return files, callers


def pack_lines(lines: Mapping[str, tuple[int, ...]]) -> bytes:
    return _pack({p: _ranges(ls) for p, ls in lines.items()})


def unpack_lines(data: bytes, paths: Collection[str] | None = None
                 ) -> dict[str, tuple[int, ...]]:
    """A packed line map; with `paths`, only those files' lines (the rest is not expanded)."""
    out = {}
    for path, ranges in _unpack(data).items():
        if paths is None or path in paths:
            out[path] = tuple(n for a, b in ranges for n in range(a, b + 1))
    return out


def _ranges(lines: tuple[int, ...]) -> list[tuple[int, int]]:
    spans: list[list[int]] = []
    for n in sorted(set(lines)):
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return [(a, b) for a, b in spans]


def _pack(obj: object) -> bytes:
    return zlib.compress(json.dumps(obj, separators=(",", ":"), sort_keys=True).encode(), 6)


def _unpack(data: bytes) -> dict:
    return json.loads(zlib.decompress(data))


pack = _pack
unpack = _unpack
unpack_modules = _unpack
