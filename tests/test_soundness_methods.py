"""Methods: a changed body or default of a method that existed before (special or not)
selects the tests that executed it, and no other reader of the class; what changes the class
itself (a special method added or removed, its bases, decorators, metaclass, `__slots__`, a
dataclass field) selects every test that reads the class.

One repository is recorded once; each case makes a test really fail, checks that it is
selected and, for the exact side, that a test which reads the class without running the
method is skipped. On the broad side the failing test never ran any changed block, so only
the readers-of-the-class rule can select it: a version that treated such a change as a plain
method edit skips it.
"""

from __future__ import annotations

import pytest
from soundness_world import failing, recorded_once

REPO = {
    "pyproject.toml": "[project]\nname = 'pk'\nversion = '0'\n",
    "pk/__init__.py": "",
    "pk/shapes.py": '''
        from dataclasses import dataclass


        class Meta(type):
            pass


        class Base:
            kind = "base"


        class Shape(Base, metaclass=Meta):
            sides = 4

            def __init__(self, size=2):
                self.size = size

            def __eq__(self, other):
                return isinstance(other, Shape) and other.size == self.size

            __hash__ = None

            def area(self):
                return self.size ** 2


        class Point:
            __slots__ = ("x", "y")

            def __init__(self):
                self.x = 0
                self.y = 0


        @dataclass
        class Box:
            width: int = 3
    ''',
    "tests/test_shapes.py": '''
        import pytest

        from pk.shapes import Box, Point, Shape


        def test_equal():
            assert Shape(3) == Shape(3)


        def test_default_area():
            assert Shape().area() == 4


        def test_sides():
            assert Shape.sides == 4


        def test_kind():
            assert Shape.kind == "base"


        def test_truthy():
            assert Shape


        def test_instances_are_truthy():
            shape = object.__new__(Shape)
            assert shape


        def test_metaclass():
            assert type(Shape).__name__ == "Meta"


        def test_no_dict():
            with pytest.raises(AttributeError):
                Point().z = 1


        def test_box():
            assert Box() == Box() and Box().width == 3
    ''',
}


recorded, repo = recorded_once("methods", REPO)


T = "tests/test_shapes.py"

EXACT = [
    pytest.param("other.size == self.size", "other.size != self.size", f"{T}::test_equal",
                 [f"{T}::test_default_area", f"{T}::test_sides", f"{T}::test_truthy"],
                 id="a-special-method-body"),
    pytest.param("def __init__(self, size=2):", "def __init__(self, size=3):",
                 f"{T}::test_default_area",
                 [f"{T}::test_sides", f"{T}::test_kind", f"{T}::test_truthy"],
                 id="a-default-of-init"),
    pytest.param("return self.size ** 2", "return self.size ** 3", f"{T}::test_default_area",
                 [f"{T}::test_equal", f"{T}::test_sides"], id="a-plain-method-body"),
]


@pytest.mark.parametrize("old, new, victim, spared", EXACT)
def test_a_changed_method_selects_the_tests_that_ran_it(repo, old, new, victim, spared):
    repo.edit("pk/shapes.py", old, new)
    assert victim in failing(repo)
    chosen = repo.selected()
    assert victim in chosen
    assert not chosen & set(spared), chosen & set(spared)


BROAD = [
    pytest.param("    __hash__ = None\n",
                 "    __hash__ = None\n\n    def __bool__(self):\n        return False\n",
                 f"{T}::test_instances_are_truthy", id="a-special-method-added"),
    pytest.param('class Base:\n    kind = "base"', 'class Base:\n    kind = "base"\n\n\n'
                 'class Other:\n    kind = "other"', None, id="unchanged-control"),
    pytest.param("class Shape(Base, metaclass=Meta):", "class Shape(metaclass=Meta):",
                 f"{T}::test_kind", id="bases"),
    pytest.param("class Shape(Base, metaclass=Meta):", "class Shape(Base):",
                 f"{T}::test_metaclass", id="metaclass"),
    pytest.param('__slots__ = ("x", "y")', '__slots__ = ("x", "y", "z")', f"{T}::test_no_dict",
                 id="slots"),
    pytest.param("width: int = 3", "width: int = 4", f"{T}::test_box", id="a-dataclass-field"),
    pytest.param("@dataclass\nclass Box:", "@dataclass(eq=False)\nclass Box:", f"{T}::test_box",
                 id="a-class-decorator"),
]


@pytest.mark.parametrize("old, new, victim", BROAD)
def test_a_change_to_the_class_itself_selects_its_readers(repo, old, new, victim):
    repo.edit("pk/shapes.py", old, new)
    if victim is None:  # a class next to it changed: Shape's readers are not selected
        assert not failing(repo)
        assert f"{T}::test_truthy" not in repo.selected()
        return
    assert victim in failing(repo)
    assert victim in repo.selected()
