"""Derive tests/github_facts.json again from GitHub's recordings: a maintainer's check.

The contract tests (test_fixtures_contract.py) check every fixture against the facts kept
in github_facts.json, in every clone. Those facts come from real recordings that the
project does not copy: PyGithub's replay data and octokit's webhook payload examples, in
../shared/github-replay and ../shared/github-payloads beside the checkout. Where they are
there, this script reads them, checks that each replay file is whole 11-line exchanges, and
compares what they say with the kept facts (exit 1 and the differing keys if they drifted);
`--write` writes the kept facts anew.

    python tests/derive_github_facts.py [--write]
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_fixtures_contract import (  # noqa: E402 (tests/ is no package)
    DERIVED_FROM_PAYLOADS,
    FACTS_FILE,
    PAYLOAD_FIXTURES,
    REST,
    _rest,
    shape,
)

SHARED = Path(__file__).resolve().parents[2] / "shared"
REPLAY, PAYLOADS = SHARED / "github-replay", SHARED / "github-payloads"


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


def whole_exchanges() -> list[str]:
    """Replay files with lines outside whole exchanges."""
    bad = []
    for path in sorted(REPLAY.glob("*.txt")):
        lines = path.read_text(encoding="utf-8").split("\n")
        exchanges = read_exchanges(path)
        if not exchanges or len(lines) - 11 * len(exchanges) not in (0, 1):
            bad.append(path.name)
    return bad


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write github_facts.json anew")
    args = parser.parse_args()
    if not (REPLAY.is_dir() and PAYLOADS.is_dir()):
        print(f"derive_github_facts: no recordings at {REPLAY} and {PAYLOADS}; nothing to "
              "derive (the kept facts are checked by the contract tests)", file=sys.stderr)
        return 2
    bad = whole_exchanges()
    if bad:
        print(f"derive_github_facts: not whole exchanges: {', '.join(bad)}", file=sys.stderr)
        return 1
    derived = json.loads(json.dumps(facts()))
    if args.write:
        FACTS_FILE.write_text(json.dumps(derived, indent=1, sort_keys=True) + "\n")
        print(f"wrote {FACTS_FILE}")
        return 0
    kept = json.loads(FACTS_FILE.read_text())
    drifted = sorted(f"{part}.{name}" for part in set(derived) | set(kept)
                     for name in set(derived.get(part, {})) | set(kept.get(part, {}))
                     if derived.get(part, {}).get(name) != kept.get(part, {}).get(name))
    if drifted:
        print(f"derive_github_facts: the kept facts differ from the recordings at "
              f"{', '.join(drifted)}; rerun with --write and review the diff", file=sys.stderr)
        return 1
    print(f"the kept facts are what the recordings show ({FACTS_FILE.name})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
