"""What a webhook payload must hold, per event: the fields FastCI reads, their types and ranges.

Plain validation functions over the parsed JSON, run before routing, so a signed payload that
does not fit is refused with a 422 that names the fields (never a 500 from deep inside the
router): ids are positive integers within GitHub's 64-bit range (not 1.5, 1e400, NaN or "5"),
shas are 40 hex digits, names are text GitHub could have sent, objects are objects. Fields
FastCI does not read are not checked: GitHub adds fields all the time.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

MAX_ID = 2**63 - 1
MAX_TEXT = 65536 * 4  # a comment body is at most 65,536 characters; refs and names far less
SHA = re.compile(r"^[0-9a-f]{40}$")
_ABSENT = object()

# A check returns why a value does not fit, or None.
Check = Callable[[Any], "str | None"]


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def an_id(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and not math.isfinite(value):
            return f"must be a positive integer, not {value!r}"
        return f"must be a positive integer, not {_describe(value)}"
    if not 0 < value <= MAX_ID:
        return f"must be a positive integer of at most 64 bits, not {_describe(value)}"
    return None


def text(value: Any) -> str | None:
    if not isinstance(value, str):
        return f"must be a string, not {type(value).__name__}"
    if len(value) > MAX_TEXT:
        return f"is {len(value)} characters long; GitHub sends at most {MAX_TEXT}"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid Unicode text (it holds a lone surrogate)"
    return None


def a_sha(value: Any) -> str | None:
    if not isinstance(value, str) or not SHA.match(value):
        return f"must be a 40-character hex sha, not {_describe(value)}"
    return None


def a_login(value: Any) -> str | None:
    """An account's login: GitHub's are 1 to 39 characters; an empty one names no one."""
    problem = text(value)
    if problem is None and not 0 < len(value) <= 100:
        return f"must be a login of 1 to 100 characters, not {_describe(value)}"
    return problem


def a_repo_name(value: Any) -> str | None:
    problem = text(value)
    if problem is None and value.count("/") != 1:
        return f"must be 'owner/name', not {_describe(value)}"
    return problem


def timestamp(value: str) -> float:
    """GitHub's ISO 8601 time (``2019-05-15T15:20:33Z``) as seconds since the epoch; ValueError
    when it is not one (a time without a zone is not: it would be read in local time)."""
    parsed = datetime.fromisoformat(value)
    if parsed.tzinfo is None:
        raise ValueError(f"{value!r} has no time zone")
    return parsed.timestamp()


def a_timestamp(value: Any) -> str | None:
    problem = text(value)
    if problem is not None:
        return problem
    try:
        timestamp(value)
    except (ValueError, OverflowError):
        return f"must be an ISO 8601 time with a zone, not {_describe(value)}"
    return None


def a_flag(value: Any) -> str | None:
    return None if isinstance(value, bool) else f"must be true or false, not {_describe(value)}"


def an_object(value: Any) -> str | None:
    return None if isinstance(value, dict) else \
        f"must be an object, not {type(value).__name__}"


def a_list(value: Any) -> str | None:
    return None if isinstance(value, list) else f"must be a list, not {type(value).__name__}"


def anything(_value: Any) -> str | None:
    return None


def _field(doc: Any, path: str) -> Any:
    """The value at a dotted path; _ABSENT when a key is missing or a parent is null."""
    for key in path.split("."):
        if not isinstance(doc, dict) or key not in doc:
            return _ABSENT
        doc = doc[key]
    return doc


def check_fields(doc: Any, fields: Mapping[str, Check], where: str = "") -> list[str]:
    """Problems with ``doc``'s fields. A path ending in "?" may be absent or null; a required
    one is checked only where its parent object is there (the parent's own check reports a
    missing parent)."""
    problems = []
    for spec, check in fields.items():
        optional = spec.endswith("?")
        path = spec.rstrip("?")
        value = _field(doc, path)
        if value is _ABSENT or value is None:
            parent = _field(doc, path.rpartition(".")[0]) if "." in path else doc
            if not optional and isinstance(parent, dict):
                problems.append(f"{where}{path} is missing" if value is _ABSENT
                                else f"{where}{path} must not be null")
            continue
        problem = check(value)
        if problem:
            problems.append(f"{where}{path} {problem}")
    return problems


def check_items(doc: Any, path: str, fields: Mapping[str, Check]) -> list[str]:
    """Problems with each object of the list at ``path`` (when it is a list)."""
    items = _field(doc, path)
    if not isinstance(items, list):
        return []
    problems = []
    for i, item in enumerate(items):
        where = f"{path}[{i}]"
        if not isinstance(item, dict):
            problems.append(f"{where} must be an object, not {type(item).__name__}")
        else:
            problems += check_fields(item, fields, where + ".")
    return problems


# -- per event: the fields the router reads -------------------------------------------------------
COMMON = {"repository": an_object, "repository.full_name": a_repo_name,
          "installation?": an_object, "installation.id?": an_id}
ACTION = {"action": text}
SENDER = {"sender": an_object, "sender.login": a_login}
SUITE_PULL = {"number": an_id, "head": an_object, "head.sha": a_sha, "base": an_object,
              "base.sha": a_sha, "base.ref": text}


def pull_request(payload: dict) -> list[str]:
    problems = check_fields(payload, ACTION)
    if payload.get("action") not in ("opened", "synchronize", "reopened"):
        return problems
    return problems + check_fields(payload, {
        **COMMON, **SENDER, "pull_request": an_object, "pull_request.number": an_id,
        "pull_request.head": an_object, "pull_request.head.sha": a_sha,
        "pull_request.head.repo?": an_object, "pull_request.head.repo.full_name?": text,
        "pull_request.base": an_object, "pull_request.base.sha": a_sha,
        "pull_request.base.ref": text, "pull_request.updated_at?": a_timestamp})


def push(payload: dict) -> list[str]:
    return check_fields(payload, {
        **COMMON, "ref": text, "after": a_sha, "deleted?": a_flag,
        "repository.default_branch?": text, "repository.master_branch?": text})


def _suite_pulls(payload: dict, holder: str) -> list[str]:
    return (check_fields(payload, {**COMMON, **SENDER, holder: an_object,
                                   f"{holder}.pull_requests?": a_list})
            + check_items(payload, f"{holder}.pull_requests", SUITE_PULL))


def check_suite(payload: dict) -> list[str]:
    problems = check_fields(payload, ACTION)
    if payload.get("action") not in ("requested", "rerequested"):
        return problems
    return problems + _suite_pulls(payload, "check_suite")


def check_run(payload: dict) -> list[str]:
    problems = check_fields(payload, ACTION)
    action = payload.get("action")
    if action == "requested_action":
        problems += check_fields(payload, {"requested_action": an_object,
                                           "requested_action.identifier": text})
    elif action != "rerequested":
        return problems
    return problems + _suite_pulls(payload, "check_run")


def issue_comment(payload: dict) -> list[str]:
    problems = check_fields(payload, ACTION)
    if payload.get("action") not in ("created", "edited"):
        return problems
    return problems + check_fields(payload, {
        **COMMON, "issue": an_object, "issue.number": an_id, "issue.pull_request?": anything,
        "comment": an_object, "comment.id": an_id, "comment.body?": text,
        "comment.user": an_object, "comment.user.login": a_login, "comment.user.type?": text,
        "changes?": an_object, "changes.body?": an_object, "changes.body.from?": text})


def installation(payload: dict) -> list[str]:
    problems = check_fields(payload, {
        **ACTION, "installation": an_object, "installation.id": an_id,
        "installation.account": an_object, "installation.account.login": a_login,
        "repositories?": a_list, "repositories_added?": a_list,
        "repositories_removed?": a_list})
    for key in ("repositories", "repositories_added", "repositories_removed"):
        problems += check_items(payload, key, {"full_name": a_repo_name})
    return problems


EVENTS: dict[str, Callable[[dict], list[str]]] = {
    "pull_request": pull_request, "push": push, "check_suite": check_suite,
    "check_run": check_run, "issue_comment": issue_comment, "installation": installation,
    "installation_repositories": installation,
}


def problems(event: str, payload: dict) -> list[str]:
    """Why ``payload`` does not fit ``event``'s schema (empty when it does, or when FastCI does
    not act on the event)."""
    check = EVENTS.get(event)
    return check(payload) if check is not None else []
