"""Recording runtime evidence inside a pytest process.

Lines are measured per context by one of two line recorders (`lines.py`): on Python 3.12+
a sys.monitoring recorder that sees each line once per context, before that coverage.py's C
tracer with one dynamic context per test. Work that is shared between tests gets a context
of its own and is then credited to every test that depends on it:

- `fixture:<scope>:<id>`: a fixture broader than a function, set up once, credited to each
  test that uses it (otherwise only the first test would carry a session fixture's code);
- `collect:<test file>`: importing a test module during collection (and, for lines only,
  `collect:<test file>|outside-module-bodies` for what pytest's own collection work runs of
  the repository there: `import_calls.py` saw which statement called each function in a
  module body, never outside one);
- "" (the empty context): conftest and plugin imports before collection;
- `torch.compile`: what ran while dynamo compiled. Compiled code runs without its lines,
  from a cache any later test may hit, so every context that entered compiled code is
  credited with all that dynamo traced and all that ran while compiling (`compiled.py`).

Import-time work is where coverage-only selectors miss regressions, so it is kept apart and
handled by the selection's module-body rules rather than credited to a test.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import sys
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Collection, Iterator

from fastci.runner.analysis import inventory
from fastci.runner.analysis.blocks import MODULE, FileBlocks, ModuleStatements
from fastci.runner.analysis.environment import Environment, current, is_manifest, lock_hash
from fastci.runner.evidence import (
    ABSENT,
    DYNAMIC_ALL,
    FOLDER,
    SESSION,
    UNRECORDED,
    ImportCaller,
    Snapshot,
    TestRecord,
)
from fastci.runner.git import WORKTREE, Repo
from fastci.runner.record import child, compiled, lines, tracing
from fastci.runner.record.capture import CAPTURED, INSIDE, Capture, ModuleCapture
from fastci.runner.record.children import Children
from fastci.runner.record.fileaccess import FileEvents
from fastci.runner.record.import_calls import OUTSIDE, ImportCalls

if TYPE_CHECKING:
    from fastci.runner.store import EvidenceStore

SESSION_CONTEXT = ""
COMPILE_CONTEXT = "torch.compile"


def blob_sha(data: bytes) -> str:
    """The git blob id of some content, so file evidence compares with git trees directly."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class _Test:
    nodeid: str
    contexts: list[str]
    start: float
    outcome: str = "passed"
    duration: float = 0.0
    markers: tuple[str, ...] = ()
    dimension: str = "correctness"
    peak_memory: int = 0
    cuda: bool = False


@dataclass
class Recording:
    """What one pytest session recorded, before it becomes a snapshot."""

    tree: dict[str, str]
    environment: Environment
    tests: dict[str, TestRecord]
    import_time: dict[str, dict[str, list[str]]]
    session_files: dict[str, str]
    first_failure_at: float | None = None
    started_at: float = 0.0
    finished_at: float = 0.0
    order: list[str] = field(default_factory=list)
    scope: dict = field(default_factory=dict)  # the session's pytest arguments (scope.py)

    def snapshot(self, commit: str, source: str) -> Snapshot:
        return Snapshot(commit=commit, environment=self.environment, tree=self.tree,
                        tests=self.tests, import_time=self.import_time,
                        session_files=self.session_files, created_at=time.time(),
                        source=source, scope=self.scope)


class Recorder:
    def __init__(self, repo: Repo, recorder: str = "auto") -> None:
        self.repo = repo
        self.root = str(repo.root)
        self.tree = repo.tree(WORKTREE)  # the code under test, as the session starts
        self.environ = dict(os.environ)  # before conftest files set anything
        self.context = SESSION_CONTEXT
        self.files: dict[str, set[str]] = defaultdict(set)
        self.dirs: dict[str, set[str]] = defaultdict(set)
        self.absent: dict[str, set[str]] = defaultdict(set)  # paths looked for, not found
        self.folders: dict[str, set[str]] = defaultdict(set)  # folders asked about, found
        self.spawns: dict[str, set[str]] = defaultdict(set)
        self.kernels: dict[str, set[tuple[str, str]]] = defaultdict(set)
        self.compiled_contexts: set[str] = set()  # contexts that entered compiled code
        self.scripted_contexts: set[str] = set()  # ... that called torch.jit.script
        self._every_context_compiled = False  # this torch's dynamo entry could not be hooked
        self.tests: dict[str, _Test] = {}
        self.started_at = time.time()
        self.first_failure_at: float | None = None
        self._stack: list[str] = []
        self._last_test = ""  # the test that ended last (its teardown may lose the tracer)
        # Which line recorder measures (lines.py), and why that one.
        self.line_recorder, self.line_recorder_why = lines.choose(recorder)
        self._lines: lines.LineRecorder | None = None
        self._kernel_hook = tracing.KernelHook(self._on_launch, self.untraced)
        self._derived: dict[str, set[str]] = defaultdict(set)
        self.capture: ModuleCapture | None = None
        # Dependencies line coverage cannot see (tracing.py): cache hits of memoized
        # repository functions, cached properties read, names read by string.
        self.memo = tracing.MemoWatch(self._owner)
        self.memo_hits: dict[str, set[tuple[str, str]]] = {}
        self.property_reads: dict[str, set] = defaultdict(set)
        self.module_reads: dict[str, set] = defaultdict(set)
        # ... and the same, reached in the children of a context: (path, name or qualname).
        self.child_reads: dict[str, set[tuple[str, str]]] = defaultdict(set)
        self.child_credited: dict[str, set[tuple[str, str]]] = defaultdict(set)
        self.item_code: dict[str, dict[str, str]] = {}
        self._hooked: list = []
        self._module_count = -1
        self._modules_seen: set[str] = set()
        self.repository_modules: list[tuple[str, ModuleType]] = []  # as scan_modules found them
        self.children: Children | None = None  # children record for the test that started them
        self.file_events: FileEvents | None = None  # every reader's opens, native ones too
        self.file_events_lost: set[str] = set()  # contexts whose kernel events overflowed
        # Which module-level statement called each function run while a test file was
        # collected (import-time attribution, import_calls.py).
        self.import_calls = ImportCalls(self.root, self.tree, self._collection_window)

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        omit = ["*/site-packages/*", "*/.venv/*", "*/.fastci/*", "*/.git/*"]
        self._lines = lines.make(self.line_recorder, self.root, omit)
        try:
            self._lines.start()
        except RuntimeError as exc:  # the tool id was taken meanwhile: coverage records
            self.line_recorder, self.line_recorder_why = "coverage", str(exc)
            self._lines = lines.make("coverage", self.root, omit)
            self._lines.start()
        self._lines.switch(SESSION_CONTEXT)
        tracing.start(self._on_file)
        tracing.probe_files(self.root, self._on_file)
        tracing.trace_raw_threads()
        child.after_import("torch", tracing.trace_autograd_threads)
        child.after_import("ctypes", tracing.trace_ctypes_callbacks)
        compiled.start(self._on_compiled_entry, self._on_compile)
        child.after_import("torch._dynamo", compiled.install)
        child.after_import("torch.jit", compiled.install_script)
        tracing.patch_cached_property()
        tracing.start_reading(self.root, self._adopt, self._loaded)
        self._route(SESSION_CONTEXT)
        self.children = Children(self.root, omit, self._detach_in_fork)
        self.children.start()
        events = FileEvents(self.root, [p for p in self.tree
                                        if tracing.wants(f"{self.root}/{p}", self.root)])
        self.file_events = events if events.start() else None

    def _detach_in_fork(self) -> None:
        """In a forked child: the parent's hooks stop here; the child records on its own."""
        tracing.stop()
        tracing.probe_files(self.root, None)
        compiled.stop()
        self.import_calls.close()
        self._kernel_hook.uninstall()
        if self._lines is not None:
            try:
                self._lines.forget()
            except Exception:  # a child's coverage may already be gone; it records on its own
                pass
        self._lines = None
        self.file_events = None  # the parent drains the kernel's events, not the child
        self.children = None
        if self.capture is not None:  # the child captures on its own (`child_capture.py`)
            self.capture.end_test()
        # It inherits the filled caches and the hooked modules: it reports its own hits.
        child.reach_with(tracing.Reached(self.root, self.memo))

    def _boundary(self, context: str) -> None:
        """Between contexts: credit the kernel's file events so far to the one that ends,
        and let children started from now on record for the next one."""
        if self.file_events is not None:
            for rel in self.file_events.drain():
                self.files[self.context].add(os.path.join(self.root, rel))
            if self.file_events.take_overflow():
                self.file_events_lost.add(self.context)
        if self.children is not None:
            self.children.enter(context)

    @contextmanager
    def untraced(self) -> Iterator[None]:
        recorder = self._lines
        if recorder is None:
            yield
            return
        recorder.pause()
        try:
            yield
        finally:
            recorder.resume()

    def install_kernel_hook(self) -> None:
        self._kernel_hook.install()

    def install_module_capture(self, budget: int) -> None:
        """Capture module calls for pruning (only once the code under test imported torch)."""
        if self.capture is None:
            self.capture = ModuleCapture(self, budget)
            self.capture.install()

    def switch_derived(self, test: str, context: str) -> None:
        """Switch to `context`, one of the running test's own (`<test>|...`, or the test's)."""
        if context != test:
            self._derived[test].add(context)
        self.switch(context)

    def switch(self, context: str) -> None:
        self.context = context
        if self._every_context_compiled:
            self.compiled_contexts.add(context)
        if self._lines is not None:
            self._lines.switch(context)
            self.import_calls.follow(context)
        self._route(context)

    def _collection_window(self, inside: bool) -> None:
        """While a test file is collected, lines outside repository module bodies go to a
        context of their own: functions run there were called unseen (import_calls.py)."""
        if self._lines is not None and self.context.startswith("collect:"):
            self._lines.switch(self.context if inside else self.context + OUTSIDE)

    def _route(self, context: str) -> None:
        tracing.set_context(self.module_reads[context], self.property_reads[context])

    # -- repository modules: reads by string and memoized functions ------------------------
    def _owner(self, code) -> tuple[str, str] | None:
        """(path, qualname) of a code object in the repository, or None."""
        filename = getattr(code, "co_filename", "")
        if not filename.startswith(self.root):
            return None
        rel = os.path.relpath(filename, self.root)
        return (rel, code.co_qualname if hasattr(code, "co_qualname") else code.co_name) \
            if rel in self.tree else None

    def _repository_module(self, name: str, module) -> bool:
        if name.startswith("fastci.runner.record"):
            return False  # the recorder's own modules stay plain
        filename = tracing._namespace(module).get("__file__") or ""
        if not isinstance(filename, str) or not filename.startswith(self.root):
            return False
        return os.path.relpath(filename, self.root) in self.tree

    def _adopt(self, module) -> None:
        name = tracing._namespace(module).get("__name__", "")
        if type(module) is ModuleType and self._repository_module(str(name), module):
            module.__class__ = tracing.RecordingModule
            self._hooked.append(module)

    def _loaded(self, module) -> None:
        """A repository module's body ran: a reload (or a first import) built new caches."""
        name = str(tracing._namespace(module).get("__name__", ""))
        if self._repository_module(name, module):
            self.memo.rescan(name, module)

    def scan_modules(self) -> None:
        """Hook repository modules imported since the last look, and find their memoized
        functions (cheap when no module was imported: one length check)."""
        if len(sys.modules) == self._module_count:
            return
        self._module_count = len(sys.modules)
        fresh = []
        for name, module in list(sys.modules.items()):
            if name in self._modules_seen or module is None:
                continue
            self._modules_seen.add(name)
            if self._repository_module(name, module):
                fresh.append((name, module))
                self.repository_modules.append((name, module))
                if type(module) is ModuleType:
                    module.__class__ = tracing.RecordingModule
                    self._hooked.append(module)
        self.memo.scan(lambda: fresh)

    def push(self, context: str) -> None:
        self._boundary(context)
        self._stack.append(self.context)
        self.switch(context)

    def pop(self) -> None:
        context = self._stack.pop() if self._stack else SESSION_CONTEXT
        self._boundary(context)
        self.switch(context)

    # -- events ------------------------------------------------------------------------------
    def _on_file(self, kind: str, path: str) -> None:
        if kind == "spawn":
            if path:
                self.spawns[self.context].add(path)
                if self.children is not None:
                    self.children.on_spawn()
            return
        found = tracing.evidence_of(kind, path, self.root)
        if found is not None:
            which, full = found
            evidence = self.dirs if which == "listed" else getattr(self, which)
            evidence[self.context].add(full)

    def _on_compiled_entry(self, kind: str, origin: str) -> None:
        if origin and not origin.startswith(self.root):
            return  # torch scripting its own code
        (self.compiled_contexts if kind == compiled.COMPILE else
         self.scripted_contexts).add(self.context)
        if compiled.unseen():  # no entry hook: from the first compile on, any test may enter
            self._every_context_compiled = True

    def _on_compile(self, starting: bool) -> None:
        if starting:
            self.push(COMPILE_CONTEXT)
        elif self.context == COMPILE_CONTEXT:
            self.pop()

    def _on_launch(self, filename: str, qualname: str) -> None:
        if filename.startswith(self.root):
            self.kernels[self.context].add((os.path.relpath(filename, self.root), qualname))

    # -- per test file, while pytest imports it ----------------------------------------------
    def begin_collect(self, path: str) -> None:
        self.scan_modules()
        self.memo.begin()
        self.push(f"collect:{path}")

    def end_collect(self) -> None:
        """A cache that answered while the test file was imported (`B = table(3)` at module
        level) counts for each of its tests: the value lives on in the module."""
        self.memo_hits[self.context] = self.memo.end()
        self.pop()

    # -- per test ----------------------------------------------------------------------------
    def _check_tracer(self, *contexts: str) -> None:
        """Whether the line tracer is still ours; if not, the contexts that ran since it was
        last checked lost lines (and so select on any change), and it is put back."""
        lines = self._lines
        how = lines.lost() if lines is not None else None
        if how is None:
            return
        for context in contexts:
            self.spawns[context].add(f"{UNRECORDED}{how}")
        lines.retrace()  # type: ignore[union-attr]  # lost() answered, so there is one

    def begin_test(self, nodeid: str, shared_contexts: list[str]) -> None:
        self._check_tracer(*([self._last_test] if self._last_test else []), self.context)
        self.scan_modules()
        self.memo.begin()
        self.tests[nodeid] = _Test(nodeid, [nodeid, *shared_contexts], time.perf_counter())
        self._rss_before = _max_rss()
        _cuda_begin()
        self.push(nodeid)
        if self.capture is not None:
            self.capture.begin_test(nodeid)
            if self.children is not None:
                self.children.capture_for(self.capture.child_request(nodeid))

    def end_test(self, nodeid: str, outcome: str, duration: float, markers: tuple[str, ...],
                 dimension: str) -> None:
        self._check_tracer(nodeid)
        self._last_test = nodeid
        if self.capture is not None:
            self.capture.end_test()
            if self.children is not None:
                self.children.capture_for(None)
        self.memo_hits[nodeid] = self.memo.end()
        self.pop()
        if self.children is not None:
            self.children.collect(nodeid)
        test = self.tests[nodeid]
        test.outcome, test.duration = outcome, duration
        test.markers, test.dimension = markers, dimension
        cuda_peak = _cuda_end()
        test.cuda = cuda_peak is not None
        test.peak_memory = cuda_peak if cuda_peak is not None else \
            max(0, _max_rss() - self._rss_before)
        if outcome in ("failed", "error") and self.first_failure_at is None:
            self.first_failure_at = time.time()

    # -- the end -----------------------------------------------------------------------------
    def finish(self, store: EvidenceStore) -> Recording:
        """Stop every hook and turn what the session saw into per-test evidence."""
        self._stop_hooks()
        lines_by_context = self._lines_by_context()
        watched = self._finish_file_events()
        child_lines = self._merge_children(lines_by_context)
        self._credit_compiled(lines_by_context)
        inventories = inventory.load(self.repo, WORKTREE, self.tree, store)
        shas = _FileHasher(self.root, self.tree)
        tests = self._test_records(inventories, lines_by_context, shas, child_lines, watched)
        import_time = _import_time(inventories, lines_by_context,
                                   _Callers(self.root, self.import_calls.calls))
        session_files = self._session_files(shas)
        if self.capture is not None:
            store.save_captures(self.capture.blobs)
        self._remove_spills()
        manifests = {p: (Path(self.root) / p).read_bytes() for p in self.tree
                     if is_manifest(p) and (Path(self.root) / p).is_file()}
        return Recording(
            tree=self.tree, environment=current(lock_hash(manifests)), tests=tests,
            import_time=import_time, session_files=session_files,
            first_failure_at=self.first_failure_at, started_at=self.started_at,
            finished_at=time.time(), order=list(self.tests))

    def _remove_spills(self) -> None:
        """The captures' files, once the store holds them."""
        for folder in (self.capture.spill if self.capture is not None else None,
                       self.children.blobs if self.children is not None else None):
            if folder:
                shutil.rmtree(folder, ignore_errors=True)

    def abandon(self) -> None:
        """Stop recording and keep nothing: the controller of a pytest-xdist session runs no
        test (its workers record), and its hooks must not reach the workers it starts."""
        self._stop_hooks()  # the line recorder too
        self._lines = None
        if self.children is not None:
            self.children.stop()
            self.children = None
        if self.file_events is not None:
            self.file_events.close()
            self.file_events = None

    def _stop_hooks(self) -> None:
        """Nothing the process does from here on is evidence."""
        tracing.stop()
        tracing.probe_files(self.root, None)
        compiled.stop()
        self.import_calls.close()
        tracing.stop_reading(self._hooked)
        tracing.unpatch_cached_property()
        self._kernel_hook.uninstall()
        if self.capture is not None:
            self.capture.uninstall()
        if self._lines is not None:
            self._lines.stop()

    def _lines_by_context(self) -> dict[str, dict[str, set[int]]]:
        """context -> path -> executed lines, for the repository's files as the session
        started (a file outside it, or written during the run, is no evidence)."""
        lines_by_context: dict[str, dict[str, set[int]]] = defaultdict(lambda: defaultdict(set))
        if self._lines is None:
            return lines_by_context
        for context, by_file in self._lines.lines().items():
            for filename, ls in by_file.items():
                rel = os.path.relpath(filename, self.root)
                if rel.startswith("..") or rel not in self.tree:
                    continue  # outside the repo, or written during the run
                lines_by_context[context][rel] |= ls
        return lines_by_context

    def _test_records(self, inventories: dict[str, FileBlocks],
                      lines_by_context: dict[str, dict[str, set[int]]],
                      shas: _FileHasher, child_lines: dict[str, dict[str, set[int]]],
                      watched: bool) -> dict[str, TestRecord]:
        """Every test's evidence, its kernels hashed with what they call and read."""
        all_kernels = {f"{p}::{q}" for ks in self.kernels.values() for p, q in ks}
        kernel_hash = inventory.kernel_hashes(inventories, all_kernels)
        tests = {}
        for nodeid, test in self.tests.items():
            seen = self._seen_by(nodeid, test, lines_by_context)
            contexts = self._contexts_of(nodeid, test)
            in_children: dict[str, set[int]] = defaultdict(set)
            for context in contexts:
                for path, ls in child_lines.get(context, {}).items():
                    in_children[path] |= ls
            if self.children is not None:  # children record: only unmerged ones are a gap
                seen.spawns = {s for s in seen.spawns if s.startswith(UNRECORDED)} | \
                    set(self.children.unmerged(contexts))
            if self.compiled_contexts.intersection(contexts) and compiled.unseen():
                seen.spawns.add(compiled.unseen())
            tests[nodeid] = TestRecord(
                test_id=nodeid, outcome=test.outcome, duration=test.duration,
                blocks=self._blocks(nodeid, test, seen, inventories),
                files=_data_evidence(shas, seen.files, seen.absent, self.root, seen.folders),
                dirs=tuple(sorted(os.path.relpath(d, self.root) for d in seen.dirs)),
                kernels={k: kernel_hash[k] for k in (f"{p}::{q}" for p, q in seen.kernels)},
                markers=test.markers, dimension=test.dimension,
                spawns=tuple(sorted(seen.spawns)),
                peak_memory=test.peak_memory, cuda=test.cuda,
                lines={p: tuple(sorted(ls)) for p, ls in seen.lines.items()},
                modules=self._module_evidence(nodeid, test, lines_by_context),
                dynamic=self._dynamic_reads(nodeid, test),
                code=self._item_code(nodeid, shas),
                child_blocks=self._child_blocks(contexts, in_children, inventories),
                ranks=self.children.ranks_of(contexts) if self.children else (),
                file_events=watched and not self.file_events_lost.intersection(contexts),
                credited=_by_path(p for p in self._credited(nodeid, test, seen)
                                  if p[0] in inventories))
        return tests

    def _child_blocks(self, contexts: list[str], in_children: dict[str, set[int]],
                      inventories: dict[str, FileBlocks]) -> dict[str, tuple[str, ...]]:
        """Blocks the test's children ran, or reached through a cache: never pruned, since
        a replay runs in the test's own process."""
        out: dict[str, set[str]] = defaultdict(set)
        for path, ls in in_children.items():
            if path in inventories:
                out[path] |= {inventories[path].owner_of(n) for n in ls}
        for context in contexts:
            for path, qualname in self.child_credited.get(context, ()):
                if path in inventories:
                    out[path].add(_enclosing_block(inventories[path].by_qualname(), qualname))
        return {p: tuple(sorted(q)) for p, q in out.items()}

    def _finish_file_events(self) -> bool:
        """The last kernel file events, credited to the context still open; whether every
        reader's opens were watched at all in this session."""
        if self.file_events is None:
            return False
        self._boundary(self.context)
        self.file_events.close()
        self.file_events = None
        return True

    def _merge_children(self, lines_by_context: dict[str, dict[str, set[int]]]
                        ) -> dict[str, dict[str, set[int]]]:
        """Children's evidence joins the context that started them; returns their lines
        alone, by context (pruning never replays what ran in a child)."""
        child_lines: dict[str, dict[str, set[int]]] = defaultdict(lambda: defaultdict(set))
        if self.children is None:
            return child_lines
        self.children.stop()
        for tag, evidence in self.children.evidence.items():
            for filename, ls in evidence.lines.items():
                rel = os.path.relpath(filename, self.root)
                if rel in self.tree:
                    lines_by_context[tag][rel] |= ls
                    child_lines[tag][rel] |= ls
            for captured in evidence.captured:
                self._merge_child_captures(tag, captured, lines_by_context, child_lines)
            self.files[tag] |= {f for f in evidence.files  # Python files: read as data
                                if tracing.wants(f, self.root) or f.endswith(".py")}
            self.absent[tag] |= {f for f in evidence.absent if tracing.may_appear(f, self.root)}
            self.folders[tag] |= {f for f in evidence.folders if tracing.wants(f, self.root)}
            self.dirs[tag] |= {d for d in evidence.listed if d.startswith(self.root)}
            self.kernels[tag] |= {(os.path.relpath(f, self.root), q)
                                  for f, q in evidence.kernels}
            for into, pairs in ((self.child_reads, evidence.reads),
                                (self.child_credited, evidence.credited)):
                for filename, name in pairs:
                    rel = os.path.relpath(filename, self.root)
                    if rel in self.tree:
                        into[tag].add((rel, name))
            if evidence.compiled:  # it may have run what this process compiled (a fork)
                self.compiled_contexts.add(tag)
        return child_lines

    def _credit_compiled(self, lines_by_context: dict[str, dict[str, set[int]]]) -> None:
        """Every context that entered compiled code (in this process or in a child) ran, as
        far as the evidence can tell, all that was compiled in the session: every line
        dynamo traced or TorchScript parsed, and every line run while compiling; one that
        called torch.jit.script, all that TorchScript parsed. Without dynamo's traced code
        (`compiled.unseen()`) the compiled ones are selected on any change instead."""
        root = os.path.realpath(self.root)
        while_compiling = dict(lines_by_context.get(COMPILE_CONTEXT, {}))
        for kind, contexts in ((compiled.COMPILE, self.compiled_contexts - self.scripted_contexts),
                               (compiled.SCRIPT, self.scripted_contexts - self.compiled_contexts),
                               (compiled.COMPILE, self.compiled_contexts & self.scripted_contexts)):
            if not contexts or (kind == compiled.COMPILE and compiled.unseen()):
                continue
            ran: dict[str, set[int]] = defaultdict(set)
            for filename, ls in compiled.traced_lines(kind).items():
                rel = os.path.relpath(os.path.realpath(filename), root)
                if rel in self.tree:
                    ran[rel] |= ls
            if kind == compiled.COMPILE:
                for path, ls in while_compiling.items():
                    ran[path] |= ls
            for context in contexts:
                for path, ls in ran.items():
                    lines_by_context[context][path] |= ls

    def _contexts_of(self, nodeid: str, test: _Test) -> list[str]:
        """Every context whose work is the test's: its own and the broader fixtures' it used
        (`test.contexts`), and those each of them derived (captured calls, `|in`)."""
        out = list(test.contexts)
        for context in test.contexts:
            out.extend(sorted(self._derived.get(context, ())))
        if nodeid not in test.contexts:
            out.extend(sorted(self._derived.get(nodeid, ())))
        return out

    def _seen_by(self, nodeid: str, test: _Test,
                 lines_by_context: dict[str, dict[str, set[int]]]) -> _Seen:
        """What ran and was read in any of the test's contexts: its own, the shared
        fixtures it used, and those it derived (captured module calls)."""
        seen = _Seen()
        for context in self._contexts_of(nodeid, test):
            seen.spawns |= self.spawns.get(context, set())
            for path, ls in lines_by_context.get(context, {}).items():
                seen.lines[path] |= ls
            seen.files |= self.files.get(context, set())
            seen.dirs |= self.dirs.get(context, set())
            seen.absent |= self.absent.get(context, set())
            seen.folders |= self.folders.get(context, set())
            seen.kernels |= self.kernels.get(context, set())
        return seen

    def _blocks(self, nodeid: str, test: _Test, seen: _Seen,
                inventories: dict[str, FileBlocks]) -> dict[str, tuple[str, ...]]:
        """path -> qualnames of the blocks the test depends on: those its lines ran in, and
        those it reached without running their lines."""
        blocks = {}
        for path, ls in seen.lines.items():
            fb = inventories.get(path)
            if fb is None:
                continue
            blocks[path] = tuple(sorted({fb.owner_of(n) for n in ls}))
        # A launch is evidence even without its lines; so is a cache hit of a memoized
        # function or a cached property read (the body ran for another test).
        for path, qualname in self._credited(nodeid, test, seen):
            fb = inventories.get(path)
            if fb is None:
                continue
            qualname = _enclosing_block(fb.by_qualname(), qualname)
            if qualname not in blocks.get(path, ()):
                blocks[path] = tuple(sorted({*blocks.get(path, ()), qualname}))
        return blocks

    def _credited(self, nodeid: str, test: _Test, seen: _Seen) -> set[tuple[str, str]]:
        """Blocks the test reached without running their lines: kernels it launched, cache
        hits, cached properties read."""
        return seen.kernels | self._memoized(nodeid, test)

    def _session_files(self, shas: _FileHasher) -> dict[str, str]:
        """Non-Python files read at session start or while a test file was collected, and
        paths looked for then and not found (ABSENT), or folders found (FOLDER)."""
        session_files: dict[str, str] = {}
        for context, found in self.folders.items():
            if context == SESSION_CONTEXT or context.startswith("collect:"):
                session_files.update((os.path.relpath(p, self.root), FOLDER) for p in found)
        for context, missing in self.absent.items():
            if context == SESSION_CONTEXT or context.startswith("collect:"):
                session_files.update((os.path.relpath(p, self.root), ABSENT) for p in missing)
        for context, opened in self.files.items():
            if context == SESSION_CONTEXT or context.startswith("collect:"):
                # A text file collected as tests (--doctest-glob, a YAML plugin) is read by
                # its own collector: its items select themselves when it changes.
                own = os.path.join(self.root, context[len("collect:"):]) \
                    if context.startswith("collect:") else None
                session_files.update(shas.hash_all({f for f in opened if f != own}))
        return session_files

    def _memoized(self, nodeid: str, test: _Test) -> set[tuple[str, str]]:
        """Memoized functions whose cache answered the test or its file's import, and cached
        properties either read."""
        collect = _collect_context(nodeid)
        out = set(self.memo_hits.get(nodeid, ())) | set(self.memo_hits.get(collect, ()))
        for context in [*self._contexts_of(nodeid, test), collect]:
            out |= self.child_credited.get(context, set())
            for func in self.property_reads.get(context, ()):
                code = getattr(func, "__code__", None)
                where = self._owner(code) if code is not None else None
                if where is not None:
                    out.add((where[0], getattr(func, "__qualname__", where[1])))
        return out

    def _dynamic_reads(self, nodeid: str, test: _Test) -> dict[str, tuple[str, ...]]:
        """path -> names the test read by string. Reads while its test file was imported,
        or at session start (conftest files), count for it too: their values live on."""
        contexts = [*self._contexts_of(nodeid, test),
                    _collect_context(nodeid), SESSION_CONTEXT]
        out: dict[str, set[str]] = defaultdict(set)
        for context in contexts:
            reads = [(os.path.relpath(tracing._namespace(module).get("__file__") or "",
                                      self.root), name)
                     for module, name in self.module_reads.get(context, ())]
            for rel, name in [*reads, *self.child_reads.get(context, ())]:
                if name == "__dict__":
                    out[rel].add(DYNAMIC_ALL)
                elif name not in tracing.MACHINERY:
                    out[rel].add(name)
        return {p: tuple(sorted(n)) for p, n in sorted(out.items())}

    def set_item_code(self, nodeid: str, kind: str, path: str, obj: str = "") -> None:
        """The test item's code is not a Python function (a doctest, a plugin's item)."""
        self.item_code[nodeid] = {"kind": kind, "path": path, "object": obj}

    def _item_code(self, nodeid: str, shas: "_FileHasher") -> dict[str, str]:
        code = self.item_code.get(nodeid)
        if code is None:
            return {}
        path = code["path"]
        out = {**code, "sha": self.tree.get(path) or
               shas.hash_all({os.path.join(self.root, path)}).get(path, "unreadable")}
        if code["kind"] == "doctest" and path.endswith(".py"):
            try:
                source = (Path(self.root) / path).read_bytes()
            except OSError:
                source = b""
            out["digest"] = inventory.doctest_digest(source, code["object"]) or ""
        return out

    def _merge_child_captures(self, tag: str, captured: dict,
                              lines_by_context: dict[str, dict[str, set[int]]],
                              child_lines: dict[str, dict[str, set[int]]]) -> None:
        """A child's captured calls join its test's own (`child_capture.py`): each call's
        lines go to a capture context of the test, repeats' to its `|in`, the rest to the
        test itself (outside any call), and its blobs to the test's captures. A child of
        anything but a capturing test (a fixture's server) is plain child evidence: none of
        its lines can be pruned."""
        capture = self.capture
        own = capture is not None and tag in capture.captures and tag not in capture.uncaptured

        def add(context: str, files: dict, plain: bool) -> None:
            for filename, ls in files.items():
                rel = os.path.relpath(filename, self.root)
                if rel in self.tree:
                    lines_by_context[context][rel] |= set(ls)
                    if plain:
                        child_lines[tag][rel] |= set(ls)

        if not own:
            for files in (captured.get("outside", {}), captured.get("inside", {}),
                          *(c.get("lines", {}) for c in captured.get("captures", ()))):
                add(tag, files, plain=True)
            return
        assert capture is not None
        add(tag, captured.get("outside", {}), plain=False)
        if captured.get("inside"):
            self._derived[tag].add(tag + INSIDE)
            add(tag + INSIDE, captured["inside"], plain=False)
        blobs = captured.get("blobs", {})
        for entry in captured.get("captures", ()):
            index = len(capture.captures[tag])
            item = Capture(index=index, module=entry["module"], digest=entry.get("digest"),
                           size=entry.get("size", 0), why=entry.get("why"),
                           out=entry.get("out", {}), env=entry.get("env", {}),
                           kind=entry.get("kind", "module"))
            if item.digest is not None and item.digest not in blobs:
                item.digest, item.why = None, "the child's saved call was lost"
            if item.digest is not None:
                capture.blobs.setdefault(item.digest, Path(blobs[item.digest]))
            capture.captures[tag].append(item)
            context = f"{tag}{CAPTURED}{index}"
            self._derived[tag].add(context)
            add(context, entry.get("lines", {}), plain=False)
        if captured.get("stopped") and tag not in capture.stopped:
            capture.stopped[tag] = f"in a child process, {captured['stopped']}"

    def _module_evidence(self, nodeid: str, test: _Test, lines_by_context) -> dict | None:
        """Which lines ran inside which captured module call, and which outside any."""
        if self.capture is None or nodeid not in self.capture.captures:
            return None

        def lines_of(contexts) -> dict[str, list[int]]:
            merged: dict[str, set[int]] = defaultdict(set)
            for context in contexts:
                for path, ls in lines_by_context.get(context, {}).items():
                    merged[path] |= ls
            return {p: sorted(ls) for p, ls in merged.items()}

        # The test's own calls, then those of the broader fixtures it used (made once, at
        # their set-up): a change that ran only inside those replays like the test's own.
        captures: list[dict] = []
        for owner in test.contexts:
            for capture in self.capture.captures.get(owner, ()):
                entry = capture.to_json()
                entry["index"] = len(captures)
                entry["lines"] = lines_of([f"{owner}{CAPTURED}{capture.index}"])
                captures.append(entry)
        out = {"captures": captures, "outside": lines_of(test.contexts),
               "inside": lines_of([c + INSIDE for c in test.contexts]),
               "sys_path": self.capture.sys_path}
        if nodeid in self.capture.uncaptured:
            out["uncaptured"] = self.capture.uncaptured[nodeid]
        if nodeid in self.capture.stopped:
            out["stopped"] = self.capture.stopped[nodeid]
        return out


@dataclass
class _Seen:
    """What one test's contexts ran and read, merged."""

    lines: dict[str, set[int]] = field(default_factory=lambda: defaultdict(set))
    files: set[str] = field(default_factory=set)
    dirs: set[str] = field(default_factory=set)
    absent: set[str] = field(default_factory=set)
    folders: set[str] = field(default_factory=set)
    kernels: set[tuple[str, str]] = field(default_factory=set)
    spawns: set[str] = field(default_factory=set)


def _data_evidence(shas: _FileHasher, opened: set[str], absent: set[str],
                   root: str, folders: Collection[str] = ()) -> dict[str, str]:
    """The files a test read (their shas), the folders it asked about and found (FOLDER),
    and the paths it looked for and did not find (ABSENT); a path it looked for and then
    made and read is a file it read, and one it looked for and then made a folder is
    absent (its appearing in the tree is what can change the test)."""
    out = {os.path.relpath(p, root): FOLDER for p in folders}
    out.update((os.path.relpath(p, root), ABSENT) for p in absent)
    out.update(shas.hash_all(opened))
    return out


def _import_time(inventories: dict[str, FileBlocks],
                 lines_by_context: dict[str, dict[str, set[int]]],
                 callers: _Callers | None = None) -> dict[str, dict[str, list[str]]]:
    """path -> qualname -> origins of the functions that ran at import time: SESSION before
    collection (conftest, plugins), else the test file whose collection ran them, with the
    module-level statements that called them then (`ImportCaller` texts)."""
    import_time: dict[str, dict[str, list[str]]] = defaultdict(dict)
    for context, by_path in lines_by_context.items():
        unseen = context.endswith(OUTSIDE)  # ran outside module bodies: callers not seen
        if context == SESSION_CONTEXT:
            origin = SESSION
        elif context.startswith("collect:"):
            origin = context[len("collect:"):len(context) - (len(OUTSIDE) if unseen else 0)]
        else:
            continue
        for path, ls in by_path.items():
            fb = inventories.get(path)
            if fb is None:
                continue
            blocks = fb.by_qualname()
            for qualname in {fb.owner_of(n) for n in ls} - {MODULE}:
                block = blocks[qualname]
                if block.kind == "function":
                    origins = import_time[path].setdefault(qualname, [])
                    found = [origin]
                    if unseen:
                        found.append(ImportCaller("?").encode())
                    elif origin != SESSION and callers is not None:
                        found += callers.of(context, path, block.start,
                                            qualname.rsplit(".", 1)[-1])
                    origins.extend(o for o in found if o not in origins)
    return {p: {q: sorted(o) for q, o in qs.items()} for p, qs in import_time.items()}


class _Callers:
    """The import calls seen in each collection context, as `ImportCaller` texts."""

    def __init__(self, root: str, calls: dict) -> None:
        self.root = root
        self.calls = calls
        self._statements: dict[tuple[str, int], ImportCaller] = {}
        self._modules: dict[str, ModuleStatements | None] = {}

    def of(self, context: str, path: str, first_line: int, name: str) -> list[str]:
        """Who called the function in `context`; ["?"] when the hook saw no call of it (a
        thread, a generator resumed later, a hook that could not be installed)."""
        seen = self.calls.get(context, {}).get((path, first_line, name))
        if not seen:
            return [ImportCaller("?").encode()]
        return sorted({self._resolve(caller).encode() for caller in seen})

    def _resolve(self, caller: tuple) -> ImportCaller:
        if caller[0] != "module":
            return ImportCaller(caller[0])
        _, path, line = caller
        key = (path, line)
        if key not in self._statements:
            if path not in self._modules:
                try:
                    self._modules[path] = ModuleStatements((Path(self.root) / path).read_bytes())
                except OSError:
                    self._modules[path] = None
            statements = self._modules[path]
            found = statements.at(line) if statements is not None else None
            self._statements[key] = ImportCaller("?", path, line) if found is None else \
                ImportCaller(found[1].kind, path, found[0], found[1].defines)
        return self._statements[key]


def _by_path(keys) -> dict[str, tuple[str, ...]]:
    out: dict[str, set[str]] = defaultdict(set)
    for path, qualname in keys:
        out[path].add(qualname)
    return {p: tuple(sorted(q)) for p, q in sorted(out.items())}


class _FileHasher:
    """Content hashes of the non-Python files tests opened, each file read once."""

    def __init__(self, root: str, tree: dict[str, str]) -> None:
        self.root = root
        self.tree = tree
        self._cache: dict[str, str] = {}

    def hash_all(self, paths: set[str]) -> dict[str, str]:
        out = {}
        for full in paths:
            rel = os.path.relpath(full, self.root)
            if rel not in self._cache:
                try:
                    self._cache[rel] = blob_sha(Path(full).read_bytes())
                except OSError:
                    self._cache[rel] = "unreadable"
            out[rel] = self._cache[rel]
        return out


def _max_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _cuda_begin() -> None:
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.reset_peak_memory_stats()


def _cuda_end() -> int | None:
    """Peak CUDA memory of the test, or None when it allocated nothing on a GPU."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    peak = torch.cuda.max_memory_allocated()
    return peak or None


def recording_to_json(rec: Recording, failures: dict[str, dict]) -> dict:
    """The hand-over from a pytest process to the `fastci run` process that started it."""
    return {
        "tree": rec.tree, "environment": json.loads(rec.environment.to_json()),
        "import_time": rec.import_time, "session_files": rec.session_files,
        "first_failure_at": rec.first_failure_at, "started_at": rec.started_at,
        "finished_at": rec.finished_at, "order": rec.order, "failures": failures,
        "scope": rec.scope,
        "tests": [{**{k: v for k, v in asdict(t).items()},
                   "lines": {p: list(ls) for p, ls in (t.lines or {}).items()}}
                  for t in rec.tests.values()],
    }


def recording_from_json(data: dict) -> tuple[Recording, dict[str, dict]]:
    tests = {}
    for t in data["tests"]:
        t = dict(t)
        t["blocks"] = {p: tuple(q) for p, q in t["blocks"].items()}
        t["lines"] = {p: tuple(ls) for p, ls in t["lines"].items()}
        t["dirs"] = tuple(t["dirs"])
        t["spawns"] = tuple(t["spawns"])
        t["markers"] = tuple(t["markers"])
        t["dynamic"] = {p: tuple(n) for p, n in t.get("dynamic", {}).items()}
        t["child_blocks"] = {p: tuple(q) for p, q in t.get("child_blocks", {}).items()}
        t["ranks"] = tuple(t.get("ranks", ()))
        if t.get("credited") is not None:
            t["credited"] = {p: tuple(q) for p, q in t["credited"].items()}
        tests[t["test_id"]] = TestRecord(**t)
    rec = Recording(tree=data["tree"], environment=Environment(**data["environment"]),
                    tests=tests, import_time=data["import_time"],
                    session_files=data["session_files"],
                    first_failure_at=data["first_failure_at"], started_at=data["started_at"],
                    finished_at=data["finished_at"], order=data["order"],
                    scope=dict(data.get("scope") or {}))
    return rec, data["failures"]


def merge_recordings(recordings: list[Recording]) -> Recording:
    """One recording from sessions that each ran part of one suite on the same tree (the
    workers of a pytest-xdist session): every test once, import-time origins and
    session-wide files united."""
    first = recordings[0]
    tests: dict[str, TestRecord] = {}
    import_time: dict[str, dict[str, list[str]]] = {}
    session_files: dict[str, str] = {}
    order: list[str] = []
    for rec in recordings:
        tests.update(rec.tests)
        order += rec.order
        session_files.update(rec.session_files)
        for path, names in rec.import_time.items():
            into = import_time.setdefault(path, {})
            for qualname, origins in names.items():
                into[qualname] = sorted({*into.get(qualname, ()), *origins})
    failures_at = [r.first_failure_at for r in recordings if r.first_failure_at]
    return Recording(tree=first.tree, environment=first.environment, tests=tests,
                     import_time=import_time, session_files=session_files,
                     first_failure_at=min(failures_at) if failures_at else None,
                     started_at=min(r.started_at for r in recordings),
                     finished_at=max(r.finished_at for r in recordings),
                     order=list(dict.fromkeys(order)), scope=dict(first.scope))


def _enclosing_block(blocks, qualname: str) -> str:
    """The block a credited function belongs to: a function nested in another
    (`deco.<locals>.wrapper`, a decorator's wrapper under a cache) is part of its enclosing
    function's block."""
    name = qualname
    while name not in blocks and "." in name:
        name = name.rsplit(".", 1)[0]
        if name.endswith(".<locals>"):
            name = name[:-len(".<locals>")]
    return name if name in blocks else qualname


def _collect_context(nodeid: str) -> str:
    """The context of the test file's import: what it read or hit then counts for its tests."""
    return "collect:" + nodeid.split("::", 1)[0]
