"""The imperative shell around selection: git, the store and pytest in, decisions out.

`Engine.plan` gathers the inputs (`select.SelectionInput`) and calls the pure selection;
`Engine.run` runs the selection through pytest in risk order and stores fresh evidence for
the head, carrying the skipped tests' evidence forward.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections import ChainMap
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, AbstractSet, Mapping, cast

from fastci.runner import config
from fastci.runner.analysis import discover, inventory
from fastci.runner.analysis.changes import analyse, diff_trees
from fastci.runner.analysis.environment import current, is_manifest, lock_hash
from fastci.runner.errors import RunError
from fastci.runner.evidence import Snapshot
from fastci.runner.evidence_index import TestIndex
from fastci.runner.execution.carry import store_run
from fastci.runner.execution.flaky import confirm, failed_ids
from fastci.runner.execution.flaky import results as test_results
from fastci.runner.git import END, WORKTREE, GitError, Repo
from fastci.runner.prune.budget import WRAP_UP
from fastci.runner.record.recorder import Recording, blob_sha, recording_from_json
from fastci.runner.selection import crosscheck
from fastci.runner.selection.plan import make_plan
from fastci.runner.selection.report import RunReport, Selection
from fastci.runner.selection.rules import History, SelectionInput, select
from fastci.runner.selection.scope import Scope
from fastci.runner.store import EvidenceStore, StoreError, open_store, resolve_store

if TYPE_CHECKING:
    from fastci.runner.analysis.blocks import FileBlocks
    from fastci.runner.prune.decide import PruneOutcome
    from fastci.runner.prune.replayers import Replayer

DEFAULT_BRANCHES = ("origin/HEAD", "origin/main", "origin/master", "main", "master")


@dataclass
class Planned:
    """A selection with what produced it, for running or explaining."""

    selection: Selection
    snapshot: Snapshot | None
    inputs: SelectionInput
    renames: dict[str, str]
    seconds: float
    pruning: PruneOutcome | None = None  # when pruning ran


class Engine:
    def __init__(self, root: str | Path = ".", store_path: str | Path | None = None,
                 progress=None, settings: config.Settings | None = None,
                 replayer: Replayer | None = None) -> None:
        self.repo = Repo.find(root)
        # Where pruning's replays run: child processes here unless told (the App: a runner).
        self.replayer = replayer
        # Given settings win: the GitHub App reads them from the trusted base commit.
        self.settings = settings or config.load(self.repo.root)
        # --store as given; else [tool.fastci] store (or FASTCI_STORE), the repository's.
        self.store_path = resolve_store(store_path, self.settings.store, self.repo.root)
        self.progress = progress or (lambda _message: None)

    def open_store(self, create: bool = True) -> EvidenceStore:
        return open_store(self.store_path, create=create)

    # -- which evidence ------------------------------------------------------------------------
    def find_evidence(self, store: EvidenceStore, base: str | None, head: str, env_digest: str
                      ) -> tuple[Snapshot | None, str | None]:
        """The snapshot to select from, or None and why there is none.

        Given a base: its evidence, else its nearest ancestor's. Without one: the nearest
        ancestor with evidence of the merge base with the default branch, else of the head.
        Evidence from another environment is used only when there is none from this one, and
        then the selection runs everything and says so.
        """
        starts = []
        if base is not None:
            starts.append(self.repo.resolve(base))
        else:
            head_commit = self.repo.head() if head == WORKTREE else head
            if head_commit is None:
                return None, "the repository has no commit yet"
            for branch in DEFAULT_BRANCHES:
                try:
                    merge_base = self.repo.merge_base(self.repo.resolve(branch), head_commit)
                except GitError:
                    continue
                if merge_base:
                    starts.append(merge_base)
                    break
            starts.append(head_commit)
        ours = store.commits_with_evidence(env_digest)
        anywhere = store.commits_with_evidence()
        for start in starts:
            for commit in self.repo.ancestors(start):
                if commit in ours:
                    return store.load_snapshot(commit, env_digest, with_lines=False), None
                if commit in anywhere:
                    key, _ = store.snapshot_envs(commit)[0]
                    return store.load_snapshot(commit, key), None
        where = base if base is not None else "the head"
        return None, (f"no evidence for {where} or any ancestor: every test runs "
                      "(record with `fastci record` on a base commit to select)")

    # -- planning ------------------------------------------------------------------------------
    def plan(self, base: str | None = None, head: str = WORKTREE,
             store: EvidenceStore | None = None, prune: bool = False,
             all_tests: bool = False) -> Planned:
        """Select; with `prune`, then replay captured module calls to prune equivalents.
        Within the evidence's recorded scope (its pytest arguments), unless `all_tests`."""
        started = time.perf_counter()
        began = time.monotonic()  # the clock local replays share (`budget.py`)
        own_store = store is None
        store = store or self.open_store()
        try:
            head = self.repo.resolve(head)
            head_tree = self.repo.tree(head)
            manifests = {p: self.repo.read(head, p) for p in head_tree if is_manifest(p)}
            env = current(lock_hash(manifests))
            snapshot, why = self.find_evidence(store, base, head, env.digest)
            head_inv = inventory.Inventories(self.repo, head, head_tree, store)
            renames: dict[str, str] = {}
            if snapshot is not None:
                renames = self._renames(snapshot, head)
                files = diff_trees(snapshot.tree, head_tree, renames)
                changed = {c.path for c in files} | {c.old_path for c in files if c.old_path}
                old_inv = self._old_inventories(store, snapshot, changed)
                new_inv = head_inv.load(sorted(changed))
                changes = analyse(files, old_inv, new_inv, head_inv,
                                  sources=self._changed_sources(snapshot, head, head_tree, files))
                removed = {p: fb for p, fb in old_inv.items() if p not in head_tree}
                graph = _LazyGraph(head_inv, removed)
                # What every test's evidence names, from the index (built, decoding every
                # test, only for a snapshot stored without one).
                index = snapshot.index or TestIndex.build(snapshot.tests)
                head_kernels = _head_kernels(index, head_inv,
                                             any(p.endswith(".py") for p in changed))
                untracked = self._untracked(snapshot, index, head, head_tree)
            else:
                changes = analyse((), {}, {}, {})
                graph, head_kernels, untracked = _LazyGraph(head_inv, {}), {}, {}
            history = History(outcomes=store.outcomes(), durations=store.durations(),
                              cofailure=store.cofailure_rates(changes.paths))
            inputs = SelectionInput(
                head=head, head_tree=head_tree, environment=env, snapshot=snapshot,
                changes=changes, head_inventories=head_inv,
                # _LazyGraph matches ImportGraph where selection uses it (`reached_from`
                # only) and defers building it; the cast says so to the type checker.
                import_graph=cast(inventory.ImportGraph, graph),
                static_tests=discover.test_functions(head_inv), head_kernels=head_kernels,
                untracked_shas=untracked, settings=self.settings, history=history,
                no_evidence_reason=why,
                scope=Scope() if all_tests or snapshot is None else
                Scope.from_json(snapshot.scope),
                line_source=_line_source(store, snapshot) if snapshot is not None else None)
            selection = select(inputs)
            if crosscheck.wanted():
                crosscheck.checked(inputs, selection)
            pruning = None
            if prune and snapshot is not None and self.settings.prune != "off" and \
                    any(d.prunable or d.prune_conditions for d in selection.selected):
                # On this machine the budget bounds the whole selection's wait, counted
                # from its start (`budget.py`); a runner's replays count their own.
                until = began + self.settings.prune_budget - WRAP_UP \
                    if self.settings.prune_budget > 0 else None
                pruning = self._prune(store, selection, snapshot, head, head_tree, until,
                                      head_inv)
                selection = pruning.selection
            return Planned(selection, snapshot, inputs, renames,
                           time.perf_counter() - started, pruning)
        finally:
            if own_store:
                store.close()

    def _prune(self, store: EvidenceStore, selection, snapshot, head, head_tree,
               until: float | None = None, head_inv=None):
        from fastci.runner.prune import decide as prune  # noqa: PLC0415 (only a plan that may prune pays for it)

        paths = {p for d in selection.selected for p, _ in d.prunable}
        old_inv = self._old_inventories(store, snapshot, paths)
        # Module calls are stored apart from the evidence selection decodes: load those of
        # the candidates only.
        wanted = [d.test_id for d in selection.selected if d.prunable or d.prune_conditions]
        found = store.load_modules(snapshot.commit, snapshot.env_key, wanted)
        if found:  # the candidates with their module calls, over the rest (not decoded)
            snapshot = replace(snapshot, tests=ChainMap(
                {t: replace(snapshot.tests[t], modules=m)
                 for t, m in found.items() if t in snapshot.tests}, snapshot.tests))
        outcome = prune.prune(self.repo, store, selection, snapshot, head, head_tree, old_inv,
                              mode=self.settings.prune, progress=self.progress,
                              replayer=self.replayer, budget=self.settings.prune_budget,
                              until=until, new_inventories=head_inv)
        note: str | None
        if outcome.pruned:
            saved = sum(e["test_seconds"] for e in outcome.pruned.values())
            note = (f"pruned {len(outcome.pruned)} of {len(outcome.pruned) + len(outcome.kept)} "
                    f"candidate tests ({saved:.2f} s of recorded test time) by replaying their "
                    f"captured calls: {outcome.replay_seconds:.2f} s of replay compute, "
                    f"{outcome.seconds:.1f} s of wall time with process start-up")
        else:
            note = (f"pruning kept all {len(outcome.kept)} candidate tests"
                    if outcome.kept else None)
        if note and outcome.skipped:
            note += (f"; {outcome.skipped} replays skipped, as every test that needed them "
                     "stayed selected")
        if note and outcome.launches[0]:
            note += (f"; {outcome.launches[0]} kernel launches taken from earlier replays "
                     f"({outcome.launches[1]} interpreted)")
        if note and outcome.cut:
            note += (f"; {outcome.cut} replays stopped at pruning's time limit "
                     f"({outcome.limit:.1f} s), their tests kept (prune_budget)")
        if note:
            outcome = replace(outcome, selection=replace(
                outcome.selection, notes=(*outcome.selection.notes, note)))
        return outcome

    def _renames(self, snapshot: Snapshot, head: str) -> dict[str, str]:
        try:
            self.repo.resolve(snapshot.commit)
        except GitError:
            return {}
        return self.repo.renames(snapshot.commit, head)

    def _old_inventories(self, store: EvidenceStore, snapshot: Snapshot, paths: set[str]):
        wanted = {p: snapshot.tree[p] for p in paths if p in snapshot.tree and p.endswith(".py")}
        found = store.load_inventories(wanted.values())
        out = {p: found[b] for p, b in wanted.items() if b in found}
        missing = {p: b for p, b in wanted.items() if b not in found}
        if missing:  # parse from git's object store; a blob git lacks stays unknown
            from fastci.runner.analysis.blocks import module_name_for, parse_blocks  # noqa: PLC0415
            for path, blob in missing.items():
                try:
                    source = self.repo.git("cat-file", "blob", END, blob).encode(
                        errors="surrogateescape")
                except GitError:
                    continue
                out[path] = parse_blocks(source, *module_name_for(path))
        return out

    def _changed_sources(self, snapshot: Snapshot, head: str, head_tree: Mapping[str, str],
                         files) -> dict[str, tuple[bytes | None, bytes | None]]:
        """(old, new) source of each modified Python file, to compare its changed functions
        statement by statement; a side git cannot give (a dirty tree's blob) is None."""
        paths = [c.path for c in files if c.status == "modified" and c.path.endswith(".py")]
        if not paths:
            return {}
        old = self.repo.read_blobs([snapshot.tree[p] for p in paths if p in snapshot.tree])
        new = self.repo.read_many(head, paths)
        return {p: (old.get(snapshot.tree.get(p, "")),
                    new[p] if p in new and blob_sha(new[p]) == head_tree.get(p) else None)
                for p in paths}

    def _untracked(self, snapshot: Snapshot, index: TestIndex, head: str, head_tree
                   ) -> dict[str, str]:
        """Content hashes of data files tests read that git does not track (worktree only)."""
        if head != WORKTREE:
            return {}
        paths = {p for p in index.data_files() if p not in head_tree}
        paths |= {p for p in snapshot.session_files if p not in head_tree}
        out = {}
        for path in paths:
            full = self.repo.root / path
            if full.is_file():
                out[path] = blob_sha(full.read_bytes())
        return out

    # -- running -------------------------------------------------------------------------------
    def run(self, base: str | None, pytest_args: list[str], *, run_all: bool = False,
            stream=None, on_verdict=None, background: bool = True,
            prune: bool = True, all_tests: bool = False) -> RunReport:
        """Select against the working tree, run the selection in risk order, store evidence.

        Blocking dimensions run first and their verdict is handed to `on_verdict` before any
        background dimension (convergence, perf) starts: they never delay it.
        """
        started = time.time()
        shadow = self.settings.mode == "shadow"
        run_all = run_all or shadow
        with self.open_store() as store:
            planned = self.plan(base, WORKTREE, store=store, prune=prune, all_tests=all_tests)
            selection = planned.selection
            # pytest collects the recorded suite's scope (its paths, -k, -m), then the
            # caller's own arguments: a test outside the scope is not collected as new.
            pytest_args = [*planned.inputs.scope.pytest_args(), *pytest_args]
            snapshot = planned.snapshot
            # All of it: the selection first, in risk order, then everything else.
            rest = sorted((d for d in selection.decisions if not d.selected),
                          key=lambda d: -d.risk)
            everything = [*selection.selected, *rest]
            order = [d.test_id for d in (everything if run_all else selection.selected)]
            known = list(snapshot.tests) if snapshot else []
            blocking = list(self.settings.blocking)
            self.progress(f"running {len(order)} of {len(selection.decisions)} tests, "
                          f"blocking dimensions ({', '.join(blocking)}) first")
            chosen = everything if run_all else selection.selected
            # A session costs seconds of start-up (imports, collection): skip one with
            # nothing to run. A new test's dimension is known only from its markers at
            # collection, so new tests keep both sessions.
            new = any(d.new for d in chosen)
            phases = []
            if new or any(self.settings.is_blocking(d.dimension) for d in chosen):
                phases.append(_Phase("blocking", blocking, exclude=False))
            if background and (new or any(not self.settings.is_blocking(d.dimension)
                                          for d in chosen)):
                phases.append(_Phase("background", blocking, exclude=True))
            for phase in phases:
                if phase.name == "background" and on_verdict is not None:
                    on_verdict(_report(selection, phases[:phases.index(phase)], started))
                self._run_phase(phase, order, known, pytest_args, stream)
            if (not phases or phases[-1].name == "blocking") and on_verdict is not None:
                on_verdict(_report(selection, phases, started))
            # every phase ran (or raised): each has its recording
            recordings = [p.recording for p in phases if p.recording is not None]
            collected = list(dict.fromkeys(c for p in phases for c in p.collected))
            self.store_results(store, planned, recordings, collected,
                               flaky={t for p in phases for t in p.flaky})
            report = _report(selection, phases, started)
            if run_all:
                entry = audit_entry(report, self.repo.head(), "shadow" if shadow else "full")
                store.add_audit(entry)
                report.extra["audit"] = entry
        return report

    def store_results(self, store: EvidenceStore, planned: Planned, recordings: list[Recording],
                      collected: list[str], flaky: AbstractSet[str] = frozenset()) -> None:
        """Store the head's evidence after running (some of) a plan's selection: fresh for
        the tests that ran, carried forward for the rest (pruned ones with their replays)."""
        if recordings:
            recording = _merge(recordings)
        else:  # nothing ran: the head's evidence is the base's, carried forward
            recording = self._nothing_ran(planned)
            collected = []
        snapshot = planned.snapshot
        if snapshot is not None:  # the base's scope, or the whole repository (--all-tests)
            recording = replace(recording, scope=planned.inputs.scope.to_json())
        if snapshot is not None:
            # Carried tests keep their line maps and module calls.
            base = store.load_snapshot(snapshot.commit, snapshot.env_key, with_lines=True,
                                       with_modules=True)
            assert base is not None, f"the evidence of {snapshot.commit[:12]} left the store"
            pruning = planned.pruning
            store_run(store, self.repo, base, recording, collected, planned.renames,
                      planned.inputs.changes.paths, flaky=flaky,
                      replayed_lines=pruning.head_lines if pruning else {},
                      replayed_reads=pruning.head_reads if pruning else {},
                      head_inventories=_over(planned.inputs.head_inventories, store))
        else:
            from fastci.runner.execution.carry import store_recording  # noqa: PLC0415
            store_recording(store, self.repo, recording)

    def _nothing_ran(self, planned: Planned) -> Recording:
        snap = planned.snapshot
        now = time.time()
        return Recording(tree=dict(planned.inputs.head_tree),
                         environment=planned.inputs.environment, tests={},
                         import_time=_import_time(snap) if snap else {},
                         session_files=dict(snap.session_files) if snap else {},
                         started_at=now, finished_at=now)

    def _run_phase(self, phase: "_Phase", order: list[str], known: list[str],
                   pytest_args: list[str], stream) -> None:
        with tempfile.TemporaryDirectory(prefix="fastci-run-") as tmp:
            plan_file = Path(tmp) / "plan.json"
            out_file = Path(tmp) / "recording.json"
            plan = make_plan(order, known)
            plan["dimensions"] = {"names": phase.dimensions, "exclude": phase.exclude}
            plan_file.write_text(json.dumps(plan))
            phase.code = self._pytest(["--fastci-record", f"--fastci-plan={plan_file}",
                                       f"--fastci-out={out_file}",
                                       f"--fastci-store={self.store_path}", *pytest_args],
                                      stream)
            if not out_file.exists():
                raise RunError(f"pytest exited with code {phase.code} before FastCI could "
                               f"record anything ({phase.name} tests); see its output")
            data = json.loads(out_file.read_text())
        failed = failed_ids(data)
        if failed:  # confirmed by one rerun: a test that passes then is flaky, not a failure
            data, phase.flaky = confirm(data, self._rerun(failed, known, pytest_args, stream))
        phase.recording, phase.failures = recording_from_json(data)
        phase.collected = data.get("collected", list(phase.recording.tests))
        if phase.flaky and not phase.failures and phase.code == 1:
            phase.code = 0

    def _rerun(self, failed: list[str], known: list[str], pytest_args: list[str], stream
               ) -> dict | None:
        """Run the failed tests once more; what they recorded (None: nothing)."""
        with tempfile.TemporaryDirectory(prefix="fastci-confirm-") as tmp:
            plan_file, out_file = Path(tmp) / "plan.json", Path(tmp) / "recording.json"
            plan_file.write_text(json.dumps(make_plan(failed, known, only=True)))
            self._pytest(["--fastci-record", f"--fastci-plan={plan_file}",
                          f"--fastci-out={out_file}", f"--fastci-store={self.store_path}",
                          *pytest_args], stream)
            return json.loads(out_file.read_text()) if out_file.exists() else None

    def _pytest(self, args: list[str], stream) -> int:
        rootdir = [] if any(a.startswith("--rootdir") for a in args) else \
            [f"--rootdir={self.repo.root}"]
        command = [sys.executable, "-m", "pytest", *rootdir, *args]
        # Replays run here (no runner's replayer): the recording starts the zygote the next
        # selection will use as it ends (`plugin._prewarm`).
        env = {**os.environ, "FASTCI_PREWARM": "1"} if self.replayer is None \
            and self.settings.prune != "off" else None
        proc = subprocess.run(command, cwd=self.repo.root, stdout=stream, stderr=subprocess.STDOUT
                              if stream is not None else None, check=False, env=env)
        return proc.returncode

    def record(self, pytest_args: list[str]) -> int:
        """A full run that records evidence for HEAD; returns pytest's exit code."""
        return self._pytest(["--fastci-record", f"--fastci-store={self.store_path}",
                             *pytest_args], None)


@dataclass
class _Phase:
    """One pytest session of a run: the blocking dimensions, or everything else."""

    name: str
    dimensions: list[str]
    exclude: bool
    code: int = 0
    recording: Recording | None = None  # once the session ran
    failures: dict[str, dict] = field(default_factory=dict)
    collected: list[str] = field(default_factory=list)
    flaky: dict[str, dict | None] = field(default_factory=dict)  # test id -> its first failure


def _line_source(store: EvidenceStore, snapshot: Snapshot):
    """Some tests' executed lines in some files, loaded from the store when a rule asks for
    them (lines are stored apart from the evidence selection decodes); a store that cannot
    answer gives none, and the rule counts whole functions."""

    def lines_of(test_ids, paths) -> dict[str, dict[str, tuple[int, ...]]]:
        try:
            return store.load_lines(snapshot.commit, snapshot.env_key, test_ids, paths)
        except StoreError:
            return {}

    return lines_of


def _import_time(snap: Snapshot) -> dict[str, dict[str, list[str]]]:
    """A snapshot's import-time origins in a recording's shape (lists where a snapshot types
    tuples; the store hands back lists either way, and both serialise alike)."""
    return {path: {qualname: list(origins) for qualname, origins in names.items()}
            for path, names in snap.import_time.items()}


def _merge(recordings: list[Recording]) -> Recording:
    """One recording from the sessions of a run (same tree, same environment)."""
    first = recordings[0]
    tests, order = {}, []
    for rec in recordings:
        tests.update(rec.tests)
        order += [t for t in rec.order if t not in order]
    failures_at = [r.first_failure_at for r in recordings if r.first_failure_at]
    return replace(first, tests=tests, order=order,
                   first_failure_at=min(failures_at) if failures_at else None,
                   finished_at=recordings[-1].finished_at)


def _report(selection: Selection, phases: list[_Phase], started: float) -> RunReport:
    results, first = [], None
    for phase in phases:
        rec = phase.recording
        if rec is None:
            continue
        results += test_results(rec, phase.failures, phase.flaky,
                                blocking=phase.name == "blocking")
        if rec.first_failure_at is not None and first is None:
            opening = phases[0].recording
            assert opening is not None  # phases run in order: a later one ran after the first
            first = rec.first_failure_at - opening.started_at
    if not phases:
        return RunReport(selection=selection, wall_seconds=time.time() - started,
                         extra={"pytest_exit_codes": {}})
    codes = {p.name: p.code for p in phases if p.recording is not None}
    return RunReport(selection=selection, results=tuple(results),
                     wall_seconds=time.time() - started, time_to_first_failure=first,
                     extra={"pytest_exit_codes": codes})


def audit_entry(report: RunReport, commit: str | None, kind: str) -> dict:
    """What a run of everything says about the selection: the failures it would have missed,
    the test time it would have saved, and how soon its order found the first failure."""
    selection = report.selection
    chosen = {d.test_id for d in selection.selected}
    failed = [r for r in report.failures]
    missed = [r.test_id for r in failed
              if r.test_id not in chosen and r.test_id.split("[")[0] not in chosen]
    ran = {r.test_id: r for r in report.results}
    selected_seconds = sum(ran[t].duration for t in chosen if t in ran)
    total_seconds = sum(r.duration for r in report.results)
    return {"at": time.time(), "commit": commit, "base": selection.base, "kind": kind,
            "mode": selection.mode, "total": len(selection.decisions),
            "selected": len(chosen), "selected_seconds": round(selected_seconds, 3),
            "total_seconds": round(total_seconds, 3),
            "failed": [r.test_id for r in failed], "missed": missed,
            "flaky": [r.test_id for r in report.results if r.flaky],
            "time_to_first_failure": report.time_to_first_failure}


def _head_kernels(index: TestIndex, head_inv: inventory.Inventories, python_changed: bool
                  ) -> dict[str, str]:
    """The head's hash of each kernel in evidence. Without a Python change a kernel is as
    recorded; where tests recorded different hashes for one kernel (evidence carried from
    different commits), its hash is computed at the head."""
    recorded = index.kernels()
    mixed = {k for k, hashes in recorded.items() if len(hashes) > 1 or python_changed}
    out = {k: next(iter(hashes)) for k, hashes in recorded.items() if k not in mixed}
    if mixed:
        out.update(inventory.kernel_hashes(head_inv, mixed))
    return out


class _LazyGraph:
    """The import graph, built only if a rule asks who imports a file."""

    def __init__(self, head_inv: inventory.Inventories, removed: Mapping[str, FileBlocks]
                 ) -> None:
        self._head_inv, self._removed = head_inv, removed
        self._graph: inventory.ImportGraph | None = None

    def reached_from(self, path: str) -> set[str]:
        if self._graph is None:
            self._graph = inventory.ImportGraph({**dict(self._head_inv.items()), **self._removed})
        return self._graph.reached_from(path)


def _over(inventories, store: EvidenceStore):
    """Lazy inventories re-bound to `store` (the plan's own may be closed by now)."""
    return inventories.using(store) if isinstance(inventories, inventory.Inventories) \
        else inventories
