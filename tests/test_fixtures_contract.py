"""The project's GitHub fixtures against the facts GitHub's recordings show.

FastCI keeps its own fixtures (fastci/testing/fixtures): REST answers the fake serves and
webhook payloads the tests send, written from the facts the recordings show (field names,
types, status codes, headers) with values of their own. Those facts are kept beside this
file (github_facts.json), so every clone checks its fixtures against them. When ../shared
holds the recordings themselves (PyGithub's replay data, octokit's payload examples), one more
test derives the facts again and checks that the kept ones still say what GitHub says.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import SHARED

from fastci.testing import FIXTURES

# Fields a fixture adds that GitHub's payload examples lack, each with why (the payloads'
# README names these gaps): an issue_comment on a pull request carries issue.pull_request.
DERIVED = {("issue_comment", "issue.pull_request")}


@dataclass(frozen=True)
class Exchange:
    """One recorded request and GitHub's answer to it (11 lines of a replay file)."""

    method: str
    path: str
    request_headers: dict[str, str]
    request_body: Any
    status: int
    response_headers: dict[str, str]
    response_body: Any


def read_exchanges(path: Path) -> list[Exchange]:
    """Every exchange in a PyGithub replay file, in recorded order."""
    lines = path.read_text(encoding="utf-8").split("\n")
    exchanges = []
    for i in range(0, len(lines) - 10, 11):
        if lines[i] not in ("http", "https"):
            raise ValueError(f"{path.name}: line {i + 1} does not start an exchange")
        _, verb, _, _, url, rq_h, rq_b, status, rs_h, rs_b, _ = lines[i:i + 11]
        exchanges.append(Exchange(
            method=verb, path=url, request_headers=ast.literal_eval(rq_h),
            request_body=None if rq_b == "None" else json.loads(rq_b), status=int(status),
            response_headers=dict(ast.literal_eval(rs_h)),
            response_body=json.loads(rs_b) if rs_b else None))
    return exchanges


def recorded(replay_dir: Path, filename: str, method: str, path_pattern: str) -> Exchange:
    """The first exchange of ``filename`` whose request matches; loud when the data drifted."""
    for exchange in read_exchanges(replay_dir / filename):
        if exchange.method == method and re.fullmatch(path_pattern, exchange.path.split("?")[0]):
            return exchange
    raise LookupError(f"{filename} holds no {method} {path_pattern}")


REPLAY, PAYLOADS = SHARED / "github-replay", SHARED / "github-payloads"
needs_recordings = pytest.mark.skipif(
    not (REPLAY.is_dir() and PAYLOADS.is_dir()),
    reason="../shared/github-replay and github-payloads are not beside the project: the kept "
           "facts (github_facts.json) are checked, not derived again from the recordings")
FACTS_FILE = Path(__file__).resolve().parent / "github_facts.json"


# -- shapes: the field names and JSON types a set of documents shows -------------------------
def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return {dict: "object", list: "array", str: "string"}[type(value)]


def shape(*documents: Any) -> dict:
    """The union of the documents' shapes: kind -> (fields for objects, items for arrays)."""
    out: dict = {}
    for doc in documents:
        kind = _kind(doc)
        if kind == "object":
            fields = out.setdefault("object", {})
            for key, value in doc.items():
                fields[key] = _merge(fields.get(key, {}), shape(value))
        elif kind == "array":
            out["array"] = _merge(out.get("array", {}), shape(*doc))
        else:
            out[kind] = None
    return out


def _merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for kind, sub in b.items():
        if kind == "object":
            fields = dict(out.get("object", {}))
            for key, value in sub.items():
                fields[key] = _merge(fields.get(key, {}), value)
            out["object"] = fields
        elif kind == "array":
            out["array"] = _merge(out.get("array", {}), sub)
        else:
            out[kind] = None
    return out


def mismatches(value: Any, expected: dict, path: str = "", derived: frozenset = frozenset()
               ) -> list[str]:
    """Where ``value`` names a field GitHub's documents lack or gives one another JSON type.
    GitHub's fields are nullable: null matches any kind, and any kind matches a field the
    recordings only show as null."""
    kind = _kind(value)
    if kind == "null" or not expected or set(expected) == {"null"}:
        return []
    if kind not in expected:
        return [f"{path or '(body)'}: {kind}, GitHub sends {'/'.join(sorted(expected))}"]
    if kind == "object":
        problems = []
        for key, item in value.items():
            where = f"{path}.{key}" if path else key
            if where in derived:
                continue
            if key not in expected["object"]:
                problems.append(f"{where}: no such field in GitHub's")
            else:
                problems += mismatches(item, expected["object"][key], where, derived)
        return problems
    if kind == "array":
        return [p for item in value for p in mismatches(item, expected["array"], path + "[]",
                                                        derived)]
    return []


def test_shapes_catch_what_they_should():
    """The checker itself: a renamed field, a retyped one and a nested one are caught."""
    github = shape({"id": 1, "user": {"login": "a"}, "labels": [{"name": "x"}], "closed_at": None})
    assert mismatches({"id": 2, "user": {"login": "b"}, "closed_at": "2024"}, github) == []
    assert mismatches({"ID": 2}, github) == ["ID: no such field in GitHub's"]
    assert mismatches({"id": "2"}, github) == ["id: string, GitHub sends number"]
    assert mismatches({"labels": [{"name": 1}]}, github) == \
        ["labels[].name: number, GitHub sends string"]


# -- the recordings themselves -----------------------------------------------------------------
@needs_recordings
def test_every_replay_file_is_whole_eleven_line_exchanges():
    for path in sorted(REPLAY.glob("*.txt")):
        lines = path.read_text(encoding="utf-8").split("\n")
        exchanges = read_exchanges(path)
        assert exchanges, path.name
        assert len(lines) - 11 * len(exchanges) in (0, 1), f"{path.name} has stray lines"


# -- REST answers the fake serves ----------------------------------------------------------------
REST = sorted(p.stem for p in (FIXTURES / "rest").glob("*.json"))
DERIVED_FROM_PAYLOADS = {"pull": ("pull_request", "pull_request"), "issue": ("issue_comment",
                                                                             "issue")}


def _rest(name: str) -> dict:
    return json.loads((FIXTURES / "rest" / f"{name}.json").read_text())


def test_the_rest_fixtures_are_the_ones_the_fake_reads():
    assert REST == ["annotations", "app", "check_run", "comment", "expired_jwt", "installation",
                    "installation_repositories", "issue", "no_push", "not_found",
                    "not_granted", "oauth_token", "permission", "pull", "reaction", "repo",
                    "token"]


def facts() -> dict:
    """What the recordings say about each fixture: a REST answer's method, status, headers,
    request fields and body shape; a derived object's shape and the fields every example has;
    each webhook event's payload shape."""
    rest = {}
    for name in (n for n in REST if n not in DERIVED_FROM_PAYLOADS):
        filename, method, pattern = _rest(name)["recorded_as"].split(" ", 2)
        exchange = recorded(REPLAY, filename, method, pattern)
        documents = [exchange.response_body]
        if name == "comment":  # the 2012 recording, completed from today's comment object
            documents += [json.loads(p.read_bytes())["comment"]
                          for p in sorted((PAYLOADS / "issue_comment").glob("*.json"))]
        body = exchange.response_body
        error = isinstance(body, dict) and set(body) <= {"message", "documentation_url",
                                                         "errors"}
        rest[name] = {
            "method": exchange.method, "status": exchange.status,
            "headers": {k.lower(): v for k, v in exchange.response_headers.items()},
            "request": None if exchange.request_body is None else sorted(exchange.request_body),
            "shape": shape(*documents),
            "fields": sorted(body) if isinstance(body, dict) else None,
            "message": body["message"] if error else None}
    derived = {}
    for name, (event, key) in sorted(DERIVED_FROM_PAYLOADS.items()):
        objects = [json.loads(p.read_bytes())[key]
                   for p in sorted((PAYLOADS / event).glob("*.json"))]
        derived[name] = {"shape": shape(*objects),
                         "common": sorted(set.intersection(*(set(o) for o in objects)))}
    payloads = {event: shape(*[json.loads(p.read_bytes())
                               for p in sorted((PAYLOADS / event).glob("*.json"))])
                for event in sorted({p.parent.name for p in PAYLOAD_FIXTURES})}
    return {"rest": rest, "derived": derived, "payloads": payloads}


PAYLOAD_FIXTURES = sorted((FIXTURES / "payloads").glob("*/*.json"))
FACTS = json.loads(FACTS_FILE.read_text())


@needs_recordings
def test_the_kept_facts_are_what_the_recordings_show():
    """Regenerate with: python -c "import json, sys; sys.path[:0] = ['tests']; import
    test_fixtures_contract as t; print(json.dumps(t.facts(), indent=1, sort_keys=True))"
    > tests/github_facts.json"""
    assert json.loads(json.dumps(facts())) == FACTS


@pytest.mark.parametrize("name", [n for n in REST if n not in DERIVED_FROM_PAYLOADS])
def test_a_rest_fixture_answers_as_github_recorded(name):
    fixture, fact = _rest(name), FACTS["rest"][name]
    pattern = fixture["recorded_as"].split(" ", 2)[2]
    assert (fixture["method"], fixture["status"]) == (fact["method"], fact["status"])
    assert re.fullmatch(pattern, fixture["path"])
    for header, value in fixture["headers"].items():
        assert fact["headers"].get(header.lower()) == value, header
    if "request" in fixture:
        assert fixture["request"] == fact["request"]
    body = fixture["body"]
    assert mismatches(body, fact["shape"]) == []
    if fact["fields"] is not None:
        missing = set(fact["fields"]) - set(body)
        assert not missing, f"{name} lacks fields GitHub sends: {sorted(missing)}"
    if fact["message"] is not None:
        assert body["message"] == fact["message"]  # GitHub's own words


@pytest.mark.parametrize("name", sorted(DERIVED_FROM_PAYLOADS))
def test_a_derived_rest_fixture_has_the_payloads_object_shape(name):
    body, fact = _rest(name)["body"], FACTS["derived"][name]
    assert mismatches(body, fact["shape"]) == []
    missing = set(fact["common"]) - set(body)  # what every example has
    assert not missing, f"{name} lacks fields GitHub sends: {sorted(missing)}"


# -- webhook payloads the tests send -------------------------------------------------------------
@pytest.mark.parametrize("path", PAYLOAD_FIXTURES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_payload_fixture_has_the_shape_github_sends(path):
    event = path.parent.name
    assert event in FACTS["payloads"], f"no recorded {event} payload to compare with"
    derived = frozenset(where for ev, where in DERIVED if ev == event)
    if path.name.startswith("edited"):  # an edit carries what changed (GitHub's docs)
        derived |= {"changes"}
    assert mismatches(json.loads(path.read_bytes()), FACTS["payloads"][event],
                      derived=derived) == []
