"""The project's GitHub fixtures against the facts GitHub's recordings show.

FastCI keeps its own fixtures (fastci/testing/fixtures): REST answers the fake serves and
webhook payloads the tests send, written from the facts the recordings show (field names,
types, status codes, headers) with values of their own. Those facts are kept beside this
file (github_facts.json), so every clone checks its fixtures against them. Deriving the facts
again from the recordings themselves (PyGithub's replay data, octokit's payload examples,
which ../shared holds and the project does not copy) is a maintainer's check, not a test:
`python tests/derive_github_facts.py` (see there).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from fastci.testing import FIXTURES

# Fields a fixture adds that GitHub's payload examples lack, each with why (the payloads'
# README names these gaps): an issue_comment on a pull request carries issue.pull_request.
DERIVED = {("issue_comment", "issue.pull_request")}


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


PAYLOAD_FIXTURES = sorted((FIXTURES / "payloads").glob("*/*.json"))
FACTS = json.loads(FACTS_FILE.read_text())


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
