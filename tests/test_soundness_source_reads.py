"""Text that block fingerprints leave out, read by a test: a repository Python file read as
text (its own checks on a kernel's source, a license header, a version pulled out with a
regex) depends on all of it, comments too; a docstring is a value read as `__doc__` (an
argparse description, a registry's help). Each case changes only such text so that its
reader fails; a test that merely imports the file, or reads another docstring, is skipped."""

from __future__ import annotations

import pytest
from soundness_world import failing, recorded_once

SOURCES = {
    "pyproject.toml": "[project]\nname = 'pk'\nversion = '0'\n",
    "pk/__init__.py": '# Copyright FastCI tests\n__version__ = "0.1.0"\n',
    "pk/model.py": '''
        def forward(x):
            # fused
            return x * 2
    ''',
    "pk/noisy.py": '''
        import warnings


        def noisy():
            # a warning shown on stderr shows this file's line: a display, not a read
            warnings.warn("careful")
            return 1
    ''',
    "pk/cli.py": '''
        """Train a tiny model."""
        import argparse


        def build_parser():
            return argparse.ArgumentParser(description=__doc__)
    ''',
    "pk/cmds.py": '''
        def train():
            """Train the model."""
            return 0


        def describe(fn):
            return fn.__doc__.strip()
    ''',
    "pk/helps.py": '''
        import inspect


        def summary(fn):
            return inspect.getdoc(fn)
    ''',
    "tests/test_docs.py": '''
        from pk.cli import build_parser
        from pk.cmds import describe, train
        from pk.helps import summary


        def test_help():
            assert "tiny model" in build_parser().format_help()


        def test_describe():
            assert describe(train) == "Train the model."


        def test_summary():
            assert summary(train) == "Train the model."
    ''',
    "tests/test_reads.py": '''
        import inspect
        import re
        import subprocess
        import sys
        from pathlib import Path

        import pk
        from pk.model import forward

        ROOT = Path(pk.__file__).parent


        def test_source_tag():
            assert "# fused" in inspect.getsource(forward)


        def test_license_header():
            assert (ROOT / "__init__.py").read_text().startswith("# Copyright")


        def test_version_format():
            text = open(ROOT / "__init__.py").read()
            assert re.search(r'__version__ = "\\d+\\.\\d+\\.\\d+"', text)


        def test_child_reads_source():
            code = "import inspect, pk.model; assert '# fused' in inspect.getsource(pk.model)"
            assert subprocess.run([sys.executable, "-c", code]).returncode == 0


        def test_imports_only():
            assert forward(2) == 4


        def test_warns_in_a_child():
            code = "from pk.noisy import noisy; noisy()"
            assert subprocess.run([sys.executable, "-c", code]).returncode == 0
    ''',
}

recorded, repo = recorded_once("source-reads", SOURCES)
T = "tests/test_reads.py"


@pytest.mark.parametrize("path, old, new, readers", [
    ("pk/model.py", "# fused", "# unfused", {"test_source_tag", "test_child_reads_source"}),
    ("pk/__init__.py", "# Copyright", "# (c)", {"test_license_header"}),
    ("pk/__init__.py", '"0.1.0"', '"0.1"', {"test_version_format"}),
])
def test_a_python_file_read_as_text_selects_its_reader(repo, path, old, new, readers):
    repo.edit(path, old, new)
    readers = {f"{T}::{name}" for name in readers}
    assert readers <= failing(repo, T)
    decisions = repo.decisions()
    for reader in readers:
        assert decisions[reader]["decision"] == "selected", decisions[reader]
        assert any(f"read a changed file: {path}" in r for r in decisions[reader]["reasons"])
    if path == "pk/model.py":  # a comment: importing and running the file is not reading it
        assert decisions[f"{T}::test_imports_only"]["decision"] == "skipped"


D = "tests/test_docs.py"


@pytest.mark.parametrize("path, old, new, reader, other", [
    # A module's docstring: a bare `__doc__` in the module (and any `obj.__doc__`, which may
    # be the module's: describe's reader is selected too).
    ("pk/cli.py", "Train a tiny model", "Train a small model", "test_help", None),
    # A function's: any `obj.__doc__`, not another module's bare `__doc__`.
    ("pk/cmds.py", "Train the model", "Fit the model", "test_describe", "test_help"),
    # ... also read inside the standard library, for a caller that never names `__doc__`.
    ("pk/cmds.py", "Train the model", "Fit the model", "test_summary", "test_help"),
])
def test_a_changed_docstring_selects_who_reads_it(repo, path, old, new, reader, other):
    repo.edit(path, old, new)
    assert f"{D}::{reader}" in failing(repo, D)
    decisions = repo.decisions()
    assert decisions[f"{D}::{reader}"]["decision"] == "selected", decisions[f"{D}::{reader}"]
    if other is not None:
        assert decisions[f"{D}::{other}"]["decision"] == "skipped"
    assert decisions[f"{T}::test_imports_only"]["decision"] == "skipped"


def test_a_source_line_shown_by_a_warning_is_not_a_read(repo):
    repo.edit("pk/noisy.py", "# a warning shown", "# any warning shown")
    assert repo.decisions()[f"{T}::test_warns_in_a_child"]["decision"] == "skipped"
