"""Pruning's replays, run by a runner worker instead of the selection worker, in two halves
so that no job waits for the replay job.

The selection worker holds the App's key and installation tokens, and replaying a capture
runs the change's code: the App's `Engine` never replays anything itself. Planning runs
twice. The first time (the selection job) its `Engine` gets a `DeferredReplayer`, which runs
nothing: it keeps a copy of what each replay would need (the trees pruning wrote out of git
objects, the captures from the store, digests already verified), and the digest of each
replay's inputs. If pruning asked for any, the job packs them as one file, publishes it like
a commit's bundle behind a signed URL (`artifacts.py`), enqueues
`fastci.runner.execution.replays.run_replays` on a GPU queue (the runner runs it as the
sandbox user) and returns; the run waits in state "replaying". When the replay job ends, its
worker enqueues `advance(run)`, which plans again with an `AnsweringReplayer`: it answers each
replay pruning asks for from the runner's output, only where that replay's inputs hash as
they did when they were sent, and only after `validate.replay_output` accepts it. Anything
else (a replay not sent, inputs that changed, a result that fails validation, a job that
failed, timed out or was lost) is an error for its captures, which keeps their tests
selected, with the reason on the check run.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from fastci.runner.execution import validate
from fastci.runner.execution.validate import InvalidResult
from fastci.runner.prune.replayers import REPLAY_TIMEOUT, ReplayItem, Steps, pack

from .markdown import code

log = logging.getLogger("fastci.app")

DEFERRED = "replayed on a runner once this selection returns"
QUEUE_ALLOWANCE = 1800  # seconds a replay job may wait for a runner (behind queued shards)


def budget(steps: int, timeout: float = REPLAY_TIMEOUT) -> float:
    """Seconds a replay job may run: each step's replays in turn, and the pack's download."""
    return timeout * max(1, steps) + 120


class DeferredReplayer:
    """Runs no replay: keeps what each would need under `staging` (paths as pruning's
    scratch folder had them) and the digest of its inputs, and answers every one with an
    error, so this plan prunes nothing and is not used."""

    in_place = False  # the runner has no checkout: every tree is written out and packed

    def __init__(self, staging: Path) -> None:
        self.staging = staging
        self.steps: Steps = []
        self.digests: dict[str, str] = {}
        self._trees: dict[Path, str] = {}

    @property
    def asked(self) -> bool:
        return bool(self.steps)

    def run(self, scratch: Path, steps: Steps) -> dict[str, dict]:
        for step in steps:
            kept = []
            for item in step:
                self.digests[item.name] = inputs_digest(item, scratch, self._trees)
                kept.append(self._keep(item, scratch))
            self.steps.append(kept)
        return {item.name: item.failed(DEFERRED) for step in steps for item in step}

    def pack(self, dest: Path) -> list[list[dict]]:
        """The kept files as one tar.gz at `dest`; the steps as the runner job gets them."""
        return pack(self.staging, self.steps, dest)

    def _keep(self, item: ReplayItem, scratch: Path) -> ReplayItem:
        def moved(path: Path | None) -> Path | None:
            return None if path is None else self.staging / path.relative_to(scratch)

        root = moved(item.root)
        if not root.exists():
            shutil.copytree(item.root, root, symlinks=True)
        captures = {}
        for digest, path in item.captures.items():
            target = moved(path)
            target.parent.mkdir(parents=True, exist_ok=True)
            if not target.exists():
                shutil.copyfile(path, target)
            captures[digest] = target
        settle = item.settle and replace(item.settle, settled=moved(item.settle.settled))
        return replace(item, root=root, captures=captures, save=moved(item.save),
                       compare=moved(item.compare), settle=settle)


class AnsweringReplayer:
    """Answers the replays pruning asks for from a runner's output (`raw`: the replay job's
    return value, or why there is none), each only if its inputs hash to the digest kept
    when it was sent, and only as validated JSON. `rejected` collects the reasons of
    outputs that failed validation, for the check run and the log."""

    in_place = False

    def __init__(self, raw: dict | str, digests: Mapping[str, str]) -> None:
        self.raw, self.digests = raw, dict(digests)
        self.rejected: list[str] = []
        self._trees: dict[Path, str] = {}

    def run(self, scratch: Path, steps: Steps) -> dict[str, dict]:
        items = [item for step in steps for item in step]
        if isinstance(self.raw, str):
            return {item.name: item.failed(self.raw) for item in items}
        outputs = self.raw.get("outputs") if isinstance(self.raw, dict) else None
        if not isinstance(outputs, dict):
            return {item.name: item.failed("the runner's replay result is malformed")
                    for item in items}
        out = {}
        for item in items:
            if self.digests.get(item.name) != inputs_digest(item, scratch, self._trees):
                out[item.name] = item.failed("what this replay needs changed after it was "
                                             "sent to a runner (or it was never sent)")
            else:
                out[item.name] = self._checked(item, outputs.get(item.name))
        return out

    def notes(self, kept: Mapping[str, str], limit: int = 5) -> list[str]:
        """For the check run: why candidates stayed selected, and any rejected result."""
        out = []
        if self.rejected:
            out.append(f"{len(self.rejected)} replay result(s) from a runner were rejected "
                       f"and not used ({' '.join(self.rejected[0][:200].split())}): their "
                       "tests stay selected")
        for test_id, why in sorted(kept.items())[:limit]:
            out.append(f"{code(test_id)} not pruned: {' '.join(why[:300].split())}")
        if len(kept) > limit:
            out.append(f"… and {len(kept) - limit} more candidates not pruned")
        return out

    def _checked(self, item: ReplayItem, raw) -> dict:
        if raw is None:
            return item.failed("the runner returned no result for this replay")
        try:
            return validate.replay_output(
                raw, captures=set(item.captures),
                overrides={f"{p}::{q}" for p, q, _ in item.overrides}, tree=_files(item.root))
        except InvalidResult as exc:
            log.warning("rejected a replay result: %s", exc)
            self.rejected.append(str(exc))
            return item.failed(f"the runner's replay result was rejected: {exc}")


def inputs_digest(item: ReplayItem, scratch: Path, trees: dict[Path, str]) -> str:
    """A digest of everything a replay's output depends on: its request (paths relative to
    the scratch folder), every file of the tree it replays in and the captures' bytes.
    `trees` caches a tree's digest within one plan."""
    if item.root not in trees:
        trees[item.root] = _tree_digest(item.root)
    h = hashlib.sha256()
    h.update(json.dumps(item.request(scratch / f"{item.name}.json", scratch),
                        sort_keys=True).encode())
    h.update(trees[item.root].encode())
    for digest, path in sorted(item.captures.items()):
        h.update(digest.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def _tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(root)).encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def _files(root: Path) -> set[str]:
    """The repository-relative files of a tree pruning wrote out (what lines may name)."""
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}
