"""A replay skips only what can change no decision, and a skipped capture never counts as
replayed: the rules of `fastci.runner.prune.settle` and how `decide` judges what they skip."""

from __future__ import annotations

from types import SimpleNamespace

from fastci.runner.prune.decide import Candidate, _judge
from fastci.runner.prune.replayers import ReplayItem, SettlePlan, settle_failures
from fastci.runner.prune.settle import SKIPPED, Settled, order, orders, unlike_recorded

LEAF = {"hash": "aa", "dtype": "float32"}
OTHER = {"hash": "bb", "dtype": "float32"}
RECORDED = {"out": {"hash": "aa"}}  # a recording keeps the hashes only


def test_a_capture_is_skipped_only_when_every_test_that_needs_it_is_settled(tmp_path):
    settled = tmp_path / "settled"
    new = Settled([["a", "b"], ["b", "c"]], str(settled),
                  [{"a": RECORDED, "b": RECORDED}, {"b": RECORDED, "c": RECORDED}])
    new.replayed("a", {"fingerprints": {"out": OTHER}, "error": None})
    assert not new.skip("b")  # the second test, which needs b and c, is still open
    new.replayed("c", {"fingerprints": {"out": LEAF}, "error": None})  # as recorded
    assert not new.skip("b")
    new.replayed("c", {"fingerprints": {}, "error": "RuntimeError: boom"})  # a failure settles
    assert new.skip("b")
    assert not new.skip("z")  # no test named it: never skipped


def test_a_result_settles_only_the_tests_whose_own_recording_it_contradicts(tmp_path):
    # Two tests share a capture but recorded different results of it (a call whose output
    # the capture does not pin down): what one replay gives may match either. Settling the
    # capture for both would skip the other test's remaining calls, and that test could
    # have been pruned.
    new = Settled([["a", "b"], ["a", "c"]], str(tmp_path / "settled"),
                  [{"a": RECORDED, "b": RECORDED}, {"a": {"out": {"hash": "bb"}},
                                                    "c": RECORDED}])
    new.replayed("a", {"fingerprints": {"out": OTHER}, "error": None})
    assert new.skip("b")  # the first test recorded aa: settled
    assert not new.skip("c")  # the second recorded bb, as replayed: still open


def test_the_evidence_trees_process_skips_what_the_new_trees_settled(tmp_path):
    settled = tmp_path / "settled"
    new = Settled([["a", "b"]], str(settled), [{"a": RECORDED, "b": RECORDED}])
    old = Settled([["a", "b"]], str(settled))  # no recorded fingerprints: it only reads
    assert not old.skip("b")
    old.replayed("b", {"fingerprints": {"out": OTHER}, "error": None})  # settles nothing
    assert not settled.exists()
    new.replayed("a", {"fingerprints": {"out": OTHER}, "error": None})
    assert old.skip("b") and old.skip("a")


def test_only_the_fields_a_recording_kept_are_compared():
    assert unlike_recorded({"out": {"hash": "aa", "max": 3.0}}, RECORDED) == []
    assert unlike_recorded({"out": OTHER}, RECORDED) == ["out"]
    assert unlike_recorded({}, RECORDED) == ["out"]  # a leaf the replay did not produce
    assert unlike_recorded({"out": {"error": "x"}}, RECORDED) == ["out"]


def test_the_new_tree_replays_the_most_needed_captures_first():
    assert order(["a", "b", "c"], [["c"], ["b", "c"], ["c", "a"]]) == ["c", "a", "b"]


def test_under_a_budget_both_trees_replay_in_one_order():
    groups = [["c"], ["b", "c"], ["c", "a"]]
    # Unlimited: the evidence's tree starts from the other end (it settles sooner).
    assert orders(["a", "b", "c"], ["a", "b", "c"], groups, budgeted=False) == \
        (["b", "a", "c"], ["c", "a", "b"])
    # Cut off at the same moment, two processes from opposite ends would share no call.
    assert orders(["a", "b", "c"], ["a", "b", "c"], groups, budgeted=True) == \
        (["c", "a", "b"], ["c", "a", "b"])


def _replays(old: dict, new: dict) -> SimpleNamespace:
    return SimpleNamespace(old=old, new=new, missing=set(), corrupt=set(), overrides={})


def _candidate(*digests: str) -> Candidate:
    return Candidate("t::x", digests, {d: "pkg.Layer" for d in digests},
                     {d: RECORDED for d in digests})


SAME = {"fingerprints": {"out": LEAF}, "error": None, "lines": {}}
SKIP = {"fingerprints": {}, "error": SKIPPED}


def test_a_skipped_capture_keeps_its_test_even_when_every_other_one_matches():
    # Were a skipped replay read as "nothing differs", a test whose one changed call was
    # skipped would be pruned: the one way skipping could let a regression through.
    why, _ = _judge(_candidate("a", "b"), _replays({"a": SAME, "b": SKIP},
                                                   {"a": SAME, "b": SAME}), tolerance=False)
    assert why and SKIPPED in why
    why, _ = _judge(_candidate("a", "b"), _replays({"a": SAME, "b": SAME},
                                                   {"a": SAME, "b": SKIP}), tolerance=False)
    assert why and SKIPPED in why


def test_the_reason_names_the_call_that_differs_not_the_one_skipped():
    differs = {"fingerprints": {"out": OTHER}, "error": None}
    why, _ = _judge(_candidate("a", "b"), _replays({"a": SKIP, "b": SKIP},
                                                   {"a": SKIP, "b": differs}), tolerance=False)
    assert why == "Layer under the new code differs at out (from what the test computed)"


def test_a_new_tree_process_that_failed_settles_every_test_that_needed_its_calls(tmp_path):
    # The new tree's process died (a segfault in the changed code): it noted nothing, but
    # each of its calls came back as an error, which keeps every test that needs one. The
    # evidence's tree's process beside it must stop replaying them.
    groups = [["a", "b"], ["c"], ["d"]]
    settled = tmp_path / "settled"
    new = ReplayItem("new-g0", tmp_path, {d: tmp_path / d for d in "abc"},
                     settle=SettlePlan(groups, settled, [{}, {}, {}]))
    settle_failures(new, new.failed("the replay process exited with -11: no output"))
    assert settled.read_text().split() == ["0", "1"]  # "d" was not this process's to replay
    old = Settled(groups, str(settled))
    assert old.skip("a") and old.skip("c") and not old.skip("d")


def test_only_the_calls_that_failed_settle_and_only_from_the_new_tree(tmp_path):
    groups = [["a"], ["b"]]
    settled = tmp_path / "settled"
    # as replay.py writes them: a success carries "error": None
    output = {"captures": {"a": {"fingerprints": {"out": LEAF}, "error": None},
                           "b": {"fingerprints": {}, "error": "raised"}}}
    old = ReplayItem("old-g0", tmp_path, {}, settle=SettlePlan(groups, settled))
    settle_failures(old, output)  # the evidence's tree settles nothing: it has no recordings
    assert not settled.exists()
    new = ReplayItem("new-g0", tmp_path, {}, settle=SettlePlan(groups, settled, [{}, {}]))
    settle_failures(new, {"captures": {"a": {"fingerprints": {"out": LEAF}, "error": None}}})
    assert not settled.exists()  # everything replayed: the process noted what it settled
    settle_failures(new, output)
    assert settled.read_text().split() == ["1"]


def test_under_a_budget_the_captures_worth_the_most_test_time_come_first():
    """A 10 s training test's one call before the calls of three 0.01 s tests: a budget that
    runs out after one replay has then pruned the most it could."""
    groups = [["long"], ["a", "b"], ["a"], ["b"]]
    assert order(["a", "b", "long"], groups, seconds=[10.0, 0.01, 0.01, 0.01])[0] == "long"
    assert order(["a", "b", "long"], groups)[0] in ("a", "b")  # by count alone
