"""The payload schema checks (app/schema.py) and the router over payloads that do not fit.

Every payload either routes to Work whose fields have the types the jobs rely on, or is
ignored, or is refused with a PayloadError that names the field: never another exception.
"""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import HealthCheck, given, settings
from mutations import FILES, mutated

from fastci.app import schema
from fastci.app.events import Ignored, PayloadError, Work, route


def fixture(event: str, name: str) -> dict:
    return json.loads(next(p for p in FILES if p.parent.name == event and p.name == name)
                      .read_bytes())


@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_fixture_fits_its_events_schema(path):
    assert schema.problems(path.parent.name, json.loads(path.read_bytes())) == []


@pytest.mark.parametrize("value, says", [
    (-1, "positive integer of at most 64 bits"),
    (0, "positive integer of at most 64 bits"),
    (2**63, "positive integer of at most 64 bits"),
    (1.5, "positive integer, not 1.5"),
    (float("inf"), "positive integer, not inf"),
    (float("nan"), "positive integer, not nan"),
    ("5", "positive integer, not '5'"),
    (True, "positive integer, not True"),
    ({"id": 5}, "positive integer"),
])
def test_ids_out_of_range_or_of_another_type_are_named(value, says):
    payload = fixture("pull_request", "opened.json")
    payload["pull_request"]["number"] = value
    with pytest.raises(PayloadError, match=re.escape(f"pull_request.number must be a {says}")):
        route("pull_request", payload)


@pytest.mark.parametrize("event, name, change, says", [
    ("pull_request", "opened.json", lambda p: p.update(repository="octo/widgets"),
     "repository must be an object, not str"),
    ("pull_request", "opened.json", lambda p: p["pull_request"].update(head=["x"]),
     "pull_request.head must be an object, not list"),
    ("pull_request", "opened.json", lambda p: p["pull_request"]["base"].pop("sha"),
     "pull_request.base.sha is missing"),
    ("pull_request", "opened.json", lambda p: p.update(action=3), "action must be a string"),
    ("push", "default-branch.json", lambda p: p.update(deleted="no"),
     "deleted must be true or false"),
    ("push", "default-branch.json", lambda p: p.update(after="HEAD"),
     "after must be a 40-character hex sha"),
    ("issue_comment", "created-command.json",
     lambda p: p["comment"].update(body="\ud800 /fastci run all"), "comment.body is not valid"),
    ("issue_comment", "created-command.json", lambda p: p["comment"].update(user=None),
     "comment.user must not be null"),
    ("check_suite", "rerequested.json",
     lambda p: p["check_suite"]["pull_requests"].append("#5"),
     "check_suite.pull_requests[1] must be an object"),
    ("check_run", "requested_action.json",
     lambda p: p["check_run"]["pull_requests"][0].update(number=-5),
     "check_run.pull_requests[0].number must be a positive integer"),
    ("installation", "created.json",
     lambda p: p["repositories"].append({"full_name": "nope"}),
     "repositories[1].full_name must be 'owner/name'"),
    ("installation_repositories", "added.json",
     lambda p: p["installation"].update(id=1e400), "installation.id must be a positive"),
])
def test_what_does_not_fit_is_refused_with_the_field(event, name, change, says):
    payload = fixture(event, name)
    change(payload)
    with pytest.raises(PayloadError, match=re.escape(says)):
        route(event, payload)


def test_fields_fastci_does_not_read_are_not_checked():
    payload = fixture("pull_request", "closed.json")
    payload["pull_request"] = "anything"  # a closed pull request runs nothing
    assert isinstance(route("pull_request", payload), Ignored)
    payload = fixture("pull_request", "opened.json")
    payload["pull_request"]["title"] = 12
    payload["new_field_github_added"] = {"x": [1]}
    assert isinstance(route("pull_request", payload), Work)


def _sound(work: Work) -> None:
    """The types the jobs rely on."""
    assert isinstance(work.repo, str) and work.repo.count("/") == 1 or work.kind == "installation"
    for value in (work.installation_id, work.number, work.comment_id):
        assert value is None or (type(value) is int and 0 < value < 2**63)
    for sha in (work.head_sha, work.base_sha):
        assert sha is None or re.fullmatch("[0-9a-f]{40}", sha)
    for name in (work.sender, work.body, work.base_ref, work.head_repo):
        assert name is None or isinstance(name, str) and name.encode()
    json.dumps(work.to_json())


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_a_mutated_payload_is_work_ignored_or_a_payload_error(case):
    event, body = case
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError):
        return  # refused by the webhook before routing (tests/test_fuzz.py)
    try:
        routed = route(event, payload)
    except PayloadError as exc:
        assert str(exc)
        return
    if isinstance(routed, Work):
        _sound(routed)
    else:
        assert isinstance(routed, Ignored) and routed.reason
