"""Bad input of every kind, generated: the webhook answers 4xx (or a deliberate 2xx) with a
message in JSON, never a 500 and never a crash, and counts every outcome in /metrics; the CLI
exits with its documented codes and a one-line reason, never a traceback."""

from __future__ import annotations

import json
import string
import uuid

import pytest
from conftest import redis_or_skip
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mutations import mutated

from fastci.app.events import Work
from fastci.app.queue import fetch
from fastci.app.settings import AppSettings, Secret
from fastci.app.signature import sign
from fastci.app.web import create_app

SECRET = "fuzz-secret"
EVENTS = ["pull_request", "push", "check_suite", "check_run", "issue_comment", "installation",
          "installation_repositories", "ping", "deployment", "star", "PULL_REQUEST", "", "x" * 80]
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(
        st.text(max_size=12), children, max_size=5), max_leaves=20)


def _client(tmp_path_factory, max_body_bytes: int):
    redis = redis_or_skip()
    prefix = f"fastci-fuzz-{uuid.uuid4().hex[:8]}"
    app = create_app(AppSettings(webhook_secret=Secret(SECRET), queue_prefix=prefix,
                                 max_body_bytes=max_body_bytes,
                                 workspace=tmp_path_factory.mktemp("ws")), redis)
    yield app.test_client()
    for key in redis.scan_iter(f"*{prefix}*"):
        redis.delete(key)


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    yield from _client(tmp_path_factory, 64 * 1024)


@pytest.fixture(scope="module")
def big_client(tmp_path_factory):
    """A service that reads bodies of up to 1 MB (nesting 100,000 deep takes 200 KB)."""
    yield from _client(tmp_path_factory, 2**20)


def _post(client, event, body: bytes, *, signature=None, delivery=None, content_type=None):
    headers = {"X-GitHub-Event": event, "X-GitHub-Delivery": delivery or str(uuid.uuid4()),
               "Content-Type": content_type or "application/json",
               "X-Hub-Signature-256": sign(SECRET, body) if signature is None else signature}
    return client.post("/webhooks", data=body, headers=headers)


def _check(response) -> None:
    assert response.status_code < 500, response.get_data()[:300]
    assert response.is_json and isinstance(response.get_json().get("message"), str)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(event=st.sampled_from(EVENTS), payload=json_values)
def test_any_signed_json_gets_a_clear_answer(client, event, payload):
    _check(_post(client, event, json.dumps(payload).encode()))


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(event=st.sampled_from(EVENTS), body=st.binary(max_size=2048))
def test_any_signed_bytes_get_a_clear_answer(client, event, body):
    _check(_post(client, event, body))


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(signature=st.text(max_size=80), delivery=st.text(
    alphabet=string.printable, max_size=70), content_type=st.sampled_from(
    ["application/json", "text/plain", "application/x-www-form-urlencoded", "", "json"]))
def test_bad_headers_are_refused_and_enqueue_nothing(client, signature, delivery, content_type):
    body = b'{"action": "opened"}'
    try:
        response = _post(client, "pull_request", body, signature=signature,
                         delivery=delivery or "d", content_type=content_type)
    except ValueError:
        return  # the test client itself refuses header values with newlines
    _check(response)
    if signature != sign(SECRET, body):
        assert response.status_code == 401


@settings(max_examples=2500, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=mutated())
def test_mutated_payloads_get_a_4xx_with_the_reason_never_a_5xx(client, case):
    """Thousands of signed payloads, each a fixture with fields deleted, retyped or replaced by
    surprising JSON (1e400, NaN, 2**64, "5", lone surrogates, deep nesting). Whatever is
    enqueued holds sound Work."""
    event, body = case
    response = _post(client, event, body)
    _check(response)
    job_id = response.get_json().get("job")
    if job_id:
        work = Work.from_json(fetch(job_id, redis_or_skip()).args[0])  # JSON, never pickle
        assert work.repo.count("/") == 1 or work.kind == "installation"
        assert all(v is None or (type(v) is int and 0 < v < 2**63)
                   for v in (work.number, work.installation_id, work.comment_id))


def _deep(depth: int) -> bytes:
    return ('{"action": "opened", "pull_request": ' + '{"head": ' * depth + "1"
            + "}" * depth + "}").encode()


@pytest.mark.parametrize("body, status, says", [
    (b"[" * 100_000 + b"]" * 100_000, 400, "nested too deeply"),
    (_deep(100_000), 400, "nested too deeply"),
    (b'{"action": "opened", "number": 1e400}', 422, "does not fit"),
    (b'{"action": "synchronize", "pull_request": "5"}', 422, "pull_request must be an object"),
    ('{"action": "opened", "x": "caf\u00e9"}'.encode("utf-16"), 422, "does not fit"),
    (b'{"action": "\\ud800 lone"}', 422, "action is not valid Unicode"),
    (b'{"action": "op\xffened"}', 400, "not valid JSON"),
    (b"\xef\xbb\xbf{}", 422, "action is missing"),  # a UTF-8 byte-order mark is read
], ids=["array-100k-deep", "object-100k-deep", "1e400", "string-for-object", "utf-16",
        "lone-surrogate", "invalid-utf-8", "byte-order-mark"])
def test_deep_and_badly_encoded_bodies_get_a_4xx(big_client, body, status, says):
    response = _post(big_client, "pull_request", body)
    _check(response)
    assert response.status_code == status and says in response.get_json()["message"], \
        response.get_json()


@pytest.mark.parametrize("signature", ["sha256=caf\u00e9", "sha256=" + "\u00ff" * 64,
                                       "\u00e9sha256=00"])
def test_a_non_ascii_signature_is_a_401(client, signature):
    response = _post(client, "pull_request", b"{}", signature=signature)
    _check(response)
    assert response.status_code == 401


def test_every_answer_is_json_flasks_own_errors_too(tmp_path):
    def broken():
        raise RuntimeError("a bug")

    app = create_app(AppSettings(webhook_secret=Secret(SECRET), workspace=tmp_path,
                                 queue_prefix=f"fastci-fuzz-{uuid.uuid4().hex[:8]}"),
                     redis_or_skip())
    app.add_url_rule("/broken", "broken", broken)  # a bug, to reach the 500 handler
    client = app.test_client()
    for response, status in [(client.get("/nowhere"), 404), (client.get("/webhooks"), 405),
                             (client.put("/healthz"), 405), (client.get("/broken"), 500),
                             (client.post("/webhooks", data=b"{}"), 401)]:
        assert response.status_code == status, response.get_data()
        assert response.is_json and isinstance(response.get_json()["message"], str)
    assert "RuntimeError" in client.get("/broken").get_json()["message"]


def test_every_outcome_is_counted(big_client):
    from prometheus_client.parser import text_string_to_metric_families

    def count(status: int, name: str = "deliveries_total") -> int:
        text = big_client.get("/metrics").get_data(as_text=True)
        return int(sum(s.value for f in text_string_to_metric_families(text)
                       for s in f.samples
                       if s.name == f"fastci_{name}" and s.labels["status"] == str(status)))

    before = {s: count(s) for s in (400, 401, 422)}
    before_404 = count(404, "requests_total")
    _post(big_client, "pull_request", b"[" * 100_000 + b"]" * 100_000)
    _post(big_client, "pull_request", b"{}", signature="sha256=\u00e9")
    _post(big_client, "pull_request", b'{"action": "opened", "number": 1e400}')
    big_client.get("/nowhere")
    assert {s: count(s) - before[s] for s in before} == {400: 1, 401: 1, 422: 1}
    assert count(404, "requests_total") == before_404 + 1


def test_huge_bodies_are_refused_before_they_are_read(client):
    response = _post(client, "pull_request", b"x" * (64 * 1024 + 1))
    assert response.status_code == 413 and "limit" in response.get_json()["message"]


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=st.lists(st.sampled_from(
    ["select", "run", "explain", "record", "--base", "HEAD~99", "no-such-rev", "--head",
     "--format", "xml", "--store", "/proc/nope/e.db", "--repo", "/nonexistent", "::",
     "tests/none.py::t", "--jobs", "-3", "--gpu", "-1", "worker", "--all", "--show-skipped",
     "--no-prune", "-q"]), min_size=1, max_size=5))
def test_the_cli_never_shows_a_traceback(library, args):
    # `run`/`record` would run the suite: keep them to their argument errors.
    if args[0] in ("run", "record", "worker") and not any(
            a in args for a in ("--repo", "--store", "--base", "--format", "--gpu")):
        return
    proc = library.fastci(*args, check=False)
    assert proc.returncode in (0, 1, 2, 3, 4, 5), (args, proc.stderr)
    assert "Traceback" not in proc.stderr, (args, proc.stderr)
    if proc.returncode in (2, 3, 4):
        assert proc.stderr.strip(), args
