"""Test functions found statically at the head, so new tests are selected without paying
for a pytest collection (which imports torch: seconds, not milliseconds)."""

from __future__ import annotations

import fnmatch
from typing import Mapping

from fastci.runner.analysis.blocks import FileBlocks

DEFAULT_FILES = ("test_*.py", "*_test.py")


def is_test_file(path: str, patterns: tuple[str, ...] = DEFAULT_FILES) -> bool:
    name = path.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatch(name, p) for p in patterns)


def is_test_code(path: str) -> bool:
    """A test file or a conftest.py: pytest's to import (fixtures, marks, rewritten
    asserts), never code under test that a capture could stand for."""
    return is_test_file(path) or path.rsplit("/", 1)[-1] == "conftest.py"


NAMES_VERSION = 1
"""The rule `names_in` applies; cached names are keyed "<blob>:<version>", so bump it
whenever the rule changes and no cache answers with the old rule's names."""


def names_in(fb: FileBlocks) -> list[str]:
    """The test functions among one file's blocks, as node-id parts (`Class::test_x`)."""
    if fb.error:
        return []
    found = []
    for block in fb.blocks:
        if block.kind != "function" or "<locals>" in block.qualname:
            continue
        parts = block.qualname.split(".")
        if not parts[-1].startswith("test"):
            continue
        if len(parts) == 1 or (len(parts) == 2 and parts[0].startswith("Test")):
            found.append("::".join(parts))
    return found


def test_functions(inventories: Mapping[str, FileBlocks],
                   patterns: tuple[str, ...] = DEFAULT_FILES) -> list[str]:
    """Node-id prefixes (`path::Class::test_x`) of the test functions in test files. Lazy
    inventories answer from their cache of names by blob (`Inventories.test_names`), so
    the files need not be loaded."""
    paths = sorted(p for p in inventories if is_test_file(p, patterns))
    cached = getattr(inventories, "test_names", None)
    names = cached(paths) if cached is not None else {p: names_in(inventories[p]) for p in paths}
    return [f"{path}::{name}" for path in paths for name in names[path]]
