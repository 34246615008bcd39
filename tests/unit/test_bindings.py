"""Which names of a test file are bound to capturing wrappers while a test runs: only names
the file uses solely as callees, so identity, callbacks and registries see the function."""

from __future__ import annotations

import importlib
import os
import sys
import textwrap
import types

import pytest

from fastci.runner.record.bindings import CallBindings, attributes_called_only, called_only


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


def imported(tmp_path, monkeypatch, name: str, library: str, test: str):
    """`name`.py holding `library`, imported for real (and forgotten at teardown), and a
    test file beside it: (the module, the test file's path)."""
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(library))
    test_file = tmp_path / f"test_{name}.py"
    test_file.write_text(test)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(sys.modules, name, None)  # what it held now comes back at teardown
    del sys.modules[name]
    return importlib.import_module(name), str(test_file)


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A repository with one library module and one test file, imported for real."""
    library, test = ("""
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
    """, "from lib_b import lr_at, steps, later\n\n"
         "def test_x():\n    assert lr_at(1) and steps() and later\n")
    return (tmp_path, *imported(tmp_path, monkeypatch, "lib_b", library, test))


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


def attributes(source: str) -> set[str]:
    return set(attributes_called_only(textwrap.dedent(source)))


def test_an_attribute_used_only_as_a_callee_is_a_method_to_wrap():
    assert attributes("""
        def test_x(trainer):
            trainer.step()
            assert trainer.evaluate(rows=2) == trainer.evaluate()
            trainer.__init__(cfg)
    """) == {"step", "evaluate"}


@pytest.mark.parametrize("use", ["f = trainer.step", "apply(trainer.step)",
                                 "trainer.step = None", "del trainer.step",
                                 "assert trainer.step.__name__"])
def test_any_other_use_of_the_attribute_leaves_the_method_alone(use):
    assert "step" not in attributes(f"""
        def test_x(trainer):
            trainer.step()
            {use}
    """)


@pytest.fixture
def classes(tmp_path, monkeypatch):
    """A repository module with a class, and a test file that calls its methods."""
    library, test = ("""
        class Counter:
            def __init__(self):
                self.n = 0

            def bump(self):
                self.n += 1
                return self.n

            def bump_twice(self):
                self.bump()  # the repository's own call: never captured
                return self.bump()

            def items(self):
                yield self.n

        class Other:
            def bump(self):
                return "other"
    """, "def test_x(counter):\n    counter.bump()\n    counter.bump_twice()\n"
         "    counter.items()\n")
    return (tmp_path, *imported(tmp_path, monkeypatch, "lib_c", library, test))


def test_a_method_the_file_calls_is_captured_from_that_file_only_while_the_block_runs(classes):
    root, lib_c, test_file = classes
    seen: list[tuple[str, object]] = []

    def call(fn, args, kwargs, reference=None):
        seen.append((fn.__qualname__, reference))
        return fn(*args, **kwargs)

    bump, items = vars(lib_c.Counter)["bump"], vars(lib_c.Counter)["items"]
    bindings = CallBindings(os.path.realpath(root), call)
    counter = lib_c.Counter()
    calls_from_the_test_file = compile(
        "counter.bump(); counter.bump_twice(); lib_c.Other().bump()", test_file, "exec")
    with bindings.wrapped({}, test_file) as count:
        assert count == 3  # Counter.bump, Counter.bump_twice, Other.bump; not the generator
        assert vars(lib_c.Counter)["items"] is items
        exec(calls_from_the_test_file, {"counter": counter, "lib_c": lib_c})
        assert counter.bump() == 4  # a call from another file (this one) is not captured
    assert seen == [("Counter.bump", ("lib_c", "Counter.bump")),
                    ("Counter.bump_twice", ("lib_c", "Counter.bump_twice")),
                    ("Other.bump", ("lib_c", "Other.bump"))]
    assert vars(lib_c.Counter)["bump"] is bump  # unbound after


def test_a_method_bound_for_two_files_stays_bound_until_both_blocks_end(classes):
    root, lib_c, test_file = classes
    fixture_file = os.path.join(root, "conftest.py")
    with open(fixture_file, "w") as f:
        f.write("def make(counter):\n    return counter.bump()\n")
    bump = vars(lib_c.Counter)["bump"]
    bindings = CallBindings(os.path.realpath(root), lambda fn, a, k, r=None: fn(*a, **k))
    with bindings.wrapped({}, test_file):
        with bindings.wrapped({}, fixture_file):
            assert vars(lib_c.Counter)["bump"] is not bump
        assert vars(lib_c.Counter)["bump"] is not bump  # the test file's block still runs
    assert vars(lib_c.Counter)["bump"] is bump


@pytest.fixture
def scale(classes):
    """A plain class with a method the test file calls, and one of an nn.Module."""
    torch = pytest.importorskip("torch")
    root, _, test_file = classes
    with open(os.path.join(root, "lib_c.py"), "a") as f:
        f.write("\n\nimport torch\n\n\nclass Scale:\n    def apply(self, x):\n"
                "        return x * 2\n\n\nclass Net(torch.nn.Module):\n"
                "    def encode(self, x):\n        return x + 1\n")
    sys.modules.pop("lib_c", None)
    import lib_c as fresh

    with open(test_file, "a") as f:
        f.write("\ndef test_y(scale, net, x):\n    scale.apply(x)\n    net.encode(x)\n")
    return torch, fresh, CallBindings(os.path.realpath(root), lambda fn, a, k, *_: fn(*a, **k)), \
        test_file


def compiled_call_works(torch, lib) -> bool:
    scale = lib.Scale()
    compiled = torch.compile(lambda x: scale.apply(x) + 1, fullgraph=True, backend="eager")
    return compiled(torch.ones(2)).tolist() == [3.0, 3.0]


def test_compiled_code_that_calls_a_bound_method_traces_it_as_the_method(scale):
    """torch.compile(fullgraph=True) fails on a graph break; the wrapper must not cause one
    when compiled code calls a method the test file also calls."""
    torch, lib, bindings, test_file = scale
    with bindings.wrapped({}, test_file):
        assert vars(lib.Scale)["apply"].__wrapped__ is not None
        assert compiled_call_works(torch, lib)


def test_a_method_first_bound_before_torch_was_imported_still_lets_compiled_code_through(
        scale, monkeypatch):
    torch, lib, bindings, test_file = scale
    with monkeypatch.context() as hidden:
        hidden.delitem(sys.modules, "torch")
        with bindings.wrapped({}, test_file):
            pass  # the wrapper is made while torch is not imported
    with bindings.wrapped({}, test_file):
        assert vars(lib.Scale)["apply"].__wrapped__ is not None
        assert compiled_call_works(torch, lib)


def test_an_nn_module_s_methods_are_left_to_module_capture(scale):
    """torch.jit.script resolves a method's names through its globals: a wrapper's would be
    FastCI's, and scripting the model would fail while recording."""
    _, lib, bindings, test_file = scale
    encode = vars(lib.Net)["encode"]
    with bindings.wrapped({}, test_file):
        assert vars(lib.Net)["encode"] is encode


def test_with_method_capture_off_only_functions_are_bound(classes, monkeypatch):
    root, lib_c, test_file = classes
    monkeypatch.setenv("FASTCI_CAPTURE_METHODS", "0")
    bump = vars(lib_c.Counter)["bump"]
    bindings = CallBindings(os.path.realpath(root), lambda fn, a, k, *_: fn(*a, **k))
    with bindings.wrapped({}, test_file) as count:
        assert count == 0 and vars(lib_c.Counter)["bump"] is bump
