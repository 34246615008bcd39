"""The import-time call hook (`record/import_calls.py`) in this process: which module-level
statement each repository function was called from while a `collect:` context was on."""

from __future__ import annotations

import ast
import importlib
import importlib.abc
import importlib.util
import sys
import textwrap
from pathlib import Path

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
    # package body, then icpkg.user's, outside again while the loader of icpkg.lib (which
    # icpkg.user imports) runs, inside for icpkg.lib's body, outside as it returns to its
    # loader, and inside for the rest of icpkg.user's body.
    assert windows == [False, True, False, True, False, True, False, True, False]


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


def test_a_third_party_body_a_repository_body_imports_runs_unprofiled(package, tmp_path,
                                                                      monkeypatch):
    """A repository module body that imports torch would profile torch's whole import; the
    hook is off while any module body outside the repository runs (on 3.12+ a
    sys.monitoring event says when it ends, before an import finder wraps its loader), and
    on again for the rest of the repository body. A repository function the third-party
    body calls back has no caller recorded: its lines are outside (the wide rule)."""
    vendor = tmp_path / "site"
    vendor.mkdir()
    (vendor / "icvendor.py").write_text(textwrap.dedent('''
        import sys

        PROFILED = sys.getprofile() is not None
        VALUE = sys.modules["icpkg.lib"].in_thread()  # a plugin registry's call back

        import icpkg.plugin  # a repository module it loads: profiled, then off again

        AFTER = sys.getprofile() is not None
    ''').lstrip("\n"))
    (package / "icpkg" / "plugin.py").write_text("from icpkg.lib import leaf\n\nP = leaf()\n")
    (package / "icpkg" / "uses_vendor.py").write_text(textwrap.dedent('''
        from icpkg.lib import helper, leaf

        import icvendor

        A = helper()
    ''').lstrip("\n"))
    monkeypatch.syspath_prepend(str(vendor))
    tree = {p: "sha" for p in [*SOURCES, "icpkg/uses_vendor.py", "icpkg/plugin.py"]}
    windows = []
    calls = ImportCalls(str(package), tree, windows.append)
    previous = sys.getprofile()
    sys.setprofile(None)
    try:
        calls.follow("collect:tests/test_v.py")
        importlib.import_module("icpkg.uses_vendor")
    finally:
        calls.stop()
        sys.setprofile(previous)
        sys.modules.pop("icvendor", None)
    vendor_module = importlib.import_module("icpkg.uses_vendor").icvendor
    assert vendor_module.PROFILED is False and vendor_module.AFTER is False
    seen = calls.calls["collect:tests/test_v.py"]
    assert ("icpkg/lib.py", 9, "in_thread") not in seen  # called back: no caller known
    assert seen[("icpkg/lib.py", 5, "helper")] == {("module", "icpkg/uses_vendor.py", 5)}
    assert ("module", "icpkg/plugin.py", 3) in seen[("icpkg/lib.py", 1, "leaf")]
    assert False in windows[windows.index(True):]  # the vendor's body ran outside


class _Rewriter(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Stands for pytest's assertion rewriter: Python work of its own (parsing, rewriting),
    then an `exec` of the module's code."""

    def __init__(self, root) -> None:
        self.root = root
        self.profiled: list[bool] = []

    def find_spec(self, name, path, target=None):
        if name != "icpkg.rewritten":
            return None
        return importlib.util.spec_from_file_location(
            name, self.root / "icpkg" / "rewritten.py", loader=self)

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        self.profiled.append(sys.getprofile() is not None)
        tree = ast.parse(Path(module.__file__).read_text())
        exec(compile(tree, module.__file__, "exec"), module.__dict__)


def test_a_loader_runs_unprofiled_and_the_repository_body_it_runs_is_profiled(package):
    """A test module that imports another has pytest rewrite it while the importer's body
    runs: 130,000 profiled calls on einops' suite. Every loader runs with the hook off;
    the loaded repository module's body is profiled, and so is the rest of the importer's."""
    (package / "icpkg" / "rewritten.py").write_text(
        "from icpkg.lib import helper\n\nimport icpkg.deeper\n\nB = helper()\n")
    (package / "icpkg" / "deeper.py").write_text("X = 1\n")  # a loader inside a loaded body
    (package / "icpkg" / "imports_rewritten.py").write_text(
        "from icpkg.lib import leaf\n\nimport icpkg.rewritten\n\nC = leaf()\n")
    rewriter = _Rewriter(package)
    tree = {p: "sha" for p in [*SOURCES, "icpkg/rewritten.py", "icpkg/imports_rewritten.py",
                               "icpkg/deeper.py"]}
    calls = ImportCalls(str(package), tree)
    previous = sys.getprofile()
    sys.setprofile(None)
    sys.meta_path.insert(0, rewriter)
    try:
        calls.follow("collect:tests/test_r.py")
        importlib.import_module("icpkg.imports_rewritten")
    finally:
        calls.stop()
        sys.meta_path.remove(rewriter)
        sys.setprofile(previous)
    assert rewriter.profiled == [False]
    seen = calls.calls["collect:tests/test_r.py"]
    assert seen[("icpkg/lib.py", 5, "helper")] == {("module", "icpkg/rewritten.py", 5)}
    assert seen[("icpkg/lib.py", 1, "leaf")] == {("module", "icpkg/rewritten.py", 5),
                                                 ("module", "icpkg/imports_rewritten.py", 5)}
