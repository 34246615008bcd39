"""What every job of the App holds: its settings, Redis, queues, the installation's
GitHub client and repository; and the two questions all of them ask (a token to fetch
with, and whether a newer head replaced the one a job works on)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from redis import Redis

from . import github
from .events import Work
from .queue import Queues
from .settings import AppSettings, load

log = logging.getLogger("fastci.app")


@dataclass
class Context:
    settings: AppSettings
    redis: Redis
    queues: Queues
    gh: object  # github.Github for the installation
    repo: object  # github.Repository
    requests: dict = field(default_factory=dict)
    """job id -> the shard request this side enqueued: what a result is checked against
    (never the job's arguments as Redis holds them, which a runner could rewrite)."""
    origins: dict = field(default_factory=dict)  # job id -> the queue it was put on

    @classmethod
    def create(cls, work: Work, settings: AppSettings | None = None,
               redis: Redis | None = None) -> "Context":
        return cls.offline(settings, redis).online(work)

    @classmethod
    def offline(cls, settings: AppSettings | None = None, redis: Redis | None = None
                ) -> "Context":
        """Settings, Redis and queues, no GitHub yet: what an advance that finds nothing new
        needs (`online` adds the installation's client)."""
        settings = settings or load()
        redis = redis or Redis.from_url(settings.redis_url)
        return cls(settings, redis, Queues(redis, settings.queue_prefix, settings.gpus), None,
                   None)

    def online(self, work: Work) -> "Context":
        """This context with the installation's GitHub client and repository."""
        gi = github.integration(self.settings)
        gh = github.for_installation(gi, work.installation_id)
        repo = github.retrying(lambda: gh.get_repo(work.repo))
        ctx = Context(self.settings, self.redis, self.queues, gh, repo, self.requests,
                      self.origins)
        ctx._gi = gi
        return ctx

    def installation_token(self, installation_id: int) -> str:
        return self._gi.get_access_token(installation_id).token

    def approved_key(self, repo: str, sha: str) -> str:
        return self.queues.key("ok-to-test", repo.lower(), sha)


def installation_token(ctx: Context, work: Work) -> str | None:
    if ctx.settings.clone_url.startswith(("file://", "/")):
        return None  # a local path (tests, demo) needs no credentials
    return ctx.installation_token(work.installation_id)


def superseded(ctx: Context, work: Work, head_sha: str, pr=None) -> bool:
    """Whether the pull request's current head is another: as its events ordered them, and,
    given `pr` (the API's view), when that order is unknown, in doubt or names another head,
    as the pull request itself says (which is then noted in Redis)."""
    if work.number is None:
        return False
    current = ctx.queues.current_head(work.repo, work.number)
    if current == head_sha or pr is None:
        return current is not None and current != head_sha
    if pr.head.sha != current:
        ctx.queues.settle(work.repo, work.number, pr.head.sha, pr.updated_at.timestamp())
    return pr.head.sha != head_sha
