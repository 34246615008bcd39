"""Which names of a test file are bound to capturing wrappers while a test runs: only names
the file uses solely as callees, so identity, callbacks and registries see the function."""

from __future__ import annotations

import os
import sys
import textwrap
import types

import pytest

from fastci.runner.record.bindings import CallBindings, called_only


def names(source: str) -> set[str]:
    return set(called_only(textwrap.dedent(source)))


def test_a_name_used_only_as_a_callee_is_wrapped():
    assert names("""
        from lib import lr_at, build

        def test_x():
            assert lr_at(0) == 0.1
            model = build(lr_at(1))
    """) >= {"lr_at", "build"}


def test_an_annotation_is_no_use_that_keeps_a_callee_unwrapped():
    """A program's `def train(cfg) -> tuple[Trainer, list]` still calls `Trainer(cfg)`."""
    assert names("""
        from lib import Trainer

        def train(cfg, t: Trainer | None = None) -> tuple[Trainer, int]:
            made: Trainer = Trainer(cfg)
            return made, 1
    """) == {"Trainer"}


@pytest.mark.parametrize("use", [
    "assert REGISTRY['lr'] is lr_at",  # identity
    "apply(lr_at)",  # handed on as a callback
    "name = lr_at.__name__",  # an attribute of the function
    "lr_at = other",  # rebound
    "global lr_at",  # rebound elsewhere
    "fns = [lr_at]",  # stored
])
def test_any_other_use_leaves_the_name_alone(use):
    assert "lr_at" not in names(f"""
        from lib import lr_at

        def test_x():
            {use}
            assert lr_at(0) == 0.1
    """)


def test_a_file_that_does_not_parse_wraps_nothing():
    assert names("def test_x(:\n    lr_at(0)") == set()


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A repository with one library module and one test file, imported for real."""
    (tmp_path / "lib_b.py").write_text(textwrap.dedent("""
        def lr_at(step):
            return step / 10

        def steps():
            yield 1

        async def later():
            return 1

        class Grid:
            # a class: constructing it is a call
            def __init__(self, rows):
                self.rows = rows

        class GridError(ValueError):
            pass
    """))
    test_file = tmp_path / "test_lib_b.py"
    test_file.write_text("from lib_b import lr_at, steps, later\n\n"
                         "def test_x():\n    assert lr_at(1) and steps() and later\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import lib_b

    yield tmp_path, lib_b, str(test_file)
    sys.modules.pop("lib_b", None)


def recording_calls():
    """A capture stand-in that calls through and notes each callee's name."""
    calls: list[str] = []

    def call(fn, args, kwargs):
        calls.append(fn.__name__)
        return fn(*args, **kwargs)

    return calls, call


def test_wrapping_lasts_as_long_as_the_block_and_leaves_the_library_alone(repo):
    root, lib_b, test_file = repo
    calls, call = recording_calls()
    namespace = {"lr_at": lib_b.lr_at, "steps": lib_b.steps, "later": lib_b.later}
    bindings = CallBindings(os.path.realpath(root), call)
    with bindings.wrapped(namespace, test_file) as count:
        assert count == 1  # the generator and the coroutine function are left alone
        assert namespace["lr_at"] is not lib_b.lr_at
        assert namespace["lr_at"](5) == 0.5
        assert lib_b.lr_at(5) == 0.5  # the library's own name is untouched
        assert namespace["steps"] is lib_b.steps
    assert calls == ["lr_at"]
    assert namespace["lr_at"] is lib_b.lr_at


def test_functions_outside_the_repository_or_not_found_by_name_are_not_captured(repo):
    root, lib_b, _ = repo
    bindings = CallBindings(os.path.realpath(root), lambda fn, a, k: fn(*a, **k))
    assert bindings.capturable(lib_b.lr_at)
    assert not bindings.capturable(os.path.join)  # the standard library
    renamed = types.FunctionType(lib_b.lr_at.__code__, lib_b.__dict__, "lr_at")
    assert not bindings.capturable(renamed)  # lib_b.lr_at is another object: not replayable


def test_a_repository_class_is_wrapped_as_its_construction_but_an_exception_is_not(repo):
    root, lib_b, test_file = repo
    calls, call = recording_calls()
    namespace = {"Grid": lib_b.Grid, "GridError": lib_b.GridError}
    with open(test_file, "a") as f:
        f.write("\ndef test_y():\n    assert Grid(2).rows == 2\n    raise GridError()\n")
    bindings = CallBindings(os.path.realpath(root), call)
    with bindings.wrapped(namespace, test_file) as count:
        assert count == 1
        grid = namespace["Grid"](2)
        assert type(grid) is lib_b.Grid and grid.rows == 2  # the class's own instance
        assert "__init__" not in vars(namespace["Grid"])  # the class's dict is not copied
        assert namespace["GridError"] is lib_b.GridError
    assert calls == ["Grid"] and namespace["Grid"] is lib_b.Grid
