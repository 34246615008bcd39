"""Pruning's replays, run by a runner worker instead of the selection worker.

The selection worker holds the App's key and installation tokens, and replaying a capture
runs the change's code: so the App's `Engine` gets a `RunnerReplayer`. It packs the scratch
folder pruning wrote (the trees from git objects, the captures from the store, digests
already verified) as one file, published like a commit's bundle behind a signed URL
(`artifacts.py`), enqueues `fastci.runner.execution.replays.run_replays` on a
GPU queue (the runner runs it as the sandbox user, where a CUDA module can be replayed as
well) and waits for it. What comes back is JSON from code under test: each replay's output is
validated (`validate.replay_output`) before pruning compares a fingerprint, and anything that
fails validation, times out or is lost becomes an error for its captures, which keeps their
tests selected with the reason on the check run.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

from redis.exceptions import RedisError

from fastci.runner.errors import FastCIError
from fastci.runner.execution import validate
from fastci.runner.execution.validate import InvalidResult
from fastci.runner.prune.replayers import REPLAY_TIMEOUT, ReplayItem, Steps, pack

from . import artifacts
from .markdown import code
from .queue import SEEN_TTL, Queues, fetch
from .settings import AppSettings

log = logging.getLogger("fastci.app")
POLL = 0.5


class RunnerReplayer:
    """Replays on a runner (see the module's docstring). `rejected` collects the reasons of
    outputs that failed validation, for the check run and the log."""

    in_place = False  # the runner has no checkout: every tree is written out and packed

    def __init__(self, queues: Queues, settings: AppSettings, gpu: int = 0,
                 timeout: float = REPLAY_TIMEOUT) -> None:
        self.queues, self.settings, self.gpu, self.timeout = queues, settings, gpu, timeout
        self.rejected: list[str] = []

    def run(self, scratch: Path, steps: Steps) -> dict[str, dict]:
        items = [item for step in steps for item in step]
        path = artifacts.directory(self.settings) / f"replays-{uuid.uuid4().hex}.tar.gz"
        try:
            # The pack travels like a bundle: a signed URL valid while the job may wait and run.
            request = {"steps": pack(scratch, steps, path),
                       "pack_url": artifacts.publish(self.settings, path,
                                                          self._budget(len(steps)) + 300)}
            raw = self._wait(request, len(steps))
        except (RedisError, OSError, ValueError, FastCIError) as exc:
            raw = f"the replays could not be run on a runner: {exc}"[:300]
        finally:
            path.unlink(missing_ok=True)
        if isinstance(raw, str):
            return {item.name: item.failed(raw) for item in items}
        outputs = raw.get("outputs") if isinstance(raw, dict) else None
        if not isinstance(outputs, dict):
            return {item.name: item.failed("the runner's replay result is malformed")
                    for item in items}
        return {item.name: self._checked(item, outputs.get(item.name)) for item in items}

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

    def _budget(self, steps: int) -> float:
        """Seconds the job may run: each step's replays in turn, and the pack's download."""
        return self.timeout * max(1, steps) + 120

    def _wait(self, request: dict, steps: int) -> dict | str:
        """The job's return value, or why there is none."""
        job_id = f"{self.queues.prefix}-shard-replay-{uuid.uuid4().hex}"  # the runners' ids
        budget = self._budget(steps)
        job = self.queues.gpu(self.gpu).enqueue(
            "fastci.runner.execution.replays.run_replays", request, job_id=job_id,
            job_timeout=int(budget), result_ttl=SEEN_TTL, failure_ttl=SEEN_TTL,
            description="pruning replays")
        deadline = time.monotonic() + budget + 300  # queueing behind shards
        while time.monotonic() < deadline:
            status = job.get_status(refresh=True)
            if status == "finished":
                return fetch(job.id, self.queues.redis).return_value()
            if status in ("failed", "stopped", "canceled"):
                return f"the replay job {status} on the runner"
            time.sleep(POLL)
        job.cancel()
        return "no runner finished the replays in time"

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


def _files(root: Path) -> set[str]:
    """The repository-relative files of a tree pruning wrote out (what lines may name)."""
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}
