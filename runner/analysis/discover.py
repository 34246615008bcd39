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


def test_functions(inventories: Mapping[str, FileBlocks],
                   patterns: tuple[str, ...] = DEFAULT_FILES) -> list[str]:
    """Node-id prefixes (`path::Class::test_x`) of the test functions in test files."""
    found = []
    for path in sorted(p for p in inventories if is_test_file(p, patterns)):
        fb = inventories[path]
        if fb.error:
            continue
        for block in fb.blocks:
            if block.kind != "function" or "<locals>" in block.qualname:
                continue
            parts = block.qualname.split(".")
            if not parts[-1].startswith("test"):
                continue
            if len(parts) == 1 or (len(parts) == 2 and parts[0].startswith("Test")):
                found.append(f"{path}::{'::'.join(parts)}")
    return found
