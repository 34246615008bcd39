"""The evidence store's interface: what every backend answers, and the schema they share.

Callers (the engine, the recorder, pruning, carry-forward, the App's jobs) hold an
`EvidenceStore` and never ask which backend it is, so a laptop's SQLite file and a fleet's
Redis are interchangeable; tests/test_store_backends.py runs one contract against both.

Schema history. SCHEMA_VERSION is one number for both backends: it names what is stored
(the tables or key kinds, and the row codec in `codec.py`, inventory format included), not
how. Bump it on any change to either; adding a table (or a Redis key kind) bumps it. A store
of an older version is moved aside, kept, and started empty (evidence is a cache: it must be
re-recorded, `fastci record`); a store of a newer version is a StoreError (exit 4) and is left
untouched, because this FastCI cannot know what the newer one stored.

  1  first version: inventories (by blob sha), trees, evidence, lines, snapshots, tests,
     history, cofailures, changes. Within it, inventory rows gained each block's `header` and
     `inherits` (narrower class changes) without a bump: such files are older than 2 and
     rebuilt now, so nothing reads the old row shape.
  2  captures and replays: module calls recorded for equivalent-context pruning, and the
     cached replays of them. Within it, the audit table (shadow runs, `fastci audit`) was
     created in place on open, without a bump, so a version-2 file may or may not have it.
  3  audit is part of the schema proper, created with the rest; the in-place creation is
     gone. Bumped so that the version alone says which tables a file has (the rule above).
     Redis keys are unchanged, but the version is shared, so a version-2 prefix is moved
     aside like a version-2 file.
  4  Redis: a snapshot's parts are saved in the same transaction as its keys, which also
     counts `<prefix>:writes` (a new key kind), so retention (`fastci gc`) can delete
     unreachable parts while writers run. A FastCI of version 3 saves the parts outside
     that transaction and would race gc into a snapshot without its tree; bumped so that it
     refuses a version-4 store (newer) instead of writing to it. SQLite is unchanged, but
     the version is shared.
  5  snapshots remember their scope: the pytest arguments (test paths, -k, -m, --ignore,
     --deselect) the suite was recorded with, so selection decides within it (a `scope`
     column in SQLite, a `scope` field in a Redis snapshot's hash). A FastCI of version 4
     would drop the field when carrying evidence forward and select the rest of the
     repository as new again; bumped so that it refuses a version-5 store.
  6  module calls (`TestRecord.modules`: captures and the lines that ran in each, about 70%
     of a snapshot's payload bytes) leave the evidence payload for a table (SQLite
     `modules`, a `tests.modules` digest column) and key kind (Redis `<prefix>:mod:<digest>`,
     a tenth field of each test's row) of their own, which only pruning and carry-forward
     load (`with_modules`, `load_modules`): selection decodes only what it reads. gc keeps
     the module calls a kept snapshot's tests name, and the captures those name.
  7  each snapshot stores the index of its tests (`evidence_index.py`: what each test's
     evidence names -> the tests, and what deciding a test "skipped" needs), a
     `snapshots.test_index` column in SQLite and an `index` field of a Redis snapshot's
     hash, so selection decodes only the tests a change reaches; and the test functions
     found in each test file are cached by blob (`test_names`, Redis `<prefix>:tn:<blob>:<rule
     version>`), so discovering a suite's tests reads no inventory. A FastCI of version 6
     would save snapshots without the index (selected by the slow path) and gc would delete
     the cached names; bumped so that it refuses a version-7 store.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Collection, Iterable, Protocol, runtime_checkable

from fastci.runner.errors import StoreError  # re-exported: every backend raises it

if TYPE_CHECKING:
    from fastci.runner.analysis.blocks import FileBlocks
    from fastci.runner.analysis.environment import Environment
    from fastci.runner.evidence import Snapshot, TestRecord
    from fastci.runner.store.retention import GcReport, Retention

SCHEMA_VERSION = 7

__all__ = ["SCHEMA_VERSION", "EvidenceStore", "StoreError", "newer_version_error",
           "older_version_message"]


@runtime_checkable
class EvidenceStore(Protocol):
    """Where evidence lives, keyed by (commit, environment). A context manager: leaving it
    closes the connection. Every method may raise StoreError when the store cannot be used."""

    def close(self) -> None: ...

    def __enter__(self) -> EvidenceStore: ...

    def __exit__(self, *exc: object) -> None: ...

    # -- file inventories, content-addressed by git blob sha ------------------------------
    def save_inventories(self, inventories: dict[str, FileBlocks]) -> None: ...

    def load_inventories(self, blobs: Iterable[str]) -> dict[str, FileBlocks]:
        """The inventories found among `blobs`; a missing one is simply absent."""
        ...

    def save_test_names(self, names: dict[str, list[str]]) -> None:
        """The test functions found in test files, keyed "<blob sha>:<rule version>"
        (`discover.py`); a key already stored is replaced."""
        ...

    def load_test_names(self, keys: Iterable[str]) -> dict[str, list[str]]:
        """The test functions cached under `keys`; a missing one is simply absent."""
        ...

    # -- captured module calls and their cached replays (pruning) ------------------------
    def save_captures(self, files: dict[str, Path]) -> None:
        """Store spilled captures ({digest: file}); a digest already stored is kept."""
        ...

    def load_capture(self, digest: str) -> bytes | None: ...

    def replay_result(self, key: str) -> dict | None: ...

    def save_replay_results(self, results: dict[str, dict]) -> None: ...

    # -- snapshots: the evidence of one (commit, environment) ----------------------------
    def save_snapshot(self, snap: Snapshot) -> None:
        """Store the snapshot, replacing any of the same (commit, environment)."""
        ...

    def snapshot_envs(self, commit: str) -> list[tuple[str, Environment]]:
        """(environment key, environment) of each snapshot of a commit, newest first."""
        ...

    def commits_with_evidence(self, env_digest: str | None = None) -> set[str]: ...

    def load_snapshot(self, commit: str, env_digest: str, *, with_lines: bool = False,
                      with_modules: bool = False) -> Snapshot | None:
        """The snapshot; its tests' `lines` only `with_lines`, their `modules` (captured
        calls, for pruning) only `with_modules`: selection reads neither."""
        ...

    def load_lines(self, commit: str, env_digest: str, test_ids: Iterable[str],
                   paths: Collection[str] | None = None
                   ) -> dict[str, dict[str, tuple[int, ...]]]:
        """The executed lines (`TestRecord.lines`) of some tests of a snapshot, of every file
        or of `paths` only; a test without any is absent. Selection asks for those of the
        tests that ran a function changed inside (the statement rule), in its files."""
        ...

    def load_modules(self, commit: str, env_digest: str, test_ids: Iterable[str]
                     ) -> dict[str, dict]:
        """The captured module calls (`TestRecord.modules`) of some tests of a snapshot;
        a test without any is absent."""
        ...

    # -- retention ---------------------------------------------------------------------------
    def gc(self, retention: Retention, *, dry_run: bool = False) -> GcReport:
        """Delete the snapshots `retention` does not keep, then the trees, evidence, line
        maps, module calls, captures, replays and inventories no kept snapshot reaches (the
        rule is in `retention.py`); with dry_run, only count them. Safe while other processes write:
        a snapshot saved during gc is either seen and kept whole or left untouched, never
        half-deleted (each backend says how)."""
        ...

    # -- audit: what the selection would have missed (shadow runs, full runs) -------------
    def add_audit(self, entry: dict) -> None: ...

    def audits(self, since: float = 0.0) -> list[dict]: ...

    # -- history: outcomes over time, co-failures ------------------------------------------
    def add_history(self, commit: str, env_digest: str, results: Iterable[TestRecord],
                    changed_paths: Iterable[str] = (), flaky: Iterable[str] = ()) -> None: ...

    def outcomes(self, limit_per_test: int = 50) -> dict[str, list[str]]:
        """Recent outcomes per test, newest first, flaky results left out."""
        ...

    def durations(self) -> dict[str, float]:
        """The latest duration of each test."""
        ...

    def cofailure_rates(self, paths: Iterable[str]) -> dict[str, dict[str, float]]:
        """test -> {changed path: failures with that path changed / runs that changed it}."""
        ...

    def flip_history(self, test_ids: Iterable[str]) -> dict[str, list[tuple[str, str]]]:
        """(commit, outcome) pairs per test, newest first."""
        ...


def older_version_message(where: str, found: object, kept_as: str) -> str:
    """What the user reads when a store of an older schema was moved aside (both backends)."""
    return (f"fastci: evidence store {where} has schema version {found}, this FastCI uses "
            f"{SCHEMA_VERSION}; kept it as {kept_as} and started a new one. Its evidence must "
            "be re-recorded (`fastci record`); until then every test is selected.")


def newer_version_error(where: str, found: object) -> StoreError:
    """A store written by a newer FastCI: left untouched, and the user decides."""
    return StoreError(
        f"evidence store {where} has schema version {found}, newer than this FastCI's "
        f"{SCHEMA_VERSION}: upgrade FastCI, or re-record into another store (`fastci record "
        "--store PATH`).")
