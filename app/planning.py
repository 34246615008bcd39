"""The step every pull-request job shares: settings from the trusted base, the plan (or,
when the evidence store cannot be read, every test and why), what runs in each mode, and
what the check runs say about the change (annotations, coverage delta)."""

from __future__ import annotations

import logging
import tempfile
from dataclasses import replace
from pathlib import Path

from fastci.runner import config as runner_config
from fastci.runner.engine import Engine
from fastci.runner.execution.coverage_delta import changed_lines, executed, report, statement_lines
from fastci.runner.git import WORKTREE
from fastci.runner.selection.report import Decision
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
    with tempfile.TemporaryDirectory(prefix="fastci-nostore-") as tmp:
        planned = engine.plan(base=base_sha, head=WORKTREE,
                              store=SqliteEvidenceStore(Path(tmp) / "empty.db"))
    reason = f"the evidence store could not be read ({problem}): every test runs"
    planned.selection = replace(planned.selection, select_all_reason=reason)
    return planned, problem


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
    if planned.snapshot is not None:
        for test in planned.snapshot.tests.values():
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
