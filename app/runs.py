"""The watchdog's list of check runs that must end by a deadline: jobs add the runs they
open (`watch`) and remove them when they conclude (`unwatch`); the watchdog concludes the
rest as timed out."""

from __future__ import annotations

import json
import logging
import time

from .context import Context
from .events import Work

log = logging.getLogger("fastci.app")


SELECTION_DEADLINE = 30 * 60


RUN_DEADLINE = 8 * 3600


def watch(ctx: Context, work: Work, run, seconds: float) -> None:
    entry = json.dumps({"repo": work.repo, "installation": work.installation_id,
                        "id": run.id, "name": run.name})
    ctx.redis.zadd(ctx.queues.key("open-runs"), {entry: time.time() + seconds})


def unwatch(ctx: Context, run) -> None:
    key = ctx.queues.key("open-runs")
    for entry in ctx.redis.zrange(key, 0, -1):
        if json.loads(entry)["id"] == run.id:
            ctx.redis.zrem(key, entry)
