"""FakeGitHub proved with PyGithub itself: a real client over real HTTP to the fake.

If PyGithub parses what the fake answers and the fake refuses what GitHub refuses, FastCI's
tests against the fake say something about FastCI against GitHub. The fake answers from the
project's fixtures (tests/test_fixtures_contract.py checks them against GitHub's recordings);
the validation rules are pure functions and are checked without a server too.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import github
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from fakegithub import FakeGitHub, check_run_problems, rest_fixture
from github import Auth, GithubException

APP_ID = 4242
INSTALLATION = 77
REPO = "octo/widgets"
PULL = 5
SHA = "0283d46537193f1fed7d46859f15c5304b9836f9"
NO_THROTTLE = {"seconds_between_requests": None, "seconds_between_writes": None}


@dataclass(frozen=True)
class KeyPair:
    private: str
    public: str


def make_key_pair() -> KeyPair:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return KeyPair(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                          serialization.NoEncryption()).decode(),
        key.public_key().public_bytes(serialization.Encoding.PEM,
                                      serialization.PublicFormat.SubjectPublicKeyInfo).decode())


@pytest.fixture(scope="module")
def app_key() -> KeyPair:
    """The App's key pair, made here: no secret is stored anywhere."""
    return make_key_pair()


@pytest.fixture
def fake(app_key: KeyPair) -> Iterator[FakeGitHub]:
    """The App installed on one repository with one open pull request."""
    with FakeGitHub() as fake:
        fake.register_app(APP_ID, app_key.public)
        fake.add_repo(REPO, installation_id=INSTALLATION)
        fake.add_pull(REPO, PULL, head_sha=SHA)
        yield fake


def integration(fake: FakeGitHub, auth: Auth.AppAuth, **options) -> github.GithubIntegration:
    """PyGithub's App client on the fake, without PyGithub's 1 s pause between writes."""
    return github.GithubIntegration(auth=auth, base_url=fake.url, **NO_THROTTLE, **options)


def token_client(fake: FakeGitHub, token: str, **options) -> github.Github:
    """PyGithub's client for an installation token (its default GithubRetry unless told)."""
    return github.Github(auth=Auth.Token(token), base_url=fake.url, **NO_THROTTLE, **options)


@pytest.fixture
def installation(fake: FakeGitHub, app_key: KeyPair) -> github.Github:
    """PyGithub as FastCI's worker uses it: App JWT -> installation token, minted on demand."""
    return integration(fake, Auth.AppAuth(APP_ID, app_key.private)).get_github_for_installation(
        INSTALLATION)


@pytest.fixture
def repo(installation: github.Github):
    return installation.get_repo(REPO)


def annotation(line: int, **fields) -> dict:
    return {"path": "tinyllm/model/norms.py", "start_line": line, "end_line": line,
            "annotation_level": "failure", "message": f"regression at line {line}", **fields}


def output(**fields) -> dict:
    return {"title": "FastCI regressions", "summary": "1 of 3 selected tests failed", **fields}


# --- App authentication ----------------------------------------------------------------------


def test_app_jwt_buys_an_installation_token_that_opens_the_repo(fake, app_key):
    gi = integration(fake, Auth.AppAuth(APP_ID, app_key.private))
    assert gi.get_app().id == APP_ID
    assert gi.get_repo_installation("octo", "widgets").id == INSTALLATION
    assert [i.id for i in gi.get_installations()] == [INSTALLATION]
    assert gi.get_app_installation(INSTALLATION).app_id == APP_ID

    grant = gi.get_access_token(INSTALLATION)

    assert grant.token.startswith("ghs_")
    lifetime = grant.expires_at - datetime.now(timezone.utc)
    assert timedelta(minutes=59) < lifetime <= timedelta(hours=1)
    mint = fake.requests[-1]
    assert (mint.method, mint.path) == ("POST", f"/app/installations/{INSTALLATION}/access_tokens")
    assert mint.headers["Authorization"].startswith("Bearer ")
    assert token_client(fake, grant.token).get_repo(REPO).full_name == REPO
    assert fake.requests[-1].headers["Authorization"] == f"token {grant.token}"


def signed_with(private_key: str, claims_at: Callable[[int], dict]):
    """A PyGithub signing function that overrides its claims with ``claims_at(now)``
    (a claim set to None is left out)."""
    def sign(payload: dict) -> str:
        claims = {**payload, **claims_at(int(time.time()))}
        return jwt.encode({k: v for k, v in claims.items() if v is not None}, private_key,
                          algorithm="RS256")
    return sign


def test_an_expired_jwt_gets_githubs_recorded_401(fake, app_key):
    expired = signed_with(app_key.private, lambda now: {"iat": now - 660, "exp": now - 60})
    gi = integration(fake, Auth.AppAuth(APP_ID, sign_func=expired))
    with pytest.raises(GithubException) as refused:
        gi.get_access_token(INSTALLATION)
    assert refused.value.status == 401
    assert refused.value.data == rest_fixture("expired_jwt")["body"]
    assert refused.value.status == rest_fixture("expired_jwt")["status"]


@pytest.mark.parametrize("claims_at, message", [
    (lambda now: {"exp": now + 900}, "'Expiration time' claim ('exp') is too far in the future"),
    (lambda now: {"iat": now - 400, "exp": now + 300},
     "'Expiration time' claim ('exp') is too far in the future"),
    (lambda now: {"iss": str(APP_ID + 1)}, "A JSON web token could not be decoded"),
    (lambda now: {"iss": None}, "A JSON web token could not be decoded"),
], ids=["exp-too-far-ahead", "lives-over-ten-minutes", "unknown-app", "no-issuer"])
def test_jwts_github_would_not_accept_get_401(fake, app_key, claims_at, message):
    gi = integration(fake, Auth.AppAuth(APP_ID, sign_func=signed_with(app_key.private,
                                                                      claims_at)))
    with pytest.raises(GithubException) as refused:
        gi.get_app()
    assert (refused.value.status, refused.value.data["message"]) == (401, message)


def test_a_jwt_signed_by_another_key_cannot_be_decoded(fake):
    gi = integration(fake, Auth.AppAuth(APP_ID, make_key_pair().private))
    with pytest.raises(GithubException) as refused:
        gi.get_access_token(INSTALLATION)
    assert refused.value.data["message"] == "A JSON web token could not be decoded"


def test_an_installation_token_lasts_one_hour(fake):
    client = token_client(fake, fake.mint_token(INSTALLATION))
    fake.advance(3599)
    assert client.get_repo(REPO).full_name == REPO

    fake.advance(1)
    with pytest.raises(github.BadCredentialsException) as refused:
        client.get_repo(REPO)
    assert refused.value.data["message"] == "Bad credentials"


def test_a_token_sees_only_its_installations_repositories(fake):
    fake.add_repo("octo/other", installation_id=INSTALLATION + 1)
    with pytest.raises(github.UnknownObjectException):
        token_client(fake, fake.mint_token(INSTALLATION)).get_repo("octo/other")


# --- check runs ------------------------------------------------------------------------------


def test_a_check_run_completes_with_annotations_from_two_batches(repo, fake):
    run = repo.create_check_run(name="fastci / regressions", head_sha=SHA, status="in_progress",
                                output=output(summary="running 3 selected tests"))
    assert (run.status, run.conclusion, run.app.id) == ("in_progress", None, APP_ID)

    run.edit(status="completed", conclusion="failure",
             output=output(annotations=[annotation(line) for line in range(1, 51)]))
    run.edit(output=output(annotations=[annotation(line) for line in range(51, 54)]))

    # 53 annotations come back over two pages, following GitHub's Link header.
    assert [a.start_line for a in run.get_annotations()] == list(range(1, 54))
    fetched = repo.get_check_run(run.id)
    assert (fetched.status, fetched.conclusion) == ("completed", "failure")
    assert fetched.completed_at is not None
    assert fetched.output.annotations_count == 53
    [stored] = fake.check_runs(REPO)
    assert len(stored["annotations"]) == 53
    assert stored["annotations"][0]["blob_href"].endswith(f"/blob/{SHA}/tinyllm/model/norms.py")


def test_check_runs_for_a_ref_keep_the_latest_of_each_name(repo, fake):
    for name in ("fastci / selection", "fastci / regressions", "fastci / regressions"):
        repo.create_check_run(name=name, head_sha=SHA, status="queued")
    lazy = token_client(fake, fake.mint_token(INSTALLATION), lazy=True)
    commit = lazy.get_repo(REPO).get_commit(SHA)

    latest = commit.get_check_runs()
    everything = commit.get_check_runs(filter="all")

    assert sorted(run.name for run in latest) == ["fastci / regressions", "fastci / selection"]
    assert max(run.id for run in everything) in {run.id for run in latest}
    assert everything.totalCount == 3


ACTION = {"label": "Run all tests", "description": "Run the whole suite on this commit",
          "identifier": "run_all"}


@pytest.mark.parametrize("request_fields, message", [
    ({"output": output(annotations=[annotation(1)] * 51)},
     "No more than 50 items are allowed; 51 were supplied."),
    ({"status": "completed"}, '"conclusion" wasn\'t supplied.'),
    ({"output": output(summary="x" * 65536)},
     "Only 65535 characters are allowed; 65536 were supplied."),
    ({"output": output(text="x" * 65536)},
     "Only 65535 characters are allowed; 65536 were supplied."),
    ({"actions": [ACTION] * 4}, "No more than 3 items are allowed; 4 were supplied."),
    ({"actions": [{**ACTION, "label": "x" * 21}]},
     "Only 20 characters are allowed; 21 were supplied."),
    ({"conclusion": "passed"}, "is not a member of"),
    ({"output": {"summary": "no title"}}, '"title" wasn\'t supplied.'),
], ids=["51-annotations", "no-conclusion", "long-summary", "long-text", "4-actions",
        "long-label", "bad-conclusion", "no-title"])
def test_check_run_requests_github_refuses_get_422(repo, fake, request_fields, message):
    with pytest.raises(GithubException) as refused:
        repo.create_check_run(name="fastci", head_sha=SHA, **request_fields)
    assert refused.value.status == 422
    assert refused.value.data["message"].startswith("Invalid request.\n\n")
    assert message in refused.value.data["message"]
    assert refused.value.data["errors"]
    assert fake.check_runs(REPO) == []


def test_github_counts_summary_bytes_too(repo):
    with pytest.raises(GithubException) as refused:
        repo.create_check_run(name="fastci", head_sha=SHA, conclusion="success",
                              output=output(summary="✅" * 30000))
    assert refused.value.data["message"] == "Validation Failed"
    assert refused.value.data["errors"][0]["message"] == \
        "summary exceeds a maximum bytesize of 65535"


def test_annotation_columns_need_a_single_line(repo):
    wide = annotation(3, end_line=4, start_column=1, end_column=2)
    with pytest.raises(GithubException) as refused:
        repo.create_check_run(name="fastci", head_sha=SHA, output=output(annotations=[wide]))
    assert refused.value.data["message"] == "Validation Failed"


def test_a_check_run_at_every_limit_is_accepted(repo, fake):
    run = repo.create_check_run(
        name="fastci", head_sha=SHA, conclusion="neutral",
        output=output(summary="x" * 65535, annotations=[annotation(1)] * 50),
        actions=[{"label": "l" * 20, "description": "d" * 40, "identifier": "i" * 20}] * 3)
    assert (run.status, run.output.annotations_count) == ("completed", 50)
    assert len(fake.check_runs(REPO)[0]["actions"]) == 3


@pytest.mark.parametrize("body, field", [
    ({"head_sha": SHA}, "name"),
    ({"name": "fastci"}, "head_sha"),
    ({"name": "fastci", "head_sha": SHA, "status": "done"}, "status"),
    ({"name": "fastci", "head_sha": SHA,
      "output": output(annotations=[annotation(1, annotation_level="error")])},
     "output.annotations[0].annotation_level"),
    ({"name": "fastci", "head_sha": SHA,
      "output": output(annotations=[{"path": "a.py", "start_line": 1, "end_line": 1,
                                     "annotation_level": "notice"}])},
     "output.annotations[0].message"),
    ({"name": "fastci", "head_sha": SHA, "completed_at": "2024-01-01T00:00:00Z"}, "conclusion"),
])
def test_check_run_problems_name_the_field(body, field):
    """The rules PyGithub's own argument checks keep a client from breaking (no server)."""
    assert [p.field for p in check_run_problems(body, creating=True)] == [field]


def test_an_update_needs_neither_name_nor_sha():
    assert check_run_problems({"conclusion": "success"}, creating=False) == []


# --- comments, reactions, permissions, pull requests -----------------------------------------


def test_a_command_gets_a_reaction_and_the_pull_request_a_reply(repo, fake):
    command_id = fake.add_comment(REPO, PULL, "/fastci retest", user="alice")

    command = repo.get_issue(PULL).get_comment(command_id)
    seen = command.create_reaction("eyes")
    seen_again = command.create_reaction("eyes")
    reply = repo.get_pull(PULL).create_issue_comment("Selected 3 of 120 tests")
    reply.edit("Selected 4 of 120 tests")

    assert (command.body, command.user.login) == ("/fastci retest", "alice")
    assert seen_again.id == seen.id
    assert [r["content"] for r in fake.reactions(command_id)] == ["eyes"]
    assert (reply.user.login, reply.user.type) == ("fastci[bot]", "Bot")
    assert reply.performed_via_github_app.id == APP_ID
    assert [c["body"] for c in fake.comments(REPO, PULL)] == ["/fastci retest",
                                                               "Selected 4 of 120 tests"]
    assert [c.id for c in repo.get_issue(PULL).get_comments()] == [command_id, reply.id]
    assert [r.content for r in command.get_reactions()] == ["eyes"]


def test_comments_and_reactions_github_refuses_get_422(repo, fake):
    pull = repo.get_pull(PULL)
    with pytest.raises(GithubException) as too_long:
        pull.create_issue_comment("x" * 65537)
    comment = pull.create_issue_comment("x" * 65536)
    with pytest.raises(GithubException) as unknown:
        comment.create_reaction("thumbsup")

    assert too_long.value.data["errors"][0]["message"] == \
        "Body is too long (maximum is 65536 characters)"
    assert unknown.value.status == 422
    assert fake.reactions(comment.id) == []


def test_collaborator_permissions_are_whatever_the_test_set(repo, fake):
    fake.set_permission(REPO, "alice", "write", role_name="maintain")
    fake.set_permission(REPO, "bob", "none")

    assert repo.get_collaborator_permission("alice") == "write"
    assert repo.get_collaborator_role_name("alice") == "maintain"
    assert repo.get_collaborator_permission("bob") == "none"
    assert repo.get_collaborator_permission("carol") == "read"  # a public repo's default


def test_a_caller_without_push_gets_githubs_recorded_403(installation, fake):
    fake.add_repo("octo/locked", installation_id=INSTALLATION, caller_has_push=False)
    locked = installation.get_repo("octo/locked")
    with pytest.raises(GithubException) as refused:
        locked.get_collaborator_permission("alice")
    assert refused.value.status == 403
    assert refused.value.data == rest_fixture("no_push")["body"]
    assert refused.value.status == rest_fixture("no_push")["status"]


def test_a_fork_pull_request_names_the_fork_as_head(repo, fake):
    fake.add_pull(REPO, 9, head_sha="f" * 40, head_repo="mallory/widgets",
                  author_association="FIRST_TIME_CONTRIBUTOR")
    pull = repo.get_pull(9)
    assert (pull.head.repo.full_name, pull.head.repo.fork) == ("mallory/widgets", True)
    assert (pull.base.repo.full_name, pull.base.ref, pull.head.sha) == (REPO, "main", "f" * 40)
    assert pull.raw_data["author_association"] == "FIRST_TIME_CONTRIBUTOR"


# --- webhook deliveries ----------------------------------------------------------------------


def test_the_app_asks_github_to_redeliver_a_failed_delivery(fake, app_key):
    failed = fake.add_delivery("d1f2", "pull_request", action="opened", status_code=503,
                               installation_id=INSTALLATION)
    requester = integration(fake, Auth.AppAuth(APP_ID, app_key.private)).requester

    _, deliveries = requester.requestJsonAndCheck("GET", "/app/hook/deliveries")
    status, _, _ = requester.requestJson("POST", f"/app/hook/deliveries/{failed}/attempts")

    assert [(d["guid"], d["status_code"]) for d in deliveries] == [("d1f2", 503)]
    assert status == 202
    assert fake.redeliveries == [failed]


# --- failures --------------------------------------------------------------------------------


def test_a_server_error_is_retried_by_pygithub(fake):
    fake.fail_next(1, status=500, method="POST", path="/check-runs$")
    repo = token_client(fake, fake.mint_token(INSTALLATION)).get_repo(REPO)

    repo.create_check_run(name="fastci", head_sha=SHA, status="queued")

    assert fake.attempts("POST", "/check-runs$") == 2
    assert len(fake.check_runs(REPO)) == 1


def test_pygithub_does_not_retry_a_failed_patch(fake):
    """GithubRetry retries GET and POST, not PATCH: FastCI must retry check-run updates."""
    repo = token_client(fake, fake.mint_token(INSTALLATION)).get_repo(REPO)
    run = repo.create_check_run(name="fastci", head_sha=SHA, status="queued")
    fake.fail_next(1, status=502, method="PATCH")

    with pytest.raises(GithubException) as failed:
        run.edit(status="in_progress")

    assert failed.value.status == 502
    assert fake.attempts("PATCH") == 1


def test_a_secondary_rate_limit_is_waited_out_and_retried(fake):
    fake.rate_limit_next(1, kind="secondary", retry_after=0, path="/issues/")
    pull = token_client(fake, fake.mint_token(INSTALLATION)).get_repo(REPO).get_pull(PULL)

    pull.create_issue_comment("Selected 3 of 120 tests")

    assert [r.status for r in fake.requests if "/issues/" in r.path] == [403, 201]


def test_a_primary_rate_limit_makes_pygithub_wait_for_the_reset(fake):
    fake.rate_limit_next(1, kind="primary", reset_in=3600)
    client = token_client(fake, fake.mint_token(INSTALLATION),
                          retry=github.GithubRetry(max_rate_limit_wait=5))

    # PyGithub reads the reset from the headers and refuses to wait an hour for it.
    with pytest.raises(github.RateLimitExceededExceedsMaxWait) as limited:
        client.get_repo(REPO)

    assert limited.value.headers["X-RateLimit-Remaining"] == "0"
    assert 3590 < limited.value.wait <= 3601
    assert fake.attempts() == 1


def test_an_unknown_route_is_githubs_404(fake):
    client = token_client(fake, fake.mint_token(INSTALLATION))
    with pytest.raises(github.UnknownObjectException) as missing:
        client.requester.requestJsonAndCheck("GET", f"/repos/{REPO}/no-such-thing")
    assert missing.value.data["message"] == "Not Found"


def test_oauths_web_flow_gives_a_user_token_once_per_code(app_key):
    """The sign-in the dashboard uses: the authorize form sends the browser back with a code
    and the state; the code buys one user token, once, and only with the client's secret;
    the token lists the App's repositories the user has explicit access to."""
    import requests  # noqa: PLC0415

    with FakeGitHub() as fake:
        fake.register_app(1, app_key.public, client_id="Iv1.x", client_secret="s3cret")
        fake.add_repo("octo/widgets", installation_id=7, private=True)
        fake.add_repo("octo/secret", installation_id=7, private=True)
        fake.set_permission("octo/widgets", "alice", "write")
        page = requests.get(f"{fake.url}/login/oauth/authorize?client_id=Iv1.x")
        assert page.status_code == 200 and 'name="login"' in page.text
        assert requests.get(f"{fake.url}/login/oauth/authorize?client_id=nope"
                            ).status_code == 404
        back = requests.post(f"{fake.url}/login/oauth/authorize", allow_redirects=False, data={
            "login": "alice", "client_id": "Iv1.x", "state": "st",
            "redirect_uri": "http://app.example/cb"})
        assert back.status_code == 302 and back.headers["Location"].startswith(
            "http://app.example/cb?code=") and back.headers["Location"].endswith("&state=st")
        code = back.headers["Location"].split("code=")[1].split("&")[0]

        def exchange(secret: str) -> dict:
            return requests.post(f"{fake.url}/login/oauth/access_token", data={
                "client_id": "Iv1.x", "client_secret": secret, "code": code},
                headers={"Accept": "application/json"}).json()

        assert exchange("wrong")["error"] == "incorrect_client_credentials"
        token = exchange("s3cret")
        assert token["token_type"] == "bearer" and token["access_token"].startswith("ghu_")
        assert exchange("s3cret")["error"] == "bad_verification_code"  # used once

        def get(path: str, bearer: str | None = token["access_token"]):
            return requests.get(fake.url + path, headers={"Authorization": f"Bearer {bearer}"}
                                if bearer else {})
        assert get("/user").json()["login"] == "alice"
        assert get("/user", None).status_code == 401
        [installation] = get("/user/installations").json()["installations"]
        listed = get(f"/user/installations/{installation['id']}/repositories").json()
        assert [r["full_name"] for r in listed["repositories"]] == ["octo/widgets"]
        assert listed["repositories"][0]["permissions"]["push"] is True
