"""Memoized repository code: a test that only hits a cache never runs the function's body,
so its evidence must come from the hit. Each test records an order in which the first test
computes the value and a later one only reads it, breaks the function so the later one
fails, and checks that FastCI selects it (and still skips an unrelated test)."""

from __future__ import annotations

import functools
import subprocess
import sys

import pytest

from fastci.runner.record import tracing

BASE = {"pyproject.toml": "[project]\nname = 'pk'\nversion = '0'\n", "pk/__init__.py": ""}

MEMO = {
    **BASE,
    "pk/tables.py": '''
        import functools

        from pk.deco import logged


        @functools.lru_cache(maxsize=None)
        def table(n):
            return [i * 2 for i in range(n)]


        @functools.cache
        def ident(n):
            return n


        class Grid:
            @functools.lru_cache(maxsize=8)
            def cells(self):
                return 4

            @functools.cached_property
            def width(self):
                return 4

            def __hash__(self):
                return 0

            def __eq__(self, other):
                return isinstance(other, Grid)


        GRID = Grid()


        @logged  # a decorator over the cache hides it behind functools.wraps
        @functools.lru_cache(maxsize=None)
        def outer(n):
            return n * 5


        @functools.lru_cache(maxsize=None)
        @logged  # ... and one under it, from another module, is skipped by a hit too
        def inner(n):
            return n * 6


        @functools.lru_cache(maxsize=None)
        def cleared(n):
            return n * 7


        @functools.lru_cache(maxsize=None)
        def imported(n):
            return n * 8


        class Box:
            @property
            @functools.lru_cache(maxsize=None)
            def size(self):
                return 41

            def __hash__(self):
                return 0

            def __eq__(self, other):
                return isinstance(other, Box)

            class Inner:
                @functools.lru_cache(maxsize=None)
                def depth(self):
                    return 42

                def __hash__(self):
                    return 0

                def __eq__(self, other):
                    return isinstance(other, Box.Inner)
    ''',
    "pk/reloaded.py": '''
        import functools


        @functools.lru_cache(maxsize=None)
        def twice(n):
            return n * 2
    ''',
    "pk/deco.py": '''
        import functools


        def logged(fn):
            @functools.wraps(fn)
            def wrapper(*args, **kwargs):
                return fn(*args, **kwargs)
            return wrapper
    ''',
    # test_a computes every value first; the tests in test_b.py only ever hit the caches.
    "tests/test_a.py": '''
        import pk.reloaded  # watched from here: test_reload's reload builds a new cache
        from pk.tables import GRID, Box, Grid, cleared, ident, imported, inner, outer, table

        FIRST = imported(3)  # computed while this file is imported


        def test_a():
            assert len(table(3)) == 3
            assert ident(3) == 3
            assert Grid().cells() > 0
            assert GRID.width > 0
            assert outer(3) > 0 and inner(3) > 0 and cleared(3) > 0
            assert Box().size > 0 and Box.Inner().depth() > 0


        def test_reload():
            import importlib

            importlib.reload(pk.reloaded)  # new cache wrappers, in the same module object
            assert pk.reloaded.twice(3) > 0


        def test_unrelated():
            assert 1 + 1 == 2
    ''',
    "tests/test_c.py": '''
        from pk.tables import imported

        SECOND = imported(3)  # a hit while this file is imported: the value lives on


        def test_import_time_hit():
            assert SECOND == 24
    ''',
    "tests/test_b.py": '''
        import pytest

        from pk.tables import GRID, Box, Grid, cleared, ident, inner, outer, table


        @pytest.fixture
        def clear_after():
            yield
            cleared.cache_clear()  # after the hit: the hit count starts again from zero


        def test_outer_decorator():
            assert outer(3) == 15


        def test_inner_decorator():
            assert inner(3) == 18


        def test_cache_cleared_after_hit(clear_after):
            assert cleared(3) == 21


        def test_property_over_cache():
            assert Box().size == 41


        def test_nested_class():
            assert Box.Inner().depth() == 42


        def test_lru_cache():
            assert table(3) == [0, 2, 4]


        def test_after_reload():
            import pk.reloaded

            assert pk.reloaded.twice(3) == 6


        def test_cache():
            assert ident(3) == 3


        def test_cached_method():
            assert Grid().cells() == 4


        def test_cached_property():
            assert GRID.width == 4
    ''',
}


def fails(project, test_id: str) -> bool:
    """Whether the test fails at the working tree (the escape is real, not hypothetical)."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "tests/test_a.py", "tests/test_b.py", "tests/test_c.py"],
                          cwd=project.root, capture_output=True, text=True)
    return f"FAILED {test_id}" in proc.stdout


@pytest.fixture
def memo(project):
    project.write(MEMO)
    project.commit()
    project.record()
    return project


@pytest.mark.parametrize("old, new, victim", [
    ("i * 2 for", "i * 3 for", "tests/test_b.py::test_lru_cache"),
    ("return n\n", "return n + 1\n", "tests/test_b.py::test_cache"),
    ("def cells(self):\n        return 4", "def cells(self):\n        return 5",
     "tests/test_b.py::test_cached_method"),
    ("def width(self):\n        return 4", "def width(self):\n        return 5",
     "tests/test_b.py::test_cached_property"),
    ("n * 5", "n * 50", "tests/test_b.py::test_outer_decorator"),
    ("n * 6", "n * 60", "tests/test_b.py::test_inner_decorator"),
    ("n * 7", "n * 70", "tests/test_b.py::test_cache_cleared_after_hit"),
    ("return 41", "return 40", "tests/test_b.py::test_property_over_cache"),
    ("return 42", "return 40", "tests/test_b.py::test_nested_class"),
    ("n * 8", "n * 80", "tests/test_c.py::test_import_time_hit"),
    ("n * 2", "n * 20", "tests/test_b.py::test_after_reload"),
])
def test_a_cache_hit_selects_the_test_that_hit_it(memo, old, new, victim):
    memo.edit("pk/reloaded.py" if "test_after_reload" in victim else "pk/tables.py", old, new)
    assert fails(memo, victim)
    selected = memo.selected()
    assert victim in selected
    assert "tests/test_a.py::test_unrelated" not in selected
    # Exact: a hit credits the one function, not the module.
    others = {"tests/test_b.py::test_lru_cache", "tests/test_b.py::test_cache",
              "tests/test_b.py::test_cached_method", "tests/test_b.py::test_cached_property"}
    assert not (selected & others) - {victim}


def test_the_recording_cached_property_behaves_like_the_original():
    """While recording, functools.cached_property is a data-descriptor subclass: caching,
    assignment, deletion, class access and __set_name__ must be what they were."""
    tracing.patch_cached_property()
    try:
        calls = []

        class Thing:
            @functools.cached_property
            def value(self):
                """The value."""
                calls.append(1)
                return len(calls)

        thing = Thing()
        assert isinstance(Thing.__dict__["value"], tracing._original_cached_property)
        assert Thing.value.__doc__ == "The value." and Thing.value.attrname == "value"
        assert (thing.value, thing.value, len(calls)) == (1, 1, 1)
        thing.value = 10
        assert thing.value == 10 and thing.__dict__["value"] == 10
        del thing.value
        assert thing.value == 2  # computed again
        with pytest.raises(AttributeError):
            del Thing().value
        reads: set = set()
        tracing.set_context(None, reads)
        assert thing.value == 2
        assert reads == {Thing.__dict__["value"].func}

        class Slotted:
            __slots__ = ()

            @functools.cached_property
            def value(self):
                return 1

        with pytest.raises(TypeError):  # as the original: no __dict__ to cache in
            Slotted().value
    finally:
        tracing.set_context(None, None)
        tracing.unpatch_cached_property()
    assert functools.cached_property is tracing._original_cached_property or \
        tracing._original_cached_property is None
    assert functools.cached_property.__module__ == "functools"


# A forkserver is a fresh interpreter that outlives the test that started it: what it
# computed while preloading (a cache filled at import) lives on in every later child it forks.
SERVED = {
    **BASE,
    "pk/table.py": '''
        import functools


        @functools.lru_cache(maxsize=None)
        def table(n):
            return [i * 2 for i in range(n)]


        def work(_):
            return table(3)


        def nothing(_):
            return None
    ''',
    "pk/warm.py": '''
        from pk.table import table

        table(3)  # the server fills the cache as it preloads this module
    ''',
    "tests/test_a_start.py": '''
        import multiprocessing

        from pk.table import nothing

        CTX = multiprocessing.get_context("forkserver")
        CTX.set_forkserver_preload(["pk.warm"])


        def test_starts_the_server():
            with CTX.Pool(1) as pool:
                assert pool.map(nothing, [0]) == [None]
    ''',
    "tests/test_b_hit.py": '''
        import multiprocessing

        from pk.table import work


        def test_hits_the_servers_cache():
            with multiprocessing.get_context("forkserver").Pool(1) as pool:
                assert pool.map(work, [0]) == [[0, 2, 4]]


        def test_unrelated():
            assert 1 + 1 == 2
    ''',
}


def test_a_cache_a_forkserver_filled_selects_the_test_whose_child_hit_it(project):
    # The child that hits runs for test_b, forked from a server test_a started: the server
    # computed table(3) while preloading, so nothing of table runs in test_b's processes.
    project.write(SERVED)
    project.commit()
    proc = project.record()
    assert "3 passed" in proc.stdout, proc.stdout + proc.stderr
    project.edit("pk/table.py", "i * 2 for", "i * 3 for")
    victim = "tests/test_b_hit.py::test_hits_the_servers_cache"
    assert project.fails(victim)
    selected = project.selected()
    assert victim in selected
    assert "tests/test_b_hit.py::test_unrelated" not in selected
