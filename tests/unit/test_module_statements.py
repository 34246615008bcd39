"""Which module-level statement spans a line (`blocks.ModuleStatements`): the recorder asks
it for every line a module body called a repository function from."""

from __future__ import annotations

import textwrap

from fastci.runner.analysis.blocks import ModuleStatements

SOURCE = textwrap.dedent('''
    """The module's docstring."""
    import os

    A, B = make(1), make(
        2)


    @register(
        "x")
    def handler():
        return A
''').lstrip("\n")


def test_each_line_names_the_statement_that_spans_it_decorators_included():
    statements = ModuleStatements(SOURCE)
    first, statement = statements.at(4)
    assert first == 4 and set(statement.defines) == {"A", "B"}
    assert statements.at(5)[0] == 4  # the statement's continuation line
    assert statements.at(9)[0] == 8  # a decorator's argument: the def, from its decorator
    assert set(statements.at(8)[1].defines) == {"handler"}
    assert statements.at(1) is None  # the docstring binds nothing
    assert statements.at(6) is None  # a blank line between statements
    assert statements.at(99) is None


def test_a_source_that_does_not_parse_answers_none():
    assert ModuleStatements("def broken(:\n").at(1) is None
    assert ModuleStatements(b"\x00").at(1) is None
