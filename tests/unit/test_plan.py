"""Plans over plain node ids: what pytest keeps, what it deselects, and in which order."""

from __future__ import annotations

import json

from fastci.runner.selection.plan import PLAN_SCHEMA, apply_plan, make_plan

COLLECTED = [
    "tests/test_a.py::test_one",
    "tests/test_a.py::test_two",
    "tests/test_b.py::test_p[1]",
    "tests/test_b.py::test_p[2]",
    "tests/test_b.py::test_three",
]


def test_make_plan_is_json_with_its_schema_and_sorted_known_ids():
    plan = make_plan(["b", "a"], ["z", "a", "b"])
    assert plan == {"schema": PLAN_SCHEMA, "order": ["b", "a"], "known": ["a", "b", "z"],
                    "only": False}
    assert json.loads(json.dumps(plan)) == plan


def test_the_plan_order_is_kept_and_known_unselected_tests_are_deselected():
    plan = make_plan(["tests/test_b.py::test_three", "tests/test_a.py::test_one"], COLLECTED)
    keep, drop = apply_plan(plan, COLLECTED)
    assert keep == ["tests/test_b.py::test_three", "tests/test_a.py::test_one"]
    assert drop == ["tests/test_a.py::test_two", "tests/test_b.py::test_p[1]",
                    "tests/test_b.py::test_p[2]"]


def test_a_prefix_selects_every_parametrization_in_collection_order():
    plan = make_plan(["tests/test_a.py::test_two", "tests/test_b.py::test_p"], COLLECTED)
    keep, drop = apply_plan(plan, COLLECTED)
    assert keep == ["tests/test_a.py::test_two", "tests/test_b.py::test_p[1]",
                    "tests/test_b.py::test_p[2]"]
    assert drop == ["tests/test_a.py::test_one", "tests/test_b.py::test_three"]


def test_an_item_the_plan_does_not_know_is_new_and_runs_first():
    known = [n for n in COLLECTED if n != "tests/test_a.py::test_two"]
    plan = make_plan(["tests/test_b.py::test_three"], known)
    keep, drop = apply_plan(plan, COLLECTED)
    assert keep == ["tests/test_a.py::test_two", "tests/test_b.py::test_three"]
    assert "tests/test_a.py::test_two" not in drop


def test_a_new_parametrization_of_a_known_test_runs():
    plan = make_plan([], COLLECTED)
    keep, drop = apply_plan(plan, [*COLLECTED, "tests/test_b.py::test_p[3]"])
    assert keep == ["tests/test_b.py::test_p[3]"]
    assert drop == COLLECTED


def test_only_runs_nothing_but_the_order():
    """A shard: a new test belongs to the shard whose plan names it, never to all of them."""
    plan = make_plan(["tests/test_a.py::test_one"], [], only=True)
    keep, drop = apply_plan(plan, COLLECTED)
    assert keep == ["tests/test_a.py::test_one"]
    assert drop == COLLECTED[1:]


def test_plan_ids_that_were_not_collected_are_ignored():
    plan = make_plan(["tests/test_gone.py::test_x", "tests/test_a.py::test_one"], COLLECTED)
    keep, _ = apply_plan(plan, COLLECTED)
    assert keep == ["tests/test_a.py::test_one"]


def test_every_collected_item_is_either_kept_or_dropped_once():
    plan = make_plan(["tests/test_b.py::test_p"], COLLECTED[:2])
    keep, drop = apply_plan(plan, COLLECTED)
    assert sorted(keep + drop) == sorted(COLLECTED)
