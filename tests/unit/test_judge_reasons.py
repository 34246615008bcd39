"""Why a candidate stays selected when its two replays did not both run: the reason names
the most telling of them (a failure, then the time limit, then a skip caused by the other),
whichever tree's process happened to finish first."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from fastci.runner.prune.budget import Deadline
from fastci.runner.prune.decide import Candidate, _judge_capture
from fastci.runner.prune.settle import SKIPPED

FAILED = {"fingerprints": {}, "error": "RuntimeError: module state differs: net.MODE"}
CUT = Deadline(2.0).result()
SKIP = {"fingerprints": {}, "error": SKIPPED}
FINE = {"fingerprints": {"out": {"hash": "a"}}, "error": None}


def why(before: dict, after: dict) -> str:
    cand = Candidate("t", ("d",), {"d": "net.Scale"}, {"d": {"out": {"hash": "a"}}})
    replays = SimpleNamespace(missing=set(), corrupt=set(), old={"d": before},
                              new={"d": after})
    reason, _ = _judge_capture(cand, replays, "d", tolerance=False)
    assert reason is not None
    return reason


@pytest.mark.parametrize("before,after,expected", [
    (SKIP, FAILED, "under the new code failed: RuntimeError: module state differs"),
    (FAILED, SKIP, "under the evidence's code failed: RuntimeError: module state differs"),
    (CUT, FAILED, "under the new code failed: RuntimeError: module state differs"),
    (FAILED, CUT, "under the evidence's code failed: RuntimeError"),
    (CUT, FINE, "not replayed before pruning's time limit ran out"),
    (SKIP, CUT, "not replayed before pruning's time limit ran out"),
])
def test_the_most_telling_replay_gives_the_reason(before, after, expected):
    assert expected in why(before, after)


def judged(before: dict, after: dict, tolerance: bool, close: dict | None = None):
    cand = Candidate("t", ("d",), {"d": "lib.loss"}, {"d": {}})
    after = {**after, "close": close if close is not None else {"out": "ok"}}
    replays = SimpleNamespace(missing=set(), corrupt=set(), old={"d": before},
                              new={"d": after})
    return _judge_capture(cand, replays, "d", tolerance=tolerance)[0]


TENSOR = {"hash": "1", "dtype": "float32", "shape": [2], "sum": 1.0}


@pytest.mark.parametrize("leaf,changed", [
    ("rng", {"hash": "2", "dtype": "uint8", "shape": [5056]}),  # one more random draw
    ("out.step", {"repr": "4"}),  # a plain value beside the tensors
    ("out#structure", {"hash": "b"}),  # a config field, deep in the returned object
    ("globals.lib.SETTINGS", {"repr": "9"}),  # a global the call assigned
])
def test_tolerance_excuses_tensor_values_and_nothing_else(leaf, changed):
    before = {"fingerprints": {"out": TENSOR, "out#": {"hash": "x"}, "rng": {
        "hash": "1", "dtype": "uint8", "shape": [5056]}, "out.step": {"repr": "3"},
        "out#structure": {"hash": "a"}, "globals.lib.SETTINGS": {"repr": "0"}}, "error": None}
    rounded = {**before["fingerprints"], "out": {**TENSOR, "hash": "2"}, "out#": {"hash": "y"}}
    assert judged(before, {"fingerprints": rounded, "error": None}, tolerance=True) is None
    moved = {**rounded, leaf: changed}
    reason = judged(before, {"fingerprints": moved, "error": None}, tolerance=True)
    assert reason is not None and leaf in reason
    # Exact mode keeps both.
    assert judged(before, {"fingerprints": rounded, "error": None}, tolerance=False)
