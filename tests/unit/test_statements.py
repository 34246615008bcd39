"""Statement-level comparison of a changed function (`analysis/statements.py`) and the rule
that uses it (`_Rules`), over inline sources: which old lines meet each change, which
changes make the whole function count, and when a test's lines cannot be trusted to tell
its path (then every test that ran the function is selected, and the reason says why)."""

from __future__ import annotations

import textwrap
from dataclasses import replace

import pytest
from selection_world import dedented, edit, run_select, selection_input

from fastci.runner.analysis.statements import function_changes, writes_in
from fastci.runner.evidence import TestRecord
from fastci.runner.selection.rules import select


def change(old: str, new: str, qualname: str = "f"):
    old, new = textwrap.dedent(old).lstrip("\n"), textwrap.dedent(new).lstrip("\n")
    return function_changes(old, new, [qualname])[qualname]


BRANCHES = textwrap.dedent('''
    def f(v):
        if v > 0:
            a = 1
        elif v < 0:
            a = 2
        else:
            a = 3
        return a
''').lstrip("\n")


@pytest.mark.parametrize("old, new, lines", [
    ("a = 1", "a = 10", {3}),  # a branch body: only who took it
    ("elif v < 0:", "elif v <= 0:", {4}),  # a condition: who evaluated it
    ("a = 3", "a = 30", {7}),  # the else body
    ("return a", "return a + 1", {8}),
    ("    return a", "    a += 0\n    return a", {8}),  # inserted: who then ran what follows
    ("        a = 3\n", "        a = 3\n        a = 4\n", {7}),  # at a block's end
], ids=["body", "condition", "else", "last", "inserted-before", "inserted-at-the-end"])
def test_each_change_is_the_old_lines_that_meet_it(old, new, lines):
    found = change(BRANCHES, BRANCHES.replace(old, new, 1))
    assert found.whole is None
    assert set().union(*(h.lines for h in found.hunks)) == lines


def test_an_insertion_at_the_start_of_a_body_is_met_by_whoever_enters_it():
    found = change(BRANCHES, BRANCHES.replace("    if v > 0:", "    v = -v\n    if v > 0:", 1))
    assert found.whole is None
    # The statement after the insertion: the `if`, which every call runs.
    assert found.hit([2]) == "a statement inserted at line 2, beside one it ran"
    assert found.hit([9]) is None


def test_a_multi_line_statement_is_met_on_any_of_its_lines():
    old = '''
        def f(a):
            y = (a
                 +
                 1)
            return y
    '''
    found = change(old, old.replace("+\n", "-\n"))
    # The tracer reports lines 2 and 4 of this statement, never line 3 (the operator).
    assert found.hit([2, 4, 5]) == "line 2 changed" and found.hit([5]) is None


def test_try_blocks_and_except_clauses():
    old = '''
        def f(a, b):
            try:
                out = a / b
            except ZeroDivisionError:
                out = 0.0
            finally:
                b = None
            return out
    '''
    handler = change(old, old.replace("out = 0.0", "out = -1.0"))
    assert [set(h.lines) for h in handler.hunks] == [{5}]
    clause = change(old, old.replace("except ZeroDivisionError:", "except TypeError:"))
    assert [set(h.lines) for h in clause.hunks] == [{4}]  # tried only by what raised
    final = change(old, old.replace("b = None", "b = 0"))
    assert [set(h.lines) for h in final.hunks] == [{7}]


@pytest.mark.parametrize("old, new, why", [
    ("def f(v):", "def f(v, w=1):", "signature"),
    ("    if v > 0:", "    global G\n    if v > 0:", "global or nonlocal"),
    ("        a = 3", "        a = 3\n        yield a", "generator"),
    ("        a = 2", "        a = 2\n        max = 1", "became local"),
    ("    return a", "    return lambda: a", "closure over its locals"),
    ("        a = 1", "        a = 1\n        CACHE[v] = a", "outlives the call"),
    ("        a = 1", "        a = 1\n        REGISTRY.append(a)", "outlives the call"),
    ("        a = 1", "        a = 1\n        setattr(obj, 'x', a)", "outlives the call"),
], ids=["signature", "global", "yield", "scope", "closure", "item-store", "mutator", "setattr"])
def test_changes_that_alter_the_function_as_a_whole(old, new, why):
    source = BRANCHES.replace("def f(v):", "def f(v):\n    w = max") if why == "became local" \
        else BRANCHES
    found = change(source, source.replace(old, new, 1))
    assert found.whole is not None and why in found.whole, found.whole


def test_a_new_local_read_nowhere_else_is_not_a_change_of_scope():
    found = change(BRANCHES, BRANCHES.replace("        a = 3", "        b = 3\n        a = b", 1))
    assert found.whole is None and found.hunks


def test_writes_into_what_the_call_made_are_not_writes_that_outlive_it():
    source = textwrap.dedent('''
        from torch import nn


        def local(xs):
            out = []
            seen = {}
            for x in xs:
                out.append(x)
                seen[x] = True
            return sum(v for v in out), sorted(out, key=lambda v: -v)


        class Thing:
            def __init__(self, n):
                self.n = n
                self.items = []
                self.items.append(n)
                nn.init.normal_(self.weight)

            def bump(self):
                self.n += 1

            def reset(self):
                nn.init.zeros_(self.weight)


        def shared(out, x):
            out.append(x)


        def deep(x):
            box = {}
            box["a"] = x
            box["a"]["b"] = 1
    ''')
    assert writes_in(source, "local") == ""
    assert writes_in(source, "Thing.__init__") == ""  # the object being built
    assert "self.n" in writes_in(source, "Thing.bump")
    assert "nn.init.zeros_" in writes_in(source, "Thing.reset")  # writes its argument
    assert "out.append" in writes_in(source, "shared")  # the caller's list
    assert "box['a']['b']" in writes_in(source, "deep")  # what the container holds
    assert writes_in(source, "missing") is None


def test_a_function_defined_twice_under_one_name_counts_as_a_whole():
    old = "if X:\n    def f():\n        return 1\nelse:\n    def f():\n        return 2\n"
    found = function_changes(old, old.replace("return 2", "return 3"), ["f"])["f"]
    assert "more than once" in found.whole


# -- the rule, over the selection world ------------------------------------------------------

OLD = dedented({
    "pk/__init__.py": "",
    "pk/calc.py": '''
        EPS = 1


        def classify(x):
            if x > 0:
                label = "pos"
            else:
                label = "neg" * EPS
            return label
    ''',
    "tests/test_calc.py": '''
        from pk.calc import classify


        def test_pos():
            assert classify(1) == "pos"


        def test_neg():
            assert classify(-1) == "neg"
    ''',
})
POS = TestRecord("tests/test_calc.py::test_pos", "passed", 0.1,
                 {"tests/test_calc.py": ("test_pos",), "pk/calc.py": ("classify",)},
                 lines={"tests/test_calc.py": (5,), "pk/calc.py": (5, 6, 9)}, credited={},
                 file_events=True)
NEG = TestRecord("tests/test_calc.py::test_neg", "passed", 0.1,
                 {"tests/test_calc.py": ("test_neg",), "pk/calc.py": ("classify",)},
                 lines={"tests/test_calc.py": (9,), "pk/calc.py": (5, 8, 9)}, credited={},
                 file_events=True)
NEW = edit(OLD, "pk/calc.py", '"neg" * EPS', '"NEG" * EPS')


def decide(tests, new=NEW, **kwargs):
    selection = run_select(OLD, new, {t.test_id: t for t in tests}, **kwargs)
    return {d.test_id: d for d in selection.decisions}


def test_fresh_lines_skip_the_test_on_the_other_path_and_say_so():
    found = decide([POS, NEG])
    assert found[NEG.test_id].reasons == (
        "executed changed code: pk/calc.py::classify (modified: line 8 changed)",)
    assert not found[POS.test_id].selected
    assert found[POS.test_id].reasons == (
        "it ran changed functions, but none of their changed statements and no statement "
        "beside an insertion: pk/calc.py::classify (line 8 changed); nothing else it executed "
        "or read changed",)


@pytest.mark.parametrize("fields, why", [
    ({"carried_from": "abcdef0123456789"}, "carried forward from abcdef012345"),
    ({"credited": None}, "predates per-statement lines"),
    ({"credited": {"pk/calc.py": ("classify",)}}, "cache hit or a launch"),
    ({"child_blocks": {"pk/calc.py": ("classify",)}}, "a child process ran it"),
    ({"lines": None}, "executed lines are not in the evidence"),
    ({"lines": {"pk/calc.py": (1,)}}, "none of its lines in the function"),
], ids=["carried", "old-evidence", "cache-hit", "child", "no-lines", "lines-elsewhere"])
def test_where_lines_cannot_tell_the_path_every_test_that_ran_it_counts(fields, why):
    found = decide([replace(POS, **fields)])[POS.test_id]
    assert found.selected
    assert found.reasons[0].startswith(
        "executed changed code: pk/calc.py::classify (modified; the whole function counts, as ")
    assert why in found.reasons[0]


def test_lines_not_loaded_with_the_evidence_are_asked_for_once_for_the_tests_that_need_them():
    asked = []

    def lines_of(test_ids, paths):
        asked.append((sorted(test_ids), sorted(paths)))
        return {POS.test_id: POS.lines} if POS.test_id in test_ids else {}

    other = TestRecord("tests/test_calc.py::test_other", "passed", 0.1,
                       {"tests/test_calc.py": ("test_other",)}, credited={})
    inp = selection_input(OLD, NEW, {t.test_id: replace(t, lines=None) for t in (POS, NEG, other)})
    selection = select(replace(inp, line_source=lines_of))
    assert not selection.decision(POS.test_id).selected
    assert selection.decision(NEG.test_id).selected
    assert asked == [([NEG.test_id, POS.test_id], ["pk/calc.py"])]


def test_a_change_to_the_first_statement_needs_no_lines():
    new = edit(OLD, "pk/calc.py", "    if x > 0:", "    if x >= 0:")
    found = decide([replace(POS, lines=None, credited=None)], new=new)[POS.test_id]
    assert found.reasons == ("executed changed code: pk/calc.py::classify (modified: line 5 "
                             "changed)",)


def test_a_test_spared_by_the_statements_still_counts_when_the_function_reads_a_changed_name():
    new = edit(NEW, "pk/calc.py", "EPS = 1", "EPS = 2")
    found = decide([POS], new=new)[POS.test_id]
    assert found.selected
    assert found.reasons == ("executed code that reads a changed module or class value: "
                             "pk/calc.py::classify reads EPS",)


def test_with_the_rule_off_every_test_that_ran_the_function_counts():
    from fastci.runner.config import Settings

    found = decide([POS, NEG], settings=Settings(exact=("import-time",)))
    assert found[POS.test_id].reasons == (
        "executed changed code: pk/calc.py::classify (modified)",)
