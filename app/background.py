"""The job that publishes the background dimensions (convergence, perf) as their own,
never-blocking check run, "FastCI background", while their shards run."""

from __future__ import annotations

import logging

from . import artifacts, checks, github, workspace
from .context import Context
from .events import Work
from .runs import RUN_DEADLINE, unwatch, watch
from .shards import Check, follow

log = logging.getLogger("fastci.app")


def follow_background(work_json: dict, head_sha: str, ids: list[str], key: str = "",
                      requests: dict | None = None) -> dict:
    """Publish the background dimensions' shards as their own, never-blocking check run."""
    work = Work.from_json(work_json)
    ctx = Context.create(work)
    ctx.requests.update(requests or {})
    ctx.origins.update({i: ctx.queues.background.name for i in ids})
    mirror = workspace.mirror_path(ctx.settings.workspace, work.repo)
    check = Check(head_sha, workspace.tree(mirror, head_sha), {})
    runs = github.CheckRuns(ctx.repo)
    run = runs.open(checks.BACKGROUND, head_sha, key or f"bg-{head_sha}",
                    output=checks.regressions_output([], shards=len(ids), shards_done=0,
                                                     done=False, blocking=False))
    watch(ctx, work, run, RUN_DEADLINE)
    try:
        results, _, _ = follow(ctx, work, head_sha, ids, runs, run, blocking=False,
                                check=check)
    finally:
        for request in ctx.requests.values():
            artifacts.discard(ctx.settings, request.get("bundle_url"))
    if results is None:
        return {"status": "superseded"}
    runs.update(run, conclusion=checks.conclusion(results, blocking=False),
                output=checks.regressions_output(results, shards=len(ids),
                                                 shards_done=len(ids), done=True,
                                                 blocking=False))
    unwatch(ctx, run)
    return {"status": "completed", "ran": len(results)}
