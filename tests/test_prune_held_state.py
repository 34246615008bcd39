"""Pruning and the state a module's objects keep outside a call's arguments: attributes set
on a class rather than an instance, on a slotted object, on a function; a global a test
added; a class's bases.

A method that writes `type(self).totals += x` leaves its result in the class, which neither
the return value nor the arguments hold; a test that set `Scaler.factor = 5` first leaves
state a fresh replay process lacks. A class with a metaclass (`abc.ABC`) holds such state
as any class does, an object whose class declares `__slots__` holds it outside a
`__dict__`, a function holds attributes as any object does, and a class's bases decide
which method its instances run. Each change here fails its test: a replay that compared
less of that state would let the failure escape. Each test puts back what it set, so that
the calls a later test made find the state a fresh process holds.
"""

from __future__ import annotations

import pytest
from soundness_world import copied_once, failing

LIB = {
    "lib/__init__.py": "",
    "lib/meters.py": '''
        import abc

        import torch


        class Meter:
            totals = torch.zeros(2)

            def add(self, x):
                type(self).totals += x


        class Counter(abc.ABC):
            count = 0

            def tick(self):
                type(self).count += 1


        class Scaler(abc.ABC):
            factor = 1

            def apply(self, x):
                return x


        class Tally:
            __slots__ = ("n",)

            def __init__(self):
                self.n = 0


        TALLY = Tally()


        def bump():
            TALLY.n += 1


        def seen():
            return None


        seen.calls = 0


        def note():
            seen.calls += 1


        def scaled(x):
            return x + 0


        class Shape:
            def __init__(self, n):
                self.n = n

            def size(self):
                return self.n


        class Tripling:
            def size(self):
                return self.n * 3


        class Box(Shape):
            pass


        def make_box(n):
            return Box(n)
    ''',
    "tests/test_meters.py": '''
        import torch

        import lib.meters as meters
        from lib.meters import TALLY, Counter, Meter, Scaler, bump, make_box, note, scaled, seen


        def test_meter_totals():
            try:
                Meter().add(torch.ones(2))
                assert float(Meter.totals.sum()) == 2.0
            finally:
                Meter.totals.zero_()


        def test_counter_ticks():
            try:
                Counter().tick()
                assert Counter.count == 1
            finally:
                Counter.count = 0


        def test_scaler_under_a_factor_the_test_set():
            Scaler.factor = 5
            try:
                assert Scaler().apply(2) == 2
            finally:
                Scaler.factor = 1


        def test_tally_bumped():
            try:
                bump()
                assert TALLY.n == 1
            finally:
                TALLY.n = 0


        def test_note_counts_on_a_function():
            try:
                note()
                assert seen.calls == 1
            finally:
                seen.calls = 0


        def test_scaled_under_a_global_the_test_added():
            meters.OVERRIDE = 3
            try:
                assert scaled(2) == 2
            finally:
                del meters.OVERRIDE


        def test_box_size():
            assert make_box(3).size() == 3
    ''',
}


def node(name: str) -> str:
    return f"tests/test_meters.py::test_{name}"


recorded, lib = copied_once(LIB, passed=7)


KEPT = {
    # A tensor the class holds, written through the class.
    "a class's tensor": ("type(self).totals += x", "type(self).totals += 2 * x",
                         "meter_totals", "lib.meters.Meter"),
    # A class with a metaclass (abc.ABC), its count written through the class.
    "an ABC's attribute written": ("type(self).count += 1", "type(self).count += 2",
                                   "counter_ticks", "lib.meters.Counter"),
    # An ABC's attribute the test set, which new code reads: a fresh process holds 1.
    "an ABC's attribute the test set": ("        return x\n",
                                        "        return x * type(self).factor\n",
                                        "scaler_under_a_factor_the_test_set",
                                        "lib.meters.Scaler"),
    # A module's object whose class keeps its attributes in `__slots__`, not a `__dict__`.
    "a slotted global written": ("TALLY.n += 1", "TALLY.n += 2", "tally_bumped",
                                 "bump under the new code differs at globals.lib.meters.TALLY"),
    # A module's function that keeps a count as its attribute (a warn-once flag, a registry).
    "a function's attribute written": (
        "seen.calls += 1", "seen.calls += 2", "note_counts_on_a_function",
        "note under the new code differs at globals.lib.meters.seen"),
    # A global the test added, which new code reads where it exists: a fresh process has
    # none, and the new code's fallback there computes what the old code did.
    "a global the test added": (
        "    return x + 0", "    try:\n        return x * OVERRIDE\n    except NameError:\n"
        "        return x + 0", "scaled_under_a_global_the_test_added",
        "module state differs from what the test had at the call: lib.meters.OVERRIDE"),
    # New bases: the object the call returns is the same, and runs another method.
    "a mixin in a class's bases": (
        "class Box(Shape):", "class Box(Tripling, Shape):", "box_size",
        "module state differs from what the test had at the call: lib.meters.Box"),
}


@pytest.mark.parametrize("case", list(KEPT))
def test_state_held_outside_the_arguments_keeps_the_test_that_changed_it(lib, case):
    """One change at a time: a replay process that ran one changed call holds a class
    another call then reads, which would keep that test for another reason."""
    old, new, name, why = KEPT[case]
    lib.edit("lib/meters.py", old, new)
    test = lib.decisions()[node(name)]
    assert test["decision"] == "selected", test
    assert why in test.get("not_pruned", ""), test


def test_every_change_here_fails_its_test(lib):
    """A rule that pruned any of them would let a failure escape (each test puts back what
    it set, so they fail alike run together; one pytest run proves all)."""
    for old, new, _, _ in KEPT.values():
        lib.edit("lib/meters.py", old, new)
    nodes = {node(name) for _, _, name, _ in KEPT.values()}
    assert failing(lib, *nodes) == nodes


def test_an_equal_write_through_the_class_is_pruned(lib):
    lib.edit("lib/meters.py", "type(self).totals += x", "type(self).totals.add_(x)")
    test = lib.decisions()[node("meter_totals")]
    assert test["decision"] == "skipped", test
