"""A small repository held as inline sources, and the selection input the engine would build
for a change to it: trees, block inventories, change set, import graph and static tests are
all computed by the real analysis functions, with no git and no store in between."""

from __future__ import annotations

import hashlib
import textwrap
from typing import Mapping

from fastci.runner.analysis.blocks import FileBlocks, module_name_for, parse_blocks
from fastci.runner.analysis.changes import ChangeSet, analyse, diff_trees
from fastci.runner.analysis.discover import test_functions
from fastci.runner.analysis.environment import Environment
from fastci.runner.analysis.inventory import ImportGraph, kernel_hashes
from fastci.runner.config import Settings
from fastci.runner.evidence import Snapshot, TestRecord
from fastci.runner.evidence_index import IndexedTests
from fastci.runner.selection.crosscheck import checked
from fastci.runner.selection.report import Selection
from fastci.runner.selection.rules import History, SelectionInput

ENV = Environment(python="3.11.7", torch="2.3.0", triton="3.0.0", cuda=None, gpu=None,
                  platform="Linux-x86_64", lock_hash="lock-1")


def sha(text: str) -> str:
    """The git blob id of `text` (what a tree maps each path to)."""
    data = text.encode()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def tree(sources: Mapping[str, str]) -> dict[str, str]:
    return {path: sha(text) for path, text in sources.items()}


def inventories(sources: Mapping[str, str]) -> dict[str, FileBlocks]:
    return {path: parse_blocks(text, *module_name_for(path))
            for path, text in sources.items() if path.endswith(".py")}


def dedented(sources: Mapping[str, str]) -> dict[str, str]:
    return {path: textwrap.dedent(text).lstrip("\n") for path, text in sources.items()}


def changes_between(old: Mapping[str, str], new: Mapping[str, str],
                    renames: Mapping[str, str] | None = None) -> ChangeSet:
    """The change set from `old` to `new`, computed as the engine computes it."""
    files = diff_trees(tree(old), tree(new), renames or {})
    changed = {c.path for c in files} | {c.old_path for c in files if c.old_path}
    old_inv = inventories({p: t for p, t in old.items() if p in changed})
    new_inv = inventories({p: t for p, t in new.items() if p in changed})
    sources = {c.path: (old[c.path], new[c.path]) for c in files
               if c.status == "modified" and c.path.endswith(".py")}
    return analyse(files, old_inv, new_inv, inventories(new), sources=sources)


def edit(sources: Mapping[str, str], path: str, old: str, new: str) -> dict[str, str]:
    """A copy of `sources` with one replacement in `path` (which must contain `old`)."""
    assert old in sources[path], f"{old!r} not in {path}"
    return {**sources, path: sources[path].replace(old, new, 1)}


def selection_input(old: Mapping[str, str], new: Mapping[str, str],
                    tests: Mapping[str, TestRecord] | None, *, environment: Environment = ENV,
                    evidence_environment: Environment = ENV,
                    import_time: Mapping | None = None,
                    session_files: Mapping[str, str] | None = None,
                    history: History | None = None, settings: Settings | None = None,
                    renames: Mapping[str, str] | None = None,
                    no_evidence_reason: str | None = None) -> SelectionInput:
    """`tests` is the evidence recorded on `old` (None: no evidence at all); `new` is the head."""
    head_inv = inventories(new)
    removed = {p: fb for p, fb in inventories(old).items() if p not in new}
    snapshot = None
    kernels: dict[str, str] = {}
    if tests is not None:
        snapshot = Snapshot(commit="base", environment=evidence_environment, tree=tree(old),
                            tests=IndexedTests.of(dict(tests)), import_time=import_time or {},
                            session_files=session_files or {})
        wanted = {k for t in tests.values() for k in t.kernels}
        kernels = kernel_hashes(head_inv, wanted) if wanted else {}
    return SelectionInput(
        head="head", head_tree=tree(new), environment=environment, snapshot=snapshot,
        changes=changes_between(old, new, renames) if tests is not None else ChangeSet(),
        head_inventories=head_inv, import_graph=ImportGraph({**head_inv, **removed}),
        static_tests=test_functions(head_inv), head_kernels=kernels,
        settings=settings or Settings(), history=history or History(),
        no_evidence_reason=no_evidence_reason)


def run_select(old, new, tests, **kwargs) -> Selection:
    """The selection, from the snapshot's index, checked against the full evaluation."""
    return checked(selection_input(old, new, tests, **kwargs))
