"""Routing: which webhook deliveries become which work. Pure functions over the payload.

Each event maps to one `Work` (a plain, JSON-able job description with no secrets) or to an
`Ignored` with the reason, which the webhook's 202 body reports. Payloads that do not fit the
event's schema (app/schema.py: a missing field GitHub always sends, a wrong type, an id out of
range) raise `PayloadError`, which the webhook answers with 422.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

from fastci.runner.errors import FastCIError

from . import schema

COMMAND_PREFIX = "/fastci"
RUN_ALL, RERUN_FAILED = "run_all", "rerun_failed"
EDITED = "edited"  # the mode of a command Work made from an edited comment: it only gets a reply


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
    updated_at: str | None = None
    """A pull_request event's `pull_request.updated_at`: GitHub's time of the event, never
    earlier than its head change, so it orders heads (queue.Queues.supersede). None for work
    that carries no such order (check suites, commands): the job asks the API."""

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


def route(event: str, payload: Any, allowed_bots: frozenset[str] = frozenset()
          ) -> Work | Ignored:
    """``allowed_bots``: the bot logins whose comments are commands (FASTCI_ALLOWED_BOTS)."""
    if not isinstance(payload, dict):
        raise PayloadError("the body must be a JSON object")
    handler = _HANDLERS.get(event)
    if handler is None:
        return Ignored(f"FastCI does not act on {event!r} events")
    problems = schema.problems(event, payload)
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise PayloadError(f"the {event} payload does not fit: " + "; ".join(problems[:3])
                           + more)
    try:
        if handler is _issue_comment:
            return _issue_comment(payload, allowed_bots)
        return handler(payload)
    except (KeyError, TypeError, AttributeError) as exc:
        raise PayloadError(f"{event} payload is missing or mistypes {exc}") from None


# -- which line of a comment is a command -----------------------------------------------------
# GitHub renders comments as (GitHub-flavoured) CommonMark: a `/fastci` line that a reader sees
# as code or as a quotation is not a command, one on any other line of the comment is.
_FENCE = re.compile(r"^(`{3,}|~{3,})(.*)$")
_BACKTICKS = re.compile(r"`+")
_SETEXT = re.compile(r"^(=+|-+)\s*$")
_LIST_ITEM = re.compile(r"^([-+*]|\d{1,9}[.)])(\s|$)")
_ONE_LINE_BLOCK = re.compile(r"^(#{1,6}(\s|$)|([-*_])[ \t]*(\3[ \t]*){2,}$)")


def command_line(body: str) -> str | None:
    """The first line of ``body`` that is a ``/fastci`` command, stripped; None when none is.

    Lines inside fenced (``` or ~~~) or indented code blocks, block quotes (their lazy
    continuation lines too) and inline code spans are never commands."""
    paragraph: list[str] = []
    fence: tuple[str, int] | None = None
    quoted_fence: tuple[str, int] | None = None
    previous = "blank"  # blank | paragraph | heading | quote | quoted-block | code | fence
    for raw in body.splitlines():
        line = raw.expandtabs(4)
        text = line.lstrip(" ")
        if fence is not None:
            if len(line) - len(text) < 4 and _closes(text, fence):
                fence = None
            continue
        kind = _line_kind(text, len(line) - len(text), previous, paragraph)
        if kind == "quote":
            kind, quoted_fence = _quoted(text, quoted_fence)
        else:
            quoted_fence = None  # a fence in a block quote ends with the quote
        if kind in ("line", "lazy", "setext"):
            paragraph = [*paragraph, text] if kind == "line" else \
                [] if kind == "setext" else paragraph
            previous = {"line": "paragraph", "setext": "heading"}.get(kind, previous)
            continue
        if (found := _command_in(paragraph)) is not None:
            return found
        paragraph = [text] if kind == "item" else []
        fence = _opens(text) if kind == "fence" else None
        previous = "paragraph" if kind == "item" else kind
    return _command_in(paragraph)


def _line_kind(text: str, indent: int, previous: str, paragraph: list[str]) -> str:
    """What a line (outside a fenced block) is, given what came before it: a line of the
    current paragraph ("line"), a lazy line of a quote ("lazy"), a list item starting a
    paragraph ("item"), the underline that makes the paragraph a heading ("setext"), or the
    start of another block (blank, code, fence, heading, quote)."""
    if not text.strip():
        return "blank"
    if indent >= 4:
        return {"paragraph": "line", "quote": "lazy"}.get(previous, "code")
    if _opens(text) is not None:
        return "fence"
    if previous == "paragraph" and _SETEXT.match(text) and not _LIST_ITEM.match(paragraph[0]):
        return "setext"  # the paragraph was a heading's text
    if _ONE_LINE_BLOCK.match(text):
        return "heading"  # an ATX heading or a thematic break
    if text.startswith(">"):
        return "quote"
    if _LIST_ITEM.match(text):
        return "item"
    return "lazy" if previous == "quote" else "line"


def _opens(text: str) -> tuple[str, int] | None:
    """The fence (character, length) a line opens, if it opens one."""
    opening = _FENCE.match(text)
    if opening is None or (opening.group(1)[0] == "`" and "`" in opening.group(2)):
        return None
    return opening.group(1)[0], len(opening.group(1))


def _closes(text: str, fence: tuple[str, int]) -> bool:
    closing = _FENCE.match(text.rstrip())
    return closing is not None and closing.group(1)[0] == fence[0] and \
        len(closing.group(1)) >= fence[1] and not closing.group(2).strip()


def _quoted(text: str, fence: tuple[str, int] | None) -> tuple[str, tuple[str, int] | None]:
    """What a block-quote line leaves open: "quote" when it ends in paragraph text (so the
    next unquoted line continues it lazily), else "quoted-block"; and the fence open in it."""
    inner = text
    while inner.lstrip(" ").startswith(">"):
        inner = inner.lstrip(" ")[1:]
        inner = inner[1:] if inner.startswith(" ") else inner
    content = inner.lstrip(" ")
    if fence is not None:
        return "quoted-block", None if _closes(content, fence) else fence
    if (opened := _opens(content)) is not None:
        return "quoted-block", opened
    if not content.strip() or len(inner) - len(content) >= 4:
        return "quoted-block", None
    return "quote", None


def _command_in(paragraph: list[str]) -> str | None:
    """The first line of a paragraph that starts with the prefix outside an inline code span."""
    text = "\n".join(paragraph)
    spans = _code_spans(text)
    start = 0
    for line in paragraph:
        inside = any(a < start < b for a, b in spans)
        if not inside and _is_command(line):
            return line.strip()
        start += len(line) + 1
    return None


def _is_command(line: str) -> bool:
    rest = line[len(COMMAND_PREFIX):]
    return line.startswith(COMMAND_PREFIX) and (not rest or rest[0].isspace())


def _code_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of each inline code span: a backtick run up to the next run of the same
    length (CommonMark); an unmatched run is literal text."""
    runs = [m for m in _BACKTICKS.finditer(text)
            if not (m.start() and text[m.start() - 1] == "\\")]
    spans, i = [], 0
    while i < len(runs):
        closer = next((j for j in range(i + 1, len(runs))
                       if len(runs[j].group()) == len(runs[i].group())), None)
        if closer is None:
            i += 1
            continue
        spans.append((runs[i].start(), runs[closer].end()))
        i = closer + 1
    return spans


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
                sender=payload["sender"]["login"], updated_at=pr.get("updated_at"))


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


def _issue_comment(payload: dict, allowed_bots: frozenset[str] = frozenset()) -> Work | Ignored:
    action = payload["action"]
    if action not in ("created", EDITED):
        return Ignored(f"issue_comment {action}: only new comments are commands")
    issue, comment = payload["issue"], payload["comment"]
    line = command_line(comment.get("body") or "")
    if line is None:
        return Ignored("the comment is not a /fastci command")
    if action == EDITED:
        before = ((payload.get("changes") or {}).get("body") or {}).get("from")
        if isinstance(before, str) and command_line(before) == line:
            return Ignored("an edit of a comment whose command was already read")
    author = comment["user"]
    if author.get("type") == "Bot" and author["login"].lower() not in allowed_bots:
        return Ignored(f"{author['login']} is a bot; its comments are not commands unless "
                       "FASTCI_ALLOWED_BOTS lists it")
    if "pull_request" not in issue:
        return Ignored("/fastci commands work on pull requests, not issues")
    # An edit is never run: its Work only tells the writer so (commands.handle_command).
    return Work("command", _repo(payload), _installation(payload), number=int(issue["number"]),
                comment_id=int(comment["id"]), sender=author["login"], body=line[:2000],
                mode=EDITED if action == EDITED else "select")


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
