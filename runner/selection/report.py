"""The contract: what a selection decided, and what a run found.

Everything downstream (the CLI's tables and JSON, the GitHub check runs, the demo's HTML)
reads these dataclasses. The JSON form is versioned (`SELECTION_SCHEMA`); fields are only
ever added within a version.

JSON of `fastci select --format json` (schema "fastci.selection/1"):

    {"schema": "fastci.selection/1",
     "base": "<sha of the evidence used, or null>", "head": "<sha or WORKTREE>",
     "mode": "trace-diff" | "all",
     "select_all_reason": null | "<why every test was selected>",
     "changed_files": ["path", ...],
     "tests": [{"id": "<pytest node id or prefix>", "decision": "selected" | "skipped",
                "risk": 0.0-1.0, "rank": 1.. | null, "reasons": ["..."],
                "expected_seconds": 0.12, "dimension": "correctness", "new": false,
                "pruned": {...}   # only when equivalent-context pruning skipped it:
                                  # mode, replayed module calls with fingerprints before
                                  # and after, replay_seconds, test_seconds
                "not_pruned": "..."  # only when it was a pruning candidate that stayed
                                     # selected: why the replays could not clear it
               }, ...],
     "summary": {"total": N, "selected": N, "skipped": N, "pruned": N,
                 "expected_seconds_selected": S, "expected_seconds_total": S,
                 "expected_seconds_saved": S},
     "scope": {} | {"paths": [...], "keyword": "...", ...},  # what the evidence was
                                  # recorded with ({}: the whole repository)
     "outside_recorded_suite": ["<node-id prefix>", ...]}  # found at the head, outside
                                  # that scope: neither selected nor counted as new

Selected tests come first, in run order (rank 1 runs first); skipped tests follow.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

SELECTION_SCHEMA = "fastci.selection/1"


@dataclass(frozen=True)
class Decision:
    test_id: str
    selected: bool
    reasons: tuple[str, ...]
    risk: float = 0.0
    expected_seconds: float = 0.0
    rank: int | None = None
    dimension: str = "correctness"
    new: bool = False
    prunable: tuple[tuple[str, str], ...] = field(default=(), compare=False, repr=False)
    """The blocks it was selected for, when those are its only reasons (else empty)."""
    prune_conditions: tuple[tuple[str, str, tuple[str, ...]], ...] = field(
        default=(), compare=False, repr=False)
    """Classes it reads that only gained methods: (path, class, methods) to check."""
    pruned: dict | None = None
    """Skipped by equivalent-context pruning: the replays that justify it (`prune.py`)."""
    not_pruned: str | None = None
    """A pruning candidate that stays selected: why pruning could not clear it."""

    def to_json(self) -> dict:
        out: dict[str, Any] = {
            "id": self.test_id, "decision": "selected" if self.selected else "skipped",
            "risk": round(self.risk, 4), "rank": self.rank, "reasons": list(self.reasons),
            "expected_seconds": round(self.expected_seconds, 4),
            "dimension": self.dimension, "new": self.new}
        if self.pruned is not None:
            out["pruned"] = self.pruned
        if self.not_pruned is not None:
            out["not_pruned"] = self.not_pruned
        return out


@dataclass(frozen=True)
class Selection:
    base: str | None
    head: str
    decisions: tuple[Decision, ...]
    select_all_reason: str | None = None
    changed_files: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    outside: tuple[str, ...] = ()
    """Tests found at the head that the recorded suite's pytest arguments would not collect:
    not decided (neither selected, skipped nor new), only listed."""
    scope: dict = field(default_factory=dict)  # the recorded suite's scope; {}: everything

    @property
    def mode(self) -> str:
        return "all" if self.select_all_reason else "trace-diff"

    @property
    def selected(self) -> list[Decision]:
        return sorted((d for d in self.decisions if d.selected), key=lambda d: d.rank or 0)

    @property
    def skipped(self) -> list[Decision]:
        return [d for d in self.decisions if not d.selected]

    def decision(self, test_id: str) -> Decision | None:
        for d in self.decisions:
            if d.test_id == test_id:
                return d
        return None

    def summary(self) -> dict:
        total = sum(d.expected_seconds for d in self.decisions)
        chosen = sum(d.expected_seconds for d in self.decisions if d.selected)
        return {"total": len(self.decisions), "selected": len(self.selected),
                "skipped": len(self.skipped),
                "pruned": sum(1 for d in self.decisions if d.pruned is not None),
                "expected_seconds_selected": round(chosen, 3),
                "expected_seconds_total": round(total, 3),
                "expected_seconds_saved": round(total - chosen, 3)}

    def to_json(self) -> dict:
        return {"schema": SELECTION_SCHEMA, "base": self.base, "head": self.head,
                "mode": self.mode, "select_all_reason": self.select_all_reason,
                "changed_files": list(self.changed_files), "notes": list(self.notes),
                "tests": [d.to_json() for d in self.selected + self.skipped],
                "summary": self.summary(), "scope": self.scope,
                "outside_recorded_suite": list(self.outside)}


@dataclass(frozen=True)
class TestResult:

    __test__ = False  # not a pytest test class
    test_id: str
    outcome: str
    duration: float
    dimension: str = "correctness"
    failure: dict | None = None  # path, line, message of the failing assertion
    flaky: bool = False
    blocking: bool = True  # its dimension decides the verdict (else it ran in the background)


@dataclass(frozen=True)
class RunReport:
    """What `fastci run` did: the selection, then what running it found."""

    selection: Selection
    results: tuple[TestResult, ...] = ()
    wall_seconds: float = 0.0
    time_to_first_failure: float | None = None
    extra: dict = field(default_factory=dict)

    @property
    def failures(self) -> list[TestResult]:
        return [r for r in self.results if r.outcome in ("failed", "error") and not r.flaky]

    @property
    def blocking_failures(self) -> list[TestResult]:
        return [r for r in self.failures if r.blocking]

    @property
    def verdict(self) -> str:
        """passed | failed, decided by the blocking dimensions alone."""
        return "failed" if self.blocking_failures else "passed"

    def summary(self) -> dict:
        s = self.selection.summary()
        ran = sum(r.duration for r in self.results)
        return {**s, "ran": len(self.results), "failed": len(self.failures),
                "flaky": sum(1 for r in self.results if r.flaky),
                "blocking_failed": len(self.blocking_failures), "verdict": self.verdict,
                "test_seconds_run": round(ran, 3),
                "actual_seconds_saved": round(max(s["expected_seconds_total"] - ran, 0.0), 3),
                "wall_seconds": round(self.wall_seconds, 3),
                "time_to_first_failure": None if self.time_to_first_failure is None
                else round(self.time_to_first_failure, 3)}

    def to_json(self) -> dict:
        return {"schema": "fastci.run/1", "selection": self.selection.to_json(),
                "results": [asdict(r) for r in self.results], "summary": self.summary(),
                **self.extra}
