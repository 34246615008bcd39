"""Retention: which snapshots `fastci gc` keeps, and what their evidence reaches.

Snapshots record their commit, environment and time (`created_at`), not a branch, so the
branches come from git: `branch_histories` lists every branch of a repository (local
`refs/heads/*` and remote-tracking `refs/remotes/*`) with its commits, tip first.

The rule (`Retention.kept`), for `keep_days` N:

  1. a snapshot saved in the last N days is kept, whatever its commit (a pull request's
     head, a developer's local commit, a branch);
  2. for each branch and each environment, the snapshot of the commit nearest the branch's
     tip (the first in `git rev-list <tip>` order that has one) is kept however old: it is
     the evidence selection starts from for the next change on that branch, so a quiet
     branch never loses its last evidence;
  3. every other snapshot goes: older than N days and either not on any branch (a closed
     pull request's head, a rebased-away commit, a commit git no longer knows) or on one
     with a newer snapshot nearer its tip in that environment.

What a kept snapshot reaches is kept with it (`Reach`): its tree, its tests' evidence,
line maps and module calls, the captures those module calls name, the cached replays of those
captures (keyed "capture:tree key:mode", `prune/decide.py`), and the inventories and cached
test names of the blobs in its tree. Everything else of those kinds is unreachable and goes.
Evidence is a cache: what gc deletes costs time (a test is selected, a file parsed again),
never safety; what it must never do is delete a part of a snapshot it keeps.

`Retention` and `Reach` are pure; the backends' `gc` applies them inside their own
transaction, and `branch_histories` is the git edge, run before the store is touched.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from fastci.runner.errors import UsageError
from fastci.runner.evidence import unpack
from fastci.runner.git import END, run_git

DAY = 86400.0
KINDS = ("snapshots", "trees", "evidence", "lines", "modules", "captures", "replays",
         "inventories", "test_names")

__all__ = ["DAY", "KINDS", "GcReport", "KindCount", "Reach", "Retention", "SnapshotRef",
           "branch_histories", "check_days", "captures_in"]


@dataclass(frozen=True)
class SnapshotRef:
    """One stored snapshot, as gc sees it."""

    commit: str
    env: str
    created_at: float


def check_days(days: object) -> float:
    """A retention in days, or a UsageError that says what is wrong with it."""
    try:
        value = float(days)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise UsageError(f"the retention must be a number of days, not {days!r}") from None
    if not math.isfinite(value) or value < 0:
        raise UsageError(f"the retention must be zero or more days, not {days!r}")
    return value


@dataclass(frozen=True, kw_only=True)
class Retention:
    """Which snapshots to keep (the rule is in the module's docstring)."""

    keep_days: float
    now: float
    branches: Mapping[str, Sequence[str]] = field(default_factory=dict)
    """Branch name -> its commits, tip first (`branch_histories`)."""

    def __post_init__(self) -> None:
        check_days(self.keep_days)

    def kept(self, snapshots: Iterable[SnapshotRef]) -> set[tuple[str, str]]:
        """(commit, env) of each snapshot to keep."""
        snapshots = list(snapshots)
        cutoff = self.now - self.keep_days * DAY
        keep = {(s.commit, s.env) for s in snapshots if s.created_at >= cutoff}
        envs_of: dict[str, set[str]] = {}
        for s in snapshots:
            envs_of.setdefault(s.commit, set()).add(s.env)
        all_envs = {s.env for s in snapshots}
        for commits in self.branches.values():
            found: set[str] = set()
            for commit in commits:
                for env in envs_of.get(commit, ()):
                    if env not in found:
                        found.add(env)
                        keep.add((commit, env))
                if found == all_envs:
                    break
        return keep


@dataclass
class Reach:
    """What the kept snapshots reach; every backend fills it the same way."""

    trees: set[str] = field(default_factory=set)
    evidence: set[str] = field(default_factory=set)
    lines: set[str] = field(default_factory=set)
    modules: set[str] = field(default_factory=set)
    captures: set[str] = field(default_factory=set)
    blobs: set[str] = field(default_factory=set)  # git blob shas of the kept trees

    def add_tree(self, data: bytes) -> None:
        self.blobs.update(unpack(data).values())

    def add_modules(self, payload: bytes) -> None:
        self.captures |= captures_in(payload)

    def keeps(self, kind: str, key: str) -> bool:
        """Whether an item of `kind` (one of KINDS but snapshots) stays."""
        if kind == "replays":  # "capture digest:tree key:mode"
            return key.split(":", 1)[0] in self.captures
        if kind == "inventories":
            return key in self.blobs
        if kind == "test_names":  # "blob sha:rule version"
            return key.split(":", 1)[0] in self.blobs
        return key in getattr(self, kind)


def captures_in(payload: bytes) -> set[str]:
    """The capture digests a test's stored module calls name (`TestRecord.modules`)."""
    modules = unpack(payload) or {}
    return {c["digest"] for c in modules.get("captures", ())
            if isinstance(c, dict) and c.get("digest")}


@dataclass
class KindCount:
    kept: int = 0
    deleted: int = 0
    bytes: int = 0  # of the deleted ones (to be deleted, in a dry run)


@dataclass
class GcReport:
    """What gc kept and deleted, per kind (KINDS), and whether it was a dry run."""

    dry_run: bool = False
    kinds: dict[str, KindCount] = field(default_factory=lambda: {k: KindCount() for k in KINDS})

    def count(self, kind: str, kept: bool, size: int = 0) -> None:
        entry = self.kinds[kind]
        if kept:
            entry.kept += 1
        else:
            entry.deleted += 1
            entry.bytes += size

    @property
    def deleted(self) -> int:
        return sum(k.deleted for k in self.kinds.values())

    @property
    def bytes(self) -> int:
        return sum(k.bytes for k in self.kinds.values())

    def to_json(self) -> dict:
        return {"dry_run": self.dry_run,
                "kinds": {name: {"kept": k.kept, "deleted": k.deleted, "bytes": k.bytes}
                          for name, k in self.kinds.items()}}


def branch_histories(git_dir: str | Path, label: str = "") -> dict[str, list[str]]:
    """Every branch of the repository at `git_dir` (a work tree or a bare mirror): its
    name (after `label`, to tell repositories apart) -> its commits, tip first."""
    out = run_git(["for-each-ref", "--format=%(objectname) %(symref) %(refname)",
                   "refs/heads", "refs/remotes"], git_dir).decode(errors="surrogateescape")
    tips: dict[str, str] = {}
    for line in out.splitlines():
        parts = line.split(" ", 2)
        if len(parts) != 3 or parts[1]:
            continue  # a symbolic ref (origin/HEAD) names a branch listed anyway
        tips[label + parts[2]] = parts[0]
    histories: dict[str, list[str]] = {}
    walked: dict[str, list[str]] = {}
    for name, tip in tips.items():
        if tip not in walked:
            walked[tip] = run_git(["rev-list", END, tip], git_dir).decode().split()
        histories[name] = walked[tip]
    return histories
