"""Equivalent-context pruning: drop a selected test when replaying, under the new code, the
module calls in which its changed code ran gives the same numbers as under the old code.

A selected test is a candidate only when every reason it was selected for is a changed block
it executed (or a block it executed that reads a changed value), and each such block ran only
inside captured module calls (`capture.py`): never outside a module call, and never in a
call of a captured signature past those captured (`MAX_REPEATS`), which is not replayed.
The captures it needs are replayed twice, each in a fresh process (`replay.py`): under the
evidence's own tree, where the outputs must reproduce the fingerprints recorded in the test
(this proves the capture holds the call's whole context), and under the new tree. The test
is pruned only when every fingerprint (outputs, state after the call, in-place changes to
arguments, RNG, parameter and input gradients under a fixed upstream gradient) is
bit-identical, or within the per-dtype tolerance when `prune = "tolerance"`. Anything else
(a failed load, an exception, a missing blob, a timeout) keeps the test selected, with the
reason.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Sequence

from fastci.runner.git import WORKTREE, Repo
from fastci.runner.prune import settle
from fastci.runner.prune.budget import cut_off
from fastci.runner.prune.replayers import LocalReplayer, Replayer, ReplayItem, SettlePlan
from fastci.runner.prune.settle import SKIPPED, differences, unlike_recorded
from fastci.runner.record import tracing
from fastci.runner.record.capture import MAX_REPEATS
from fastci.runner.selection.report import Selection

if TYPE_CHECKING:
    from fastci.runner.store import EvidenceStore

MAX_MATERIALIZE = 256 * 2**20  # bytes of a tree written out for its replay
SPLIT_AT = 8  # new-code calls from which two processes replay them


@dataclass(frozen=True)
class Candidate:
    test_id: str
    captures: tuple[str, ...]  # digests to replay
    modules: Mapping[str, str]  # digest -> module class
    recorded: Mapping[str, dict]  # digest -> output fingerprints recorded in the test
    classes: tuple[tuple[str, str, tuple[str, ...]], ...] = ()  # must override nothing
    lines: Mapping[str, Mapping[str, list[int]]] = field(default_factory=dict)
    """digest -> the lines the test ran in that call (the old replay must run them all)."""
    env: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    """digest -> environment variables the test session had set (TRITON_INTERPRET=1)."""
    seconds: float = 0.0  # what pruning it saves: the test's expected duration


@dataclass(frozen=True)
class PruneOutcome:
    """What pruning did: the new selection, per-test evidence and what it cost."""

    selection: Selection
    pruned: Mapping[str, dict] = field(default_factory=dict)  # test id -> evidence
    kept: Mapping[str, str] = field(default_factory=dict)  # candidate -> why it stays
    head_lines: Mapping[str, Mapping[str, tuple[int, ...]]] = field(default_factory=dict)
    head_reads: Mapping[str, tuple[str, ...] | None] = field(default_factory=dict)
    """Per pruned test, the data files its replays read under the new code (native readers
    too), or None where they could not be seen: its carried evidence then trusts Python's
    `open` no more (`carry.add_replayed`)."""
    seconds: float = 0.0
    replay_seconds: float = 0.0
    skipped: int = 0  # replays not run: every test that needed them stayed selected
    cut: int = 0  # replays cut off, or never started, when the time limit ran out
    limit: float | None = None  # the seconds each replay process had (`budget.py`)
    launches: tuple[int, int] = (0, 0)  # kernel launches remembered, interpreted (`launches.py`)


# What a replay process does not share with the test's: new code that reads one of these
# (`"pytest" in sys.modules`, `sys.argv`, the working folder) may compute, in the test,
# what no replay shows. (module or None, attribute), as the block inventory's reads name them.
PROCESS_CONTEXT = ((("sys",), "modules"), (("sys",), "argv"), (("os",), "getcwd"),
                   (("os",), "getcwdb"), (("Path", "pathlib"), "cwd"))


def _reads_process_context(blocks, inventories) -> str | None:
    """The first of PROCESS_CONTEXT a block's code (as the new tree has it) reads."""
    for path, qualname in blocks:
        fb = inventories.get(path) if inventories is not None else None
        block = fb.by_qualname().get(qualname) if fb is not None else None
        reads = set(block.reads) if block is not None else set()
        for owners, name in PROCESS_CONTEXT:
            if name in reads and reads.intersection(owners):
                return (f"{path}::{qualname} reads {owners[0]}.{name} under the new code, "
                        "which a replay process does not share with the test")
    return None


def candidates(selection: Selection, snapshot, old_inventories, new_inventories=None
               ) -> tuple[list[Candidate], dict[str, str]]:
    """Which selected tests might be pruned, and why each other one with captures cannot."""
    out, kept = [], {}
    for decision in selection.selected:
        if not (decision.prunable or decision.prune_conditions) or decision.new:
            continue
        test = snapshot.tests.get(decision.test_id)
        if test is None or test.carried_from:
            continue
        blind = _reads_process_context(decision.prunable, new_inventories)
        if blind:
            kept[decision.test_id] = blind
            continue
        needed: set[str] = set()
        if decision.prunable:
            if not test.modules:
                continue
            if test.modules.get("uncaptured"):
                kept[decision.test_id] = ("its calls were not captured: "
                                          + test.modules["uncaptured"])
                continue
            why, needed = _needed_captures(decision.prunable, test.modules, old_inventories)
            if why:
                kept[decision.test_id] = why
                continue
        caps, why = _by_digest((test.modules or {}).get("captures", ()), needed)
        if why:
            kept[decision.test_id] = why
            continue
        out.append(Candidate(decision.test_id, tuple(sorted(needed)),
                             {d: c["module"] for d, c in caps.items()},
                             {d: c["out"] for d, c in caps.items()},
                             tuple(decision.prune_conditions),
                             {d: c.get("lines", {}) for d, c in caps.items()},
                             {d: c.get("env", {}) for d, c in caps.items()},
                             decision.expected_seconds))
    return out, kept


def _by_digest(captures, needed: set[str]) -> tuple[dict[str, dict], str | None]:
    """The needed captures by digest. Two calls of a test can save the same bytes (a loop
    that calls twice with nothing changed between): one replay serves both, which must then
    run the lines of either. If they returned different values, what they computed depends
    on something the capture does not hold, and no replay of it proves anything."""
    out: dict[str, dict] = {}
    for capture in captures:
        digest = capture["digest"]
        if digest not in needed:
            continue
        seen = out.get(digest)
        if seen is None:
            out[digest] = capture
            continue
        if seen["out"] != capture["out"]:
            return {}, (f"two {capture['module'].rsplit('.', 1)[-1]} calls with the same "
                        "captured context returned different values: the capture does not "
                        "hold all they depend on")
        lines = {path: sorted(set(ls) | set(capture.get("lines", {}).get(path, ())))
                 for path, ls in seen.get("lines", {}).items()}
        for path, ls in capture.get("lines", {}).items():
            lines.setdefault(path, sorted(ls))
        out[digest] = {**seen, "lines": lines}
    return out, None


def _needed_captures(blocks, modules: dict, inventories) -> tuple[str | None, set[str]]:
    needed: set[str] = set()
    for path, qualname in blocks:
        fb = inventories.get(path)
        if fb is None:
            return f"no block inventory for {path} at the evidence's commit", set()

        def mine(lines) -> set[int]:
            return {n for n in lines if fb.owner_of(n) == qualname}

        if mine(modules["outside"].get(path, ())):
            stopped = f" ({modules['stopped']})" if modules.get("stopped") else ""
            return f"{path}::{qualname} ran outside any captured call{stopped}", set()
        reached: set[int] = set()
        hit = False
        for capture in modules["captures"]:
            lines = mine(capture["lines"].get(path, ()))
            if not lines:
                continue
            if capture["digest"] is None:
                return (f"{path}::{qualname} ran in a {capture['module'].rsplit('.', 1)[-1]} "
                        f"call that was not kept ({capture['why']})"), set()
            needed.add(capture["digest"])
            reached |= lines
            hit = True
        if not hit:
            return f"{path}::{qualname} ran in no captured call", set()
        # A call of a captured signature past MAX_REPEATS (same shapes, other values: a
        # long training loop's later step) is not replayed, and the replays of the captured
        # ones prove nothing about it: a clamp bound only its values reach.
        repeated = mine(modules["inside"].get(path, ()))
        if repeated:
            only = repeated - reached
            return (f"{path}::{qualname} ran lines "
                    + (f"{_span(only)} only" if only else f"{_span(repeated)} also")
                    + " in calls that were not captured (calls of a captured signature "
                    f"past the first {MAX_REPEATS})"), set()
    return None, needed


def _span(lines: set[int]) -> str:
    s = sorted(lines)
    return f"{s[0]}" if len(s) == 1 else f"{s[0]}-{s[-1]}"


def prune(repo: Repo, store: EvidenceStore, selection: Selection, snapshot, head: str,
          head_tree, old_inventories, mode: str = "exact", progress=None,
          replayer: Replayer | None = None, budget: float = 0.0,
          until: float | None = None, new_inventories=None) -> PruneOutcome:
    """Prune what replays prove equivalent. `replayer`: where the replays run (by default
    child processes here; the App's runs them on a runner, in its sandbox). `budget`:
    seconds each replay process may replay for after its start-up (0: no limit; `budget.py`);
    `until`: the `time.monotonic()` by which replays on this machine must be done, their
    start-up included (a runner's replays have their budget only)."""
    started = time.perf_counter()
    progress = progress or (lambda _message: None)
    found, kept = candidates(selection, snapshot, old_inventories, new_inventories)
    if not found:
        return PruneOutcome(_apply(selection, {}, mode, kept), kept=kept,
                            seconds=time.perf_counter() - started)
    decisions = {d.test_id: d for d in selection.decisions}
    limit = budget if budget > 0 else None
    digests = sorted({d for c in found for d in c.captures})
    classes = sorted({c for cand in found for c in cand.classes})
    progress(f"pruning: replaying {len(digests)} captured calls for "
             f"{len(found)} candidate tests")
    tolerance = mode == "tolerance"
    with tempfile.TemporaryDirectory(prefix="fastci-replay-") as tmp:
        replays = _Replays(repo, store, snapshot, head, head_tree, Path(tmp), mode,
                           replayer or LocalReplayer(), limit, until)
        # FastCI's own variables (a child hand-over tagged per test, in older evidence) are
        # no environment of the code: they never reach a replay, nor split its groups.
        envs = {d: {k: v for k, v in cand.env.get(d, {}).items() if not k.startswith("FASTCI_")}
                for cand in found for d in cand.captures}
        replays.run(digests, classes, sorted({p for c in _all_captures(snapshot, found)
                                              for p in c}), envs, found)
    pruned, head_lines, head_reads = {}, {}, {}
    for cand in found:
        why, evidence = _judge(cand, replays, tolerance)
        if why:
            kept[cand.test_id] = why
            continue
        decision = decisions[cand.test_id]
        evidence["test_seconds"] = round(decision.expected_seconds, 4)
        pruned[cand.test_id] = evidence
        lines: dict[str, set[int]] = defaultdict(set)
        for digest in cand.captures:
            for path, ls in replays.new[digest].get("lines", {}).items():
                lines[path] |= set(ls)
        head_lines[cand.test_id] = {p: tuple(sorted(ls)) for p, ls in lines.items()}
        head_reads[cand.test_id] = _reads(replays.new[d] for d in cand.captures)
    replay_seconds = sum(r.get("seconds", 0.0) for r in
                         [*replays.old.values(), *replays.new.values()])
    results = [*replays.old.values(), *replays.new.values()]
    skipped = sum(r.get("error") == SKIPPED for r in results)
    new_selection = _apply(selection, pruned, mode, kept)
    return PruneOutcome(new_selection, pruned, kept, head_lines,
                        seconds=time.perf_counter() - started, replay_seconds=replay_seconds,
                        skipped=skipped, cut=sum(map(cut_off, results)), limit=limit,
                        launches=(replays.launches[0], replays.launches[1]),
                        head_reads=head_reads)


def _reads(results) -> tuple[str, ...] | None:
    """The data files a pruned test's new-code replays read, or None if any replay could
    not see them (no file events, an overflow, a result from before they were noted)."""
    read: set[str] = set()
    for result in results:
        if result.get("unwatched") is not None or result.get("read") is None:
            return None
        read.update(result["read"])
    return tuple(sorted(read))


class _Replays:
    """The two replays (the evidence's tree, the new tree), cached in the store by
    (capture, tree, mode): a capture replayed once under some code is never replayed again."""

    def __init__(self, repo, store: EvidenceStore, snapshot, head, head_tree, tmp: Path,
                 mode: str, replayer: Replayer, budget: float | None = None,
                 until: float | None = None) -> None:
        self.repo, self.store, self.snapshot, self.replayer = repo, store, snapshot, replayer
        self.budget = budget  # seconds each replay process may replay for
        self.until = until  # ... and the monotonic time by which local ones must be done
        self.head, self.head_tree, self.tmp, self.mode = head, head_tree, tmp, mode
        self.old: dict[str, dict] = {}
        self.new: dict[str, dict] = {}
        self.overrides: dict[str, dict] = {}
        self.missing: set[str] = set()
        self.corrupt: set[str] = set()  # stored bytes that do not hash to their digest
        self.found: list[Candidate] = []
        self.launches = [0, 0]  # hits, misses over every replay process

    def run(self, digests: list[str], classes: list, sys_path: list[str],
            envs: dict[str, dict] | None = None, found: Sequence[Candidate] = ()) -> None:
        """Replay `digests`, one pair of processes per distinct session environment;
        `found`, the candidates, lets a replay skip what can change no decision."""
        envs = envs or {}
        self.found = list(found)
        groups: dict[str, list[str]] = defaultdict(list)
        for digest in digests:
            groups[json.dumps(sorted(envs.get(digest, {}).items()))].append(digest)
        if not groups:
            groups["[]"] = []
        for i, (key, members) in enumerate(sorted(groups.items())):
            self._run_group(members, classes if i == 0 else [], sys_path,
                            dict(json.loads(key)), f"g{i}")

    def _run_group(self, digests: list[str], classes: list, sys_path: list[str], env: dict,
                   tag: str) -> None:
        tolerance = self.mode == "tolerance"
        old_key, new_key = _tree_key(self.snapshot.tree), _tree_key(self.head_tree)
        blobs = {}
        for digest in digests:
            data = self.store.load_capture(digest)
            if data is None:
                self.missing.add(digest)
                continue
            if hashlib.sha256(data).hexdigest() != digest:  # content-addressed: verified
                self.corrupt.add(digest)
                continue
            blobs[digest] = self.tmp / "captures" / digest
            blobs[digest].parent.mkdir(exist_ok=True)
            blobs[digest].write_bytes(data)
        if not tolerance:  # a tolerance replay compares tensors, which are not cached
            self.old.update(_cached(self.store, blobs, old_key, self.mode))
            self.new.update(_cached(self.store, blobs, new_key, self.mode))
        todo_old = {d: p for d, p in blobs.items() if d not in self.old}
        todo_new = {d: p for d, p in blobs.items() if d not in self.new}
        tensors = self.tmp / f"tensors-{tag}"
        tensors.mkdir()
        old_root = self._root(self.snapshot.tree, "old", todo_old, self.old) \
            if todo_old else None
        new_root = self._root(self.head_tree, "new", todo_new, self.new,
                              worktree=self.head == WORKTREE and self.replayer.in_place) \
            if (todo_new or classes) else None
        first: list[ReplayItem] = []
        second: list[ReplayItem] = []
        settle_old = settle_new = None
        if not tolerance:  # a tolerance replay may accept what differs: it skips nothing
            settle_old, settle_new, todo_old, todo_new = self._settling(
                set(blobs), todo_old, todo_new, self.tmp / f"settled-{tag}")
        if old_root:
            first.append(ReplayItem(f"old-{tag}", Path(old_root), todo_old, sys_path, env=env,
                                    watch=_data_files(self.snapshot.tree),
                                    save=tensors if tolerance else None, settle=settle_old,
                                    budget=self.budget, until=self.until))
        if new_root:
            # With every old replay cached (the base's, after the first change), many new
            # calls split over two processes, alternating in replay order: the second core
            # would otherwise idle while the budget runs. A few calls are not worth the
            # second process's start.
            halves = [todo_new] if tolerance or todo_old or len(todo_new) < SPLIT_AT else [
                dict(list(todo_new.items())[i::2]) for i in (0, 1)]
            for i, half in enumerate(halves):
                new = ReplayItem(f"new-{tag}" + ("" if i == 0 else f"-{i}"), Path(new_root),
                                 half, sys_path, env=env, overrides=classes if i == 0 else [],
                                 watch=_data_files(self.head_tree),
                                 compare=tensors if tolerance else None,
                                 settle=settle_new, budget=self.budget, until=self.until)
                # a tolerance replay compares against the tensors the old one saved: after
                (second if tolerance else first).append(new)
        outputs = self.replayer.run(self.tmp, [s for s in (first, second) if s])
        for item in first + second:
            self._collect(item.name.split("-")[0], outputs.get(item.name) or item.failed(
                "the replay returned nothing"))
        if not tolerance:
            self.store.save_replay_results(
                {f"{d}:{old_key}:{self.mode}": r for d, r in self.old.items()
                 if d in todo_old and not r.get("error")} |
                {f"{d}:{new_key}:{self.mode}": r for d, r in self.new.items()
                 if d in todo_new and not r.get("error")})

    def _settling(self, mine: set[str], todo_old: dict, todo_new: dict, settled: Path):
        """What lets this group's two processes skip calls that can change no decision
        (`settle.py`), and the order each replays its calls in."""
        cands = [c for c in self.found if mine & set(c.captures)]
        groups = [[d for d in c.captures if d in mine] for c in cands]
        recorded = [{d: c.recorded[d] for d in g} for c, g in zip(cands, groups)]
        # a cached replay of the new code that contradicts a test's recording settles it
        cached = {d: self.new[d] for d in mine - set(todo_new) if d in self.new}

        def contradicted(i: int) -> bool:
            return any(r.get("error") or unlike_recorded(r["fingerprints"], recorded[i][d])
                       for d, r in cached.items() if d in recorded[i])

        settled.write_text("".join(f"{i}\n" for i in range(len(groups)) if contradicted(i)))
        old_order, new_order = settle.orders(todo_old, todo_new, groups,
                                             budgeted=self.budget is not None,
                                             seconds=[c.seconds for c in cands])
        return (SettlePlan(groups, settled), SettlePlan(groups, settled, recorded),
                {d: todo_old[d] for d in old_order}, {d: todo_new[d] for d in new_order})

    def _root(self, tree, name: str, todo: dict, results: dict, worktree: bool = False):
        if worktree:
            return str(self.repo.root)
        if (self.tmp / name).exists():
            return str(self.tmp / name)  # written out for an earlier group
        try:
            return _materialize(self.repo, tree, self.tmp / name)
        except _CannotReplay as exc:
            results.update({d: {"error": str(exc)} for d in todo})
            return None

    def _collect(self, name: str, output: dict) -> None:
        (self.old if name == "old" else self.new).update(output.get("captures", {}))
        counts = output.get("launches")
        if isinstance(counts, dict):
            for i, key in enumerate(("hits", "misses")):
                value = counts.get(key)
                self.launches[i] += value if isinstance(value, int) else 0
        if name == "new":
            self.overrides.update(output.get("overrides", {}))


def _judge(cand: Candidate, replays: _Replays, tolerance: bool) -> tuple[str | None, dict]:
    replayed, checked = [], []
    for path, qualname, names in cand.classes:
        found = replays.overrides.get(f"{path}::{qualname}")
        if found is None or found["error"]:
            why = found["error"] if found else "not checked"
            return f"could not check the methods added to {qualname}: {why}", {}
        if found["overriding"]:
            return (f"{qualname} gained {', '.join(found['overriding'])}, overriding an "
                    "inherited attribute"), {}
        checked.append({"class": f"{path}::{qualname}", "added": list(names)})
    # A capture skipped because the test is settled by another: that other one says why.
    whys = []
    for digest in sorted(cand.captures, key=lambda d: _skipped(replays, d)):
        why, entry = _judge_capture(cand, replays, digest, tolerance)
        if why and SKIPPED not in why:
            return why, {}
        if why:
            whys.append(why)
        replayed.append(entry)
    if whys:
        return whys[0], {}
    return None, {"mode": "tolerance" if tolerance else "exact", "replayed": replayed,
                  "classes": checked,
                  "replay_seconds": round(sum(r["replay_seconds"] for r in replayed), 4)}


def _judge_capture(cand: Candidate, replays: _Replays, digest: str, tolerance: bool
                   ) -> tuple[str | None, dict]:
    """Why one capture keeps the test, or what its replays showed."""
    name = cand.modules[digest].rsplit(".", 1)[-1]
    if digest in replays.missing:
        return f"the saved {name} call is missing from the store", {}
    if digest in replays.corrupt:
        return (f"the saved {name} call does not match its digest "
                f"{digest[:12]} (never loaded)"), {}
    before, after = replays.old.get(digest), replays.new.get(digest)
    if before is None or after is None:
        return f"{name} was not replayed", {}
    if before.get("error") == SKIPPED and not after.get("error"):
        unlike = unlike_recorded(after["fingerprints"], cand.recorded[digest])
        if unlike:
            return (f"{name} under the new code differs at {', '.join(unlike[:3])} (from "
                    "what the test computed)"), {}
    # A failure says more than a replay cut off by the time limit, which says more than one
    # skipped because the other failed: the most telling first.
    for label, result in sorted((("the evidence's code", before), ("the new code", after)),
                                key=lambda pair: _telling(pair[1])):
        if cut_off(result):
            return (f"{name} was not replayed before pruning's time limit ran out (the "
                    "prune_budget setting gives pruning more time)"), {}
        if result.get("error"):
            return f"replaying {name} under {label} failed: {result['error']}", {}
    recorded = cand.recorded[digest]
    drift = unlike_recorded(before["fingerprints"], recorded)
    if drift:
        return (f"replaying {name} under the evidence's own code did not reproduce what "
                f"the test computed ({', '.join(drift[:3])}): the call depends on more "
                "than its module and arguments"), {}
    unrun = _lines_not_replayed(cand.lines.get(digest, {}), before.get("lines"))
    if unrun:
        return (f"replaying {name} under the evidence's own code did not run {unrun}, "
                "which the test ran in that call: the replay took another path (an "
                "environment or global state it cannot see)"), {}
    if tolerance:
        close = after.get("close", {})
        bad = [p for p, v in close.items() if v != "ok"] or ([] if close else ["*"])
        bad += _exact_differences(before["fingerprints"], after["fingerprints"])
        if bad:
            return (f"{name} under the new code differs beyond tolerance at "
                    f"{', '.join(bad[:3])}"), {}
    else:
        diff = differences(before["fingerprints"], after["fingerprints"])
        if diff:
            return f"{name} under the new code differs at {', '.join(diff[:3])}", {}
    return None, {
        "module": cand.modules[digest], "capture": digest,
        "fingerprints": len(after["fingerprints"]),
        "before": _hashes(before["fingerprints"]), "after": _hashes(after["fingerprints"]),
        "replay_seconds": round(before.get("seconds", 0.0) + after.get("seconds", 0.0), 4)}


def _exact_differences(before: Mapping[str, dict], after: Mapping[str, dict]) -> list[str]:
    """What tolerance cannot excuse: every leaf but the tensors' values (compared within
    tolerance apart) must be equal: plain values, structure, the modules' globals after the
    call, and the RNG (one more draw changes every later random number)."""
    def numeric(path: str) -> bool:
        if path.endswith("#"):  # an exact digest that includes tensor values
            return True
        a, b = before.get(path) or {}, after.get(path) or {}
        return path != "rng" and "dtype" in a and "dtype" in b
    return [p for p in differences(before, after) if not numeric(p)]


def _telling(result: Mapping) -> int:
    return 2 if result.get("error") == SKIPPED else 1 if cut_off(result) else 0


def _skipped(replays: _Replays, digest: str) -> int:
    """0: replayed on both trees; 1: under the new code only (which may say why); 2: not
    under the new code."""
    if (replays.new.get(digest) or {}).get("error") == SKIPPED:
        return 2
    return int((replays.old.get(digest) or {}).get("error") == SKIPPED)


def _lines_not_replayed(recorded: Mapping[str, list[int]], replayed) -> str | None:
    """The first file:lines the test ran in a call that its replay did not, if any."""
    if replayed is None:
        return "any traced line" if recorded else None
    for path, lines in sorted(recorded.items()):
        missing = set(lines) - set(replayed.get(path, ()))
        if missing:
            return f"{path}:{_span(missing)}"
    return None


def _hashes(prints: dict) -> dict:
    return {p: v.get("hash", v.get("repr", v.get("error"))) for p, v in sorted(prints.items())}


def _apply(selection: Selection, pruned: Mapping[str, dict], mode: str,
           kept: Mapping[str, str]) -> Selection:
    """Skip the pruned tests, with their evidence; say why each other candidate stays."""
    if not pruned and not kept:
        return selection
    decisions = []
    for d in selection.decisions:
        evidence = pruned.get(d.test_id)
        if evidence is None:
            why = kept.get(d.test_id)
            decisions.append(replace(d, not_pruned=why) if why and d.selected else d)
            continue
        names = sorted({r["module"].rsplit(".", 1)[-1] for r in evidence["replayed"]})
        n = len(evidence["replayed"])
        same = "bit-identical" if mode == "exact" else "within tolerance"
        reason = (f"pruned: {n} call{'s' if n != 1 else ''} it made "
                  f"({', '.join(names)}) replayed under the new code gave {same} outputs, "
                  f"state and gradients (replay {evidence['replay_seconds']:.3f} s vs "
                  f"{evidence['test_seconds']:.3f} s for the test)")
        decisions.append(replace(d, selected=False, rank=None, reasons=(reason, *d.reasons),
                                 pruned=evidence))
    ranked = sorted((d for d in decisions if d.selected), key=lambda d: d.rank or 0)
    rank = {d.test_id: i + 1 for i, d in enumerate(ranked)}
    decisions = [replace(d, rank=rank.get(d.test_id)) if d.selected else d for d in decisions]
    return replace(selection, decisions=tuple(decisions))


# -- processes ------------------------------------------------------------------------------
class _CannotReplay(Exception):
    pass


REPLAY_FORMAT = 8
"""What a replay fingerprints; part of the key of stored replays, so bump it whenever a
replay records something more (2: `said.files`, 3: a module call's `out.is`, 4: `out.is`
element by element in a returned container, 5: in a plain object too, 6: through what
the arguments hold, numpy's memory, and under the call's autocast, 7: the data files a
call read, natively too, 8: a module call's globals after it, and its effects), and results
stored before are not mixed with new ones (a fingerprint on one side only is a difference:
its tests would stay kept)."""


def _data_files(tree: Mapping[str, str]) -> tuple[str, ...]:
    """The tree's files whose reads a replay notes: those a recording watches too."""
    return tuple(sorted(p for p in tree if tracing.wants(f"/{p}", "/")))


def _tree_key(tree: Mapping[str, str]) -> str:
    digest = hashlib.sha256(json.dumps(sorted(tree.items())).encode()).hexdigest()[:24]
    return f"{digest}:r{REPLAY_FORMAT}"


def _cached(store: EvidenceStore, blobs: dict, key: str, mode: str) -> dict:
    out = {}
    for digest in blobs:
        found = store.replay_result(f"{digest}:{key}:{mode}")
        if found is not None:
            out[digest] = found
    return out


def _all_captures(snapshot, found: list[Candidate]):
    """The sys.path entries (inside the repository) the tests had, for the replays."""
    return [tuple(snapshot.tests[c.test_id].modules.get("sys_path", ())) for c in found]


def _materialize(repo: Repo, tree: Mapping[str, str], dest: Path) -> str:
    """Write a tree's files out of git's object store, for a replay of its code."""
    contents = repo.read_blobs(sorted(set(tree.values())))
    lacking = [p for p, b in tree.items() if b not in contents]
    py_lacking = [p for p in lacking if p.endswith(".py")]
    if py_lacking:
        raise _CannotReplay(f"git does not have the recorded contents of {py_lacking[0]} "
                            "(a tree with uncommitted changes)")
    if sum(len(contents[b]) for b in set(tree.values()) if b in contents) > MAX_MATERIALIZE:
        raise _CannotReplay("the evidence's tree is too large to write out for a replay")
    for path, blob in tree.items():
        if blob not in contents:
            continue
        target = dest / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(contents[blob])
    return str(dest)
