"""GitHub through PyGithub: App authentication and check runs within GitHub's limits.

PyGithub turns the App's JWT into installation tokens and refreshes them before they expire
(`AppInstallationAuth`); the base URL is configurable for GitHub Enterprise. GitHub's limits
are kept here, once: at most 50 annotations per request (the rest follow in PATCHes, which
GitHub appends), summaries and texts of at most 65,535 characters (truncated with a note),
at most 3 requested actions. Writes are retried with backoff on 5xx and rate limits (PyGithub
retries GETs only).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Callable, TypeVar

import github
from github import Auth, GithubException, GithubIntegration, RateLimitExceededException

from .settings import AppSettings

log = logging.getLogger("fastci.app")
T = TypeVar("T")

MAX_ANNOTATIONS = 50
MAX_TEXT = 65535  # bytes
MAX_ACTIONS = 3
MAX_TITLE = 255
TRUNCATED = "\n\n… (truncated: GitHub allows 65,535 characters; the full report is in the " \
            "run's log)"


def integration(settings: AppSettings) -> GithubIntegration:
    settings.require_github()
    auth = Auth.AppAuth(settings.app_id, settings.private_key.reveal())
    return GithubIntegration(auth=auth, base_url=settings.github_url,
                             retry=github.GithubRetry(total=4, backoff_factor=0.5),
                             seconds_between_requests=None, seconds_between_writes=None)


def for_installation(gi: GithubIntegration, installation_id: int) -> github.Github:
    return gi.get_github_for_installation(installation_id)


def retrying(call: Callable[[], T], attempts: int = 5, first_wait: float = 0.5,
             sleep=time.sleep) -> T:
    """Call a GitHub write, retrying 5xx answers and rate limits with exponential backoff."""
    wait = first_wait
    for attempt in range(1, attempts + 1):
        try:
            return call()
        except RateLimitExceededException as exc:
            if attempt == attempts:
                raise
            retry_after = _retry_after(exc)
            log.warning("GitHub rate limit; retrying in %.1f s", retry_after or wait)
            sleep(min(retry_after or wait, 60))
        except GithubException as exc:
            transient = exc.status >= 500 or (exc.status == 403 and "rate limit" in str(
                exc.data).lower())
            if not transient or attempt == attempts:
                raise
            log.warning("GitHub answered %s; retrying in %.1f s", exc.status, wait)
            sleep(wait)
        wait *= 2
    raise AssertionError("unreachable")


def _retry_after(exc: GithubException) -> float | None:
    headers = exc.headers or {}
    value = headers.get("retry-after") or headers.get("Retry-After")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def fit(text: str, limit: int = MAX_TEXT) -> str:
    """At most `limit` bytes of UTF-8 (GitHub counts bytes), with a note when cut."""
    data = text.encode()
    if len(data) <= limit:
        return text
    keep = limit - len(TRUNCATED.encode())
    return data[:keep].decode(errors="ignore") + TRUNCATED


@dataclass
class CheckRunOutput:
    title: str
    summary: str
    text: str = ""
    annotations: list[dict] = field(default_factory=list)

    def batches(self) -> list[dict]:
        """The output as successive requests: the first with the text and up to 50
        annotations, each further one with the next 50 (GitHub appends annotations)."""
        base = {"title": fit(self.title, MAX_TITLE), "summary": fit(self.summary)}
        if self.text:
            base["text"] = fit(self.text)
        chunks = [self.annotations[i:i + MAX_ANNOTATIONS]
                  for i in range(0, len(self.annotations), MAX_ANNOTATIONS)] or [[]]
        out = []
        for i, chunk in enumerate(chunks):
            body = dict(base) if i == 0 else {"title": base["title"], "summary": base["summary"]}
            if chunk:
                body["annotations"] = chunk
            out.append(body)
        return out


class CheckRuns:
    """Create and update one repository's check runs.

    GitHub appends every annotation it is sent, so a run updated as shards finish would
    show a failure once per update: each annotation is sent once per run. `sent` carries
    what earlier jobs sent (check run id -> digests of its annotations), as `sent()` gave
    it: a run is updated by several jobs, one after another."""

    def __init__(self, repo, sent: dict | None = None) -> None:
        self.repo = repo
        self._sent: dict[int, set[str]] = {int(k): set(v) for k, v in (sent or {}).items()}

    def sent(self) -> dict[str, list[str]]:
        """What was sent, for the next job that updates these runs."""
        return {str(k): sorted(v) for k, v in self._sent.items()}

    def _unsent(self, run_id: int | None, output: CheckRunOutput | None):
        if output is None or not output.annotations:
            return output
        sent = self._sent.setdefault(run_id, set()) if run_id is not None else set()
        fresh = []
        for annotation in output.annotations:
            key = hashlib.sha256(json.dumps(annotation, sort_keys=True).encode()).hexdigest()[:24]
            if key not in sent:
                sent.add(key)
                fresh.append(annotation)
        return CheckRunOutput(output.title, output.summary, output.text, fresh)

    def find(self, name: str, head_sha: str, external_id: str):
        """The check run of this name on this commit made for `external_id`, if any: a job
        that runs again (a retry, a redelivery) continues its runs instead of adding some."""
        _, data = retrying(lambda: self.repo._requester.requestJsonAndCheck(
            "GET", f"{self.repo.url}/commits/{head_sha}/check-runs",
            parameters={"check_name": name, "filter": "all", "per_page": 100}))
        for run in data.get("check_runs", []):
            if run.get("external_id") == external_id:
                return retrying(lambda run=run: self.repo.get_check_run(run["id"]))
        return None

    def open(self, name: str, head_sha: str, external_id: str, **kwargs):
        """`find`, else `create` (with `external_id`)."""
        found = self.find(name, head_sha, external_id)
        if found is not None:
            return found
        return self.create(name, head_sha, external_id=external_id, **kwargs)

    def create(self, name: str, head_sha: str, *, status: str = "in_progress",
               output: CheckRunOutput | None = None, conclusion: str | None = None,
               actions: list[dict] | None = None, external_id: str | None = None):
        kwargs = {"status": status}
        if conclusion:
            kwargs.update(conclusion=conclusion, status="completed")
        if external_id:
            kwargs["external_id"] = external_id
        if actions:
            kwargs["actions"] = actions[:MAX_ACTIONS]
        batches = output.batches() if output else []
        if batches:
            kwargs["output"] = batches[0]
        run = retrying(lambda: self.repo.create_check_run(name, head_sha, **kwargs))
        self._unsent(run.id, output)  # what this request sent counts as sent
        for body in batches[1:]:
            retrying(lambda body=body: run.edit(output=body))
        return run

    def update(self, run, *, output: CheckRunOutput | None = None, status: str | None = None,
               conclusion: str | None = None, actions: list[dict] | None = None) -> None:
        kwargs = {}
        if status:
            kwargs["status"] = status
        if conclusion:
            kwargs.update(conclusion=conclusion, status="completed")
        if actions is not None:
            kwargs["actions"] = actions[:MAX_ACTIONS]
        output = self._unsent(run.id, output)
        batches = output.batches() if output else [None]
        first = batches[0]
        if first is not None:
            kwargs["output"] = first
        # Annotations go first, while the run is open; the conclusion comes with the last.
        if len(batches) > 1:
            final = kwargs
            retrying(lambda: run.edit(**{k: v for k, v in final.items()
                                         if k not in ("conclusion", "status")}))
            for body in batches[1:-1]:
                retrying(lambda body=body: run.edit(output=body))
            last = {k: v for k, v in final.items() if k in ("conclusion", "status")}
            retrying(lambda: run.edit(output=batches[-1], **last))
        elif kwargs:
            retrying(lambda: run.edit(**kwargs))
