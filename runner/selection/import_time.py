"""Import-time work whose result may have changed, and what it reaches.

A function that ran while a test file was imported (`Snapshot.import_time`) has a changed
result when its block changed or when it reads a changed module-level value. Its result went
to the module-level statement that called it (recorded as an `ImportCaller`): when that
statement is a plain assignment or import, the change acts as a change of the names the
statement binds (`DEFAULT = Foo()`: DEFAULT), propagated like any changed module value; the
tests that read them, or executed the function themselves, are the ones affected. Otherwise
(a call from `register(x)`, a decorator, a class body; no statement recorded; a function in
that call that writes state outliving it) the wide rule stays: every test whose test file
imports the function's module. A function run at session start (conftest, plugins) whose
result may have changed selects everything.

Names bound this way may be read by another import-time function (`TABLE = build()` where
`build` reads DEFAULT): that one's result may have changed too, so this runs to a fixpoint.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from fastci.runner.analysis.blocks import FileBlocks
from fastci.runner.analysis.changes import ChangeSet, with_names
from fastci.runner.analysis.statements import writes_in
from fastci.runner.evidence import SESSION, ImportCaller, import_origins

RESOLVED_KINDS = ("assign", "import")  # statements whose whole effect is the names they bind


@dataclass(frozen=True)
class Wide:
    """An import-time function whose changed result could not be tied to names."""

    path: str
    qualname: str
    test_files: frozenset[str]  # whose collection ran it
    why: str  # "changed", "reads a changed value (EPS)"
    detail: str = ""  # why it could not be narrowed, where narrowing was possible at all


@dataclass(frozen=True)
class ImportEffects:
    changes: ChangeSet  # with the names attributed statements bind, propagated
    wide: tuple[Wide, ...] = ()
    everything: tuple[str, ...] = ()  # reasons to select every test
    bound: Mapping[str, str] = field(default_factory=dict)
    """name -> how an import-time call changed it, for reasons."""


def import_effects(changes: ChangeSet, import_time: Mapping[str, Mapping[str, Sequence[str]]],
                   inventories: Mapping[str, FileBlocks], exact: bool,
                   source: Callable[[str], bytes | None] | None = None) -> ImportEffects:
    """What changed import-time work reaches. `exact`: attribute to calling statements (else
    every such function keeps the wide rule); `source`: a head file's bytes, to check that
    the functions an attributed statement ran write nothing that outlives the call."""
    entries = {(p, q): list(o) for p, qs in import_time.items() for q, o in qs.items()}
    if not entries or (changes.empty and not changes.names):
        return ImportEffects(changes)
    checker = _Writes(changes, inventories, source)
    done: set[tuple[str, str]] = set()
    wide: list[Wide] = []
    everything: list[str] = []
    bound: dict[str, str] = {}
    current = changes
    while True:
        fresh = []
        for key, origins in entries.items():
            if key not in done:
                why = _why(key, current, inventories)
                if why is not None:
                    done.add(key)
                    fresh.append((key, origins, why))
        if not fresh:
            break
        names: dict[str, set[str]] = {}
        for (path, qualname), origins, why in sorted(fresh):
            files, callers = import_origins(origins)
            tests = frozenset(f for f in files if f != SESSION)
            if SESSION in files:
                if why != "changed":  # a changed block at session start: `select` says so
                    everything.append(f"{path}::{qualname} ran at session start (conftest or "
                                      f"plugin import) and {why}")
                continue
            detail = _unresolved(callers, exact) or checker.writes(
                (path, qualname), callers, entries)
            if detail is not None:
                wide.append(Wide(path, qualname, tests, why, detail if callers else ""))
                continue
            for caller in callers:
                names.setdefault(caller.path, set()).update(caller.defines)
                for name in caller.defines:
                    bound.setdefault(name, f"bound at import time by {caller.path}:"
                                           f"{caller.line}, whose call ran {path}::{qualname}, "
                                           f"which {why}")
        current = with_names(current, names, {}, inventories)
    return ImportEffects(current, tuple(wide), tuple(everything), bound)


def _why(key: tuple[str, str], changes: ChangeSet, inventories: Mapping[str, FileBlocks]
         ) -> str | None:
    """Why an import-time function's result may have changed, or None."""
    if key in changes.blocks:
        return "changed"
    path, qualname = key
    fb = inventories.get(path)
    block = fb.by_qualname().get(qualname) if fb is not None else None
    if block is None:
        return None
    hit = (changes.names | changes.local_names.get(path, frozenset())) & set(block.reads)
    if hit:
        return f"reads a changed value ({', '.join(sorted(hit)[:3])})"
    return None


def _unresolved(callers: list[ImportCaller], exact: bool) -> str | None:
    """Why the calling statements cannot be resolved to names, or None when they can."""
    if not exact:
        return "exact import-time attribution is off"
    if not callers:
        return "the evidence does not say which statement called it"
    for caller in callers:
        if caller.kind == "class":
            return "it was called from a class body"
        if caller.kind == "?":
            return ("no module-level statement of the repository called it (a hook, a "
                    "thread, a generator resumed later)")
        if caller.kind not in RESOLVED_KINDS or not caller.defines:
            what = "a def or class statement (a decorator, a default)" \
                if caller.kind == "def" else "a statement that is not a plain definition"
            return f"{caller.path}:{caller.line}, which called it, is {what}"
    return None


class _Writes:
    """Whether the functions an attributed statement ran wrote state that outlives the
    call: then the statement's names are not its whole effect."""

    def __init__(self, changes: ChangeSet, inventories: Mapping[str, FileBlocks],
                 source: Callable[[str], bytes | None] | None) -> None:
        self.changes = changes
        self.inventories = inventories
        self.source = source
        self._sources: dict[str, bytes | None] = {}
        self._seen: dict[tuple[str, str], str | None] = {}

    def writes(self, key: tuple[str, str], callers: list[ImportCaller],
               entries: Mapping[tuple[str, str], list[str]]) -> str | None:
        texts = {c.encode() for c in callers}
        ran = [k for k, origins in entries.items() if texts.intersection(origins)]
        for other in sorted({key, *ran, *self._new_callees(key)}):
            found = self._one(other)
            if found is not None:
                return found
        return None

    def _new_callees(self, key: tuple[str, str]) -> list[tuple[str, str]]:
        """Functions added by the change that the changed function's new version calls."""
        path, qualname = key
        fb = self.inventories.get(path)
        block = fb.by_qualname().get(qualname) if fb is not None else None
        if block is None:
            return []
        calls = set(block.calls)
        return [k for k, status in self.changes.blocks.items()
                if status == "added" and k[1].rsplit(".", 1)[-1] in calls]

    def _one(self, key: tuple[str, str]) -> str | None:
        if key not in self._seen:
            self._seen[key] = self._analyse(key)
        return self._seen[key]

    def _analyse(self, key: tuple[str, str]) -> str | None:
        path, qualname = key
        known = self.changes.functions.get(key)
        if known is not None:
            return (f"{path}::{qualname} writes state that outlives the call ({known.writes})"
                    if known.writes else None)
        if key in self.changes.blocks and self.changes.blocks[key] != "added":
            return (f"{path}::{qualname} changed and its old version could not be checked "
                    "for writes")
        if self.source is None:
            return f"{path}::{qualname} could not be checked for writes"
        if path not in self._sources:
            self._sources[path] = self.source(path)
        text = self._sources[path]
        found = writes_in(text, qualname) if text is not None else None
        if found is None:
            return f"{path}::{qualname} could not be checked for writes"
        return f"{path}::{qualname} writes state that outlives the call ({found})" \
            if found else None


__all__ = ["ImportEffects", "Wide", "import_effects", "RESOLVED_KINDS"]
