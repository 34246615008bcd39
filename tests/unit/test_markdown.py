"""The markdown FastCI posts, parsed as GitHub parses it (CommonMark, with GFM tables).

Replies and check-run summaries are read by people on GitHub: explain's code block must be a
code block (its fence at a line start, after the @mention), tables must keep their columns
whatever a test id holds, and text cut at GitHub's 65,535-byte limit must still parse.
"""

from __future__ import annotations

import pytest
from markdown_it import MarkdownIt

from fastci.app import markdown
from fastci.app.checks import regressions_output, selection_output
from fastci.app.commands import EXPLAIN_LIMIT, explain_reply
from fastci.app.events import RERUN_FAILED, RUN_ALL
from fastci.app.github import MAX_TEXT, CheckRunOutput
from fastci.runner.selection.explain import explain
from fastci.runner.selection.report import Decision, Selection, TestResult

HEAD, BASE = "c0ffee" + "0" * 34, "6dcb09b5" + "0" * 32
GFM = MarkdownIt("commonmark").enable("table")
IDS = ["tests/test_a.py::test_one", "tests/test_a.py::test_p[x|y]", "tests/t.py::test_`tick`",
       "tests/t.py::test_ü[ß-✅]"]


def selection(n_selected: int = 2, *, ids=IDS) -> Selection:
    decisions = tuple(
        Decision(test_id, i < n_selected, (f"reads `{test_id}` | changed block",),
                 risk=0.5, expected_seconds=1.0, rank=i + 1 if i < n_selected else None)
        for i, test_id in enumerate(ids))
    return Selection(BASE, HEAD, decisions, changed_files=("pkg/a.py", "pkg/b|c.py"))


def fences(text: str) -> list:
    return [t for t in GFM.parse(text) if t.type == "fence"]


def table_rows(text: str) -> list[list[str]]:
    """Each table row's cells, as rendered text (inline code included)."""
    rows, cells, in_cell = [], None, False
    for token in GFM.parse(text):
        if token.type == "tr_open":
            cells = []
        elif token.type in ("th_open", "td_open"):
            in_cell = True
        elif token.type == "inline" and in_cell:
            cells.append("".join(c.content for c in token.children or []))
            in_cell = False
        elif token.type == "tr_close":
            rows.append(cells)
    return rows


# -- explain -------------------------------------------------------------------------------------
def test_explain_is_a_code_block_after_the_mention_and_names_the_head_commit():
    text = explain(selection(), IDS[1])
    reply = "@alice " + explain_reply(text, IDS[1], HEAD)  # as commands.reply posts it
    [block] = fences(reply)
    assert block.content == text + "\n"
    assert f"head {HEAD[:12]}" in block.content and "WORKTREE" not in reply
    assert f"`{HEAD[:12]}`" in reply.splitlines()[0]


def test_a_code_block_is_not_closed_by_the_text_it_holds():
    text = "reason: ```\n~~~\n````` five\nend"
    [block] = fences("intro\n\n" + markdown.code_block(text))
    assert block.content == text + "\n"


def test_a_long_explanation_is_cut_inside_its_code_block():
    text = "\n".join(f"line {i} ✅" for i in range(20000))
    reply = explain_reply(text, IDS[0], HEAD)
    [block] = fences(reply)
    assert len(reply) < 65536 and len(block.content) <= EXPLAIN_LIMIT + 20
    assert block.content.endswith("… (truncated)\n")


# -- selection and regressions check runs ---------------------------------------------------------
def test_table_cells_keep_their_columns_whatever_a_test_id_holds():
    out = selection_output(selection(len(IDS)), [])
    rows = table_rows(out.text)
    assert rows[0] == ["#", "risk", "test", "dimension", "why"]
    assert [len(r) for r in rows] == [5] * (len(IDS) + 1)
    assert [r[2] for r in rows[1:]] == IDS
    summary_rows = table_rows(out.summary)
    assert [len(r) for r in summary_rows] == [3] * 4
    assert "pkg/b|c.py" in "".join(t.content for t in GFM.parse(out.summary))


def test_a_failure_table_keeps_its_columns():
    results = [TestResult(IDS[1], "failed", 0.1,
                          failure={"path": "tests/t|u.py", "line": 3, "message": "a\nb | c"})]
    out = regressions_output(results, shards=1, shards_done=1, done=True)
    rows = table_rows(out.summary)
    assert rows[1] == [IDS[1], "tests/t|u.py:3", "a b | c"]


def test_a_run_all_does_not_claim_a_selection_it_did_not_run():
    nothing = selection(0)  # nothing changed that a test executed: the selection is empty
    assert selection_output(nothing, []).title == "0 of 4 tests selected (100% of test time saved)"
    out = selection_output(nothing, [], mode=RUN_ALL)
    assert out.title == "all 4 tests run on request (the selection: 0)"
    assert "saved" not in out.title + out.summary
    assert "every test runs, as requested" in out.summary
    assert "saved" not in selection_output(nothing, [], mode=RERUN_FAILED).title


@pytest.mark.parametrize("where", ["summary", "text"])
def test_text_cut_at_githubs_limit_still_parses(where):
    many = [f"tests/test_{i}.py::test_✅_{i}[a|b]" for i in range(250)]
    out = selection_output(selection(250, ids=many), [])
    long = out.text * 3  # ~80 kB of table rows, many of them multi-byte
    huge = CheckRunOutput(out.title, long if where == "summary" else out.summary,
                          long if where == "text" else "")
    batch = huge.batches()[0]
    cut = batch[where]
    assert len(cut.encode()) <= MAX_TEXT < len(getattr(huge, where).encode())
    tokens = GFM.parse(cut)
    assert tokens[-1].type == "paragraph_close"  # the note is a paragraph after the table
    assert "truncated" in tokens[-2].content
    rows = table_rows(cut)
    assert rows and all(len(r) == 5 for r in rows[:-1])  # the last row may be cut short
