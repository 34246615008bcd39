"""A child's hooks wait for their module: `after_import` must survive a lookup before the import.

torch's CUDA builds call `importlib.util.find_spec("triton")` as they start, long before anything
imports triton. The hook that notes a child's kernel launches once took its callbacks at that
lookup, so the import that followed ran none of them, and on Python 3.12 (where pip gives the
CUDA build) a child's launches went unseen.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

from fastci.runner.record import child


def test_a_lookup_before_the_import_leaves_the_callbacks_for_the_import(tmp_path, monkeypatch):
    (tmp_path / "looked_up_first.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen: list[int] = []
    child.after_import("looked_up_first", lambda module: seen.append(module.VALUE))
    try:
        assert importlib.util.find_spec("looked_up_first") is not None  # a lookup alone
        assert seen == []
        module = importlib.import_module("looked_up_first")
        assert seen == [1], "the import after a lookup ran no callback"
        importlib.reload(module)
        assert seen == [1], "a callback runs once"
    finally:
        sys.modules.pop("looked_up_first", None)
        child._finder.callbacks.pop("looked_up_first", None)


def test_a_module_already_imported_runs_the_callback_at_once():
    seen: list[str] = []
    child.after_import("json", lambda module: seen.append(module.__name__))
    assert seen == ["json"]
