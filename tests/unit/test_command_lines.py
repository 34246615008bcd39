"""Which line of a comment is a `/fastci` command, over comment bodies as people write them.

A command is a line that starts with `/fastci` anywhere in the comment (the first one counts);
a line a reader sees as code (fenced, indented, inline) or as a quotation never is. Each
expectation is also checked against a CommonMark parser (markdown-it), so the table says what
GitHub shows, not what the function happens to do.
"""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt

from fastci.app.commands import parse
from fastci.app.events import Ignored, Work, command_line, route

BODIES = [
    # (body, the command line or None)
    ("/fastci run all", "/fastci run all"),
    ("Looks good.\n\n/fastci ok-to-test", "/fastci ok-to-test"),
    ("Looks good.\n/fastci ok-to-test", "/fastci ok-to-test"),  # same paragraph, own line
    ("LGTM\r\n\r\n/fastci retest\r\n", "/fastci retest"),  # GitHub sends CRLF
    ("   /fastci retest", "/fastci retest"),  # up to 3 spaces is still a paragraph
    ("/fastci help\n/fastci run all", "/fastci help"),  # the first one counts
    ("/fastci", "/fastci"),
    ("/fastcix run all", None),
    ("run it: /fastci run all", None),  # not at the start of a line
    ("`/fastci run all`", None),
    ("use `/fastci\n/fastci run all` to run", None),  # inline code over two lines
    ("an unmatched ` backtick\n/fastci run all", "/fastci run all"),
    ("``two ` ticks\n/fastci run all``", None),
    ("    /fastci run all", None),  # indented code block
    ("\t/fastci run all", None),
    ("Try:\n\n    /fastci run all\n\nthanks", None),
    ("```\n/fastci run all\n```", None),
    ("```bash\n/fastci run all\n```\n", None),
    ("~~~\n/fastci run all\n~~~", None),
    ("````\n```\n/fastci run all\n````", None),  # a shorter fence does not close it
    ("```\n/fastci run all", None),  # an unclosed fence runs to the end
    ("~~~\n/fastci x\n~~~\n\n/fastci help", "/fastci help"),
    ("```\ncode\n```\n/fastci retest", "/fastci retest"),
    ("> /fastci run all", None),
    (">/fastci run all", None),
    ("> > /fastci run all", None),
    ("> quoting you\n/fastci run all", None),  # a lazy continuation of the quote
    ("> quoting you\n\n/fastci run all", "/fastci run all"),
    ("- /fastci run all", None),  # a list item starts with "- "
    ("# /fastci run all", None),
    ("Thanks!\n\n> /fastci ok-to-test\n\nI can't, ask a maintainer", None),
    ("1. first\n/fastci run all", "/fastci run all"),  # a new line in a list item's text
    ("Heading\n---\n/fastci help", "/fastci help"),
    ("/fastci run all\n===", None),  # a heading's text, not a line of a paragraph
    ("> ```\n/fastci run all", "/fastci run all"),  # a fence in a quote ends with it
    ("> ```\n> /fastci run all\n> ```", None),
]


def commonmark_command(body: str) -> str | None:
    """The oracle: the first line of a paragraph outside block quotes whose text, as
    CommonMark parses it (not code), starts with `/fastci` (then a space or the end)."""
    quoted, recent = 0, ["", ""]
    for token in MarkdownIt("commonmark").parse(body):
        quoted += {"blockquote_open": 1, "blockquote_close": -1}.get(token.type, 0)
        after, recent = recent, [recent[1], token.type]
        if token.type != "inline" or quoted or after[1] != "paragraph_open":
            continue
        at_start = after[0] != "list_item_open"  # "- /fastci" does not start with /fastci
        for child in token.children or []:
            if at_start and child.type == "text" and (
                    child.content == "/fastci" or child.content.startswith("/fastci ")):
                return child.content
            at_start = child.type in ("softbreak", "hardbreak")
    return None


@pytest.mark.parametrize("body, expected", BODIES)
def test_the_command_line_of_a_comment(body, expected):
    assert command_line(body) == expected
    oracle = commonmark_command(body)
    assert (oracle is None) == (expected is None), oracle
    if expected is not None:
        assert expected.startswith(oracle)


LINES = ["/fastci run all", "/fastci retest", "text", "", "    /fastci help", "```", "~~~", "````",
         "> quote", "> /fastci x", "`", "a `b", "``", "```py", "> ```", "/fastcix", "# h",
         "   /fastci ok-to-test", "\t/fastci y", "- item", "1. /fastci z", "---", "==="]


@settings(max_examples=2000, deadline=None)
@given(st.lists(st.sampled_from(LINES), max_size=8))
def test_commands_agree_with_a_commonmark_parser(lines):
    """Comments made of tricky lines: the function and the parser agree on whether one holds a
    command. Left out: an indented line after a list item, which CommonMark may read as a
    paragraph of the item; FastCI reads lists flat (four spaces are code)."""
    assume(not any(a in ("- item", "1. /fastci z") and b[:1] in (" ", "\t")
                   for i, a in enumerate(lines) for b in lines[i + 1:]))
    body = "\n".join(lines)
    oracle = commonmark_command(body)
    assert (command_line(body) is None) == (oracle is None), oracle


@pytest.mark.parametrize("body, name, argument", [
    ("Looks good.\n\n/fastci ok-to-test", "ok-to-test", ""),
    ("```\n/fastci run all\n```\n/fastci retest", "retest", ""),
    ("> /fastci run all", "unknown", ""),
])
def test_parse_reads_the_same_line(body, name, argument):
    command = parse(body)
    assert (command.name, command.argument) == (name, argument)


def comment_payload(body: str, *, action: str = "created", user_type: str = "User",
                    login: str = "octocat", before: str | None = None) -> dict:
    payload = {
        "action": action, "repository": {"full_name": "octo/widgets"},
        "installation": {"id": 7}, "sender": {"login": login, "type": user_type},
        "issue": {"number": 5, "pull_request": {"url": "https://api.github.com/x"}},
        "comment": {"id": 801, "body": body, "user": {"login": login, "type": user_type}}}
    if before is not None:
        payload["changes"] = {"body": {"from": before}}
    return payload


def test_a_command_on_a_later_line_is_routed():
    work = route("issue_comment", comment_payload("Looks good.\n\n/fastci ok-to-test"))
    assert isinstance(work, Work) and work.kind == "command"
    assert work.body == "/fastci ok-to-test" and work.mode == "select"


@pytest.mark.parametrize("body", ["    /fastci run all", "```\n/fastci run all\n```",
                                  "> /fastci run all", "`/fastci run all`"])
def test_code_and_quotes_are_not_routed(body):
    assert isinstance(route("issue_comment", comment_payload(body)), Ignored)


def test_bots_are_ignored_unless_allowed():
    payload = comment_payload("/fastci run all", user_type="Bot", login="renovate[bot]")
    ignored = route("issue_comment", payload)
    assert isinstance(ignored, Ignored) and "FASTCI_ALLOWED_BOTS" in ignored.reason
    work = route("issue_comment", payload, frozenset({"renovate[bot]"}))
    assert isinstance(work, Work) and work.sender == "renovate[bot]"


def test_an_edit_into_a_command_gets_a_reply_and_is_never_run():
    work = route("issue_comment", comment_payload("Looks good.\n/fastci run all",
                                                  action="edited", before="Looks good."))
    assert isinstance(work, Work) and work.mode == "edited" and work.body == "/fastci run all"
    # An edit that leaves the comment's command as it was is not answered again.
    again = route("issue_comment", comment_payload("LGTM!\n/fastci run all", action="edited",
                                                   before="LGTM\n/fastci run all"))
    assert isinstance(again, Ignored)
    assert isinstance(route("issue_comment", comment_payload("/fastci run all",
                                                             action="deleted")), Ignored)
