"""The indexed selection checked against the full evaluation of every test.

`rules.select` decides the tests a change does not reach from the snapshot's index alone
(`evidence_index.py`); `select(..., use_index=False)` evaluates every test. They must agree
on every decision, reason and rank: a difference is a test the index failed to reach, a
FastCI bug. `FASTCI_CHECK_INDEX=1` makes `Engine.plan` run both and fail on any difference
(the test suite sets it, so every selection it makes is checked); tests call `checked`.
"""

from __future__ import annotations

import os

from fastci.runner.selection.report import Selection
from fastci.runner.selection.rules import SelectionInput, select

ENV = "FASTCI_CHECK_INDEX"


class IndexMismatch(AssertionError):
    """The indexed selection differs from the full one: a bug, never the user's doing."""


def wanted() -> bool:
    return os.environ.get(ENV, "") == "1"


def facts(selection: Selection) -> dict:
    """Everything a selection decided, with the fields `Decision` leaves out of equality."""
    return {"base": selection.base, "head": selection.head,
            "select_all_reason": selection.select_all_reason,
            "changed_files": selection.changed_files, "notes": selection.notes,
            "outside": selection.outside, "scope": selection.scope,
            "order": [d.test_id for d in selection.selected],
            "decisions": [(d, d.prunable, d.prune_conditions) for d in selection.decisions]}


def differences(indexed: Selection, full: Selection) -> list[str]:
    """What differs, one line per test or field (empty: they agree)."""
    a, b = facts(indexed), facts(full)
    out = [f"{k}: indexed {a[k]!r}, full {b[k]!r}" for k in a
           if k != "decisions" and a[k] != b[k]]
    for (da, *pa), (db, *pb) in zip(a["decisions"], b["decisions"]):
        if (da, pa) != (db, pb):
            out.append(f"{da.test_id}: indexed {da!r} {pa!r}, full {db!r} {pb!r}")
    if len(a["decisions"]) != len(b["decisions"]):
        out.append(f"{len(a['decisions'])} decisions indexed, {len(b['decisions'])} in full")
    return out


def checked(inp: SelectionInput, indexed: Selection | None = None) -> Selection:
    """The indexed selection (`indexed`, when already made), after the full evaluation
    agreed with it; IndexMismatch says where it did not."""
    indexed = indexed if indexed is not None else select(inp)
    found = differences(indexed, select(inp, use_index=False))
    if found:
        raise IndexMismatch("the selection from the snapshot's index differs from the full "
                            "evaluation (a FastCI bug):\n" + "\n".join(found[:20]))
    return indexed
