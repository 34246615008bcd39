"""`/fastci` slash commands in pull-request comments (Prow and pytorchbot style).

Only users with write access may command FastCI, and that is checked through the API
(`GET /repos/{repo}/collaborators/{user}/permission`), never from the comment's
author_association, which hides private organisation members. Every command is acknowledged
with a reaction and answered with a comment; an unknown one gets the help text.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, replace

from github import GithubException

from . import github, markdown
from .context import installation_token
from .events import EDITED, RUN_ALL, Work, command_line
from .planning import base_settings
from .queue import SEEN_TTL

WRITE = ("admin", "maintain", "write")
HELP = """\
FastCI commands (write access required):

| command | what it does |
| --- | --- |
| `/fastci run all` | run every test on this head, not only the selection |
| `/fastci retest` | select and run again on this head (failed tests included) |
| `/fastci explain <test id>` | why a test is selected or skipped, with its evidence |
| `/fastci ok-to-test [<sha>]` | run this fork's head (as you saw it, or `<sha>`) on the runners |
| `/fastci help` | this message |
"""


@dataclass(frozen=True)
class Command:
    name: str  # run-all | retest | explain | ok-to-test | help | unknown
    argument: str = ""
    text: str = ""


def parse(body: str) -> Command:
    """The first `/fastci ...` line of a comment (events.command_line says which that is)."""
    line = command_line(body)
    if line is None:
        return Command("unknown", text=body[:100])
    try:
        words = shlex.split(line)[1:]
    except ValueError:
        words = line.split()[1:]
    if not words:
        return Command("help", text=line)
    verb, rest = words[0].lower(), words[1:]
    if verb == "run" and [w.lower() for w in rest] == ["all"]:
        return Command("run-all", text=line)
    if verb in ("retest", "ok-to-test", "help") and not rest:
        return Command(verb, text=line)
    if verb == "ok-to-test" and len(rest) == 1:
        return Command(verb, rest[0], text=line)
    if verb == "explain" and len(rest) == 1:
        return Command("explain", rest[0], text=line)
    return Command("unknown", " ".join(words), text=line)


def may_command(repo, user: str) -> bool:
    try:
        permission = github.retrying(lambda: repo.get_collaborator_permission(user))
    except GithubException as exc:
        if exc.status in (403, 404):
            return False  # not a collaborator (or we may not ask): not allowed
        raise
    return permission in WRITE


COMMAND_CLAIM_TTL = 3600  # seconds a comment's command is held while it is handled


def handle_command(ctx, work: Work) -> dict:
    """Handle a comment's command once: a redelivery of the same comment (or a second job for
    it) changes nothing and posts nothing."""
    command = parse(work.body or "")
    claim = ctx.queues.key("comment", work.repo.lower(), str(work.comment_id), work.mode)
    if not ctx.redis.set(claim, "handling", nx=True, ex=COMMAND_CLAIM_TTL):
        return {"command": command.name, "duplicate": True}
    try:
        out = _handle(ctx, work, command)
    except BaseException:
        ctx.redis.delete(claim)  # not handled: a retry or redelivery may
        raise
    ctx.redis.set(claim, "handled", ex=SEEN_TTL)
    return out


def _handle(ctx, work: Work, command: Command) -> dict:
    issue = github.retrying(lambda: ctx.repo.get_issue(work.number))
    comment = github.retrying(lambda: issue.get_comment(work.comment_id))
    github.retrying(lambda: comment.create_reaction("eyes"))

    def reply(text: str) -> None:
        github.retrying(lambda: issue.create_comment(f"@{work.sender} {text}"))

    if not may_command(ctx.repo, work.sender):
        reply("thanks for asking, but FastCI takes commands only from people with write "
              "access to this repository. A maintainer can run it for you.")
        return {"command": command.name, "allowed": False}
    if work.mode == EDITED:
        reply(f"edits are not commands, so {markdown.code(command.text[:80])} did nothing: "
              "FastCI reads commands in new comments only. Post it as a new comment to run it.")
        return {"command": command.name, "allowed": True, "edited": True}
    if command.name in ("help", "unknown"):
        prefix = "" if command.name == "help" else \
            f"I don't know {markdown.code(command.text.strip()[:80])}.\n\n"
        reply(prefix + HELP)
        return {"command": command.name, "allowed": True}
    pr = github.retrying(lambda: ctx.repo.get_pull(work.number))
    head, base = pr.head.sha, pr.base.sha
    if command.name == "ok-to-test":
        approved = _approved_head(ctx, work, command, pr, comment, reply)
        if approved is None:
            return {"command": command.name, "allowed": True, "approved": None}
        ctx.redis.set(ctx.approved_key(work.repo, approved), work.sender,
                      ex=30 * 24 * 3600)
        _rerun(ctx, work, approved, base, pr, "select")
        reply(f"approved `{approved[:12]}` for testing on FastCI's runners; running it now. "
              "A new push needs a new `/fastci ok-to-test`.")
        return {"command": command.name, "allowed": True, "approved": approved}
    elif command.name in ("run-all", "retest") and _unapproved_fork(ctx, work, pr):
        reply(f"this pull request comes from a fork, and its head `{head[:12]}` is not approved "
              "for FastCI's runners, so nothing runs: a maintainer must review it and say "
              f"`/fastci ok-to-test {head[:12]}` first, then {markdown.code(command.text[:40])} "
              "again.")
        return {"command": command.name, "allowed": True, "ran": False}
    elif command.name == "run-all":
        _rerun(ctx, work, head, base, pr, RUN_ALL)
        reply(f"running every test on `{head[:12]}`.")
    elif command.name == "retest":
        _rerun(ctx, work, head, base, pr, "select")
        reply(f"selecting and running again on `{head[:12]}`.")
    elif command.name == "explain":
        reply(explain(ctx, work, pr, command.argument))
    return {"command": command.name, "allowed": True}


def _unapproved_fork(ctx, work: Work, pr) -> bool:
    head_repo = pr.head.repo.full_name if pr.head.repo is not None else None
    fork = head_repo is None or head_repo.lower() != work.repo.lower()
    return fork and not ctx.redis.exists(ctx.approved_key(work.repo, pr.head.sha))


SHA_PREFIX = re.compile(r"^[0-9a-f]{7,40}$")


def _approved_head(ctx, work: Work, command: Command, pr, comment, reply) -> str | None:
    """The commit an ok-to-test approves: the one it names, or the head when the comment was
    written (by the pull request's events, as `Queues.head_at` keeps them); that commit
    only if it is still the head. Else None, after a reply saying why and what to say."""
    head = pr.head.sha
    again = f"Review `{head[:12]}`, then say `/fastci ok-to-test {head[:12]}`."
    if command.argument:
        named = command.argument.lower()
        if not SHA_PREFIX.match(named):
            reply(f"{markdown.code(command.argument[:60])} is not a commit sha, so nothing "
                  "was approved. "
                  "Say `/fastci ok-to-test` or `/fastci ok-to-test <sha of the head you "
                  "reviewed>`.")
            return None
        if not head.startswith(named):
            reply(f"`{named[:12]}` is not this pull request's head, so nothing was approved: "
                  f"the head is `{head[:12]}` now. {again}")
            return None
        return head
    seen, later = ctx.queues.head_at(work.repo, work.number, comment.created_at.timestamp())
    if seen is None:
        reply("FastCI cannot tell which commit was this pull request's head when you wrote "
              "that (it saw no push of it before your comment), so nothing was approved. "
              + again)
        return None
    if later or seen != head:
        reply(f"the head moved after your comment, so nothing was approved: you approved "
              f"`{seen[:12]}`, and the head is now `{head[:12]}`. {again}")
        return None
    return seen


def _rerun(ctx, work: Work, head: str, base: str, pr, mode: str) -> None:
    head_repo = pr.head.repo.full_name if pr.head.repo is not None else None
    rerun = Work("pull_request", work.repo, work.installation_id, number=work.number,
                 head_sha=head, base_sha=base, base_ref=pr.base.ref, head_repo=head_repo,
                 sender=work.sender, mode=mode)
    delivery = f"command-{work.comment_id}-{mode}"
    if ctx.queues.claim(delivery):
        ctx.queues.enqueue(rerun, delivery)


def explain(ctx, work: Work, pr, test_id: str) -> str:
    """The `fastci explain` text for a test, from a selection of the PR's head."""
    from fastci.runner.engine import Engine  # noqa: PLC0415
    from fastci.runner.git import WORKTREE  # noqa: PLC0415
    from fastci.runner.selection.explain import explain as render  # noqa: PLC0415

    from . import workspace  # noqa: PLC0415

    head_repo = pr.head.repo.full_name if pr.head.repo is not None else None
    fork = head_repo is None or head_repo.lower() != work.repo.lower()
    if fork:
        if _unapproved_fork(ctx, work, pr):
            return ("this pull request comes from a fork; FastCI explains its selection "
                    "after `/fastci ok-to-test`.")
    mirror = workspace.sync(ctx.settings.workspace, work.repo,
                            ctx.settings.clone_url.format(repo=work.repo),
                            [pr.base.sha, pr.head.sha], number=work.number,
                            token=installation_token(ctx, work))
    with workspace.worktree(mirror, pr.head.sha) as tree:
        engine = Engine(tree, ctx.settings.store_path,
                        settings=base_settings(mirror, pr.base.sha))
        # No pruning here: its replays would wait for a runner; the reply says what the
        # selection found, and the selection check run shows what pruning did.
        planned = engine.plan(base=pr.base.sha, head=WORKTREE, prune=False)
    selection = replace(planned.selection, head=pr.head.sha)  # planned on its worktree
    ids = [d.test_id for d in selection.decisions]
    match = test_id if test_id in ids else next(
        (i for i in ids if i.startswith(test_id)), None)
    if match is None:
        return f"no test {markdown.code(test_id)} is known at `{pr.head.sha[:12]}`."
    evidence = planned.snapshot.tests.get(match) if planned.snapshot else None
    kept = planned.pruning.kept.get(match) if planned.pruning else None
    return explain_reply(render(selection, match, evidence, not_pruned=kept), match,
                         pr.head.sha)


EXPLAIN_LIMIT = 60000  # characters of explanation; GitHub takes comments of up to 65,536


def explain_reply(text: str, test_id: str, head: str) -> str:
    """A sentence, then the explanation in a code block that opens at the start of a line
    (after the reply's @mention it would not render)."""
    if len(text) > EXPLAIN_LIMIT:
        text = text[:EXPLAIN_LIMIT] + "\n… (truncated)"
    return (f"how FastCI decides on {markdown.code(test_id)} at `{head[:12]}`:\n\n"
            + markdown.code_block(text))
