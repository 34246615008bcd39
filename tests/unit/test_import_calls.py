"""The import-time call hook (`record/import_calls.py`) in this process: which module-level
statement each repository function was called from while a `collect:` context was on."""

from __future__ import annotations

import importlib
import sys
import textwrap

import pytest

from fastci.runner.record.import_calls import ImportCalls

SOURCES = {
    "icpkg/__init__.py": "",
    "icpkg/lib.py": '''
        def leaf():
            return 1


        def helper():
            return leaf() + 1


        def in_thread():
            return 3
    ''',
    "icpkg/user.py": '''
        import threading

        from icpkg.lib import helper, in_thread, leaf

        A = helper()


        class K:
            B = leaf()


        worker = threading.Thread(target=in_thread)
        worker.start()
        worker.join()
    ''',
}


@pytest.fixture
def package(tmp_path, monkeypatch):
    for path, text in SOURCES.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(textwrap.dedent(text).lstrip("\n"))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [n for n in sys.modules if n == "icpkg" or n.startswith("icpkg.")]:
        del sys.modules[name]


def test_each_call_names_the_innermost_module_statement_or_why_there_is_none(package):
    windows = []
    calls = ImportCalls(str(package), {p: "sha" for p in SOURCES}, windows.append)
    previous = sys.getprofile()
    sys.setprofile(None)  # a profiler of the test runner's own would leave calls unknown
    try:
        calls.follow("collect:tests/test_x.py")
        importlib.import_module("icpkg.user")
        calls.follow("tests/test_x.py::test_y")  # a test: the hook is off
        assert sys.getprofile() is None
        importlib.import_module("icpkg.lib").helper()
    finally:
        calls.stop()
        sys.setprofile(previous)
    seen = calls.calls["collect:tests/test_x.py"]
    assert seen[("icpkg/lib.py", 5, "helper")] == {("module", "icpkg/user.py", 5)}
    # The chain: leaf ran under helper for the statement that binds A, and from K's body.
    assert seen[("icpkg/lib.py", 1, "leaf")] == {("module", "icpkg/user.py", 5), ("class",)}
    # A thread is not followed: the function ran, no call of it was seen.
    assert ("icpkg/lib.py", 9, "in_thread") not in seen
    assert list(calls.calls) == ["collect:tests/test_x.py"]
    # Outside until a repository module body starts, inside until it returns: icpkg's
    # package body, then icpkg.user's (icpkg.lib's, nested in it, included).
    assert windows == [False, True, False, True, False]


def test_another_profiler_is_left_alone_and_nothing_is_claimed(package):
    calls = ImportCalls(str(package), {p: "sha" for p in SOURCES})
    theirs = []

    def profiler(frame, event, arg):
        theirs.append(event)

    previous = sys.getprofile()
    sys.setprofile(profiler)
    try:
        calls.follow("collect:tests/test_x.py")
        assert sys.getprofile() is profiler
        importlib.import_module("icpkg.user")
    finally:
        calls.stop()
        sys.setprofile(previous)
    assert calls.skipped == "another profiler was active"
    assert not any(calls.calls.values()) and theirs
