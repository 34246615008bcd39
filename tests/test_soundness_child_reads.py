"""Cache hits, names read by string and folders listed inside a test's child processes.

A forked child inherits its parent's filled caches and hooked modules: a hit or a read by
string there happens in the child's copy of the recorder, so the child must report them. A
fresh interpreter (`python -c ...`) imports the repository itself: its reads by string must
be recorded there. Each case breaks the value its reader gets only in the child, so that the
reader fails, and checks that FastCI selects it and still skips a test reading nothing."""

from __future__ import annotations

import pytest
from soundness_world import assert_selects, recorded_once

CHILDREN = {
    "pyproject.toml": "[project]\nname = 'pk'\nversion = '0'\n",
    "pk/__init__.py": "",
    "pk/consts.py": "SCALE = 2\nWIDTH = 4\nUNUSED = 0\n",
    "plugins/a.txt": "a\n",
    "pk/tables.py": '''
        import functools


        @functools.lru_cache(maxsize=None)
        def table(n):
            return n * 2


        class Grid:
            @functools.cached_property
            def width(self):
                return 4


        GRID = Grid()
    ''',
    "tests/helpers.py": '''
        import os


        def in_fork(check):
            """Run `check()` in a forked child; True when it returned True."""
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    code = 0 if check() else 1
                finally:
                    os._exit(code)
            _, status = os.waitpid(pid, 0)
            return os.waitstatus_to_exitcode(status) == 0
    ''',
    # test_a fills the caches in this process; test_b's children only ever hit them.
    "tests/test_a.py": '''
        import pk.consts  # noqa: F401 (imported here: the children find it loaded)
        from pk.tables import GRID, table


        def test_a():
            assert table(3) > 0
            assert GRID.width > 0


        def test_unrelated():
            assert 1 + 1 == 2
    ''',
    "tests/test_b.py": '''
        import importlib
        import os
        import subprocess
        import sys

        from helpers import in_fork
        from pk.tables import GRID, table

        READ = ("import importlib, sys; "
                "sys.exit(getattr(importlib.import_module('pk.consts'), 'WIDTH') != 4)")
        LIST = "import os, sys; sys.exit(os.listdir('plugins') != ['a.txt'])"


        def test_fork_cache_hit():
            assert in_fork(lambda: table(3) == 6)


        def test_fork_cached_property():
            assert in_fork(lambda: GRID.width == 4)


        def test_fork_read_by_string():
            assert in_fork(lambda: getattr(importlib.import_module("pk.consts"), "SCALE") == 2)


        def test_spawn_read_by_string():
            assert subprocess.run([sys.executable, "-c", READ]).returncode == 0


        def test_fork_lists_a_folder():
            assert in_fork(lambda: os.listdir("plugins") == ["a.txt"])


        def test_spawn_lists_a_folder():
            assert subprocess.run([sys.executable, "-c", LIST]).returncode == 0
    ''',
}


recorded, repo = recorded_once("child-reads", CHILDREN)


@pytest.mark.parametrize("path, old, new, reader", [
    ("pk/tables.py", "n * 2", "n * 3", "test_fork_cache_hit"),
    ("pk/tables.py", "return 4", "return 5", "test_fork_cached_property"),
    ("pk/consts.py", "SCALE = 2", "SCALE = 3", "test_fork_read_by_string"),
    ("pk/consts.py", "WIDTH = 4", "WIDTH = 5", "test_spawn_read_by_string"),
])
def test_a_child_s_hit_or_read_selects_its_test(repo, path, old, new, reader):
    repo.edit(path, old, new)
    reader = f"tests/test_b.py::{reader}"
    assert_selects(repo, reader, "tests/test_a.py::test_unrelated", None,
                   "tests/test_a.py", "tests/test_b.py")


def test_a_child_s_reads_are_exact_by_name(repo):
    """A child that read SCALE by string does not depend on every value of the module."""
    repo.edit("pk/consts.py", "UNUSED = 0", "UNUSED = 1")
    selected = repo.selected()
    assert "tests/test_b.py::test_fork_read_by_string" not in selected
    assert "tests/test_b.py::test_fork_cache_hit" not in selected


@pytest.mark.parametrize("reader", ["test_fork_lists_a_folder", "test_spawn_lists_a_folder"])
def test_a_child_that_lists_a_folder_is_selected_when_a_file_is_added_there(repo, reader):
    """A child's listing is its test's evidence, as the test process's own is: a plugin
    folder read by a training command's child, one more file in it, and the child fails."""
    added = repo.root / "plugins" / "b.txt"
    added.write_text("b\n")
    try:
        assert_selects(repo, f"tests/test_b.py::{reader}", "tests/test_a.py::test_unrelated",
                       "listed plugins/", "tests/test_a.py", "tests/test_b.py")
    finally:
        added.unlink()
