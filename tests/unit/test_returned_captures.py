"""Module captures a shard sends back: bytes, checked against the digest and size the
validated recording names, within the base's budget; read on the runner only from the
scratch store the sandbox wrote, never through a link it left in its place."""

from __future__ import annotations

import base64
import hashlib
import sqlite3

import pytest

from fastci.runner.evidence import TestRecord
from fastci.runner.execution.shard import _captures
from fastci.runner.execution.validate import InvalidResult, captures
from fastci.runner.record.recorder import Recording

DATA = b"\x80\x04 a pickled module call"
DIGEST = hashlib.sha256(DATA).hexdigest()
TEST = "tests/test_net.py::test_scale"


def recording(size: int = len(DATA), digest: str = DIGEST) -> Recording:
    modules = {"captures": [{"index": 0, "module": "net.Scale", "digest": digest,
                             "size": size, "why": None, "out": {}, "env": {}, "lines": {}}],
               "outside": {}, "inside": {}, "sys_path": []}
    test = TestRecord(test_id=TEST, outcome="passed", duration=0.1, blocks={}, files={},
                      modules=modules)
    return Recording(tree={}, environment=None, tests={TEST: test}, import_time={},
                     session_files={})


def sent(data: bytes = DATA, digest: str = DIGEST) -> dict:
    return {"captures": {digest: base64.b64encode(data).decode()}}


def test_a_capture_the_evidence_names_comes_back_as_its_bytes():
    assert captures(sent(), recording(), 1) == {DIGEST: DATA}
    assert captures({}, recording(), 1) == {}  # none sent: pruning finds it missing


@pytest.mark.parametrize("result,rec,budget,why", [
    (sent(b"something else"), recording(), 1, "does not match its digest"),
    (sent(), recording(size=3), 1, "does not match its digest and size"),
    (sent(digest="b" * 64), recording(), 1, "belongs to no test"),
    ({"captures": {DIGEST: "not base64!"}}, recording(), 1, "not base64"),
    (sent(), recording(), 1e-9, "over the base's budget"),
])
def test_a_capture_that_is_not_what_the_evidence_names_rejects_the_result(result, rec,
                                                                         budget, why):
    with pytest.raises(InvalidResult, match=why):
        captures(result, rec, budget)


def scratch(path, rows):
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE captures (digest TEXT PRIMARY KEY, data BLOB NOT NULL)")
        db.executemany("INSERT INTO captures VALUES (?, ?)", rows)


def raw_recording() -> dict:
    return {"tests": [{"test_id": TEST, "modules": {"captures": [{"digest": DIGEST}]}}]}


def test_the_runner_sends_only_the_captures_the_recording_names(tmp_path):
    scratch(tmp_path / "scratch-first.db", [(DIGEST, DATA), ("c" * 64, b"unrelated")])
    assert _captures(tmp_path, ["first", "again"], raw_recording()) == {
        DIGEST: base64.b64encode(DATA).decode()}
    assert _captures(tmp_path, ["first"], {"tests": "garbage"}) == {}


def test_the_runner_never_reads_a_scratch_store_through_a_link(tmp_path):
    elsewhere = tmp_path / "worker-secrets.db"
    scratch(elsewhere, [(DIGEST, DATA)])
    (tmp_path / "scratch-first.db").symlink_to(elsewhere)
    assert _captures(tmp_path, ["first"], raw_recording()) == {}
