"""Routing: which webhook deliveries become which work. Pure functions over the payload.

Each event maps to one `Work` (a plain, JSON-able job description with no secrets) or to an
`Ignored` with the reason, which the webhook's 202 body reports. Malformed payloads (a
missing field GitHub always sends) raise `PayloadError`, which the webhook answers with 422.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from fastci.runner.errors import FastCIError

COMMAND_PREFIX = "/fastci"
RUN_ALL, RERUN_FAILED = "run_all", "rerun_failed"


class PayloadError(FastCIError, ValueError):
    """The payload lacks a field (or has a wrong type) that this event always carries."""


@dataclass(frozen=True)
class Work:
    """A unit of work for a job: what to do, for which repository and revision."""

    kind: str  # pull_request | refresh | command | installation
    repo: str
    installation_id: int | None
    number: int | None = None  # pull request
    head_sha: str | None = None
    base_sha: str | None = None
    base_ref: str | None = None
    head_repo: str | None = None
    sender: str | None = None
    mode: str = "select"  # select | run_all | rerun_failed
    comment_id: int | None = None
    body: str | None = None
    repos: tuple[str, ...] = ()
    extra: dict = field(default_factory=dict)

    @property
    def fork(self) -> bool:
        return bool(self.head_repo) and self.head_repo.lower() != self.repo.lower()

    def to_json(self) -> dict:
        out = asdict(self)
        out["repos"] = list(self.repos)
        return out

    @classmethod
    def from_json(cls, data: dict) -> "Work":
        return cls(**{**data, "repos": tuple(data.get("repos", ()))})


@dataclass(frozen=True)
class Ignored:
    reason: str


def route(event: str, payload: Any) -> Work | Ignored:
    if not isinstance(payload, dict):
        raise PayloadError("the body must be a JSON object")
    handler = _HANDLERS.get(event)
    if handler is None:
        return Ignored(f"FastCI does not act on {event!r} events")
    try:
        return handler(payload)
    except (KeyError, TypeError, AttributeError) as exc:
        raise PayloadError(f"{event} payload is missing or mistypes {exc}") from None


def _repo(payload: dict) -> str:
    name = payload["repository"]["full_name"]
    if not isinstance(name, str) or name.count("/") != 1:
        raise PayloadError(f"repository.full_name must be 'owner/name', not {name!r}")
    return name


def _installation(payload: dict) -> int | None:
    inst = payload.get("installation")
    return int(inst["id"]) if isinstance(inst, dict) and "id" in inst else None


def _sha(value: Any, what: str) -> str:
    if not isinstance(value, str) or len(value) != 40 or not all(
            c in "0123456789abcdef" for c in value):
        raise PayloadError(f"{what} must be a 40-character hex sha, not {value!r}")
    return value


def _pull(payload: dict) -> Work | Ignored:
    action = payload["action"]
    if action not in ("opened", "synchronize", "reopened"):
        return Ignored(f"pull_request {action}: nothing to run")
    pr = payload["pull_request"]
    head_repo = (pr["head"].get("repo") or {}).get("full_name")
    return Work("pull_request", _repo(payload), _installation(payload), number=int(pr["number"]),
                head_sha=_sha(pr["head"]["sha"], "pull_request.head.sha"),
                base_sha=_sha(pr["base"]["sha"], "pull_request.base.sha"),
                base_ref=pr["base"]["ref"], head_repo=head_repo or "(deleted fork)",
                sender=payload["sender"]["login"])


def _push(payload: dict) -> Work | Ignored:
    ref = payload["ref"]
    default = payload["repository"].get("default_branch") or payload["repository"].get(
        "master_branch")
    if ref != f"refs/heads/{default}":
        return Ignored(f"push to {ref}: evidence is refreshed for the default branch only")
    if payload.get("deleted") or payload["after"] == "0" * 40:
        return Ignored("the default branch was deleted")
    return Work("refresh", _repo(payload), _installation(payload),
                head_sha=_sha(payload["after"], "after"), base_ref=default)


def _suite_pulls(payload: dict, holder: dict, mode: str, what: str) -> Work | Ignored:
    pulls = holder.get("pull_requests") or []
    if not pulls:
        return Ignored(f"{what}: not for a pull request")
    pr = pulls[0]
    # The suite lists only the number and shas; the job asks the API which repository the
    # head lives in (a fork's head must not run before /fastci ok-to-test).
    return Work("pull_request", _repo(payload), _installation(payload), number=int(pr["number"]),
                head_sha=_sha(pr["head"]["sha"], "pull_requests[0].head.sha"),
                base_sha=_sha(pr["base"]["sha"], "pull_requests[0].base.sha"),
                base_ref=pr["base"]["ref"], head_repo=None,
                sender=payload["sender"]["login"], mode=mode)


def _check_suite(payload: dict) -> Work | Ignored:
    action = payload["action"]
    if action not in ("requested", "rerequested"):
        return Ignored(f"check_suite {action}: nothing to run")
    return _suite_pulls(payload, payload["check_suite"], "select", f"check_suite {action}")


def _check_run(payload: dict) -> Work | Ignored:
    action = payload["action"]
    run = payload["check_run"]
    if action == "rerequested":
        return _suite_pulls(payload, run, "select", "check_run rerequested")
    if action == "requested_action":
        identifier = payload["requested_action"]["identifier"]
        if identifier not in (RUN_ALL, RERUN_FAILED):
            return Ignored(f"requested action {identifier!r} is not FastCI's")
        return _suite_pulls(payload, run, identifier, f"check_run action {identifier}")
    return Ignored(f"check_run {action}: nothing to do")


def _issue_comment(payload: dict) -> Work | Ignored:
    if payload["action"] != "created":
        return Ignored(f"issue_comment {payload['action']}: only new comments are commands")
    issue, comment = payload["issue"], payload["comment"]
    body = comment.get("body") or ""
    if not body.lstrip().startswith(COMMAND_PREFIX):
        return Ignored("the comment is not a /fastci command")
    if "pull_request" not in issue:
        return Ignored("/fastci commands work on pull requests, not issues")
    return Work("command", _repo(payload), _installation(payload), number=int(issue["number"]),
                comment_id=int(comment["id"]), sender=comment["user"]["login"], body=body[:2000])


def _installation_event(payload: dict) -> Work | Ignored:
    repos = payload.get("repositories") or payload.get("repositories_added") or []
    removed = payload.get("repositories_removed") or []
    account = payload["installation"]["account"]["login"]
    return Work("installation", f"{account}/*", int(payload["installation"]["id"]),
                mode=payload["action"],
                repos=tuple(r["full_name"] for r in repos),
                extra={"removed": [r["full_name"] for r in removed]})


_HANDLERS = {
    "pull_request": _pull,
    "push": _push,
    "check_suite": _check_suite,
    "check_run": _check_run,
    "issue_comment": _issue_comment,
    "installation": _installation_event,
    "installation_repositories": _installation_event,
}
