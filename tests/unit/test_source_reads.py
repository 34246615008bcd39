"""Who opened a repository Python file decides whether it is a test's read of its text
(`tracing.wants_source`): the frames are built with the file names each caller has."""

from __future__ import annotations

import os

import pytest

from fastci.runner.record import tracing

OURS = os.path.dirname(os.path.dirname(os.path.abspath(tracing.__file__))) + os.sep


def frames(root: str, opener: str):
    """A call as the audit hook sees it: repository code calls `opener` (a file name), which
    opens root/pk/m.py, and the hook (`_audit`, in FastCI's code) asks `wants_source`."""
    target = os.path.join(root, "pk", "m.py")
    namespace = {"wants_source": tracing.wants_source, "TARGET": target, "ROOT": root}
    for source, filename in (
            ("def _audit():\n    return wants_source(TARGET, ROOT)\n", OURS + "record/tracing.py"),
            ("def open_it():\n    return _audit()\n", opener),
            ("def caller():\n    return open_it()\n", os.path.join(root, "pk", "caller.py"))):
        exec(compile(source, filename, "exec"), namespace)
    return namespace["caller"]


@pytest.fixture
def root(tmp_path, monkeypatch):
    tracing._locate()
    monkeypatch.setattr(tracing, "_repo_root", str(tmp_path) + os.sep)
    return str(tmp_path)


def test_repository_code_reading_a_source_is_a_read(root):
    assert frames(root, os.path.join(root, "tests", "test_a.py"))()
    assert frames(root, "<string>")()  # python -c: the test's command


def test_fastci_or_a_tool_reading_a_source_is_not(root):
    assert not frames(root, OURS + "record/bindings.py")()  # capture binding names
    assert not frames(root, tracing._tool_dirs[1] + "assertion/rewrite.py")()  # pytest
    assert not frames(root, tracing._site_packages[0] + "triton/runtime/jit.py")()
