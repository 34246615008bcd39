"""Diff coverage and the coverage delta, from the evidence's executed lines.

Statement lines come from the AST (a line a statement starts on), so blank lines, comments
and docstrings never count as uncovered. Test files are left out of both measures: they are
what measures, not what is measured.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Mapping


def statement_lines(source: bytes) -> set[int]:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return set()
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt):
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) \
                    and isinstance(node.value.value, str):
                continue  # a docstring
            lines.add(node.lineno)
    return lines


def is_test_file(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return (path.startswith("tests/") or "/tests/" in path or name.startswith("test_")
            or name.endswith("_test.py") or name == "conftest.py")


@dataclass(frozen=True)
class CoverageReport:
    changed_statements: int
    changed_covered: int
    uncovered: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    head_ratio: float | None = None
    base_ratio: float | None = None

    @property
    def diff_coverage(self) -> float | None:
        if not self.changed_statements:
            return None
        return self.changed_covered / self.changed_statements

    @property
    def delta(self) -> float | None:
        if self.head_ratio is None or self.base_ratio is None:
            return None
        return self.head_ratio - self.base_ratio


def executed(lines_by_test: Mapping[str, Mapping[str, tuple[int, ...]] | None]
             ) -> dict[str, set[int]]:
    out: dict[str, set[int]] = {}
    for lines in lines_by_test.values():
        for path, ls in (lines or {}).items():
            out.setdefault(path, set()).update(ls)
    return out


def ratio(executed_lines: Mapping[str, set[int]],
          statements: Mapping[str, set[int]]) -> float | None:
    total = covered = 0
    for path, stmts in statements.items():
        if is_test_file(path):
            continue
        total += len(stmts)
        covered += len(stmts & executed_lines.get(path, set()))
    return covered / total if total else None


def report(changed_lines: Mapping[str, set[int]], head_statements: Mapping[str, set[int]],
           head_executed: Mapping[str, set[int]], base_statements=None, base_executed=None
           ) -> CoverageReport:
    changed = covered = 0
    uncovered: dict[str, tuple[int, ...]] = {}
    for path, lines in sorted(changed_lines.items()):
        if is_test_file(path) or not path.endswith(".py"):
            continue
        stmts = lines & head_statements.get(path, set())
        hit = stmts & head_executed.get(path, set())
        changed += len(stmts)
        covered += len(hit)
        if stmts - hit:
            uncovered[path] = tuple(sorted(stmts - hit))
    return CoverageReport(
        changed, covered, uncovered, ratio(head_executed, head_statements),
        ratio(base_executed, base_statements) if base_statements is not None else None)


def changed_lines(hunks: list[tuple[int, int, int, int]]) -> set[int]:
    """New-side line numbers of a diff's hunks."""
    out: set[int] = set()
    for _, _, new_start, new_len in hunks:
        out.update(range(new_start, new_start + new_len))
    return out
