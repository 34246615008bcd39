"""A fake of GitHub's REST API on a real local socket, answering in the shapes GitHub sends.

It ships with FastCI (in fastci.testing, outside the App) for `fastci demo --app`; FastCI's
tests use it through ``tests/fakegithub.py``. FastCI talks to GitHub only through PyGithub, so
its tests point PyGithub's ``base_url`` at this server instead of mocking HTTP. Every response
body starts from one of the project's fixtures (``fastci/testing/fixtures/rest``: the field
names, types, status codes and headers of GitHub's recorded answers, with values of the
project's own) with the ids, names, shas, states and urls of the request filled in, so PyGithub
parses them exactly as it parses GitHub's. The fake keeps the state a test inspects afterwards
(check runs with their accumulated annotations, comments, reactions, tokens, every request),
validates requests the way GitHub does, and can be told to fail the way GitHub fails.

Shapes no recording holds are derived, and say so in their fixture: the pull request and its
issue view (from the ``pull_request`` and ``issue_comment`` webhook payloads, which carry the
same REST objects) and the App's webhook deliveries (from GitHub's documented delivery fields,
the ones PyGithub's ``HookDeliverySummary`` parses). tests/test_fixtures_contract.py checks
the fixtures against the recordings where those lie beside the checkout.

    with FakeGitHub() as fake:
        fake.register_app(APP_ID, public_key_pem)
        fake.add_repo("octo/widgets", installation_id=7)
        integration = github.GithubIntegration(auth=github.Auth.AppAuth(APP_ID, private_key),
                                               base_url=fake.url)
        ...
        assert fake.check_runs("octo/widgets")[0]["annotations"]
"""

from __future__ import annotations

import base64
import copy
import functools
import itertools
import json
import math
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

import jwt
from werkzeug.exceptions import HTTPException
from werkzeug.routing import Map, Rule
from werkzeug.serving import WSGIRequestHandler, make_server
from werkzeug.wrappers import Request, Response

from . import FIXTURES

# The fixtures name GitHub's API by this root; the fake serves every url under its own.
RECORDED_API_ROOT = "https://api.github.com"
DOCS = "https://docs.github.com/rest"

# GitHub's vocabularies and limits (REST docs, "Create a check run", "Create reaction").
STATUSES = ("queued", "in_progress", "completed", "waiting", "requested", "pending")
CONCLUSIONS = ("action_required", "cancelled", "failure", "neutral", "success", "skipped",
               "stale", "timed_out")
ANNOTATION_LEVELS = ("notice", "warning", "failure")
REACTIONS = ("+1", "-1", "laugh", "confused", "heart", "hooray", "rocket", "eyes")
MAX_OUTPUT_CHARS = 65535
MAX_ANNOTATIONS = 50
MAX_ACTIONS = 3
ACTION_LIMITS = {"label": 20, "description": 40, "identifier": 20}
MAX_COMMENT_CHARS = 65536
TOKEN_LIFETIME_S = 3600
MAX_JWT_LIFETIME_S = 600
PERMISSION_LEVELS = {"read": 1, "write": 2, "admin": 3}
RATE_LIMIT = 5000  # an installation's hourly budget
RATE_WINDOW_S = 3600

# Messages GitHub sends that the recordings do not hold (each seen in GitHub's answers as quoted
# in public bug reports); the recorded ones are in the fixtures.
BAD_CREDENTIALS = "Bad credentials"
REQUIRES_AUTHENTICATION = "Requires authentication"
JWT_UNDECODABLE = "A JSON web token could not be decoded"
JWT_TOO_LONG = "'Expiration time' claim ('exp') is too far in the future"
PROBLEMS_PARSING_JSON = "Problems parsing JSON"
# OAuth's web flow (docs.github.com/apps/creating-github-apps/authenticating-with-a-github-app/
# generating-a-user-access-token-for-a-github-app): a code lives ten minutes and is used once;
# a bad one is answered 200 with an error object, not an HTTP error.
OAUTH_CODE_LIFETIME_S = 600
BAD_VERIFICATION_CODE = {
    "error": "bad_verification_code",
    "error_description": "The code passed is incorrect or expired.",
    "error_uri": "https://docs.github.com/apps/managing-oauth-apps/"
                 "troubleshooting-oauth-app-access-token-request-errors/#bad-verification-code"}
INCORRECT_CLIENT_CREDENTIALS = {
    "error": "incorrect_client_credentials",
    "error_description": "The client_id and/or client_secret passed are incorrect.",
    "error_uri": "https://docs.github.com/apps/managing-oauth-apps/"
                 "troubleshooting-oauth-app-access-token-request-errors/"
                 "#incorrect-client-credentials"}
READ_LEVELS = ("read", "triage", "write", "maintain", "admin")
SECONDARY_RATE_LIMIT = ("You have exceeded a secondary rate limit. Please wait a few minutes "
                        "before you try again. If you reach out to GitHub Support for help, "
                        "please include the request ID {request_id}.")
PRIMARY_RATE_LIMIT = "API rate limit exceeded for installation ID {installation_id}."


# ---------------------------------------------------------------------------------------------
# The shapes GitHub answers in


@dataclass(frozen=True)
class Shapes:
    """GitHub's response bodies the fake fills in, one per fixture in ``rest/``."""

    check_run: dict
    annotation: dict
    token: dict
    installation: dict
    app: dict
    user: dict
    repo: dict
    comment: dict
    reaction: dict
    permission: dict
    not_found: dict
    expired_jwt: dict
    no_push: dict
    not_granted: dict
    pull: dict
    issue: dict
    oauth_token: dict
    installation_repositories: dict


def rest_fixture(name: str, fixtures: Path = FIXTURES) -> dict:
    """One REST fixture: method, path, status, headers and the body GitHub answers with."""
    return json.loads((fixtures / "rest" / f"{name}.json").read_text(encoding="utf-8"))


@functools.lru_cache(maxsize=4)
def load_shapes(fixtures: Path = FIXTURES) -> Shapes:
    """Read each shape once per process from the project's fixtures."""
    def body(name: str) -> Any:
        return rest_fixture(name, fixtures)["body"]

    app = body("app")
    return Shapes(
        check_run=body("check_run"), annotation=body("annotations")[0], token=body("token"),
        installation=body("installation"), app=app, user=app["owner"], repo=body("repo"),
        comment=body("comment"), reaction=body("reaction"), permission=body("permission"),
        not_found=body("not_found"), expired_jwt=body("expired_jwt"), no_push=body("no_push"),
        not_granted=body("not_granted"), pull=body("pull"), issue=body("issue"),
        oauth_token=body("oauth_token"),
        installation_repositories=body("installation_repositories"))


def rebased(value: Any, replacements: dict[str, str]) -> Any:
    """``value`` with every string's ``old`` parts replaced by ``new`` (urls, names, logins)."""
    if isinstance(value, str):
        for old, new in replacements.items():
            value = value.replace(old, new)
        return value
    if isinstance(value, dict):
        return {key: rebased(item, replacements) for key, item in value.items()}
    if isinstance(value, list):
        return [rebased(item, replacements) for item in value]
    return value


def node_id(kind: str, number: int) -> str:
    """GitHub's legacy global node id, e.g. base64("08:CheckRun1296028076") as recorded."""
    return base64.b64encode(f"0{len(kind)}:{kind}{number}".encode()).decode()


def iso(timestamp: float) -> str:
    """GitHub's timestamp format, e.g. 2023-06-19T08:14:58Z."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(timestamp))


# ---------------------------------------------------------------------------------------------
# Validation, as GitHub validates: pure functions from a request body to the problems in it


@dataclass(frozen=True)
class Problem:
    """One reason GitHub refuses a request, in GitHub's error-object terms.

    ``schema`` problems are the ones GitHub's request-schema check finds ("Invalid request."),
    which runs before its model validation ("Validation Failed").
    """

    resource: str
    field: str
    code: str
    message: str
    schema: bool = True

    def as_error(self) -> dict:
        return {"resource": self.resource, "code": self.code, "field": self.field,
                "message": self.message}


def _missing(resource: str, where: str, body: dict, names: tuple[str, ...]) -> list[Problem]:
    return [Problem(resource, where + name, "missing_field", f'"{name}" wasn\'t supplied.')
            for name in names if body.get(name) in (None, "")]


def _not_member(resource: str, where: str, body: dict, name: str,
                allowed: tuple[str, ...]) -> list[Problem]:
    if name not in body or body[name] in allowed:
        return []
    return [Problem(resource, where + name, "invalid",
                    f"For 'properties/{name}', {json.dumps(body[name])} is not a member of "
                    f"{json.dumps(list(allowed))}.")]


def _too_long(resource: str, where: str, body: dict, name: str, limit: int) -> list[Problem]:
    value = body.get(name)
    if not isinstance(value, str) or len(value) <= limit:
        return []
    return [Problem(resource, where + name, "custom",
                    f"Only {limit} characters are allowed; {len(value)} were supplied.")]


def _too_many(resource: str, name: str, items: list, limit: int) -> list[Problem]:
    if len(items) <= limit:
        return []
    return [Problem(resource, name, "custom",
                    f"No more than {limit} items are allowed; {len(items)} were supplied.")]


def check_run_problems(body: dict, *, creating: bool) -> list[Problem]:
    """What GitHub would refuse in a create (POST) or update (PATCH) check-run body."""
    problems = _missing("CheckRun", "", body, ("name", "head_sha")) if creating else []
    problems += _not_member("CheckRun", "", body, "status", STATUSES)
    problems += _not_member("CheckRun", "", body, "conclusion", CONCLUSIONS)
    completing = body.get("status") == "completed" or "completed_at" in body
    if completing and body.get("conclusion") is None:
        problems += _missing("CheckRun", "", body, ("conclusion",))
    if body.get("output") is not None:
        problems += output_problems(body["output"])
    if body.get("actions") is not None:
        problems += actions_problems(body["actions"])
    return problems


def output_problems(output: dict) -> list[Problem]:
    """``output`` needs a title and a summary; summary and text are capped in characters by the
    schema and in UTF-8 bytes by the model, which is what catches emoji-heavy summaries."""
    problems = _missing("CheckRun", "output.", output, ("title", "summary"))
    for name in ("summary", "text"):
        problems += _too_long("CheckRun", "output.", output, name, MAX_OUTPUT_CHARS)
    annotations = output.get("annotations") or []
    problems += _too_many("CheckRun", "output.annotations", annotations, MAX_ANNOTATIONS)
    for i, annotation in enumerate(annotations):
        problems += annotation_problems(annotation, f"output.annotations[{i}].")
    for name in ("summary", "text"):
        value = output.get(name)
        if isinstance(value, str) and len(value.encode()) > MAX_OUTPUT_CHARS:
            problems.append(Problem("CheckRun", name, "custom",
                                    f"{name} exceeds a maximum bytesize of {MAX_OUTPUT_CHARS}",
                                    schema=False))
    return problems


def annotation_problems(annotation: dict, where: str) -> list[Problem]:
    """An annotation needs a place, a level and a message; columns only within one line."""
    problems = _missing("CheckRun", where, annotation,
                        ("path", "start_line", "end_line", "annotation_level", "message"))
    problems += _not_member("CheckRun", where, annotation, "annotation_level", ANNOTATION_LEVELS)
    has_columns = "start_column" in annotation or "end_column" in annotation
    if has_columns and annotation.get("start_line") != annotation.get("end_line"):
        problems.append(Problem(
            "CheckRun", where + "start_column", "invalid",
            "Annotations only support start_column and end_column on the same line.",
            schema=False))
    return problems


def actions_problems(actions: list) -> list[Problem]:
    """At most three requested-action buttons, each with short label/description/identifier."""
    problems = _too_many("CheckRun", "actions", actions, MAX_ACTIONS)
    for i, action in enumerate(actions):
        where = f"actions[{i}]."
        problems += _missing("CheckRun", where, action, tuple(ACTION_LIMITS))
        for name, limit in ACTION_LIMITS.items():
            problems += _too_long("CheckRun", where, action, name, limit)
    return problems


def comment_problems(body: dict) -> list[Problem]:
    """A comment needs a body of at most 65536 characters (a model check on GitHub)."""
    problems = _missing("IssueComment", "", body, ("body",))
    text = body.get("body")
    if isinstance(text, str) and len(text) > MAX_COMMENT_CHARS:
        problems.append(Problem("IssueComment", "data", "unprocessable",
                                f"Body is too long (maximum is {MAX_COMMENT_CHARS} characters)",
                                schema=False))
    return problems


def reaction_problems(body: dict) -> list[Problem]:
    """A reaction's content is one of GitHub's eight."""
    return (_missing("Reaction", "", body, ("content",))
            or _not_member("Reaction", "", body, "content", REACTIONS))


def newest_of_each_name(runs: list[dict]) -> list[dict]:
    """The first run of each name in a newest-first list (GitHub's ``filter=latest``)."""
    seen: set[str] = set()
    newest = []
    for run in runs:
        if run["name"] not in seen:
            seen.add(run["name"])
            newest.append(run)
    return newest


def grants(granted: dict[str, str], requested: dict[str, str]) -> bool:
    """Whether an installation's permissions cover those a token asks for (read < write < admin)."""
    return all(PERMISSION_LEVELS.get(level, 0) <= PERMISSION_LEVELS.get(granted.get(name), 0)
               for name, level in requested.items())


def unprocessable(problems: list[Problem], documentation_url: str) -> dict:
    """GitHub's 422 body: schema problems first, as "Invalid request." with their texts;
    otherwise the model's "Validation Failed". Both carry the error objects."""
    schema = [p for p in problems if p.schema]
    shown = schema or problems
    message = ("Invalid request.\n\n" + "\n".join(p.message for p in schema) if schema
               else "Validation Failed")
    return {"message": message, "errors": [p.as_error() for p in shown],
            "documentation_url": documentation_url}


# ---------------------------------------------------------------------------------------------
# State


class Reply(Exception):
    """An HTTP answer. Handlers return one; raising one answers at once (errors)."""

    def __init__(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        super().__init__(status)
        self.status = status
        self.body = body
        self.headers = headers or {}


@dataclass(frozen=True)
class RecordedRequest:
    """What a client sent, and what the fake answered, for assertions."""

    method: str
    path: str
    query: dict[str, str]
    json: Any
    headers: dict[str, str]
    status: int


@dataclass
class _App:
    id: int
    slug: str
    name: str
    public_key: str | None
    permissions: dict[str, str]
    events: list[str]
    client_id: str | None = None
    client_secret: str | None = None


@dataclass
class _Installation:
    id: int
    app_id: int
    account: str
    repos: set[str] = field(default_factory=set)


@dataclass
class _Repo:
    full_name: str
    installation_id: int
    default_branch: str
    private: bool
    caller_has_push: bool
    permissions: dict[str, tuple[str, str]] = field(default_factory=dict)
    pulls: dict[int, dict] = field(default_factory=dict)


@dataclass
class _CheckRun:
    repo: str
    served: dict
    annotations: list[dict] = field(default_factory=list)
    actions: list[dict] = field(default_factory=list)


@dataclass
class _Comment:
    repo: str
    number: int
    served: dict
    reactions: list[dict] = field(default_factory=list)


@dataclass(frozen=True)
class _Token:
    installation_id: int
    expires_at: float


@dataclass(frozen=True)
class _Grant:
    """An OAuth code GitHub handed the browser, for one user of one App."""

    login: str
    app_id: int
    redirect_uri: str
    expires_at: float


@dataclass(frozen=True)
class _UserToken:
    login: str
    app_id: int
    expires_at: float


@dataclass
class _Fault:
    remaining: int
    kind: str
    status: int
    method: str | None
    path: re.Pattern[str] | None
    retry_after: int
    reset_in: int

    def matches(self, method: str, path: str) -> bool:
        return (self.remaining > 0 and (self.method is None or self.method == method)
                and (self.path is None or bool(self.path.search(path))))


class Hold:
    """One request held after GitHub has acted on it and before its answer leaves: the
    client is stopped at a known point (a check run created, its creator not yet told)
    while the test changes the world around it. `arrived` is set when the request comes;
    the answer leaves on `release()`, or after `timeout` seconds."""

    def __init__(self, method: str, path: str, body: dict | None, timeout: float) -> None:
        self.method, self.path, self.body, self.timeout = method, re.compile(path), body, timeout
        self.arrived = threading.Event()
        self._released = threading.Event()
        self.taken = False

    def matches(self, method: str, path: str, payload: Any) -> bool:
        if self.taken or method != self.method or not self.path.search(path):
            return False
        return not self.body or (isinstance(payload, dict)
                                 and all(payload.get(k) == v for k, v in self.body.items()))

    def wait(self) -> None:
        self.arrived.set()
        self._released.wait(self.timeout)

    def release(self) -> None:
        self._released.set()


def _payload(request: Request) -> Any:
    """The request's JSON, whatever its Content-Type says (GitHub parses it regardless)."""
    return request.get_json(force=True, silent=True)


class _QuietHandler(WSGIRequestHandler):
    """Keeps werkzeug's per-request lines out of the test output, but not its errors (a bug in
    the fake answers 500, which PyGithub would otherwise retry in silence)."""

    def log(self, type: str, message: str, *args: Any) -> None:
        if type != "info":
            super().log(type, message, *args)


# ---------------------------------------------------------------------------------------------
# The fake


_ROUTES = Map([
    Rule("/app", methods=["GET"], endpoint="get_app"),
    Rule("/app/installations", methods=["GET"], endpoint="list_installations"),
    Rule("/app/installations/<int:installation_id>", methods=["GET"],
         endpoint="get_installation"),
    Rule("/app/installations/<int:installation_id>/access_tokens", methods=["POST"],
         endpoint="create_token"),
    Rule("/app/hook/deliveries", methods=["GET"], endpoint="list_deliveries"),
    Rule("/app/hook/deliveries/<int:delivery_id>/attempts", methods=["POST"],
         endpoint="redeliver"),
    Rule("/repos/<owner>/<name>/installation", methods=["GET"], endpoint="get_repo_installation"),
    Rule("/repos/<owner>/<name>", methods=["GET"], endpoint="get_repo"),
    Rule("/repos/<owner>/<name>/check-runs", methods=["POST"], endpoint="create_check_run"),
    Rule("/repos/<owner>/<name>/check-runs/<int:run_id>", methods=["GET"],
         endpoint="get_check_run"),
    Rule("/repos/<owner>/<name>/check-runs/<int:run_id>", methods=["PATCH"],
         endpoint="update_check_run"),
    Rule("/repos/<owner>/<name>/check-runs/<int:run_id>/annotations", methods=["GET"],
         endpoint="list_annotations"),
    Rule("/repos/<owner>/<name>/commits/<path:ref>/check-runs", methods=["GET"],
         endpoint="list_check_runs_for_ref"),
    Rule("/repos/<owner>/<name>/pulls/<int:number>", methods=["GET"], endpoint="get_pull"),
    Rule("/repos/<owner>/<name>/issues/<int:number>", methods=["GET"], endpoint="get_issue"),
    Rule("/repos/<owner>/<name>/issues/<int:number>/comments", methods=["GET"],
         endpoint="list_comments"),
    Rule("/repos/<owner>/<name>/issues/<int:number>/comments", methods=["POST"],
         endpoint="create_comment"),
    Rule("/repos/<owner>/<name>/issues/comments/<int:comment_id>", methods=["GET"],
         endpoint="get_comment"),
    Rule("/repos/<owner>/<name>/issues/comments/<int:comment_id>", methods=["PATCH"],
         endpoint="edit_comment"),
    Rule("/repos/<owner>/<name>/issues/comments/<int:comment_id>/reactions", methods=["GET"],
         endpoint="list_reactions"),
    Rule("/repos/<owner>/<name>/issues/comments/<int:comment_id>/reactions", methods=["POST"],
         endpoint="create_reaction"),
    Rule("/repos/<owner>/<name>/collaborators/<user>/permission", methods=["GET"],
         endpoint="get_permission"),
    # OAuth's web flow (on github.com, not the API host; the fake serves both) and what a
    # user-to-server token reads.
    Rule("/login/oauth/authorize", methods=["GET"], endpoint="authorize_page"),
    Rule("/login/oauth/authorize", methods=["POST"], endpoint="authorize"),
    Rule("/login/oauth/access_token", methods=["POST"], endpoint="oauth_token"),
    Rule("/user", methods=["GET"], endpoint="get_user"),
    Rule("/user/installations", methods=["GET"], endpoint="list_user_installations"),
    Rule("/user/installations/<int:installation_id>/repositories", methods=["GET"],
         endpoint="list_user_installation_repos"),
], strict_slashes=False)


class FakeGitHub:
    """GitHub's REST API for one test: a werkzeug server on 127.0.0.1, a random port.

    Set up with ``register_app`` (with ``client_id``/``client_secret``, the sign-in of OAuth's
    web flow: ``/login/oauth/*``, then ``/user`` and ``/user/installations``), ``add_repo``,
    ``add_pull``, ``push``, ``add_comment``, ``set_permission``, ``add_delivery``; inspect
    with ``check_runs``, ``comments``, ``reactions``, ``redeliveries``, ``requests`` and
    ``attempts``; break with ``fail_next`` and ``rate_limit_next``; move GitHub's clock
    with ``advance``.

    Its answers are built from the fixtures in ``fixtures`` (the packaged ones by default).
    """

    def __init__(self, fixtures: Path = FIXTURES) -> None:
        self._shapes = load_shapes(fixtures)
        self._lock = threading.RLock()
        self._ids = itertools.count(1001)
        self._clock_offset = 0.0
        self._apps: dict[int, _App] = {}
        self._installations: dict[int, _Installation] = {}
        self._repos: dict[str, _Repo] = {}
        self._repo_ids: dict[str, int] = {}
        self._user_ids: dict[str, int] = {}
        self._tokens: dict[str, _Token] = {}
        self._runs: dict[int, _CheckRun] = {}
        self._suites: dict[tuple[str, str, int], int] = {}
        self._comments: dict[int, _Comment] = {}
        self._deliveries: list[dict] = []
        self._grants: dict[str, _Grant] = {}
        self._user_tokens: dict[str, _UserToken] = {}
        self._faults: list[_Fault] = []
        self._holds: list[Hold] = []
        self._rate_used = 0
        self._rate_reset = int(self._now()) + RATE_WINDOW_S
        self.redeliveries: list[int] = []
        self.requests: list[RecordedRequest] = []
        self._server = make_server("127.0.0.1", 0, self._wsgi, threaded=True,
                                   request_handler=_QuietHandler)
        self.url = f"http://127.0.0.1:{self._server.server_port}"
        self._thread: threading.Thread | None = None

    # -- lifecycle --------------------------------------------------------------------------

    def __enter__(self) -> FakeGitHub:
        # A short poll keeps shutdown (which waits for the next poll) from costing 0.5 s a test.
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.01,),
                                        daemon=True, name="fakegithub")
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    # -- set-up -----------------------------------------------------------------------------

    def register_app(self, app_id: int, public_key_pem: str | None = None, *,
                     slug: str = "fastci", name: str = "FastCI",
                     permissions: dict[str, str] | None = None,
                     events: list[str] | None = None, client_id: str | None = None,
                     client_secret: str | None = None) -> None:
        """A GitHub App whose JWTs verify against ``public_key_pem`` (none: no JWT verifies).

        The default permissions and events are the ones FastCI asks for. ``client_id`` and
        ``client_secret``: the App's OAuth credentials, for the user-to-server sign-in.
        """
        with self._lock:
            self._apps[app_id] = _App(
                app_id, slug, name, public_key_pem,
                permissions or {"checks": "write", "contents": "read", "issues": "write",
                                "metadata": "read", "pull_requests": "write"},
                events or ["check_run", "check_suite", "issue_comment", "pull_request", "push"],
                client_id, client_secret)

    def add_repo(self, full_name: str, *, installation_id: int, app_id: int | None = None,
                 default_branch: str = "main", private: bool = False,
                 caller_has_push: bool = True) -> int:
        """A repository the App is installed on; returns its id.

        ``caller_has_push=False`` makes collaborator-permission lookups answer GitHub's 403.
        """
        with self._lock:
            app_id = app_id if app_id is not None else self._only_app_id()
            installation = self._installations.setdefault(
                installation_id, _Installation(installation_id, app_id, full_name.split("/")[0]))
            installation.repos.add(full_name.lower())
            self._repos[full_name.lower()] = _Repo(full_name, installation_id, default_branch,
                                                   private, caller_has_push)
            return self._repo_id(full_name)

    def add_pull(self, repo: str, number: int, *, head_sha: str, head_ref: str = "feature",
                 head_repo: str | None = None, base_ref: str | None = None,
                 base_sha: str = "0" * 40, user: str = "octocat",
                 author_association: str = "CONTRIBUTOR", title: str = "Change",
                 body: str | None = None) -> None:
        """An open pull request; ``head_repo`` other than ``repo`` makes it a fork's."""
        with self._lock:
            state = self._repos[repo.lower()]
            state.pulls[number] = {
                "id": next(self._ids), "issue_id": next(self._ids), "head_sha": head_sha,
                "head_ref": head_ref, "head_repo": head_repo or state.full_name,
                "base_ref": base_ref or state.default_branch, "base_sha": base_sha,
                "user": user, "author_association": author_association, "title": title,
                "body": body, "created_at": iso(self._now())}

    def push(self, repo: str, number: int, head_sha: str) -> None:
        """A push (or force-push) to the pull request's head branch: its head becomes
        ``head_sha`` now, and its ``updated_at`` moves with it."""
        with self._lock:
            pull = self._repos[repo.lower()].pulls[number]
            pull.update(head_sha=head_sha, updated_at=iso(self._now()))

    def add_comment(self, repo: str, number: int, body: str, *, user: str = "octocat",
                    author_association: str = "CONTRIBUTOR") -> int:
        """A comment a person wrote (e.g. a slash command); returns its id."""
        with self._lock:
            state = self._repos[repo.lower()]
            if number not in state.pulls:
                raise ValueError(f"add_pull({repo!r}, {number}, ...) first: the fake's only "
                                 "issues are pull requests")
            return self._new_comment(state, number, body, self._user_json(user),
                                     author_association, None)

    def set_permission(self, repo: str, user: str, permission: str,
                       role_name: str | None = None) -> None:
        """``user``'s permission on ``repo``: admin, write, read or none (role name alike)."""
        with self._lock:
            self._repos[repo.lower()].permissions[user.lower()] = (permission,
                                                                   role_name or permission)

    def add_delivery(self, guid: str, event: str, *, action: str | None = None,
                     status_code: int = 200, installation_id: int | None = None,
                     repository_id: int | None = None, redelivery: bool = False) -> int:
        """A webhook delivery GitHub made to the App (as GET /app/hook/deliveries lists it).

        Derived shape: the replay holds no delivery; these are GitHub's documented fields, the
        ones PyGithub's HookDeliverySummary parses. ``redelivery=True``: GitHub's later
        attempt at an earlier delivery, listed with the same ``guid``. The list is newest
        first, paged by ``Link`` headers.
        """
        with self._lock:
            delivery_id = next(self._ids)
            self._deliveries.append({
                "id": delivery_id, "guid": guid, "delivered_at": iso(self._now()),
                "redelivery": redelivery, "duration": 0.05,
                "status": "OK" if status_code < 300 else f"Invalid HTTP Response: {status_code}",
                "status_code": status_code, "event": event, "action": action,
                "installation_id": installation_id, "repository_id": repository_id,
                "throttled_at": None})
            return delivery_id

    def mint_token(self, installation_id: int) -> str:
        """An installation token, as POST .../access_tokens would mint (no JWT needed)."""
        with self._lock:
            return self._mint(installation_id)

    def advance(self, seconds: float) -> None:
        """Move GitHub's clock. Tokens expire by it; PyGithub still signs JWTs by the real
        clock, so after more than ten minutes its JWTs read as expired (a lagging client)."""
        with self._lock:
            self._clock_offset += seconds

    # -- inspection -------------------------------------------------------------------------

    def check_runs(self, repo: str) -> list[dict]:
        """The repo's check runs as GitHub serves them, oldest first, each with its
        ``annotations`` (all batches, in order) and its latest ``actions`` added."""
        with self._lock:
            return [{**copy.deepcopy(run.served), "annotations": copy.deepcopy(run.annotations),
                     "actions": copy.deepcopy(run.actions)}
                    for run in self._runs.values() if run.repo == repo.lower()]

    def comments(self, repo: str, number: int) -> list[dict]:
        """The comments on issue/PR ``number``, oldest first, as GitHub serves them."""
        with self._lock:
            return [copy.deepcopy(c.served) for c in self._comments.values()
                    if c.repo == repo.lower() and c.number == number]

    def reactions(self, comment_id: int) -> list[dict]:
        """The reactions on a comment, as GitHub serves them."""
        with self._lock:
            return copy.deepcopy(self._comments[comment_id].reactions)

    def attempts(self, method: str | None = None, path: str | None = None) -> int:
        """How many requests arrived (failed ones too), optionally by method and path regex."""
        with self._lock:
            return sum(1 for r in self.requests
                       if (method is None or r.method == method)
                       and (path is None or re.search(path, r.path)))

    # -- faults -----------------------------------------------------------------------------

    def fail_next(self, n: int = 1, *, status: int = 500, method: str | None = None,
                  path: str | None = None) -> None:
        """The next ``n`` matching requests (``path``: a regex searched in the path) answer
        ``status`` before GitHub looks at them."""
        self._add_fault(n, "error", status, method, path)

    def rate_limit_next(self, n: int = 1, *, kind: str = "secondary", method: str | None = None,
                        path: str | None = None, retry_after: int = 60,
                        reset_in: int = 60) -> None:
        """The next ``n`` matching requests hit a rate limit, as GitHub signals it: 403 with the
        secondary-limit message and ``Retry-After: retry_after`` (PyGithub waits that long and
        retries), or 403 "API rate limit exceeded" with ``X-RateLimit-Remaining: 0`` and a reset
        ``reset_in`` seconds away (PyGithub waits until the reset, plus a second)."""
        if kind not in ("secondary", "primary"):
            raise ValueError(f"kind must be 'secondary' or 'primary', not {kind!r}")
        self._add_fault(n, kind, 403, method, path, retry_after, reset_in)

    def hold(self, method: str, path: str, *, body: dict | None = None,
             timeout: float = 60.0) -> Hold:
        """Hold the answer to the next request of `method` whose path matches `path` (and
        whose JSON has `body`'s items), once GitHub has acted on it; see `Hold`."""
        held = Hold(method, path, body, timeout)
        with self._lock:
            self._holds.append(held)
        return held

    def _add_fault(self, n: int, kind: str, status: int, method: str | None, path: str | None,
                   retry_after: int = 0, reset_in: int = 0) -> None:
        with self._lock:
            self._faults.append(_Fault(n, kind, status, method,
                                       re.compile(path) if path else None, retry_after,
                                       reset_in))

    # -- HTTP -------------------------------------------------------------------------------

    def _wsgi(self, environ: dict, start_response: Any) -> Any:
        request = Request(environ)
        with self._lock:
            reply = self._respond(request)
            page = isinstance(reply, Response)  # the sign-in page and its redirect
            self.requests.append(RecordedRequest(
                request.method, request.path, dict(request.args),
                None if page else _payload(request), dict(request.headers),
                reply.status_code if page else reply.status))
            response = reply if page else self._render(reply)
            held = next((h for h in self._holds
                         if h.matches(request.method, request.path, _payload(request))), None)
            if held is not None:
                held.taken = True
        if held is not None:
            held.wait()  # outside the lock: the fake answers everyone else meanwhile
        return response(environ, start_response)

    def _respond(self, request: Request) -> Reply | Response:
        fault = next((f for f in self._faults if f.matches(request.method, request.path)), None)
        if fault is not None:
            fault.remaining -= 1
            return self._fault_reply(fault, request)
        form = request.path.startswith("/login/")  # github.com takes forms there
        if not form and request.get_data() and _payload(request) is None:
            return Reply(400, {"message": PROBLEMS_PARSING_JSON, "documentation_url": DOCS})
        try:
            endpoint, args = _ROUTES.bind("127.0.0.1").match(request.path, request.method)
        except HTTPException:
            return self._not_found(DOCS)
        try:
            return getattr(self, f"_on_{endpoint}")(request, **args)
        except Reply as reply:
            return reply

    def _render(self, reply: Reply) -> Response:
        data = b"" if reply.body is None else json.dumps(reply.body).encode()
        response = Response(data, status=reply.status,
                            content_type="application/json; charset=utf-8")
        response.headers.update(self._rate_headers())
        response.headers["X-GitHub-Media-Type"] = "github.v3; format=json"
        response.headers["X-GitHub-Request-Id"] = secrets.token_hex(8).upper()
        response.headers.update(reply.headers)
        return response

    def _rate_headers(self) -> dict[str, str]:
        """GitHub's rate-limit headers, as recorded on every answer."""
        self._rate_used += 1
        return {"X-RateLimit-Limit": str(RATE_LIMIT),
                "X-RateLimit-Remaining": str(max(0, RATE_LIMIT - self._rate_used)),
                "X-RateLimit-Used": str(self._rate_used),
                "X-RateLimit-Reset": str(self._rate_reset),
                "X-RateLimit-Resource": "core"}

    def _fault_reply(self, fault: _Fault, request: Request) -> Reply:
        if fault.kind == "secondary":
            message = SECONDARY_RATE_LIMIT.format(request_id=secrets.token_hex(8).upper())
            return Reply(fault.status, {
                "message": message,
                "documentation_url": DOCS + "/overview/rate-limits-for-the-rest-api"
                                            "#about-secondary-rate-limits"},
                {"Retry-After": str(fault.retry_after)})
        if fault.kind == "primary":
            token = self._tokens.get(self._credential(request) or "")
            message = PRIMARY_RATE_LIMIT.format(
                installation_id=token.installation_id if token else 0)
            return Reply(fault.status, {
                "message": message,
                "documentation_url": DOCS + "/overview/rate-limits-for-the-rest-api"
                                            "#about-primary-rate-limits"},
                {"X-RateLimit-Remaining": "0", "X-RateLimit-Used": str(RATE_LIMIT),
                 "X-RateLimit-Reset": str(int(self._now()) + fault.reset_in)})
        # No recording holds a 5xx body; PyGithub reads only the status of one.
        return Reply(fault.status, {"message": "Server Error", "documentation_url": DOCS})

    # -- authentication ---------------------------------------------------------------------

    @staticmethod
    def _credential(request: Request) -> str | None:
        """The value of ``Authorization: token X`` or ``Authorization: Bearer X``."""
        scheme, _, value = request.headers.get("Authorization", "").partition(" ")
        return value.strip() if scheme.lower() in ("token", "bearer") and value.strip() else None

    def _authenticated_app(self, request: Request) -> _App:
        """The App whose JWT signed this request, checked as GitHub checks it: RS256 under the
        App's key, ``iss`` the App id, ``exp`` in the future, at most ten minutes after ``iat``
        and at most ten minutes ahead of GitHub's clock."""
        value = self._credential(request)
        if value is None:
            raise Reply(401, {"message": REQUIRES_AUTHENTICATION, "documentation_url": DOCS})
        undecodable = Reply(401, {"message": JWT_UNDECODABLE, "documentation_url": DOCS})
        try:
            issuer = int(jwt.decode(value, options={"verify_signature": False})["iss"])
            app = self._apps[issuer]
            claims = jwt.decode(value, app.public_key or "", algorithms=["RS256"],
                                options={"verify_exp": False, "verify_iat": False,
                                         "require": ["iat", "exp", "iss"]})
        except (jwt.PyJWTError, KeyError, ValueError, TypeError):
            raise undecodable from None
        if not isinstance(claims["iat"], (int, float)):
            raise undecodable
        now = self._now()
        if not isinstance(claims["exp"], (int, float)) or claims["exp"] <= now:
            raise Reply(401, self._shapes.expired_jwt)
        if claims["exp"] - claims["iat"] > MAX_JWT_LIFETIME_S or \
                claims["exp"] > now + MAX_JWT_LIFETIME_S:
            raise Reply(401, {"message": JWT_TOO_LONG, "documentation_url": DOCS})
        return app

    def _authenticated_installation(self, request: Request) -> _Installation:
        """The installation whose unexpired token came with this request."""
        value = self._credential(request)
        if value is None:
            raise Reply(401, {"message": REQUIRES_AUTHENTICATION, "documentation_url": DOCS})
        token = self._tokens.get(value)
        if token is None or token.expires_at <= self._now():
            raise Reply(401, {"message": BAD_CREDENTIALS, "documentation_url": DOCS})
        return self._installations[token.installation_id]

    def _visible_repo(self, request: Request, owner: str, name: str) -> _Repo:
        """The repo, if the token's installation covers it; GitHub hides the others (404)."""
        installation = self._authenticated_installation(request)
        key = f"{owner}/{name}".lower()
        if key not in installation.repos:
            raise self._not_found(DOCS)
        return self._repos[key]

    def _mint(self, installation_id: int) -> str:
        token = "ghs_" + secrets.token_hex(18)
        self._tokens[token] = _Token(installation_id, self._now() + TOKEN_LIFETIME_S)
        return token

    # -- App endpoints (JWT) ----------------------------------------------------------------

    def _on_get_app(self, request: Request) -> Reply:
        return Reply(200, self._app_json(self._authenticated_app(request)))

    def _on_list_installations(self, request: Request) -> Reply:
        app = self._authenticated_app(request)
        return Reply(200, [self._installation_json(i) for i in self._installations.values()
                           if i.app_id == app.id])

    def _on_get_installation(self, request: Request, installation_id: int) -> Reply:
        return Reply(200, self._installation_json(
            self._own_installation(self._authenticated_app(request), installation_id)))

    def _on_get_repo_installation(self, request: Request, owner: str, name: str) -> Reply:
        app = self._authenticated_app(request)
        repo = self._repos.get(f"{owner}/{name}".lower())
        if repo is None:
            raise self._not_found(self._shapes.not_found["documentation_url"])
        return Reply(200, self._installation_json(
            self._own_installation(app, repo.installation_id)))

    def _on_create_token(self, request: Request, installation_id: int) -> Reply:
        app = self._authenticated_app(request)
        installation = self._own_installation(app, installation_id)
        requested = (_payload(request) or {}).get("permissions") or {}
        if not grants(app.permissions, requested):
            raise Reply(422, self._shapes.not_granted)
        token = self._mint(installation.id)
        body = copy.deepcopy(self._shapes.token)
        body.update(token=token, expires_at=iso(self._tokens[token].expires_at),
                    permissions=requested or dict(app.permissions))
        return Reply(201, body)

    def _on_list_deliveries(self, request: Request) -> Reply:
        self._authenticated_app(request)
        return self._page(request, list(reversed(self._deliveries)))

    def _on_redeliver(self, request: Request, delivery_id: int) -> Reply:
        """Derived: GitHub answers 202 Accepted with an empty object, as it answers a
        check-suite rerequest (recorded: CheckSuite.testCheckSuiteRerequest, 201 ``{}``)."""
        self._authenticated_app(request)
        if not any(d["id"] == delivery_id for d in self._deliveries):
            raise self._not_found(DOCS)
        self.redeliveries.append(delivery_id)
        return Reply(202, {})

    def _own_installation(self, app: _App, installation_id: int) -> _Installation:
        installation = self._installations.get(installation_id)
        if installation is None or installation.app_id != app.id:
            raise self._not_found(self._shapes.not_found["documentation_url"])
        return installation

    # -- repository endpoints (installation token) ------------------------------------------

    def _on_get_repo(self, request: Request, owner: str, name: str) -> Reply:
        return Reply(200, self._repo_json(self._visible_repo(request, owner, name).full_name))

    def _on_create_check_run(self, request: Request, owner: str, name: str) -> Reply:
        repo = self._visible_repo(request, owner, name)
        app = self._app_of(repo)
        body = self._validated(request, check_run_problems, "checks/runs#create-a-check-run",
                               creating=True)
        run_id = next(self._ids)
        run = _CheckRun(repo.full_name.lower(), self._new_check_run_json(run_id, repo, app, body))
        self._runs[run_id] = run
        self._apply_check_run_update(run, body)
        return Reply(201, copy.deepcopy(run.served), {"Location": run.served["url"]})

    def _on_get_check_run(self, request: Request, owner: str, name: str, run_id: int) -> Reply:
        return Reply(200, copy.deepcopy(self._check_run(request, owner, name, run_id).served))

    def _on_update_check_run(self, request: Request, owner: str, name: str,
                             run_id: int) -> Reply:
        run = self._check_run(request, owner, name, run_id)
        body = self._validated(request, check_run_problems, "checks/runs#update-a-check-run",
                               creating=False)
        self._apply_check_run_update(run, body)
        return Reply(200, copy.deepcopy(run.served))

    def _on_list_annotations(self, request: Request, owner: str, name: str,
                             run_id: int) -> Reply:
        return self._page(request, self._check_run(request, owner, name, run_id).annotations)

    def _on_list_check_runs_for_ref(self, request: Request, owner: str, name: str,
                                    ref: str) -> Reply:
        """Newest first, filtered as GitHub filters (``check_name``, ``status``, ``app_id``,
        and ``filter=latest`` by default: only the newest run of each name). ``ref`` is
        matched against head shas only; the fake keeps no branches."""
        repo = self._visible_repo(request, owner, name)
        args = request.args
        runs = [run.served for _, run in sorted(self._runs.items(), reverse=True)
                if run.repo == repo.full_name.lower() and run.served["head_sha"] == ref
                and args.get("check_name", run.served["name"]) == run.served["name"]
                and args.get("status", run.served["status"]) == run.served["status"]
                and args.get("app_id", type=int, default=run.served["app"]["id"])
                == run.served["app"]["id"]]
        if args.get("filter", "latest") == "latest":
            runs = newest_of_each_name(runs)
        page = self._page(request, runs)
        return Reply(200, {"total_count": len(runs), "check_runs": page.body}, page.headers)

    def _on_get_pull(self, request: Request, owner: str, name: str, number: int) -> Reply:
        repo = self._visible_repo(request, owner, name)
        return Reply(200, self._pull_json(repo, number, self._pull(repo, number)))

    def _on_get_issue(self, request: Request, owner: str, name: str, number: int) -> Reply:
        repo = self._visible_repo(request, owner, name)
        return Reply(200, self._issue_json(repo, number, self._pull(repo, number)))

    def _on_list_comments(self, request: Request, owner: str, name: str, number: int) -> Reply:
        repo = self._visible_repo(request, owner, name)
        self._pull(repo, number)
        return self._page(request, self.comments(repo.full_name, number))

    def _on_create_comment(self, request: Request, owner: str, name: str, number: int) -> Reply:
        """Posted by the App's bot user, ``performed_via_github_app`` set, as GitHub does."""
        repo = self._visible_repo(request, owner, name)
        self._pull(repo, number)
        body = self._validated(request, comment_problems,
                               "issues/comments#create-an-issue-comment")
        app = self._app_of(repo)
        comment_id = self._new_comment(repo, number, body["body"], self._bot_json(app), "NONE",
                                       self._app_json(app))
        served = self._comments[comment_id].served
        return Reply(201, copy.deepcopy(served), {"Location": served["url"]})

    def _on_get_comment(self, request: Request, owner: str, name: str, comment_id: int) -> Reply:
        return Reply(200, copy.deepcopy(self._comment(request, owner, name, comment_id).served))

    def _on_edit_comment(self, request: Request, owner: str, name: str, comment_id: int) -> Reply:
        comment = self._comment(request, owner, name, comment_id)
        body = self._validated(request, comment_problems,
                               "issues/comments#update-an-issue-comment")
        comment.served.update(body=body["body"], updated_at=iso(self._now()))
        return Reply(200, copy.deepcopy(comment.served))

    def _on_list_reactions(self, request: Request, owner: str, name: str,
                           comment_id: int) -> Reply:
        return self._page(request, self._comment(request, owner, name, comment_id).reactions)

    def _on_create_reaction(self, request: Request, owner: str, name: str,
                            comment_id: int) -> Reply:
        """201 with the new reaction; 200 with the existing one when the App already reacted
        with that content, as GitHub answers a repeat."""
        comment = self._comment(request, owner, name, comment_id)
        body = self._validated(request, reaction_problems,
                               "reactions/reactions#create-reaction-for-an-issue-comment")
        bot = self._bot_json(self._app_of(self._repos[comment.repo]))
        for reaction in comment.reactions:
            if reaction["content"] == body["content"] and reaction["user"]["id"] == bot["id"]:
                return Reply(200, copy.deepcopy(reaction))
        reaction = copy.deepcopy(self._shapes.reaction)
        reaction_id = next(self._ids)
        reaction.update(id=reaction_id, node_id=node_id("Reaction", reaction_id), user=bot,
                        content=body["content"], created_at=iso(self._now()))
        comment.reactions.append(reaction)
        rollup = comment.served["reactions"]
        rollup[body["content"]] += 1
        rollup["total_count"] += 1
        return Reply(201, copy.deepcopy(reaction))

    def _on_get_permission(self, request: Request, owner: str, name: str, user: str) -> Reply:
        """A collaborator's permission; GitHub's recorded 403 when the caller lacks push.
        Users never set read a public repo and have no access to a private one."""
        repo = self._visible_repo(request, owner, name)
        if not repo.caller_has_push:
            raise Reply(403, self._shapes.no_push)
        default = "none" if repo.private else "read"
        permission, role_name = repo.permissions.get(user.lower(), (default, default))
        body = copy.deepcopy(self._shapes.permission)
        body.update(user=self._user_json(user), permission=permission, role_name=role_name)
        return Reply(200, body)

    # -- OAuth's web flow and user-to-server tokens ----------------------------------------

    def _oauth_app(self, client_id: str | None) -> _App | None:
        return next((a for a in self._apps.values()
                     if client_id and a.client_id == client_id), None)

    def _on_authorize_page(self, request: Request) -> Response:
        """GitHub's sign-in and authorize page, reduced to a login field and a button (a
        person would sign in and approve; a test types a login). GitHub shows a 404 page for
        an unknown client id."""
        args = request.args
        app = self._oauth_app(args.get("client_id"))
        if app is None:
            return Response("<h1>404</h1><p>Not Found</p>", 404, content_type="text/html")
        hidden = "".join(f'<input type="hidden" name="{k}" value="{escape(args.get(k, ""))}">'
                         for k in ("client_id", "redirect_uri", "state"))
        page = (f"<!doctype html><title>Sign in to GitHub</title>"
                f"<body style=\"font:15px system-ui;max-width:340px;margin:4rem auto\">"
                f"<h1 style=\"font-weight:400\">Sign in to GitHub</h1>"
                f"<p>to continue to <strong>{escape(app.name)}</strong></p>"
                f'<form method="post" action="/login/oauth/authorize">{hidden}'
                f'<label>Username <input name="login" id="login" autofocus></label> '
                f'<button type="submit" id="authorize">Authorize {escape(app.name)}</button>'
                f"</form></body>")
        return Response(page, 200, content_type="text/html; charset=utf-8")

    def _on_authorize(self, request: Request) -> Response:
        """The person approved: GitHub sends the browser back to ``redirect_uri`` with a code
        for them and the ``state`` the App sent, unchanged."""
        form = request.form
        app = self._oauth_app(form.get("client_id"))
        login = form.get("login", "").strip()
        redirect_uri = form.get("redirect_uri", "")
        if app is None or not login or urlsplit(redirect_uri).scheme not in ("http", "https"):
            return Response("<h1>422</h1><p>Unprocessable</p>", 422, content_type="text/html")
        code = secrets.token_hex(10)
        self._grants[code] = _Grant(login, app.id, redirect_uri,
                                    self._now() + OAUTH_CODE_LIFETIME_S)
        query = {"code": code, **({"state": form["state"]} if form.get("state") else {})}
        separator = "&" if "?" in redirect_uri else "?"
        return Response("", 302, {"Location": f"{redirect_uri}{separator}{urlencode(query)}"})

    def _on_oauth_token(self, request: Request) -> Reply:
        """A code for a user access token (form or JSON, as GitHub takes both; the answer is
        JSON, as for ``Accept: application/json``). GitHub answers a wrong secret or a bad,
        used or expired code with 200 and an error object, as here."""
        fields = dict(request.form) or (_payload(request) or {})
        app = self._oauth_app(fields.get("client_id"))
        if app is None or not fields.get("client_secret") or \
                not secrets.compare_digest(str(fields["client_secret"]), app.client_secret or ""):
            return Reply(200, INCORRECT_CLIENT_CREDENTIALS)
        grant = self._grants.pop(str(fields.get("code", "")), None)
        if grant is None or grant.app_id != app.id or grant.expires_at <= self._now() or \
                fields.get("redirect_uri", grant.redirect_uri) != grant.redirect_uri:
            return Reply(200, BAD_VERIFICATION_CODE)
        body = copy.deepcopy(self._shapes.oauth_token)
        token = "ghu_" + secrets.token_hex(18)
        self._user_tokens[token] = _UserToken(grant.login, app.id,
                                              self._now() + body["expires_in"])
        body.update(access_token=token, refresh_token="ghr_" + secrets.token_hex(18))
        return Reply(200, body)

    def _authenticated_user(self, request: Request) -> _UserToken:
        value = self._credential(request)
        if value is None:
            raise Reply(401, {"message": REQUIRES_AUTHENTICATION, "documentation_url": DOCS})
        token = self._user_tokens.get(value)
        if token is None or token.expires_at <= self._now():
            raise Reply(401, {"message": BAD_CREDENTIALS, "documentation_url": DOCS})
        return token

    def _readable(self, login: str, repo: _Repo) -> bool:
        """Whether ``login`` has explicit access to ``repo`` (its owner, or a permission set
        with ``set_permission``): what GitHub's user-to-server listings go by."""
        owner = repo.full_name.split("/")[0].lower()
        permission = repo.permissions.get(login.lower(), ("none", "none"))[0]
        return login.lower() == owner or permission in READ_LEVELS

    def _user_repos(self, token: _UserToken, installation: _Installation) -> list[_Repo]:
        return [self._repos[name] for name in sorted(installation.repos)
                if self._readable(token.login, self._repos[name])]

    def _on_get_user(self, request: Request) -> Reply:
        """The signed-in user (the recorded user object; GitHub adds profile fields such as
        ``name`` that FastCI does not read)."""
        return Reply(200, self._user_json(self._authenticated_user(request).login))

    def _on_list_user_installations(self, request: Request) -> Reply:
        """Derived (GitHub's documented fields): the App's installations in which the user
        can reach at least one repository, as ``{total_count, installations}``."""
        token = self._authenticated_user(request)
        found = [self._installation_json(i) for i in self._installations.values()
                 if i.app_id == token.app_id and self._user_repos(token, i)]
        return Reply(200, {"total_count": len(found), "installations": found})

    def _on_list_user_installation_repos(self, request: Request, installation_id: int) -> Reply:
        """The installation's repositories the user can reach, in the recorded shape of
        ``GET /installation/repositories``; 404 for an installation they reach nothing of.
        One page: the fake's worlds are small."""
        token = self._authenticated_user(request)
        installation = self._installations.get(installation_id)
        repos = self._user_repos(token, installation) if installation is not None and \
            installation.app_id == token.app_id else []
        if not repos:
            raise self._not_found(DOCS)
        body = copy.deepcopy(self._shapes.installation_repositories)
        listed = []
        for repo in repos:
            served = self._repo_json(repo.full_name)
            level = repo.permissions.get(token.login.lower(), ("admin", "admin"))[0]
            rank = READ_LEVELS.index(level) if level in READ_LEVELS else 0
            served["permissions"] = {"admin": rank >= 4, "maintain": rank >= 3,
                                     "push": rank >= 2, "triage": rank >= 1, "pull": True}
            listed.append(served)
        body.update(total_count=len(listed), repositories=listed)
        return Reply(200, body)

    # -- helpers for handlers ---------------------------------------------------------------

    def _validated(self, request: Request, problems_of: Callable[..., list[Problem]],
                   doc_anchor: str, **options: Any) -> dict:
        """The request's JSON object, or GitHub's 422 listing what is wrong with it."""
        body = _payload(request)
        body = body if isinstance(body, dict) else {}
        problems = problems_of(body, **options)
        if problems:
            raise Reply(422, unprocessable(problems, f"{DOCS}/{doc_anchor}"))
        return body

    def _check_run(self, request: Request, owner: str, name: str, run_id: int) -> _CheckRun:
        repo = self._visible_repo(request, owner, name)
        run = self._runs.get(run_id)
        if run is None or run.repo != repo.full_name.lower():
            raise self._not_found(DOCS)
        return run

    def _comment(self, request: Request, owner: str, name: str, comment_id: int) -> _Comment:
        repo = self._visible_repo(request, owner, name)
        comment = self._comments.get(comment_id)
        if comment is None or comment.repo != repo.full_name.lower():
            raise self._not_found(DOCS)
        return comment

    def _pull(self, repo: _Repo, number: int) -> dict:
        """The pull request numbered ``number``; the fake's only issues are pull requests."""
        if number not in repo.pulls:
            raise self._not_found(DOCS)
        return repo.pulls[number]

    def _page(self, request: Request, items: list) -> Reply:
        """One page of ``items`` with GitHub's ``Link`` header (per_page 30 by default, at
        most 100), which PyGithub's PaginatedList follows."""
        per_page = min(max(request.args.get("per_page", 30, type=int), 1), 100)
        page = max(request.args.get("page", 1, type=int), 1)
        last = max(1, math.ceil(len(items) / per_page))

        def link(number: int, rel: str) -> str:
            query = {**request.args.to_dict(), "page": str(number)}
            return f'<{self.url}{request.path}?{urlencode(query)}>; rel="{rel}"'

        links = [link(page + 1, "next"), link(last, "last")] if page < last else []
        links += [link(page - 1, "prev"), link(1, "first")] if page > 1 else []
        chunk = copy.deepcopy(items[(page - 1) * per_page:page * per_page])
        return Reply(200, chunk, {"Link": ", ".join(links)} if links else {})

    def _not_found(self, documentation_url: str) -> Reply:
        """GitHub's recorded 404 body, pointing at the right documentation."""
        return Reply(404, {**self._shapes.not_found, "documentation_url": documentation_url})

    def _now(self) -> float:
        return time.time() + self._clock_offset

    def _app_of(self, repo: _Repo) -> _App:
        """The App installed on ``repo``, which is who acts with its installation's tokens."""
        return self._apps[self._installations[repo.installation_id].app_id]

    def _only_app_id(self) -> int:
        if len(self._apps) != 1:
            raise ValueError("register exactly one App first, or pass app_id=")
        return next(iter(self._apps))

    def _repo_id(self, full_name: str) -> int:
        return self._repo_ids.setdefault(full_name.lower(), next(self._ids))

    def _user_id(self, login: str) -> int:
        return self._user_ids.setdefault(login.lower(), next(self._ids))

    # -- state changes ----------------------------------------------------------------------

    def _apply_check_run_update(self, run: _CheckRun, body: dict) -> None:
        """Fold a validated create/update body into the run as GitHub does: a conclusion
        completes the run, output text replaces the old, annotations accumulate."""
        served = run.served
        for key in ("name", "head_sha", "details_url", "external_id", "started_at", "status"):
            if key in body:
                served[key] = body[key]
        if body.get("conclusion") is not None:
            served.update(conclusion=body["conclusion"], status="completed",
                          completed_at=body.get("completed_at") or iso(self._now()))
        output = body.get("output")
        if output:
            served["output"].update({k: output[k] for k in ("title", "summary", "text")
                                     if k in output})
            run.annotations += [self._annotation_json(run, a)
                                for a in output.get("annotations") or []]
            served["output"]["annotations_count"] = len(run.annotations)
        if "actions" in body:
            run.actions = copy.deepcopy(body["actions"])

    def _new_comment(self, repo: _Repo, number: int, text: str, user: dict,
                     author_association: str, app: dict | None) -> int:
        comment_id = next(self._ids)
        repo_json = self._repo_json(repo.full_name)
        url = f"{repo_json['url']}/issues/comments/{comment_id}"
        body = copy.deepcopy(self._shapes.comment)
        now = iso(self._now())
        body.update(
            id=comment_id, node_id=node_id("IssueComment", comment_id), url=url,
            html_url=f"{repo_json['html_url']}/pull/{number}#issuecomment-{comment_id}",
            issue_url=f"{repo_json['url']}/issues/{number}", body=text, user=user,
            created_at=now, updated_at=now, author_association=author_association,
            performed_via_github_app=app,
            reactions={"url": f"{url}/reactions", "total_count": 0,
                       **{content: 0 for content in REACTIONS}})
        self._comments[comment_id] = _Comment(repo.full_name.lower(), number, body)
        return comment_id

    # -- JSON built from the recorded shapes ------------------------------------------------

    def _local(self, shape: Any) -> Any:
        """A recorded shape with GitHub's API root pointed at this server."""
        return rebased(copy.deepcopy(shape), {RECORDED_API_ROOT: self.url})

    def _user_json(self, login: str, kind: str = "User") -> dict:
        template = self._shapes.user
        user = self._local(rebased(template, {f"/{template['login']}": f"/{login}"}))
        user_id = self._user_id(login)
        user.update(login=login, id=user_id, node_id=node_id(kind, user_id), type=kind,
                    avatar_url=f"https://avatars.githubusercontent.com/u/{user_id}?v=4")
        return user

    def _bot_json(self, app: _App) -> dict:
        """The user an App acts as: ``<slug>[bot]``, of type Bot."""
        return self._user_json(f"{app.slug}[bot]", "Bot")

    def _repo_json(self, full_name: str) -> dict:
        template = self._shapes.repo
        repo = self._local(rebased(template, {template["full_name"]: full_name}))
        state = self._repos.get(full_name.lower())
        owner, name = full_name.split("/")
        repo_id = self._repo_id(full_name)
        private = state.private if state else False
        repo.pop("organization", None)
        # A repository the fake does not host appears only as the head of a fork's pull request.
        repo.update(
            id=repo_id, node_id=node_id("Repository", repo_id), name=name, full_name=full_name,
            owner=self._user_json(owner), private=private,
            visibility="private" if private else "public",
            fork=state is None, default_branch=state.default_branch if state else "main")
        push = bool(state and state.caller_has_push)
        repo["permissions"] = {"admin": False, "maintain": False, "push": push, "triage": push,
                               "pull": True}
        return repo

    def _app_json(self, app: _App) -> dict:
        body = self._local(self._shapes.app)
        body.update(id=app.id, slug=app.slug, name=app.name, node_id=node_id("App", app.id),
                    html_url=f"https://github.com/apps/{app.slug}",
                    permissions=dict(app.permissions), events=list(app.events),
                    installations_count=sum(1 for i in self._installations.values()
                                            if i.app_id == app.id))
        return body

    def _installation_json(self, installation: _Installation) -> dict:
        app = self._apps[installation.app_id]
        body = self._local(self._shapes.installation)
        account = self._user_json(installation.account)
        body.update(
            id=installation.id, account=account, target_id=account["id"],
            target_type=account["type"], app_id=app.id, app_slug=app.slug,
            access_tokens_url=f"{self.url}/app/installations/{installation.id}/access_tokens",
            html_url=f"https://github.com/settings/installations/{installation.id}",
            permissions=dict(app.permissions), events=list(app.events))
        return body

    def _new_check_run_json(self, run_id: int, repo: _Repo, app: _App, body: dict) -> dict:
        """A queued run as GitHub creates it, in its own check suite for (repo, sha, App);
        ``_apply_check_run_update`` then folds in the rest of the request."""
        repo_json = self._repo_json(repo.full_name)
        app_json = self._app_json(app)
        suite_key = (repo.full_name.lower(), body["head_sha"], app.id)
        url = f"{repo_json['url']}/check-runs/{run_id}"
        served = self._local(self._shapes.check_run)
        served.update(
            id=run_id, node_id=node_id("CheckRun", run_id), head_sha=body["head_sha"],
            external_id="", url=url, html_url=f"{repo_json['html_url']}/runs/{run_id}",
            details_url=app_json["external_url"], status="queued", conclusion=None,
            started_at=iso(self._now()), completed_at=None, name=body["name"],
            output={"title": None, "summary": None, "text": None, "annotations_count": 0,
                    "annotations_url": f"{url}/annotations"},
            check_suite={"id": self._suites.setdefault(suite_key, next(self._ids))},
            app=app_json, pull_requests=[])
        return served

    def _annotation_json(self, run: _CheckRun, annotation: dict) -> dict:
        body = copy.deepcopy(self._shapes.annotation)
        html_url = self._repo_json(self._repos[run.repo].full_name)["html_url"]
        body.update({key: annotation.get(key) for key in body if key != "blob_href"})
        body["blob_href"] = f"{html_url}/blob/{run.served['head_sha']}/{annotation['path']}"
        return body

    def _pull_json(self, repo: _Repo, number: int, pull: dict) -> dict:
        """Derived from the pull_request webhook payload's ``pull_request`` object."""
        repo_json = self._repo_json(repo.full_name)
        url = f"{repo_json['url']}/pulls/{number}"
        html_url = f"{repo_json['html_url']}/pull/{number}"
        issue_url = f"{repo_json['url']}/issues/{number}"
        body = self._local(self._shapes.pull)
        body.update(
            url=url, id=pull["id"], node_id=node_id("PullRequest", pull["id"]), html_url=html_url,
            diff_url=f"{html_url}.diff", patch_url=f"{html_url}.patch", issue_url=issue_url,
            number=number, state="open", title=pull["title"], body=pull["body"],
            user=self._user_json(pull["user"]), created_at=pull["created_at"],
            updated_at=pull.get("updated_at", pull["created_at"]), assignees=[],
            requested_reviewers=[], labels=[],
            commits_url=f"{url}/commits", review_comments_url=f"{url}/comments",
            review_comment_url=f"{repo_json['url']}/pulls/comments{{/number}}",
            comments_url=f"{issue_url}/comments",
            statuses_url=f"{repo_json['url']}/statuses/{pull['head_sha']}",
            author_association=pull["author_association"],
            head=self._pull_end(pull["head_repo"], pull["head_ref"], pull["head_sha"]),
            base=self._pull_end(repo.full_name, pull["base_ref"], pull["base_sha"]))
        body["_links"] = {
            "self": {"href": url}, "html": {"href": html_url}, "issue": {"href": issue_url},
            "comments": {"href": f"{issue_url}/comments"},
            "review_comments": {"href": f"{url}/comments"},
            "review_comment": {"href": f"{repo_json['url']}/pulls/comments{{/number}}"},
            "commits": {"href": f"{url}/commits"},
            "statuses": {"href": f"{repo_json['url']}/statuses/{pull['head_sha']}"}}
        return body

    def _pull_end(self, full_name: str, ref: str, sha: str) -> dict:
        owner = full_name.split("/")[0]
        return {"label": f"{owner}:{ref}", "ref": ref, "sha": sha,
                "user": self._user_json(owner), "repo": self._repo_json(full_name)}

    def _issue_json(self, repo: _Repo, number: int, pull: dict) -> dict:
        """Derived from the issue_comment webhook payload's ``issue`` object, with the
        ``pull_request`` links GitHub adds when the issue is a pull request."""
        pull_json = self._pull_json(repo, number, pull)
        repo_json = self._repo_json(repo.full_name)
        body = self._local(self._shapes.issue)
        issue_url = pull_json["issue_url"]
        body.update(
            url=issue_url, repository_url=repo_json["url"],
            labels_url=f"{issue_url}/labels{{/name}}", comments_url=f"{issue_url}/comments",
            events_url=f"{issue_url}/events", html_url=pull_json["html_url"],
            id=pull["issue_id"], node_id=node_id("Issue", pull["issue_id"]), number=number,
            title=pull["title"], body=pull["body"], user=pull_json["user"], labels=[],
            assignee=None, assignees=[], state="open",
            comments=len(self.comments(repo.full_name, number)),
            created_at=pull["created_at"], updated_at=pull_json["updated_at"],
            author_association=pull["author_association"])
        body["pull_request"] = {key: pull_json[key]
                                for key in ("url", "html_url", "diff_url", "patch_url")}
        body["pull_request"]["merged_at"] = None
        return body
