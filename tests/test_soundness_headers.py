"""What a def statement evaluates in its parent: decorators, which run as the module is
imported (a registry filled by `@register("adam")`), and a signature, which code reads
without calling the function (`inspect.signature`, a CLI built from the defaults); and a
class changed beyond its methods, which a test reached through a registry, not its name.
Each case changes only that, so that a test that never ran the changed code fails; FastCI
must select it, and still skip a test that neither imports the module nor names it."""

from __future__ import annotations

import pytest
from soundness_world import PACKAGE, REGISTRY, assert_selects, recorded_once

HEADERS = {
    **PACKAGE,
    "pk/registry.py": REGISTRY,
    "pk/opts.py": '''
        from pk.registry import register


        @register("adam")
        def adam(lr):
            return lr


        @register("sgd")
        def sgd(lr):
            return lr / 2
    ''',
    # A class reached only through the registry, never by its name.
    "pk/layers.py": '''
        from pk.registry import register


        @register("block")
        class Block:
            __slots__ = ("w", "b")

            def __init__(self):
                self.w = 1
                self.b = 2
    ''',
    # An Enum and a class of constants, reached only through the registry: no line of
    # theirs runs in a test.
    "pk/levels.py": '''
        import enum

        from pk.registry import register


        @register("level")
        class Level(enum.Enum):
            LOW = 1
            HIGH = 2


        @register("sizes")
        class Sizes:
            SMALL = 4


        class Mode(enum.Enum):
            FAST = 1


        register("mode")(Mode)
    ''',
    "pk/cli.py": '''
        import inspect


        def train(steps: int = 10, lr: float = 0.1):
            return steps * lr


        def defaults(fn):
            return {k: p.default for k, p in inspect.signature(fn).parameters.items()}
    ''',
    "tests/test_opts.py": '''
        from pk.registry import OPTIMIZERS
        import pk.opts  # noqa: F401 (registers them)


        def test_adam():
            assert OPTIMIZERS["adam"](1.0) == 1.0
    ''',
    "tests/test_layers.py": '''
        import pk.layers  # noqa: F401 (registers it)
        from pk.registry import OPTIMIZERS


        def test_block():
            assert OPTIMIZERS["block"]().b == 2
    ''',
    "tests/test_levels.py": '''
        import pk.levels  # noqa: F401 (registers them)
        from pk.registry import OPTIMIZERS


        def test_level():
            assert OPTIMIZERS["level"](1).name == "LOW"


        def test_sizes():
            assert OPTIMIZERS["sizes"].SMALL == 4


        def test_mode():
            assert OPTIMIZERS["mode"](1).name == "FAST"
    ''',
    "tests/test_cli.py": '''
        from pk.cli import defaults, train


        def test_cli_defaults():
            assert defaults(train) == {"steps": 10, "lr": 0.1}
    ''',
    "tests/test_other.py": '''
        def test_other():
            assert 1 + 1 == 2
    ''',
}

recorded, repo = recorded_once("headers", HEADERS)


@pytest.mark.parametrize("path, old, new, victim, why", [
    # A copy-paste slip: sgd now registers under adam's key, so adam's test gets sgd.
    ("pk/opts.py", '@register("sgd")', '@register("adam")', "tests/test_opts.py::test_adam",
     "the decorators of sgd changed"),
    ("pk/cli.py", "steps: int = 10", "steps: int = 20", "tests/test_cli.py::test_cli_defaults",
     "reads train"),
    # Not a def: a class-body statement of a class its test ran only through the registry.
    ("pk/layers.py", '__slots__ = ("w", "b")', '__slots__ = ("w",)',
     "tests/test_layers.py::test_block", "Block.__init__ reads Block"),
    # A class with no method of its own, reached only through the registry: an Enum member's
    # value, a constant, the key its decorator registered it under.
    ("pk/levels.py", "LOW = 1", "LOW = 3", "tests/test_levels.py::test_level",
     "a decorator may have registered it"),
    ("pk/levels.py", "SMALL = 4", "SMALL = 5", "tests/test_levels.py::test_sizes",
     "a decorator may have registered it"),
    ("pk/levels.py", '@register("sizes")', '@register("small")', "tests/test_levels.py::test_sizes",
     "a decorator may have registered it"),
    # Registered by a call after its definition: the call is a module-level statement that
    # reads the class.
    ("pk/levels.py", "FAST = 1", "FAST = 2", "tests/test_levels.py::test_mode",
     "a module-level statement reads changed name(s) Mode"),
])
def test_a_changed_def_header_selects_who_depends_on_it(repo, path, old, new, victim, why):
    repo.edit(path, old, new)
    assert_selects(repo, victim, "tests/test_other.py::test_other", why)
