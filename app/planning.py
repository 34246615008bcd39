"""The step every pull-request job shares: settings from the trusted base, the plan (or,
when the evidence store cannot be read, every test and why), what runs in each mode, and
what the check runs say about the change (annotations, coverage delta); and what of a plan a
run keeps in Redis between its jobs (the selection, the evidence it was planned from,
pruning's replayed lines), as JSON, and the plan made again from it when the run stores
its evidence."""

from __future__ import annotations

import logging
import tempfile
from dataclasses import replace
from pathlib import Path

from fastci.runner import config as runner_config
from fastci.runner.engine import Engine
from fastci.runner.execution.coverage_delta import (
    CoverageReport,
    changed_lines,
    executed,
    report,
    statement_lines,
)
from fastci.runner.git import WORKTREE
from fastci.runner.prune.decide import PruneOutcome
from fastci.runner.selection.report import Decision, Selection
from fastci.runner.store import EvidenceStore, SqliteEvidenceStore, StoreError

from . import checks, workspace
from .events import RERUN_FAILED, RUN_ALL

log = logging.getLogger("fastci.app")


def base_settings(mirror: Path, base_sha: str) -> runner_config.Settings:
    """[tool.fastci] as the base commit has it: a pull request cannot loosen its own gate."""
    text = workspace.read_at(mirror, base_sha, "pyproject.toml")
    with tempfile.TemporaryDirectory() as tmp:
        if text is not None:
            (Path(tmp) / "pyproject.toml").write_bytes(text)
        return runner_config.load(Path(tmp), environ={})


def plan_or_all(engine: Engine, base_sha: str, prune: bool):
    """The plan, or, when the evidence store cannot be read, every test with the reason."""
    try:
        return engine.plan(base=base_sha, head=WORKTREE, prune=prune), None
    except StoreError as exc:
        problem = str(exc)
    return all_tests(engine, base_sha, problem), problem


def all_tests(engine: Engine, base_sha: str, problem: str):
    """Every test, with the reason the evidence could not be used."""
    with tempfile.TemporaryDirectory(prefix="fastci-nostore-") as tmp:
        planned = engine.plan(base=base_sha, head=WORKTREE,
                              store=SqliteEvidenceStore(Path(tmp) / "empty.db"))
    reason = f"the evidence store could not be read ({problem}): every test runs"
    planned.selection = replace(planned.selection, select_all_reason=reason)
    return planned


def chosen_tests(selection, mode: str, engine: Engine) -> list[Decision]:
    if mode == RUN_ALL:
        return sorted(selection.decisions, key=lambda d: (d.rank is None, d.rank or 0,
                                                          -d.risk))
    if mode == RERUN_FAILED:
        with engine.open_store() as store:
            outcomes = store.outcomes(limit_per_test=1)
        return [d for d in selection.decisions
                if outcomes.get(d.test_id, ["passed"])[0] in ("failed", "error")]
    return selection.selected


def change_notes(planned) -> list[dict]:
    changes = planned.inputs.changes
    spans, per_block = {}, {}
    for path, qualname in changes.blocks:
        fb = planned.inputs.head_inventories.get(path)
        block = fb.by_qualname().get(qualname) if fb is not None else None
        if block is not None and block.kind != "module":
            spans[(path, qualname)] = (block.start, block.end)
    snap = planned.snapshot
    if snap is not None:
        # Only the tests that executed a changed file (the index says which) are decoded.
        ids = snap.index.executing({p for p, _ in spans}) if snap.index else list(snap.tests)
        for test in (snap.tests[t] for t in ids if t in snap.tests):
            for path, qualnames in test.blocks.items():
                for q in qualnames:
                    if (path, q) in spans:
                        per_block[(path, q)] = per_block.get((path, q), 0) + 1
    return checks.change_annotations(dict(changes.blocks), spans, per_block)


def coverage_report(engine: Engine, store: EvidenceStore, planned):
    """Diff coverage of the change, and coverage against the base, from stored evidence."""
    head_commit = engine.repo.head()
    envs = store.snapshot_envs(head_commit)
    if not envs:
        return None
    head = store.load_snapshot(head_commit, envs[0][0], with_lines=True)
    head_tree = planned.inputs.head_tree
    old_tree = planned.snapshot.tree if planned.snapshot else {}
    changed = {}
    for change in planned.inputs.changes.files:
        path = change.path
        if not path.endswith(".py") or path not in head_tree:
            continue
        old_blob = old_tree.get(change.old_path or path)
        if old_blob is None:
            text = engine.repo.read(WORKTREE, path)
            changed[path] = set(range(1, text.count(b"\n") + 2))
        else:
            changed[path] = changed_lines(engine.repo.hunks(old_blob, head_tree[path]))
    python = [p for p in head_tree if p.endswith(".py")]
    contents = engine.repo.read_many(WORKTREE, python)
    head_statements = {p: statement_lines(c) for p, c in contents.items()}
    base_statements = base_executed = None
    if planned.snapshot is not None:
        base = store.load_snapshot(planned.snapshot.commit, planned.snapshot.env_key,
                                   with_lines=True)
        blobs = {p: b for p, b in old_tree.items() if p.endswith(".py")}
        found = engine.repo.read_blobs(list(blobs.values()))
        base_statements = {p: statement_lines(found[b]) for p, b in blobs.items() if b in found}
        base_executed = executed({t: r.lines for t, r in base.tests.items()})
    return report(changed, head_statements, executed({t: r.lines for t, r in head.tests.items()}),
                  base_statements, base_executed)


# -- what a run keeps of its plan --------------------------------------------------------------
def selection_from_json(data: dict) -> Selection:
    """A selection as `Selection.to_json` wrote it (what a run keeps between its jobs)."""
    decisions = tuple(Decision(
        t["id"], t["decision"] == "selected", tuple(t["reasons"]), t["risk"],
        t["expected_seconds"], t["rank"], t["dimension"], t["new"], pruned=t.get("pruned"),
        not_pruned=t.get("not_pruned"))
        for t in data["tests"])
    return Selection(base=data["base"], head=data["head"], decisions=decisions,
                     select_all_reason=data["select_all_reason"],
                     changed_files=tuple(data["changed_files"]), notes=tuple(data["notes"]),
                     outside=tuple(data["outside_recorded_suite"]), scope=data["scope"])


def evidence_key(planned) -> list[str] | None:
    """Which snapshot a plan selected from: [commit, environment key], or None."""
    snap = planned.snapshot
    return [snap.commit, snap.env_key] if snap is not None else None


def replayed_lines(planned) -> dict:
    """Pruning's lines under the new code, per pruned test, as JSON."""
    lines = planned.pruning.head_lines if planned.pruning is not None else {}
    return {t: {p: list(ls) for p, ls in per.items()} for t, per in lines.items()}


def replayed_reads(planned) -> dict:
    """The data files pruning's replays read under the new code, per pruned test (null:
    unseen), as JSON."""
    reads = planned.pruning.head_reads if planned.pruning is not None else {}
    return {t: None if files is None else list(files) for t, files in reads.items()}


def plan_to_store(engine: Engine, base_sha: str, evidence: list[str] | None,
                  lines: dict, reads: dict | None = None):
    """The plan a run's evidence is stored with, made again when its last shard is in: from
    the same snapshot the selection used (its commit as the base), pruning's replayed lines
    and reads as they were (a test without reads: unseen). None if that snapshot is no
    longer what the store gives (gc removed it, a new recording replaced it): carried
    evidence must come from exactly the snapshot the skipped tests were judged against."""
    planned = engine.plan(base=evidence[0] if evidence else base_sha, head=WORKTREE,
                          prune=False)
    if evidence_key(planned) != evidence:
        return None
    head_lines = {t: {p: tuple(ls) for p, ls in per.items()} for t, per in lines.items()}
    head_reads = {t: None if files is None else tuple(files)
                  for t, files in (reads or {}).items()}
    return replace(planned, pruning=PruneOutcome(planned.selection, head_lines=head_lines,
                                                 head_reads=head_reads))


def coverage_to_json(coverage: CoverageReport | None) -> dict | None:
    if coverage is None:
        return None
    return {"changed_statements": coverage.changed_statements,
            "changed_covered": coverage.changed_covered,
            "uncovered": {p: list(ls) for p, ls in coverage.uncovered.items()},
            "head_ratio": coverage.head_ratio, "base_ratio": coverage.base_ratio}


def coverage_from_json(data: dict | None) -> CoverageReport | None:
    if data is None:
        return None
    return CoverageReport(data["changed_statements"], data["changed_covered"],
                          {p: tuple(ls) for p, ls in data["uncovered"].items()},
                          data["head_ratio"], data["base_ratio"])
