"""The markdown FastCI writes to GitHub (comments, check-run summaries), built in one place.

GitHub renders GitHub-flavoured CommonMark, so: a code fence opens at the start of a line and
is longer than any run of backticks inside it; a table cell holds no newline and escapes "|"
(inside code spans too: GFM splits cells before it reads code); text is cut to GitHub's
limits in bytes, never inside a character (github.fit). tests/unit/test_markdown.py parses
what these produce with a CommonMark parser.
"""

from __future__ import annotations

import re

_BACKTICKS = re.compile(r"`+")


def code_block(text: str, info: str = "") -> str:
    """``text`` as a fenced code block that starts at a line start; the caller puts it after a
    blank line. The fence outgrows any backtick run in ``text``, so nothing closes it early."""
    longest = max((len(run) for run in _BACKTICKS.findall(text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{info}\n{text.rstrip(chr(10))}\n{fence}"


def cell(value: object) -> str:
    """A value for a table cell: one line, pipes escaped."""
    return " ".join(str(value).split("\n")).replace("|", "\\|")


def code(value: object) -> str:
    """A value as inline code on one line: its backticks outgrow the value's own. In a table,
    pass it through ``cell`` too (GFM splits cells before it reads code spans)."""
    text = " ".join(str(value).split("\n"))
    longest = max((len(run) for run in _BACKTICKS.findall(text)), default=0)
    ticks = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"
