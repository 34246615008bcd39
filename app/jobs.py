"""The entry point the webhook enqueues (on the CPU queue): one job per delivery, handed to
the module for its kind. A pull request or a push starts a run (`run_state`) and returns;
`advance` moves runs on as their runner jobs end. The pipeline lives in modules of one job
each: `pull_request`, `shards`, `background`, `refresh`, `publish`, with `planning` the step
they share, `context` what they hold and `runs` the watchdog's registry; `commands`
answers `/fastci` comments.
"""

from __future__ import annotations

from .context import Context
from .events import Work
from .pull_request import run_pull_request
from .refresh import refresh


def handle(work_json: dict, delivery: str) -> dict:
    """The job for one delivery."""
    work = Work.from_json(work_json)
    if work.kind == "installation":
        return {"installation": work.installation_id, "action": work.mode,
                "repos": list(work.repos)}
    ctx = Context.create(work)
    if work.kind == "pull_request":
        return run_pull_request(ctx, work, delivery)
    if work.kind == "refresh":
        return refresh(ctx, work, delivery)
    if work.kind == "command":
        from .commands import handle_command  # noqa: PLC0415 (commands import the pipeline)

        return handle_command(ctx, work)
    raise ValueError(f"unknown work kind {work.kind!r}")
