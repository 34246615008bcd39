"""Selection: for every test, selected or skipped, and why. Pure functions over plain data.

`rules` applies the safety rules and the trace diff to a `SelectionInput`; `risk` scores and
orders what was selected; `plan` turns a selection into what pytest keeps and in which
order; `report` is the contract (decisions, results) that the CLI and the App read;
`explain` renders one test's decision as text.
"""

from fastci.runner.selection.report import Decision, RunReport, Selection, TestResult
from fastci.runner.selection.rules import History, SelectionInput, select

__all__ = [
    "Decision", "History", "RunReport", "Selection", "SelectionInput", "TestResult", "select",
]
