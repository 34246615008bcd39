"""Turning a recording into a stored snapshot, carrying skipped tests' evidence forward.

After `fastci run`, the head commit has evidence for every test without a full run: tests
that ran bring fresh evidence; a test that was skipped had nothing changed in its evidence,
so its old evidence still holds, with its executed lines moved to where they now are.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, AbstractSet, Mapping

from fastci.runner.evidence import Snapshot, TestRecord
from fastci.runner.git import GitError, Repo
from fastci.runner.record.recorder import Recording

if TYPE_CHECKING:
    from fastci.runner.store import EvidenceStore


def head_commit(repo: Repo) -> str:
    commit = repo.head()
    if commit is None:
        raise GitError("the repository has no commit yet: commit once so evidence has a key")
    return commit


def store_recording(store: EvidenceStore, repo: Repo, recording: Recording) -> str:
    """Store a full recording as the snapshot of HEAD; returns a one-line summary."""
    commit = head_commit(repo)
    store.save_snapshot(recording.snapshot(commit, source="record"))
    store.add_history(commit, recording.environment.digest, recording.tests.values())
    dirty = "" if recording.tree == repo.tree(commit) else " (with uncommitted changes)"
    return (f"recorded evidence for {len(recording.tests)} tests at {commit[:12]}{dirty} "
            f"[{recording.environment.describe()}]")


def remap_lines(lines: tuple[int, ...], hunks: list[tuple[int, int, int, int]]
                ) -> tuple[int, ...]:
    """Move line numbers across a diff; lines inside changed hunks are dropped."""
    out = []
    for line in lines:
        shift, dropped = 0, False
        for old_start, old_len, new_start, new_len in hunks:
            old_end = old_start + old_len - 1 if old_len else old_start
            if old_len and old_start <= line <= old_end:
                dropped = True
                break
            if (old_len and line > old_end) or (not old_len and line > old_start):
                shift += new_len - old_len
        if not dropped:
            out.append(line + shift)
    return tuple(out)


def carry_forward(repo: Repo, base: Snapshot, recording: Recording, collected: list[str],
                  renames: dict[str, str]) -> dict[str, TestRecord]:
    """Evidence at the head for every test: fresh where it ran, carried where it did not.

    A test is carried while its file exists and, if that file was collected, while the test
    was among the items collected (a filtered run must not drop other files' evidence)."""
    tests = dict(recording.tests)
    hunks_cache: dict[str, list | None] = {}

    def hunks(path: str):
        if path not in hunks_cache:
            old_blob = base.tree.get(path)
            new_path = renames.get(path, path)
            new_blob = recording.tree.get(new_path)
            if old_blob == new_blob:
                hunks_cache[path] = []
            elif old_blob is None or new_blob is None:
                hunks_cache[path] = None
            else:
                try:
                    hunks_cache[path] = repo.hunks(old_blob, new_blob)
                except GitError:
                    hunks_cache[path] = None  # a blob from a dirty tree git never stored
        return hunks_cache[path]

    collected_set = set(collected)
    collected_files = {c.split("::", 1)[0] for c in collected}
    for test_id in base.tests:
        path = test_id.split("::", 1)[0]
        if test_id in tests or path not in recording.tree:
            continue
        if path in collected_files and test_id not in collected_set:
            continue  # its file was collected without it: the test is gone
        old = base.tests[test_id]
        lines = None
        if old.lines is not None:
            lines = {}
            for path, ls in old.lines.items():
                h = hunks(path)
                if h is not None:
                    lines[renames.get(path, path)] = remap_lines(ls, h)
        tests[test_id] = replace(old, lines=lines,
                                 carried_from=old.carried_from or base.commit)
    return tests


def add_replayed(test: TestRecord, lines: dict[str, tuple[int, ...]], inventories,
                 reads: tuple[str, ...] | None = (), tree: Mapping[str, str] | None = None
                 ) -> TestRecord:
    """A pruned test's carried evidence, plus what its replays ran under the new code.

    The test did not run, so its old evidence is all we have; an equivalent refactor may
    have moved its work into new blocks (a helper split out of a forward), and a later
    change there must select it. Likewise the data files the replays read (`reads`, with
    their blobs in the head's `tree`): new code may read a file natively where the old
    computed the same value, and a later change to that file must select it. `reads` None:
    the replays could not see native readers, so the evidence no longer vouches that its
    files are every file the test reads (`file_events`)."""
    blocks = {p: set(q) for p, q in test.blocks.items()}
    merged = {p: set(ls) for p, ls in (test.lines or {}).items()}
    for path, ls in lines.items():
        merged.setdefault(path, set()).update(ls)
        fb = inventories.get(path)
        if fb is not None:
            blocks.setdefault(path, set()).update(fb.owner_of(n) for n in ls)
    files = dict(test.files)
    for path in reads or ():
        blob = (tree or {}).get(path)
        if blob is not None:
            files[path] = blob
    return replace(test, blocks={p: tuple(sorted(q)) for p, q in blocks.items()},
                   lines={p: tuple(sorted(ls)) for p, ls in merged.items()}, files=files,
                   file_events=test.file_events and reads is not None)


def store_run(store: EvidenceStore, repo: Repo, base: Snapshot, recording: Recording,
              collected: list[str], renames: dict[str, str], changed_paths: list[str],
              flaky: AbstractSet[str] = frozenset(), replayed_lines=None, head_inventories=None,
              replayed_reads: Mapping[str, tuple[str, ...] | None] | None = None
              ) -> Snapshot:
    """Store the head's snapshot after a selective run, and the run's history."""
    commit = head_commit(repo)
    tests = carry_forward(repo, base, recording, collected, renames)
    for test_id, lines in (replayed_lines or {}).items():
        if test_id in tests and test_id not in recording.tests:
            paths = sorted(lines)
            inventories = {p: head_inventories.get(p) for p in paths} \
                if head_inventories is not None else {}
            # Pruned before replays noted their reads (a run planned by an older App): unseen.
            reads = (replayed_reads or {}).get(test_id)
            tests[test_id] = add_replayed(tests[test_id], lines, inventories, reads,
                                          recording.tree)
    snap = replace(recording.snapshot(commit, source="run"), tests=tests)
    store.save_snapshot(snap)
    store.add_history(commit, recording.environment.digest, recording.tests.values(),
                      changed_paths=changed_paths, flaky=flaky)
    return snap

