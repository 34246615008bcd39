"""Selection: for every test, selected or skipped, and why. Pure functions over plain data.

Safety rules come first and each one selects with its reason; then the trace diff; then the
risk order. When anything is unclear the answer is to select, and to say why.
"""

from __future__ import annotations

import posixpath
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Collection, Mapping, Sequence

from fastci.runner.analysis.blocks import MODULE, FileBlocks
from fastci.runner.analysis.changes import ChangeSet, blocks_reading, is_native, is_pytest_config
from fastci.runner.analysis.environment import Environment, is_manifest
from fastci.runner.analysis.inventory import ImportGraph, doctest_digest
from fastci.runner.config import Settings
from fastci.runner.evidence import (
    ABSENT,
    DYNAMIC_ALL,
    FAILED,
    FOLDER,
    IMPORTED,
    SESSION,
    UNRECORDED,
    Snapshot,
    TestRecord,
)
from fastci.runner.evidence_index import (
    BLOCKS,
    CODE,
    DIRS,
    DYNAMIC,
    EXECUTED,
    FILES,
    KERNELS,
    NO_FILE_EVENTS,
    SPAWNS,
    Counts,
    TestIndex,
    evidence_counts,
)
from fastci.runner.selection import risk as risk_model
from fastci.runner.selection.import_time import import_effects
from fastci.runner.selection.report import Decision, Selection
from fastci.runner.selection.scope import Scope

MAX_EXAMPLES = 3
# Method names frameworks look up by name on modules (hasattr/getattr), so adding one can
# change behaviour without overriding anything: such additions are never pruned.
LOOKED_UP_BY_NAME = frozenset({"reset_parameters", "_reset_parameters", "extra_repr",
                               "init_weights", "_init_weights", "fuse", "fuse_modules"})

_BlockKey = tuple[str, str]  # (path, qualname)
_Condition = tuple[str, str, tuple[str, ...]]  # (path, class, methods it only gained)
_Weighted = list[tuple[str, int]]  # reasons, each with its share of the change


@dataclass(frozen=True)
class History:
    outcomes: Mapping[str, Sequence[str]] = field(default_factory=dict)  # newest first
    durations: Mapping[str, float] = field(default_factory=dict)
    cofailure: Mapping[str, Mapping[str, float]] = field(default_factory=dict)


@dataclass(frozen=True)
class SelectionInput:
    head: str
    head_tree: Mapping[str, str]
    environment: Environment  # where the selected tests will run
    snapshot: Snapshot | None  # the evidence; None when there is none to use
    changes: ChangeSet
    head_inventories: Mapping[str, FileBlocks]
    import_graph: ImportGraph
    static_tests: Sequence[str]  # test functions found at the head, as node-id prefixes
    head_kernels: Mapping[str, str]  # kernel -> hash at the head, for kernels in evidence
    untracked_shas: Mapping[str, str] = field(default_factory=dict)
    settings: Settings = field(default_factory=Settings)
    history: History = field(default_factory=History)
    no_evidence_reason: str | None = None
    scope: Scope = field(default_factory=Scope)
    """The recorded suite's scope (the snapshot's; whole with `--all-tests`)."""
    line_source: Callable[[Sequence[str], Collection[str]],
                          Mapping[str, Mapping[str, tuple[int, ...]]]] | None = None
    """Some tests' executed lines in some files (stored apart from their evidence), for
    tests whose `lines` were not loaded: asked once, for the tests that ran a function
    changed inside, in those functions' files."""


def test_file(test_id: str) -> str:
    return test_id.split("::", 1)[0]


def test_function(test_id: str) -> tuple[str, str]:
    """`tests/t.py::TestA::test_b[x]` -> ("tests/t.py", "TestA.test_b")."""
    path, _, rest = test_id.split("[", 1)[0].partition("::")
    return path, rest.replace("::", ".")


def function_id(test_id: str) -> str:
    return test_id.split("[", 1)[0]


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _select_all_reasons(inp: SelectionInput, snap: Snapshot, folders: _Folders) -> list[str]:
    changes = inp.changes
    reasons = []
    if snap.environment.digest != inp.environment.digest:
        reasons.append(f"evidence was recorded under another environment "
                       f"({snap.environment.describe()}); this one is "
                       f"{inp.environment.describe()}")
    for change in changes.files:
        path = change.path
        if is_manifest(path):
            reasons.append(f"dependency manifest {path} {change.status}")
        elif is_pytest_config(path):
            reasons.append(f"pytest configuration {path} {change.status}")
        elif is_native(path):
            reasons.append(f"{path} {change.status}: native code or a build input FastCI "
                           "cannot map to the tests that load it")
    if snap.environment.lock_hash != inp.environment.lock_hash and not any(
            is_manifest(c.path) for c in changes.files):
        reasons.append("the dependency lock differs from the one the evidence was recorded "
                       "with")
    reasons.extend(_session_input_reasons(inp, snap, folders))
    for path, qualnames in snap.import_time.items():
        for qualname, origins in qualnames.items():
            if SESSION in origins and (path, qualname) in changes.blocks:
                reasons.append(f"{path}::{qualname} ran at session start (conftest or plugin "
                               "import) and changed")
    for change in changes.files:
        if change.path.rsplit("/", 1)[-1] == "conftest.py" and "/" not in change.path \
                and _conftest_changed(change.path, changes):
            reasons.append(f"the root conftest.py {change.status} at module level")
    return reasons


def _session_input_reasons(inp: SelectionInput, snap: Snapshot, folders: _Folders
                           ) -> list[str]:
    """Files read, paths looked for and folders found outside any test (session start, a
    test file's import): whatever changed there reaches every test."""
    out = []
    for path, sha in sorted(snap.session_files.items()):
        how = _input_change(inp, path, sha, folders)
        if how == "added":
            out.append(f"{path} was looked for at import time, outside any test, and was added")
        elif how == "gone":
            out.append(f"{path}/ was found at import time, outside any test, and is gone")
        elif how is not None:
            out.append(f"{path} was read at import time, outside any test, and changed")
    return out


def _conftest_changed(path: str, changes: ChangeSet) -> bool:
    status = changes.blocks.get((path, MODULE))
    return status is not None or path in changes.unparseable


def _file_sha(inp: SelectionInput, path: str) -> str | None:
    if path in inp.head_tree:
        return inp.head_tree[path]
    return inp.untracked_shas.get(path)


def _folders_above(path: str) -> Iterator[str]:
    folder = posixpath.dirname(path)
    while folder:
        yield folder
        folder = posixpath.dirname(folder)


@dataclass(frozen=True)
class _Folders:
    """The folders a change made (above an added file: a path looked for and not found may
    now be one) and those it emptied (every file under them removed or renamed away: a
    folder a test found may be gone)."""

    added: frozenset[str] = frozenset()
    gone: frozenset[str] = frozenset()

    @classmethod
    def of(cls, inp: SelectionInput) -> _Folders:
        added: set[str] = set()
        emptied: set[str] = set()
        for path, change in inp.changes.file_status().items():
            if change.status in ("added", "renamed"):
                added.update(_folders_above(path))
            if change.status in ("removed", "renamed") and _file_sha(inp, path) is None:
                emptied.update(_folders_above(path))
        if emptied:  # only then is every file's folder worth a look
            present: set[str] = set()
            for path in (*inp.head_tree, *inp.untracked_shas):
                for folder in _folders_above(path):
                    if folder in present:
                        break  # and so are the folders above it
                    present.add(folder)
            emptied -= present
        return cls(frozenset(added), frozenset(emptied))


def _input_change(inp: SelectionInput, path: str, sha: str, folders: _Folders) -> str | None:
    """How a file a test read or asked about differs now ("changed", "removed"), "added"
    for a path it looked for and did not find that is now a file or a folder with files,
    or "gone" for a folder it found that no file is in now; None when it is as the test
    saw it."""
    now = _file_sha(inp, path)
    if sha == ABSENT:
        return "added" if now is not None or path in folders.added else None
    if sha == FOLDER:
        return "gone" if path in folders.gone else None
    if now == sha:
        return None
    return "removed" if now is None else "changed"


class _Rules:
    """Per-test rules, with the tree-wide facts they share computed once."""

    def __init__(self, inp: SelectionInput, snap: Snapshot, folders: _Folders) -> None:
        self.inp = inp
        self.exact = set(inp.settings.exact)
        # Import-time work whose result may have changed: its calling statements' names join
        # the changed names (import_time.py); what cannot be attributed keeps the wide rule.
        reader = getattr(inp.head_inventories, "source", None)
        effects = import_effects(inp.changes, snap.import_time, inp.head_inventories,
                                 exact="import-time" in self.exact, source=reader)
        self.changes = changes = effects.changes
        self.import_wide = effects.wide
        self.import_everything = list(effects.everything)
        self.bound = effects.bound
        self.changed_blocks = changes.blocks
        self.name_hits = blocks_reading(changes, inp.head_inventories)
        self.harmless_classes = self._harmless_class_additions()
        # Files holding a changed block or a block that reads a changed name: a test's other
        # files need no per-block look.
        self.block_paths = {p for p, _ in self.changed_blocks} | {p for p, _ in self.name_hits}
        self.reached: dict[str, set[str]] = {}
        watch = set(changes.unresolved) | set(changes.unparseable)
        watch.update(w.path for w in self.import_wide)
        for path in watch:
            self.reached[path] = inp.import_graph.reached_from(path)
        self.conftest_dirs = sorted(
            posixpath.dirname(c.path) for c in changes.files
            if c.path.rsplit("/", 1)[-1] == "conftest.py" and "/" in c.path
            and _conftest_changed(c.path, changes))
        # What a child process might see: any changed block, or any changed non-Python file.
        self.code_or_data_changed = bool(changes.blocks or changes.unresolved
                                         or changes.unparseable) or any(
            not c.path.endswith(".py") for c in changes.files)
        self._sources: dict[str, bytes | None] = {}
        self.namespace_readers = self._namespace_readers()
        # Changed non-Python files a native reader might have read unseen, where a test's
        # evidence lacks the kernel's file events (no inotify, or events lost).
        self.unwatched_changes = [f"{c.path} ({c.status})" for c in changes.files
                                  if not c.path.endswith(".py")
                                  and not inp.settings.ignores(c.path)]
        status = changes.file_status()
        self.folders = folders
        self.added_or_removed: dict[str, list[str]] = defaultdict(list)
        for path, change in status.items():
            if change.status in ("added", "removed", "renamed"):
                # by folder as the evidence names it (the root as ".", as relpath does)
                self.added_or_removed[posixpath.dirname(path) or "."].append(path)
        self.snapshot = snap
        self._lines: dict[str, Mapping[str, tuple[int, ...]]] | None = None  # loaded once
        self._spared: dict[str, list[str]] = {}  # test -> functions it ran, none of the change

    def _harmless_class_additions(self) -> dict[str, _Condition]:
        """Class name -> (path, class, added methods) for classes that only gained methods
        nobody else reads; whether one overrides an inherited attribute is checked when
        pruning, under the new code."""
        out: dict[str, _Condition | None] = {}
        for (path, qualname), added in self.changes.added_methods.items():
            if added & LOOKED_UP_BY_NAME:
                continue
            readers = [key for key, names in self.name_hits.items() if names & added]
            if any(key not in self.changed_blocks for key in readers):
                continue
            short = qualname.rsplit(".", 1)[-1]
            if short in out:  # two changed classes of one name: keep it simple, no pruning
                out[short] = None
                continue
            out[short] = (path, qualname, tuple(sorted(added)))
        return {k: v for k, v in out.items() if v is not None}

    def reasons(self, test: TestRecord
                ) -> tuple[list[str], int, tuple[_BlockKey, ...], tuple[_Condition, ...]]:
        """Why the test must run (empty: it need not), its share of the change, and the
        blocks it was selected for when they are its only reasons (pruning candidates)."""
        own = self._own_reasons(test)
        executed = self._executed_changes(test)
        tfile = test_file(test.test_id)
        later = [*self._module_level_changes(test, tfile),
                 *self._import_time_changes(tfile, executed.keys),
                 *self._changed_inputs(test), *self._unseen_dependencies(test)]
        out = own + executed.reasons + [reason for reason, _ in later]
        units = executed.units + sum(n for _, n in later)
        in_child = [k for k in executed.keys if k[1] in test.child_blocks.get(k[0], ())]
        if executed.reasons and not own and not later and not in_child:
            # Pruning replays in-process module calls: a change a child ran is never pruned.
            return out, units, tuple(sorted(executed.keys)), tuple(sorted(executed.conditions))
        return out, units, (), ()

    def _own_reasons(self, test: TestRecord) -> list[str]:
        """Reasons about the test itself (no share of the change): it failed last time, or
        its own code changed. Any of them rules out pruning."""
        out: list[str] = []
        if test.failed:
            out.append(f"it {'errored' if test.outcome == 'error' else 'failed'} in the last run")
        elif test.outcome == "skipped" and not self.changes.empty:
            # A skipped test ran nothing, so it has no evidence; its skip condition may read
            # what changed (`skipif(not FUSED_ADAMW)`), and running it costs a skip.
            out.append("it was skipped in the last run, which leaves no evidence of what its "
                       "skip condition read")
        own = test_function(test.test_id)
        if own in self.changed_blocks:
            out.append(f"the test's own code changed ({own[0]}::{own[1]})")
        if test.code:
            why = self._item_code_changed(test.code)
            if why:
                out.append(why)
        return out

    def _executed_changes(self, test: TestRecord) -> _Executed:
        """Changed blocks the test executed, and blocks it executed that read a changed
        name: the only reasons a pruning replay can clear, so the blocks are kept too."""
        found = _Executed()
        hits, name_hits = [], []
        for path, qualnames in test.blocks.items():
            if path not in self.block_paths:
                continue  # nothing changed in this file's blocks, nothing reads a change here
            for qualname in qualnames:
                key = (path, qualname)
                detail = self._how_changed(test, key) if key in self.changed_blocks \
                    and not self._resolved_body(key) else None
                if detail is not None:
                    hits.append(f"{path}::{qualname} ({detail})")
                    found.keys.append(key)
                elif key in self.name_hits:  # also when it ran none of what changed in it
                    names = self.name_hits[key]
                    if names <= self.harmless_classes.keys():
                        found.conditions.update(self.harmless_classes[n] for n in names)
                    else:
                        found.keys.append(key)
                    read = ", ".join(sorted(self.name_hits[key]))
                    origin = next((self.bound[n] for n in sorted(names) if n in self.bound), "")
                    name_hits.append(f"{path}::{qualname} reads {read}"
                                     + (f" ({origin})" if origin else ""))
        found.units = len(hits) + len(name_hits)
        if hits:
            found.reasons.append(_examples("executed changed code", hits))
        if name_hits:
            found.reasons.append(_examples(
                "executed code that reads a changed module or class value", name_hits))
        return found

    def _resolved_body(self, key: _BlockKey) -> bool:
        """A module body, or the body of a class not defined inside a function, whose
        change was resolved to the names it binds. A test that ran such a body (a child
        process importing the module, an import inside the test) is affected through those
        names, as a test whose module was imported at collection is, not by having run it:
        the body binds names and does nothing else, or the change would be unresolved."""
        path, qualname = key
        if path in self.changes.unresolved or path in self.changes.unparseable:
            return False
        if qualname == MODULE:
            return True
        if "<locals>" in qualname:
            return False  # it runs whenever its function runs: code like any other
        fb = self.inp.head_inventories.get(path)
        block = fb.by_qualname().get(qualname) if fb is not None and not fb.error else None
        return block is not None and block.kind == "class"

    def _how_changed(self, test: TestRecord, key: _BlockKey) -> str | None:
        """How a changed block the test executed changed, as its reason says it; None when
        the test ran the function along a path the change does not touch."""
        status = self.changed_blocks[key]
        change = self.changes.functions.get(key)
        if status != "modified" or "statements" not in self.exact:
            return status
        if change is None:
            fb = self.inp.head_inventories.get(key[0])
            block = fb.by_qualname().get(key[1]) if fb is not None else None
            return "modified; the whole function counts, as its old or new source could not " \
                   "be read to compare" if block is not None and block.kind == "function" \
                else status
        if change.whole is not None:
            return f"modified: {change.whole}"
        if change.everyone:  # its first statement changed: every call met it
            return f"modified: {change.hunks[0].what}"
        unusable = self._lines_unusable(test, key, change)
        if unusable is not None:
            return f"modified; the whole function counts, as {unusable}"
        hit = change.hit(self._test_lines(test).get(key[0], ()))  # type: ignore[union-attr]
        if hit is None:
            self._spared.setdefault(test.test_id, []).append(
                f"{key[0]}::{key[1]} ({change.hunks[0].what})")
            return None
        return f"modified: {hit}"

    def _lines_unusable(self, test: TestRecord, key: _BlockKey, change) -> str | None:
        """Why the test's executed lines cannot tell which statements of a function it ran,
        or None when they can (fresh evidence that ran the function's lines itself)."""
        path, qualname = key
        if test.carried_from:
            return (f"its evidence was carried forward from {test.carried_from[:12]} and its "
                    "lines may have moved since")
        if test.credited is None:
            return "its evidence predates per-statement lines"
        if qualname in test.credited.get(path, ()):
            return "it reached the function through a cache hit or a launch, not its lines"
        if qualname in test.child_blocks.get(path, ()):
            return "a child process ran it"
        lines = self._test_lines(test)
        if lines is None:
            return "its executed lines are not in the evidence"
        if not change.ran(lines.get(path, ())):
            return "its evidence holds none of its lines in the function"
        return None

    def _test_lines(self, test: TestRecord) -> Mapping[str, tuple[int, ...]] | None:
        if test.lines is not None:
            return test.lines
        if self._lines is None:
            self._lines = self._load_lines()
        return self._lines.get(test.test_id)

    def _load_lines(self) -> dict[str, Mapping[str, tuple[int, ...]]]:
        """The lines of every test the statement rule may need, in one request: those that
        ran a function changed inside whose hunks not every call meets."""
        source = self.inp.line_source
        keys = {k for k, c in self.changes.functions.items()
                if c.whole is None and not c.everyone and k in self.changed_blocks}
        if source is None or not keys:
            return {}
        paths = {p for p, _ in keys}
        index = getattr(self.snapshot, "index", None)
        if index is not None:  # decode only the tests that ran one of those functions
            executed = index.keys(EXECUTED)
            ran = sorted({index.tests[i] for key in keys for i in executed.get(key, ())})
            candidates = [self.snapshot.tests[t] for t in ran]
        else:
            candidates = list(self.snapshot.tests.values())
        wanted = [t.test_id for t in candidates
                  if t.lines is None and t.credited is not None and not t.carried_from
                  and any(q in t.blocks.get(p, ()) for p, q in keys)]
        return dict(source(wanted, paths)) if wanted else {}

    def _module_level_changes(self, test: TestRecord, tfile: str) -> _Weighted:
        """Modules that changed at module level (unresolved to names) or no longer parse,
        which the test executed or its file imports."""
        changes, out = self.changes, []
        for path in sorted(changes.unresolved):
            why = changes.unresolved[path]
            if path in test.blocks:
                out.append((f"executed code in {path}, which changed at module level ({why})", 1))
            elif tfile in self.reached.get(path, ()):
                out.append((f"{tfile} imports {path}, which changed at module level ({why})", 1))
        for path, error in sorted(changes.unparseable.items()):
            if path in test.blocks or tfile in self.reached.get(path, ()) or path == tfile:
                out.append((f"{path} {error}, and this test depends on it", 1))
        return out

    def _import_time_changes(self, tfile: str, executed: list[_BlockKey]) -> _Weighted:
        """Changed code that runs when the test's file is imported: functions called at
        import time whose result could not be tied to the names it is bound to, and
        conftest.py files above it."""
        out = [(reason, 1) for reason in self.import_everything]
        for wide in self.import_wide:
            if (wide.path, wide.qualname) in executed:
                continue  # already a reason: it executed the changed block itself
            if tfile in wide.test_files or tfile in self.reached.get(wide.path, ()):
                detail = f" ({wide.detail})" if wide.detail else ""
                out.append((f"{wide.path}::{wide.qualname} runs at import time for {tfile} "
                            f"and {wide.why}{detail}", 1))
        for directory in self.conftest_dirs:
            if tfile.startswith(directory + "/"):
                out.append((f"{directory}/conftest.py changed at module level", 1))
        return out

    def _changed_inputs(self, test: TestRecord) -> _Weighted:
        """Data the test read: files whose contents changed, directories it listed where
        files were added or removed."""
        out = []
        changed_files, appeared, gone = [], [], []
        for path, sha in test.files.items():
            how = _input_change(self.inp, path, sha, self.folders)
            if how == "added":
                appeared.append(path)
            elif how == "gone":
                gone.append(f"{path}/")
            elif how is not None:
                changed_files.append(f"{path} ({how})")
        if changed_files:
            out.append((_examples("read a changed file", changed_files), len(changed_files)))
        if appeared:
            out.append((_examples("looked for paths missing then, present now", appeared),
                        len(appeared)))
        if gone:
            out.append((_examples("found folders no file is in now", gone), len(gone)))
        for directory in test.dirs:
            entries = self.added_or_removed.get(directory)
            if entries:
                out.append((f"listed {directory}/, where files were added or removed "
                            f"({', '.join(entries[:MAX_EXAMPLES])})", 1))
        return out

    def _unseen_dependencies(self, test: TestRecord) -> _Weighted:
        """What line coverage does not show: child processes (and compiled code where this
        torch hides what dynamo traced), Triton kernels launched, and values read by
        string."""
        out = []
        if test.spawns and self.code_or_data_changed:
            first = test.spawns[0]
            what = "it ran torch.compile'd code FastCI could not see" \
                if first.startswith("torch.compile") else \
                "some of its lines went unrecorded" if first.startswith(UNRECORDED) else \
                "it starts child processes whose evidence FastCI could not merge"
            out.append((f"{what} ({first.removeprefix(UNRECORDED)}"
                        f"{' and more' if len(test.spawns) > 1 else ''}), "
                        "and code or data changed", 1))
        if not test.file_events and self.unwatched_changes:
            out.append((_examples("its file evidence was recorded without the kernel's file "
                                  "events (which see native readers and child processes), "
                                  "and non-Python files changed", self.unwatched_changes), 1))
        kernels = [k for k, h in test.kernels.items()
                   if self.inp.head_kernels.get(k, "missing") != h]
        if kernels:
            out.append((_examples("launched a Triton kernel whose source, a jit function it "
                                  "calls, or a module-level value they read changed", kernels),
                        len(kernels)))
        by_string = self._read_by_string(test)
        if by_string:
            out.append((_examples("read by string a changed module or class value",
                                  by_string), len(by_string)))
        return out

    def _namespace_readers(self) -> dict[tuple[str, str], str]:
        """Blocks that call globals() or vars() in a module whose values changed: they read
        names by string from their own module, which no static read shows."""
        changes = self.changes
        out: dict[tuple[str, str], str] = {}
        for path in set(changes.names_by_path) | set(changes.unresolved):
            if path not in self.inp.head_inventories:
                continue
            fb = self.inp.head_inventories[path]
            changed = ", ".join(sorted(changes.names_by_path.get(path, ()))[:MAX_EXAMPLES])
            for block in fb.blocks:
                if block.kind != "module" and {"globals", "vars"} & set(block.calls):
                    out[(path, block.qualname)] = changed or changes.unresolved.get(path, "")
        return out

    def _read_by_string(self, test: TestRecord) -> list[str]:
        """Names the test reached through getattr, import_module, vars() or a module's
        __dict__ that changed; a whole namespace read sees any changed value in it."""
        changes = self.changes
        out = []
        for (path, qualname), values in self.namespace_readers.items():
            if qualname in test.blocks.get(path, ()):
                out.append(f"{path}::{qualname} through globals() or vars() ({values})")
        for path, names in test.dynamic.items():
            changed = changes.names_by_path.get(path, frozenset())
            broad = changes.unresolved.get(path) or (
                "does not parse" if path in changes.unparseable else None)
            if DYNAMIC_ALL in names and (changed or broad):
                shown = ", ".join(sorted(changed)[:MAX_EXAMPLES]) or broad
                out.append(f"{path} as a whole, through vars() or __dict__ ({shown})")
                continue
            hit = changed.intersection(names)
            if hit:
                out += [f"{path}::{name}" for name in sorted(hit)]
            elif broad:
                shown = ", ".join(n if n != IMPORTED else "(imported by name)"
                                  for n in names[:MAX_EXAMPLES])
                out.append(f"{path}::{shown} ({broad})")
        return out

    def _item_code_changed(self, code: Mapping[str, str]) -> str | None:
        """Why an item whose code is not a Python function must run, or None: a doctest is
        its docstring, any other kind (a doctest text file, a plugin's YAML item) its file."""
        path, kind = code.get("path", ""), code.get("kind", "item")
        now = _file_sha(self.inp, path)
        if now is not None and now == code.get("sha"):
            return None
        if now is None:
            return f"the file that holds its code, {path}, is gone ({kind} item)"
        if kind == "doctest" and code.get("digest"):
            if path not in self._sources:
                reader = getattr(self.inp.head_inventories, "source", None)
                self._sources[path] = reader(path) if reader is not None else None
            source = self._sources[path]
            where = f"{path}::{code.get('object') or MODULE}"
            if source is None:
                return f"its doctest's file changed and cannot be read to compare ({where})"
            if doctest_digest(source, code.get("object", "")) == code["digest"]:
                return None
            return f"the doctest's own code changed: the docstring of {where}"
        return (f"the test's own code changed: {path}, which holds this {kind} item "
                "(its code is not a Python block FastCI can map)")

    def skip_reason(self, test: TestRecord) -> str:
        spared = self._spared.get(test.test_id)
        if spared:
            return (_examples("it ran changed functions, but none of their changed statements "
                              "and no statement beside an insertion", spared)
                    + "; nothing else it executed or read changed")
        return skip_reason(evidence_counts(test))


@dataclass
class _Executed:
    """The changed code a test executed: its reasons, their share of the change, and the
    blocks and class conditions a pruning replay would have to clear."""

    reasons: list[str] = field(default_factory=list)
    units: int = 0
    keys: list[_BlockKey] = field(default_factory=list)
    conditions: set[_Condition] = field(default_factory=set)


def _examples(label: str, items: list[str]) -> str:
    shown = ", ".join(items[:MAX_EXAMPLES])
    more = f" and {len(items) - MAX_EXAMPLES} more" if len(items) > MAX_EXAMPLES else ""
    return f"{label}: {shown}{more}"


def skip_reason(counts: Counts) -> str:
    """Why a test the change does not reach is skipped, from its evidence's counts (the
    index keeps them, so a test decided from the index reads as one decided in full)."""
    nblocks, nfiles, ndata, nkernels = counts
    parts = [_plural(nblocks, "block"), f"in {_plural(nfiles, 'file')}"]
    extra = []
    if ndata:
        extra.append(_plural(ndata, "data file"))
    if nkernels:
        extra.append(_plural(nkernels, "kernel"))
    detail = " ".join(parts) + ("; " + ", ".join(extra) if extra else "")
    return f"nothing it executed or read changed ({detail})"


@dataclass(frozen=True, slots=True)
class _Fact:
    """One test's decision before ranking, and what ranking reads of it."""

    selected: bool
    reasons: list[str]
    units: int  # its share of the change
    new: bool
    duration: float | None  # recorded; None for a new test
    dimension: str | None  # None for a new test (the default dimension)
    prunable: tuple = ()
    conditions: tuple = ()


def _decide(rules: _Rules | None, all_reasons: list[str], test: TestRecord) -> _Fact:
    """A test decided from its evidence (decoded)."""
    if rules is None:
        return _Fact(True, list(all_reasons), 0, False, test.duration, test.dimension)
    reasons, units, prunable, conditions = rules.reasons(test)
    if reasons:
        return _Fact(True, reasons, units, False, test.duration, test.dimension, prunable,
                     conditions)
    return _Fact(False, [rules.skip_reason(test)], 0, False, test.duration, test.dimension)


def _reached(inp: SelectionInput, rules: _Rules, index: TestIndex) -> set[int]:
    """The positions in `index` of the tests the change can reach: every test for which
    `rules.reasons` may give a reason, read off what the index says each test's evidence
    names (a superset: a reached test is decoded and evaluated in full)."""
    if rules.import_everything:  # import-time work at session start changed: every test
        return set(range(len(index.tests)))
    changes = rules.changes  # with the names and modules import-time work adds
    broad = set(changes.unresolved) | set(changes.unparseable)
    by_string = set(changes.names_by_path) | broad
    changed: dict[str, Callable[..., bool]] = {  # kind -> does this key name a change?
        BLOCKS: lambda path: path in broad,  # module level: whatever of it the test ran
        FILES: lambda path, sha: _input_change(inp, path, sha, rules.folders) is not None,
        DIRS: lambda directory: bool(rules.added_or_removed.get(directory)),
        KERNELS: lambda kernel, digest: inp.head_kernels.get(kernel, "missing") != digest,
        DYNAMIC: lambda path: path in by_string,
        CODE: lambda path, sha: _file_sha(inp, path) != sha,
        SPAWNS: lambda: rules.code_or_data_changed,
        NO_FILE_EVENTS: lambda: bool(rules.unwatched_changes),
    }
    out = {i for i, outcome in enumerate(index.outcomes)  # (`_own_reasons`)
           if outcome in FAILED or outcome == "skipped" and not changes.empty}
    for kind, names_change in changed.items():
        for parts, ords in index.keys(kind).items():
            if names_change(*parts):
                out.update(ords)
    # Blocks the test executed: changed ones, ones that read a changed name, ones that
    # read their module's names by string.
    executed = index.keys(EXECUTED)
    for key in {*rules.changed_blocks, *rules.name_hits, *rules.namespace_readers}:
        out.update(executed.get(key, ()))
    # Rules about the test's own file: its own code, imports of a module changed at module
    # level or of one whose import-time work changed, conftest.py files above it.
    test_files = {p for p, _ in changes.blocks} | broad
    for path in broad:
        test_files |= rules.reached.get(path, set())
    for wide in rules.import_wide:  # import-time work no statement's names stand for
        test_files |= set(wide.test_files) | rules.reached.get(wide.path, set())
    for prefix in [f"{f}::" for f in test_files] + [f"{d}/" for d in rules.conftest_dirs]:
        out.update(_starting_with(index.tests, prefix))  # the ids sort by their test file
    for path in test_files:  # an id that is its file alone (no "::")
        at = bisect_left(index.tests, path)
        if at < len(index.tests) and index.tests[at] == path:
            out.add(at)
    return out


def _starting_with(ids: Sequence[str], prefix: str) -> range:
    """The positions of the sorted `ids` that start with `prefix` (not empty)."""
    after = prefix[:-1] + chr(ord(prefix[-1]) + 1)
    return range(bisect_left(ids, prefix), bisect_left(ids, after))


def select(inp: SelectionInput, *, use_index: bool = True) -> Selection:
    """Decide every test. The head's tests are those in evidence (unless their file is
    gone) plus the test functions found statically at the head that evidence lacks.

    With the snapshot's index (and `use_index`), only the tests the change reaches are
    decoded and evaluated; every other one is skipped from the index alone, with the
    reason and order the full evaluation (`use_index=False`) gives."""
    snap = inp.snapshot
    facts: dict[str, _Fact] = {}
    notes: list[str] = []
    known_functions: set[str] = set()
    all_reasons: list[str] = []
    if snap is None:
        all_reasons = [inp.no_evidence_reason or "no evidence to select from"]
    else:
        folders = _Folders.of(inp)  # the change's, computed once: a walk of the tree at worst
        all_reasons = _select_all_reasons(inp, snap, folders)
        rules = None if all_reasons else _Rules(inp, snap, folders)
        index = snap.index if use_index else None
        reached = _reached(inp, rules, index) if index is not None and rules is not None \
            else set()
        position = index.position if index is not None else {}
        skip_texts: dict[tuple[int, ...], str] = {}  # many tests share their counts
        gone = 0
        for test_id in snap.tests:  # ids only: a test is decoded when it must be evaluated
            if test_file(test_id) not in inp.head_tree:
                gone += 1
                continue
            known_functions.add(function_id(test_id))
            at = position.get(test_id)
            if index is None or at is None or at in reached:
                facts[test_id] = _decide(rules, all_reasons, snap.tests[test_id])
            elif rules is None:
                facts[test_id] = _Fact(True, list(all_reasons), 0, False,
                                       index.durations[at], index.dimensions[at])
            else:
                counts = tuple(index.counts[at])
                text = skip_texts.get(counts) or skip_texts.setdefault(
                    counts, skip_reason(index.counts[at]))
                facts[test_id] = _Fact(False, [text], 0, False, index.durations[at],
                                       index.dimensions[at])
        if gone:
            notes.append(f"{_plural(gone, 'test')} in removed test files left out")
    outside = []
    for prefix in inp.static_tests:
        if prefix not in known_functions and prefix not in facts:
            if snap is not None and not inp.scope.contains(prefix):
                outside.append(prefix)  # never in the suite being gated
                continue
            reasons = ["new test: no evidence yet"] if snap is not None else list(all_reasons)
            facts[prefix] = _Fact(True, reasons, 0, True, None, None)
    if outside:
        notes.append(f"{_plural(len(outside), 'test')} outside the recorded suite (recorded "
                     f"with `{inp.scope.describe()}`): neither selected nor counted as new; "
                     "--all-tests widens the scope")
    selection = _rank(inp, facts, all_reasons, notes)
    return replace(selection, outside=tuple(outside), scope=inp.scope.to_json())


def _rank(inp: SelectionInput, facts: dict[str, _Fact], all_reasons: list[str],
          notes: list[str]) -> Selection:
    history, settings = inp.history, inp.settings
    known = [f.duration for f in facts.values() if f.duration is not None]
    known += list(history.durations.values())
    fallback = risk_model.typical_seconds(known)
    changed_units = max(len(inp.changes.blocks) + len(inp.changes.files), 1)
    changed_paths = set(inp.changes.paths)
    # Most tests have no history and no share of the change: their risk is one number.
    plain: dict[tuple[bool, int], float] = {}
    scored = {}
    for test_id, fact in facts.items():
        seconds = risk_model.expected_seconds(test_id, history.durations, fact.duration,
                                              fallback)
        outcomes = history.outcomes.get(test_id, ())
        cofail = {p: r for p, r in history.cofailure.get(test_id, {}).items()
                  if p in changed_paths}
        key = (fact.new, fact.units)
        if outcomes or cofail or key not in plain:
            value = risk_model.risk(
                risk_model.RiskFacts(test_id, fact.new, fact.units, seconds), outcomes,
                cofail, changed_units, settings.failure_half_life)
            if not outcomes and not cofail:
                plain[key] = value
        else:
            value = plain[key]
        scored[test_id] = (value, seconds)
    ranked = risk_model.order([(t, *scored[t]) for t, f in facts.items() if f.selected])
    rank = {test_id: i + 1 for i, test_id in enumerate(ranked)}
    decisions = []
    for test_id, fact in sorted(facts.items()):
        value, seconds = scored[test_id]
        decisions.append(Decision(
            test_id=test_id, selected=fact.selected, reasons=tuple(fact.reasons), risk=value,
            expected_seconds=seconds, rank=rank.get(test_id),
            dimension=fact.dimension or settings.default_dimension,
            new=fact.new, prunable=fact.prunable, prune_conditions=fact.conditions))
    snap = inp.snapshot
    return Selection(base=snap.commit if snap else None, head=inp.head,
                     decisions=tuple(decisions),
                     select_all_reason="; ".join(all_reasons) if all_reasons else None,
                     changed_files=tuple(inp.changes.paths), notes=tuple(notes))
