"""The GitHub side, piece by piece: signatures, routing of GitHub's real payloads, slash
command parsing, check-run limits against the fake GitHub, and the webhook service under a
real WSGI server with real Redis."""

from __future__ import annotations

import json
import threading
import uuid

import pytest
import redis as redis_lib
import requests
from conftest import payload_path
from werkzeug.serving import make_server

from fastci.app import events
from fastci.app.commands import parse
from fastci.app.github import MAX_TEXT, CheckRunOutput, CheckRuns, fit, retrying
from fastci.app.queue import Queues
from fastci.app.settings import AppSettings, Secret, SettingsError, load
from fastci.app.signature import sign, verify
from fastci.app.web import create_app
from fastci.testing import FIXTURES

SECRET = "It's a Secret to Everybody"


# -- signatures ------------------------------------------------------------------------------
def test_signature_is_githubs_hmac_sha256():
    # GitHub's documented example: secret, body and the expected header.
    assert sign(SECRET, b"Hello, World!") == (
        "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17")
    assert verify(SECRET, b"Hello, World!", sign(SECRET, b"Hello, World!")) is None
    assert "unsigned" in verify(SECRET, b"x", None)
    assert "sha256=" in verify(SECRET, b"x", "sha1=abc")
    assert "does not match" in verify(SECRET, b"x", sign("other", b"x"))
    assert "does not match" in verify(SECRET, b"y", sign(SECRET, b"x"))


def test_secrets_come_from_files_and_never_print(tmp_path):
    key = tmp_path / "key.pem"
    key.write_text("-----BEGIN PRIVATE KEY-----\nabc\n")
    settings = load({"FASTCI_APP_ID": "12", "FASTCI_APP_PRIVATE_KEY_FILE": str(key),
                     "FASTCI_WEBHOOK_SECRET": "s3cret", "FASTCI_WORKSPACE": str(tmp_path)})
    assert settings.private_key.reveal().startswith("-----BEGIN")
    shown = repr(settings) + str(settings.webhook_secret) + repr(settings.private_key)
    assert "s3cret" not in shown and "BEGIN" not in shown
    with pytest.raises(SettingsError, match="FASTCI_APP_PRIVATE_KEY_FILE"):
        load({"FASTCI_APP_PRIVATE_KEY_FILE": str(tmp_path / "missing.pem")})
    with pytest.raises(SettingsError, match="FASTCI_APP_ID must be an integer"):
        load({"FASTCI_APP_ID": "twelve"})


# -- routing GitHub's payloads (the project's fixtures, in GitHub's shapes) ----------------------
def _payloads():
    return sorted((FIXTURES / "payloads").glob("*/*.json"))


def test_every_payload_fixture_routes_without_error():
    kinds = {}
    for path in _payloads():
        event = path.parent.name
        routed = events.route(event, json.loads(path.read_bytes())) if event != "ping" \
            else events.Ignored("ping")
        kinds[(event, path.name)] = routed.kind if isinstance(routed, events.Work) \
            else "ignored"
    assert kinds[("pull_request", "opened.json")] == "pull_request"
    assert kinds[("pull_request", "opened-from-fork.json")] == "pull_request"
    assert kinds[("pull_request", "synchronize.json")] == "pull_request"
    assert kinds[("pull_request", "closed.json")] == "ignored"
    assert kinds[("push", "default-branch.json")] == "refresh"
    assert kinds[("push", "tag.json")] == "ignored"
    assert kinds[("check_suite", "rerequested.json")] == "pull_request"
    assert kinds[("check_suite", "completed.json")] == "ignored"
    assert kinds[("check_run", "requested_action.json")] == "pull_request"
    assert kinds[("installation", "created.json")] == "installation"
    assert kinds[("installation_repositories", "added.json")] == "installation"
    assert kinds[("issue_comment", "created-on-issue.json")] == "ignored"  # not a command
    assert kinds[("issue_comment", "created-command.json")] == "command"  # on its 3rd line
    assert kinds[("issue_comment", "edited-command.json")] == "command"  # only for a reply


def test_a_pull_request_payload_becomes_work_without_secrets():
    payload = json.loads(payload_path("pull_request", "opened.json").read_bytes())
    work = events.route("pull_request", payload)
    assert (work.repo, work.number, work.installation_id) == ("octo/widgets", 5, 7)
    assert work.head_sha == payload["pull_request"]["head"]["sha"]
    assert not work.fork
    assert events.Work.from_json(json.loads(json.dumps(work.to_json()))) == work


def test_a_slash_command_on_a_pull_request_is_work():
    payload = json.loads(payload_path("issue_comment", "created-on-issue.json").read_bytes())
    payload["comment"]["body"] = "/fastci explain tests/test_x.py::test_y"
    assert isinstance(events.route("issue_comment", payload), events.Ignored)  # an issue
    payload["issue"]["pull_request"] = {"url": payload["issue"]["url"]}  # GitHub's PR marker
    work = events.route("issue_comment", payload)
    assert work.kind == "command" and work.comment_id == payload["comment"]["id"]


@pytest.mark.parametrize("payload, problem", [
    ([], "JSON object"),
    ({"action": "opened"}, "missing"),
    ({"action": "opened", "number": 1, "repository": {"full_name": "nope"},
      "pull_request": {"number": 1, "head": {"sha": "x" * 40, "repo": None},
                       "base": {"sha": "0" * 40, "ref": "main"}}, "sender": {"login": "a"}},
     "owner/name"),
])
def test_malformed_payloads_are_errors_that_say_why(payload, problem):
    with pytest.raises(events.PayloadError, match=problem):
        events.route("pull_request", payload)


# -- slash commands --------------------------------------------------------------------------
@pytest.mark.parametrize("body, name, argument", [
    ("/fastci run all", "run-all", ""),
    ("/fastci   retest", "retest", ""),
    ("LGTM\n/fastci explain tests/t.py::test_a[x-1]", "explain", "tests/t.py::test_a[x-1]"),
    ("/fastci ok-to-test", "ok-to-test", ""),
    ("/fastci help", "help", ""),
    ("/fastci", "help", ""),
    ("/fastci deploy prod", "unknown", "deploy prod"),
    ("/fastci explain", "unknown", "explain"),
    ('/fastci explain "unbalanced', "explain", '"unbalanced'),  # taken as typed
])
def test_commands_parse(body, name, argument):
    command = parse(body)
    assert (command.name, command.argument) == (name, argument)


# -- check runs within GitHub's limits ----------------------------------------------------------
def test_outputs_are_batched_and_truncated():
    annotations = [{"path": "a.py", "start_line": i, "end_line": i,
                    "annotation_level": "warning", "message": "m"} for i in range(1, 121)]
    out = CheckRunOutput("t" * 300, "s" * 70000, "x" * 70000, annotations)
    batches = out.batches()
    assert [len(b.get("annotations", [])) for b in batches] == [50, 50, 20]
    assert len(batches[0]["summary"].encode()) <= MAX_TEXT and "truncated" in batches[0]["summary"]
    assert len(batches[0]["text"].encode()) <= MAX_TEXT and "text" not in batches[1]
    assert len(batches[0]["title"].encode()) <= 255
    assert fit("short") == "short"


def test_writes_retry_transient_errors_but_not_client_errors():
    from github import GithubException

    calls, waits = [], []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise GithubException(502, {"message": "Bad gateway"}, {})
        return "ok"

    assert retrying(flaky, sleep=waits.append) == "ok"
    assert waits == [0.5, 1.0]

    def bad():
        raise GithubException(422, {"message": "Validation Failed"}, {})

    with pytest.raises(GithubException):
        retrying(bad, sleep=waits.append)


# -- the webhook service: a real WSGI server, real Redis -----------------------------------------
@pytest.fixture
def service(redis, tmp_path):
    prefix = f"fastci-test-{uuid.uuid4().hex[:8]}"
    settings = AppSettings(webhook_secret=Secret(SECRET), workspace=tmp_path,
                           queue_prefix=prefix, max_body_bytes=2**20)
    server = make_server("127.0.0.1", 0, create_app(settings, redis), threaded=True)
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_port}"
    yield url, Queues(redis, prefix)
    server.shutdown()
    for key in redis.scan_iter(f"{prefix}*"):
        redis.delete(key)
    for key in redis.scan_iter(f"rq:*{prefix}*"):
        redis.delete(key)


def post(url: str, event: str, body: bytes, *, secret: str = SECRET, delivery: str | None = None,
         signature: str | None = None, content_type: str = "application/json"):
    headers = {"X-GitHub-Event": event, "X-GitHub-Delivery": delivery or str(uuid.uuid4()),
               "Content-Type": content_type,
               "X-Hub-Signature-256": signature if signature is not None else sign(secret, body)}
    return requests.post(f"{url}/webhooks", data=body, headers=headers, timeout=10)


def payload_bytes(event: str, name: str) -> bytes:
    return payload_path(event, name).read_bytes()


def test_a_signed_real_payload_is_enqueued_once(service):
    url, queues = service
    body = payload_bytes("pull_request", "opened.json")
    delivery = str(uuid.uuid4())
    first = post(url, "pull_request", body, delivery=delivery)
    assert first.status_code == 202, first.text
    assert first.json()["job"] == f"{queues.prefix}-{delivery}"
    again = post(url, "pull_request", body, delivery=delivery)
    assert again.status_code == 200 and "duplicate" in again.json()["message"]
    assert queues.cpu.count == 1
    job = queues.cpu.jobs[0]
    work = events.Work.from_json(job.args[0])
    assert work.number == 5 and work.kind == "pull_request"
    assert SECRET not in json.dumps(job.args)  # no secret travels in a job


@pytest.mark.parametrize("change, status, says", [
    ({"signature": ""}, 401, "unsigned"),
    ({"secret": "wrong"}, 401, "does not match"),
    ({"signature": "sha1=00"}, 401, "sha256="),
    ({"delivery": "../etc/passwd"}, 400, "X-GitHub-Delivery"),
    ({"content_type": "application/x-www-form-urlencoded"}, 415, "application/json"),
])
def test_bad_requests_get_a_clear_4xx(service, change, status, says):
    url, queues = service
    response = post(url, "pull_request", payload_bytes("pull_request", "opened.json"),
                    **change)
    assert response.status_code == status
    assert says in response.json()["message"]
    assert queues.cpu.count == 0


def test_malformed_oversized_unknown_and_ping(service):
    url, queues = service
    bad = post(url, "pull_request", b"{not json")
    assert bad.status_code == 400 and "not valid JSON" in bad.json()["message"]
    missing = post(url, "pull_request", b'{"action": "opened"}')
    assert missing.status_code == 422 and "missing" in missing.json()["message"]
    huge = post(url, "pull_request", b"{" + b" " * (2**20 + 10) + b"}")
    assert huge.status_code == 413
    unknown = post(url, "deployment", b"{}")
    assert unknown.status_code == 202 and "ignored" in unknown.json()["message"]
    ping = post(url, "ping", payload_bytes("ping", "ping.json"))
    assert ping.status_code == 200 and ping.json()["message"] == "pong"
    assert queues.cpu.count == 0
    assert requests.get(f"{url}/webhooks", timeout=5).status_code == 405
    assert requests.get(f"{url}/nope", timeout=5).status_code == 404


def test_a_command_below_a_comment_is_enqueued_and_one_in_code_is_not(service):
    """Through the real webhook: "Looks good.\n\n/fastci ok-to-test" is a command; the same
    line in an indented code block, or written by a bot, is not."""
    url, queues = service
    payload = json.loads(payload_bytes("issue_comment", "created-command.json"))
    assert payload["comment"]["body"] == "Looks good.\n\n/fastci ok-to-test"
    answer = post(url, "issue_comment", json.dumps(payload).encode())
    assert answer.status_code == 202 and answer.json()["message"] == "enqueued command"
    [job] = queues.cpu.jobs
    assert events.Work.from_json(job.args[0]).body == "/fastci ok-to-test"
    payload["comment"]["body"] = "Looks good, try:\n\n    /fastci ok-to-test\n"
    code = post(url, "issue_comment", json.dumps(payload).encode())
    assert code.status_code == 202 and "not a /fastci command" in code.json()["message"]
    payload["comment"]["body"] = "/fastci run all"
    payload["comment"]["user"]["type"] = "Bot"
    bot = post(url, "issue_comment", json.dumps(payload).encode())
    assert bot.status_code == 202 and "bot" in bot.json()["message"]
    assert queues.cpu.count == 1


def test_allowed_bots_come_from_the_environment():
    assert load({"FASTCI_ALLOWED_BOTS": "Renovate[bot], dependabot[bot] ,"}).allowed_bots == \
        frozenset({"renovate[bot]", "dependabot[bot]"})
    assert load({}).allowed_bots == frozenset()


def test_healthz_and_metrics(service):
    from prometheus_client.parser import text_string_to_metric_families

    def samples() -> dict:
        text = requests.get(f"{url}/metrics", timeout=5).text
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}

    url, _ = service
    assert requests.get(f"{url}/healthz", timeout=5).json() == {"status": "ok", "redis": "ok"}
    before = samples()
    post(url, "pull_request", payload_bytes("pull_request", "opened.json"))
    post(url, "pull_request", b"{")
    after = samples()

    def delta(status: str, outcome: str) -> float:
        key = ("fastci_deliveries_total", (("outcome", outcome), ("status", status)))
        return after.get(key, 0) - before.get(key, 0)

    assert delta("202", "enqueued") == 1 and delta("400", "refused") == 1
    assert after[("fastci_enqueued_total", ())] == 1  # this service's prefix: counted in Redis
    assert after[("fastci_redis_up", ())] == 1


def test_a_newer_push_cancels_the_older_heads_queued_work(service):
    url, queues = service
    payload = json.loads(payload_bytes("pull_request", "synchronize.json"))
    first = post(url, "pull_request", json.dumps(payload).encode())
    payload["pull_request"]["head"]["sha"] = "1" * 40
    payload["pull_request"]["updated_at"] = "2024-01-02T10:07:00Z"  # a later push
    second = post(url, "pull_request", json.dumps(payload).encode())
    assert first.status_code == second.status_code == 202
    from fastci.app.queue import fetch

    old = fetch(first.json()["job"], queues.redis)
    new = fetch(second.json()["job"], queues.redis)
    assert old.get_status() == "canceled"
    assert new.get_status() == "queued"
    assert queues.current_head("octo/widgets", 5) == "1" * 40


def test_redis_down_answers_503_and_enqueues_nothing(tmp_path):
    settings = AppSettings(webhook_secret=Secret(SECRET), workspace=tmp_path)
    dead = redis_lib.Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.2)
    client = create_app(settings, dead).test_client()
    body = payload_path("pull_request", "opened.json").read_bytes()
    response = client.post("/webhooks", data=body, headers={
        "X-GitHub-Event": "pull_request", "X-GitHub-Delivery": "abc-1",
        "X-Hub-Signature-256": sign(SECRET, body), "Content-Type": "application/json"})
    assert response.status_code == 503 and "redelivered" in response.get_json()["message"]
    assert client.get("/healthz").status_code == 503


def test_the_service_refuses_to_start_without_a_webhook_secret(tmp_path):
    with pytest.raises(SettingsError, match="FASTCI_WEBHOOK_SECRET"):
        create_app(AppSettings(workspace=tmp_path))


def test_check_runs_batch_annotations_against_the_fake(tmp_path):
    from fakegithub import FakeGitHub
    from github import Auth, GithubIntegration
    from test_fakegithub import APP_ID, INSTALLATION, NO_THROTTLE, REPO, SHA, make_key_pair

    keys = make_key_pair()
    with FakeGitHub() as fake:
        fake.register_app(APP_ID, keys.public)
        fake.add_repo(REPO, installation_id=INSTALLATION)
        gi = GithubIntegration(auth=Auth.AppAuth(APP_ID, keys.private), base_url=fake.url,
                               **NO_THROTTLE)
        repo = gi.get_github_for_installation(INSTALLATION).get_repo(REPO)
        annotations = [{"path": "a.py", "start_line": i, "end_line": i,
                        "annotation_level": "warning", "message": f"m{i}"} for i in range(1, 121)]
        runs = CheckRuns(repo)
        fake.fail_next(1, status=502, method="PATCH")
        run = runs.create("FastCI regressions", SHA, output=CheckRunOutput(
            "t", "s" * 70000, "", annotations))
        extra = [{**a, "message": "new"} for a in annotations[:10]]
        runs.update(run, conclusion="failure", output=CheckRunOutput("done", "ok", "",
                                                                     annotations[:60] + extra),
                    actions=[{"label": str(i), "identifier": str(i), "description": "d"}
                             for i in range(5)])
        [served] = fake.check_runs(REPO)
        assert served["conclusion"] == "failure"
        # Each annotation once: the 60 repeated ones are not sent again, the 10 new ones are.
        assert len(served["annotations"]) == 130
        assert len(served["actions"]) == 3
        assert len(served["output"]["summary"]) <= MAX_TEXT
