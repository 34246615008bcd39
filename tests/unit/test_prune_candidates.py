"""Which selected tests equivalent-context pruning may try to drop, and why the others stay.

Only the pure part (`candidates`): a test is a candidate when every reason it was selected is
changed code it executed, and that code ran only inside module calls that were captured.
No replay process runs here.
"""

from __future__ import annotations

from dataclasses import replace

from selection_world import dedented, edit, inventories, selection_input

from fastci.runner.evidence import TestRecord
from fastci.runner.prune.decide import candidates
from fastci.runner.selection.report import Decision, Selection
from fastci.runner.selection.rules import select

OLD = dedented({
    "pkg/__init__.py": "",
    "pkg/layers.py": '''
        import torch


        class Scale(torch.nn.Module):
            def forward(self, x):
                y = x * 2
                return y + 0


        def helper(x):
            return x + 1
    ''',
    "tests/test_layers.py": '''
        from pkg.layers import Scale, helper


        def test_scale():
            assert Scale()(1) == 2


        def test_helper():
            assert helper(1) == 2
    ''',
})
LAYERS = OLD["pkg/layers.py"].splitlines()
Y_LINE = LAYERS.index("        y = x * 2") + 1
RETURN_LINE = Y_LINE + 1
SCALE = "tests/test_layers.py::test_scale"
HELPER = "tests/test_layers.py::test_helper"


def capture(digest="d1", lines=(Y_LINE, RETURN_LINE), **extra) -> dict:
    return {"digest": digest, "module": "pkg.layers.Scale", "out": {"output": f"hash-{digest}"},
            "lines": {"pkg/layers.py": list(lines)}, "env": {"TRITON_INTERPRET": "1"}, **extra}


def modules(captures, outside=(), inside=()) -> dict:
    return {"captures": list(captures), "outside": {"pkg/layers.py": list(outside)},
            "inside": {"pkg/layers.py": list(inside)}, "sys_path": []}


def evidence_for(scale_modules=None, **scale_fields) -> dict[str, TestRecord]:
    records = [
        TestRecord(SCALE, "passed", 0.5,
                   {"tests/test_layers.py": ("test_scale",), "pkg/layers.py": ("Scale.forward",)},
                   modules=modules([capture()]) if scale_modules is None else scale_modules,
                   **scale_fields),
        TestRecord(HELPER, "passed", 0.5,
                   {"tests/test_layers.py": ("test_helper",), "pkg/layers.py": ("helper",)}),
    ]
    return {r.test_id: r for r in records}


FORWARD_CHANGED = edit(OLD, "pkg/layers.py", "return y + 0", "return y + 0.0")


def find(new=FORWARD_CHANGED, evidence=None, old_inventories=None):
    """(selection, candidates, kept) for a change to OLD, as `prune` would see them."""
    evidence = evidence_for() if evidence is None else evidence
    inp = selection_input(OLD, new, evidence)
    selection = select(inp)
    old_inv = inventories(OLD) if old_inventories is None else old_inventories
    found, kept = candidates(selection, inp.snapshot, old_inv)
    return selection, {c.test_id: c for c in found}, kept


def test_changed_code_run_only_inside_a_captured_call_makes_a_candidate():
    selection, found, kept = find()
    assert selection.decision(SCALE).prunable == (("pkg/layers.py", "Scale.forward"),)
    assert set(found) == {SCALE} and kept == {}
    cand = found[SCALE]
    assert cand.captures == ("d1",)
    assert cand.modules == {"d1": "pkg.layers.Scale"}
    assert cand.recorded == {"d1": {"output": "hash-d1"}}
    assert cand.lines == {"d1": {"pkg/layers.py": [Y_LINE, RETURN_LINE]}}
    assert cand.env == {"d1": {"TRITON_INTERPRET": "1"}}
    assert cand.classes == ()


def test_only_the_captures_that_ran_the_changed_block_are_replayed():
    other = capture("d2", lines=())
    _, found, _ = find(evidence=evidence_for(modules([capture(), other])))
    assert found[SCALE].captures == ("d1",)


def test_a_block_that_also_ran_outside_any_module_call_is_kept():
    _, found, kept = find(evidence=evidence_for(modules([capture()], outside=[Y_LINE])))
    assert found == {}
    assert kept == {SCALE: "pkg/layers.py::Scale.forward ran outside any captured call"}


def test_a_block_a_call_past_the_captured_ones_also_ran_is_kept():
    # The same lines, other values (a long training loop's ninth step): not replayed.
    _, found, kept = find(evidence=evidence_for(modules([capture()],
                                                        inside=[Y_LINE, RETURN_LINE])))
    assert found == {}
    assert kept == {SCALE: f"pkg/layers.py::Scale.forward ran lines {Y_LINE}-{RETURN_LINE} also "
                           "in calls that were not captured (calls of a captured signature "
                           "past the first 8)"}


def test_two_calls_saved_alike_are_replayed_once_running_the_lines_of_both():
    # A loop that calls twice with nothing changed between saves the same bytes twice.
    first, second = capture(lines=[Y_LINE]), capture(lines=[RETURN_LINE])
    _, found, kept = find(evidence=evidence_for(modules([first, second])))
    assert kept == {}
    assert found[SCALE].captures == ("d1",)
    assert found[SCALE].lines["d1"] == {"pkg/layers.py": [Y_LINE, RETURN_LINE]}


def test_two_calls_saved_alike_that_returned_otherwise_are_kept():
    # The same saved call returned two values: it depends on what the capture lacks.
    second = capture(out={"output": "another"})
    _, found, kept = find(evidence=evidence_for(modules([capture(), second])))
    assert found == {}
    assert kept == {SCALE: "two Scale calls with the same captured context returned "
                           "different values: the capture does not hold all they depend on"}


def test_a_block_that_ran_in_a_call_that_was_not_kept_is_kept():
    dropped = capture(digest=None, why="over the capture budget")
    _, found, kept = find(evidence=evidence_for(modules([dropped])))
    assert found == {}
    assert kept == {SCALE: "pkg/layers.py::Scale.forward ran in a Scale call that was not "
                           "kept (over the capture budget)"}


def test_a_block_that_ran_in_no_captured_call_is_kept():
    _, found, kept = find(evidence=evidence_for(modules([capture(lines=())])))
    assert found == {}
    assert kept == {SCALE: "pkg/layers.py::Scale.forward ran in no captured call"}


def test_lines_that_only_uncaptured_calls_reached_keep_the_test():
    _, found, kept = find(evidence=evidence_for(modules([capture(lines=[Y_LINE])],
                                                        inside=[Y_LINE, RETURN_LINE])))
    assert found == {}
    assert kept == {SCALE: f"pkg/layers.py::Scale.forward ran lines {RETURN_LINE} only in "
                           "calls that were not captured (calls of a captured signature "
                           "past the first 8)"}


def test_without_the_evidence_commit_inventory_the_test_is_kept():
    _, found, kept = find(old_inventories={})
    assert found == {}
    assert kept == {SCALE: "no block inventory for pkg/layers.py at the evidence's commit"}


def test_a_test_with_no_captured_calls_is_not_a_candidate_and_needs_no_reason():
    _, found, kept = find(evidence=evidence_for(scale_modules={}))
    assert found == {} and kept == {}


def test_carried_evidence_is_not_a_candidate():
    """Carried evidence came from an older commit's run: its captures are not this tree's."""
    _, found, kept = find(evidence=evidence_for(carried_from="older"))
    assert found == {} and kept == {}


def test_a_test_selected_for_any_other_reason_is_not_a_candidate():
    evidence = evidence_for()
    evidence[SCALE] = replace(evidence[SCALE], outcome="failed")
    selection, found, kept = find(evidence=evidence)
    assert selection.decision(SCALE).selected
    assert selection.decision(SCALE).prunable == ()
    assert found == {} and kept == {}


def test_a_change_to_the_test_itself_is_not_prunable():
    new = edit(FORWARD_CHANGED, "tests/test_layers.py", "Scale()(1) == 2", "Scale()(1) == 2.0")
    selection, found, _ = find(new)
    assert selection.decision(SCALE).selected and found == {}


def test_skipped_tests_are_never_candidates():
    selection, found, _ = find()
    assert not selection.decision(HELPER).selected
    assert HELPER not in found


def test_a_class_that_only_gained_a_method_is_a_condition_to_check():
    """A method added to a class with bases might override an inherited one: the candidate
    carries the class, for the replay to check under the new code."""
    new = edit(OLD, "pkg/layers.py", "    def forward(self, x):",
               "    def describe(self):\n        return 'scale'\n\n    def forward(self, x):")
    selection, found, kept = find(new)
    decision = selection.decision(SCALE)
    assert decision.selected and decision.prunable == ()
    assert decision.prune_conditions == (("pkg/layers.py", "Scale", ("describe",)),)
    assert set(found) == {SCALE} and kept == {}
    assert found[SCALE].classes == (("pkg/layers.py", "Scale", ("describe",)),)
    assert found[SCALE].captures == ()


def test_a_new_test_is_never_a_candidate():
    decision = Decision("tests/test_layers.py::test_new", True, ("new test: no evidence yet",),
                        new=True, prunable=(("pkg/layers.py", "Scale.forward"),))
    selection = Selection(base="base", head="head", decisions=(decision,))
    snapshot = selection_input(OLD, OLD, evidence_for()).snapshot
    assert candidates(selection, snapshot, inventories(OLD)) == ([], {})
